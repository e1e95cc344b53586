"""docs/guides/scanned_layers.md runs as printed: its code blocks, in order, in one namespace, on
the 8 simulated devices of conftest.py; each stacked block gets a ratio of its own."""

import pathlib
import re

import jax
import numpy as np
import pytest

pytest.importorskip("flax")

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guides" / "scanned_layers.md"


def test_the_guide_runs_and_every_block_is_a_layer():
  blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
  assert len(blocks) == 4
  ns: dict = {}
  exec(compile(blocks[0], "scanned_layers-linen", "exec"), ns)
  depth, s = ns["DEPTH"], ns["S"]
  assert ns["layer_axes"]["blocks"]["Dense_0"] == {"bias": 0, "kernel": 0}
  assert ns["layer_axes"]["Dense_0"] == {"bias": None, "kernel": None}
  kernel_ratios = np.array(
    [ns["metrics"][f"gain_ratio/blocks/Dense_0/kernel/{i}"] for i in range(depth)]
  )
  assert len(set(kernel_ratios.tolist())) == depth and "gain_ratio/Dense_0/kernel" in ns["metrics"]
  assert np.all((kernel_ratios >= 1) & (kernel_ratios <= s)) and np.isfinite(float(ns["loss"]))

  exec(compile(blocks[1], "scanned_layers-nnx", "exec"), ns)
  axes = jax.tree.leaves(ns["nnx_axes"], is_leaf=lambda x: x is None)
  assert sorted(a for a in axes if a is not None) == [0, 0] and axes.count(None) == 4
  metrics = ns["nnx_metrics"]
  nnx_kernel = [metrics[f"gain_ratio/blocks/linear/kernel/{i}"] for i in range(depth)]
  assert len(set(nnx_kernel)) == depth and metrics["num_layers"] == 2 * depth + 4
  assert int(ns["optimizer"].step[...]) == 3 and np.isfinite(float(ns["nnx_loss_value"]))

  exec(compile(blocks[2], "scanned_layers-maxtext", "exec"), ns)
  stats = ns["grad_stats"]
  assert stats.sq_norm_mean["decoder"]["mlp"]["kernel"].shape == (depth,)
  assert stats.sq_norm_mean["head"]["kernel"].shape == ()

  exec(compile(blocks[3], "scanned_layers-sharded", "exec"), ns)
  kernel = ns["sharded_new"]["decoder"]["mlp"]["kernel"]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "stage")
  # The sharded step is the unsharded one, to float32 rounding.
  pairs = ((ns["sharded_new"], ns["new_params"]), (ns["sharded_stats"], ns["grad_stats"]))
  for got, want in pairs:
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  old = ns["stacked_params"]["decoder"]["mlp"]["kernel"]
  assert not np.allclose(ns["new_params"]["decoder"]["mlp"]["kernel"], old)
