"""The trainer with ``model_parallel=2``: kernels split over the mesh axis ``'model'``.

On 8 simulated CPU devices (see conftest.py), 4 data-parallel rows x 2 model devices with 2
micro-batches each give the parameters of the unsharded run on 4 devices x 2 micro-batches (the
same S = 8 per-worker gradients of the same rows), to float32 rounding (the model-axis partial
sums add in another order: observed <= 2.4e-7 of a leaf's largest entry), and the state stays
split after the updates and through a checkpoint.
"""

import dataclasses
from pathlib import Path

import flax
import jax
import numpy as np
import pytest

from examples import checkpoints
from examples.lena import configs, parallel, train

RTOL = 2e-6  # see the module docstring; a wrong reduction moves parameters by ~1e-2


def _config(cache_dir: str, **changes) -> configs.Config:
  return dataclasses.replace(
    configs.get_config("tiny_test"),
    cache_dir=cache_dir,
    optimizer="lena",
    micro_batches=2,
    checkpoint_every=3,
    **changes,
  )


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory, cache_dir: str):
  state = train.train_and_evaluate(
    _config(cache_dir, num_devices=4), tmp_path_factory.mktemp("unsharded")
  )
  return jax.device_get(state)


@pytest.mark.parametrize("path", ["gspmd", "shard_map"])
def test_model_parallel_matches_unsharded(path: str, tmp_path: Path, cache_dir: str, unsharded):
  config = _config(cache_dir, model_parallel=2, parallel=path)
  layout = parallel.batch_layout(config, jax.device_count())
  assert (layout.num_devices, layout.micro_batches, layout.model_parallel) == (4, 2, 2)
  state = train.train_and_evaluate(config, tmp_path)
  kernel = state.params["Conv_0"]["kernel"]
  assert kernel.sharding.spec[-1] == "model"
  assert {s.data.shape[-1] for s in kernel.addressable_shards} == {kernel.shape[-1] // 2}
  assert state.params["Conv_0"]["bias"].sharding.is_fully_replicated
  got = jax.device_get(state)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(unsharded), strict=True):
    scale = float(np.max(np.abs(b)))
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * scale)
  # The checkpoint holds the same numbers, written from the split arrays.
  saved = checkpoints.restore_checkpoint(tmp_path)["state"]
  as_dict = flax.serialization.to_state_dict(got)
  for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(as_dict), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_model_parallel_errors(cache_dir: str) -> None:
  with pytest.raises(configs.ConfigError, match="does not divide the 8 devices"):
    parallel.batch_layout(_config(cache_dir, model_parallel=3), 8)
  with pytest.raises(configs.ConfigError, match="parallel='pmap' runs on one process"):
    parallel.create("pmap", parallel.BatchLayout(8, 4, 2, 2), lambda *a: a, lambda *a: a)
  with pytest.raises(configs.ConfigError, match="model_parallel must be >= 1"):
    train.validate_config(_config(cache_dir, model_parallel=0))


def test_explicit_sharding_mode_matches_auto(tmp_path: Path, cache_dir: str, unsharded) -> None:
  """``sharding_mode='explicit'``: GSPMD on a mesh of explicit axes (the statistics, optimizer
  and reductions typed by their shardings) gives the parameters of the Auto-mesh run."""
  config = _config(cache_dir, num_devices=4, parallel="gspmd", sharding_mode="explicit")
  state = train.train_and_evaluate(config, tmp_path)
  kernel = state.params["Conv_0"]["kernel"]
  assert kernel.sharding.mesh.axis_types == (jax.sharding.AxisType.Explicit,)
  assert all(axis is None for axis in jax.typeof(kernel).sharding.spec)  # replicated, in type
  for a, b in zip(jax.tree.leaves(jax.device_get(state)), jax.tree.leaves(unsharded), strict=True):
    scale = float(np.max(np.abs(b)))
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * scale)
  layout, fn = parallel.BatchLayout(8, 4, 2), lambda *a: a
  with pytest.raises(configs.ConfigError, match="sharding_mode='explicit' runs the jit"):
    parallel.create("shard_map", layout, fn, fn, "explicit")
  with pytest.raises(configs.ConfigError, match="Unknown sharding_mode 'manual'"):
    parallel.create("gspmd", layout, fn, fn, "manual")
