"""The data-parallel guide's GSPMD step, then the Flax guide's linen, NNX and logging patterns,
run as printed in one namespace, on the 8 simulated devices of conftest.py."""

import json

import jax
import numpy as np
import pytest

from tests.docs.pages import GUIDES, block, run

pytest.importorskip("flax")


def test_gspmd_step_then_flax_and_logging_patterns_run():
  steps, flax = GUIDES / "data_parallel.md", GUIDES / "flax.md"
  ns = run(block(steps, "jax.shard_map", "def local_step"), "guide-shard-map")
  run(block(steps, "def gspmd_step", "NamedSharding"), "guide-gspmd", ns)
  ol, s = ns["ol"], jax.device_count()
  # The GSPMD step ran on the worker-sharded batch with replicated parameters.
  assert ns["x"].sharding.spec[0] == "batch" and len(ns["x"].sharding.device_set) == s
  assert ns["params"]["w"].sharding.is_fully_replicated
  assert int(ol.diagnostics(ns["opt_state"])["num_updates"]) == 2
  assert int(ol.diagnostics(ns["opt_state"])["num_samples"]) == s

  run(block(flax, "optax_lena.flax", "nn.Module"), "guide-linen", ns)
  state = ns["state"]
  assert int(state.step) == 1 and np.isfinite(float(ns["loss"]))
  assert int(ol.diagnostics(state.opt_state)["num_samples"]) == s
  bn_mean = jax.tree.leaves(state.batch_stats)[0]
  assert not np.allclose(bn_mean, 0.0)  # updated with the workers' mean statistics

  run(block(flax, "nnx.Optimizer", "nnx_grad_stats"), "guide-nnx", ns)
  nnx = ns["nnx"]
  assert int(ns["optimizer"].step[...]) == 1 and np.isfinite(float(ns["loss"]))
  assert not np.allclose(ns["model"].bn.mean[...], 0.0)

  run(block(flax, "flat_diagnostics", "json.dumps"), "guide-logging", ns)
  metrics = ns["metrics"]
  json.dumps(metrics, allow_nan=False)
  assert metrics["lena/num_samples"] == float(s) and metrics["linen/num_updates"] == 1.0
  assert "lena/gain_ratio/dense/kernel" in metrics
  assert "linen/gain_ratio/Dense_0/kernel" in metrics
  assert nnx.state(ns["model"], nnx.Param)  # the names come from this tree
