"""The README's complete GSPMD quickstart, its Flax (linen, NNX) patterns and its logging
pattern run as printed, in one namespace, on the 8 simulated devices of conftest.py."""

import json
import pathlib
import re

import jax
import numpy as np
import pytest

pytest.importorskip("flax")

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def block(*needles: str) -> str:
  """The one README python block containing every needle."""
  blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
  found = [b for b in blocks if all(n in b for n in needles)]
  assert len(found) == 1, (needles, len(found))
  return found[0]


def test_gspmd_quickstart_then_flax_and_logging_patterns_run():
  ns: dict = {}
  exec(compile(block("jax.shard_map", "def local_step"), "README-quickstart", "exec"), ns)
  exec(compile(block("def gspmd_step", "NamedSharding"), "README-gspmd", "exec"), ns)
  ol, s = ns["ol"], jax.device_count()
  # The GSPMD step ran on the worker-sharded batch with replicated parameters.
  assert ns["x"].sharding.spec[0] == "batch" and len(ns["x"].sharding.device_set) == s
  assert ns["params"]["w"].sharding.is_fully_replicated
  assert int(ol.diagnostics(ns["opt_state"])["num_updates"]) == 2
  assert int(ol.diagnostics(ns["opt_state"])["num_samples"]) == s

  exec(compile(block("optax_lena.flax", "nn.Module"), "README-linen", "exec"), ns)
  state = ns["state"]
  assert int(state.step) == 1 and np.isfinite(float(ns["loss"]))
  assert int(ol.diagnostics(state.opt_state)["num_samples"]) == s
  bn_mean = jax.tree.leaves(state.batch_stats)[0]
  assert not np.allclose(bn_mean, 0.0)  # updated with the workers' mean statistics

  exec(compile(block("nnx.Optimizer", "nnx_grad_stats"), "README-nnx", "exec"), ns)
  nnx = ns["nnx"]
  assert int(ns["optimizer"].step[...]) == 1 and np.isfinite(float(ns["loss"]))
  assert not np.allclose(ns["model"].bn.mean[...], 0.0)

  exec(compile(block("flat_diagnostics", "json.dumps"), "README-logging", "exec"), ns)
  metrics = ns["metrics"]
  json.dumps(metrics, allow_nan=False)
  assert metrics["lena/num_samples"] == float(s) and metrics["linen/num_updates"] == 1.0
  assert "lena/gain_ratio/dense/kernel" in metrics
  assert "linen/gain_ratio/Dense_0/kernel" in metrics
  assert nnx.state(ns["model"], nnx.Param)  # the names come from this tree
