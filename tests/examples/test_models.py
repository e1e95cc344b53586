"""examples.models.ResNet1D: ResNet-18's 62 parameter leaves in 1D, with BatchNorm, for MNIST-1D."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
  sys.path.insert(0, _REPO_ROOT)

from examples import models  # noqa: E402


def _init(
  width: int, shapes_only: bool = False, name: str = "resnet1d"
) -> tuple[models.ResNet1D, dict]:
  """The model and its variables; with ``shapes_only`` their shapes (nothing is computed)."""
  model = models.create_model(name, 10, width=width)
  init = lambda key, x: model.init(key, x, train=False)
  args = (jax.random.key(0), jnp.zeros((2, 40)))
  return model, jax.eval_shape(init, *args) if shapes_only else init(*args)


def test_leaves_and_parameters() -> None:
  """The same leaf structure as ResNet-18 (62 leaves) and the documented sizes."""
  for width, size in ((8, 61_778), (16, 243_354)):
    _, variables = _init(width, shapes_only=True)
    leaves = jax.tree.leaves(variables["params"])
    assert len(leaves) == 62
    assert sum(x.size for x in leaves) == size
  names = ["/".join(str(k.key) for k in path) for path, _ in jax.tree_util.tree_flatten_with_path(
    variables["params"])[0]]  # fmt: skip
  kinds = [n.rsplit("/", 1)[1] for n in names]
  assert kinds.count("kernel") == 21  # 20 convolutions (3 shortcuts) + the Dense layer
  assert kinds.count("scale") == 20 and kinds.count("bias") == 21
  # BatchNorm running statistics: a mean and a variance per BatchNorm layer.
  assert len(jax.tree.leaves(variables["batch_stats"])) == 40


def test_forward_train_and_eval_modes() -> None:
  model, variables = _init(4)
  x = jax.random.normal(jax.random.key(1), (16, 40))
  # Train mode normalises with the batch and updates the running statistics.
  logits, new = model.apply(variables, x, train=True, mutable=["batch_stats"])
  assert logits.shape == (16, 10) and logits.dtype == jnp.float32
  assert np.all(np.isfinite(logits))
  before = jax.tree.leaves(variables["batch_stats"])
  after = jax.tree.leaves(new["batch_stats"])
  assert any(not np.allclose(a, b) for a, b in zip(before, after, strict=True))
  # Eval mode uses the running statistics: deterministic, per-example (batch-independent).
  ev = {**variables, "batch_stats": new["batch_stats"]}
  full = model.apply(ev, x, train=False)
  half = model.apply(ev, x[:8], train=False)
  np.testing.assert_allclose(full[:8], half, rtol=1e-5, atol=1e-5)
  assert not np.allclose(full, logits, atol=1e-3)  # batch vs running statistics differ
  # A [batch, length, 1] input is accepted as well.
  np.testing.assert_allclose(model.apply(ev, x[..., None], train=False), full, rtol=1e-6)


def test_per_worker_batchnorm_under_vmap() -> None:
  """Under vmap each worker normalises with its own batch (as data-parallel workers)."""
  model, variables = _init(4)
  x = jax.random.normal(jax.random.key(2), (3, 8, 40))
  f = lambda xb: model.apply(variables, xb, train=True, mutable=["batch_stats"])[0]
  stacked = jax.vmap(f)(x)
  for i in range(3):
    np.testing.assert_allclose(stacked[i], f(x[i]), rtol=1e-5, atol=1e-5)


def test_config_builds_the_study_model() -> None:
  """``--config mnist1d_resnet1d`` is the second study's setting (ResNet1D width 8)."""
  from examples.lena import configs

  config = configs.get_config("mnist1d_resnet1d")
  assert (config.model, config.width, config.per_worker_batch) == ("resnet1d", 8, 8)
  assert config.mnist1d_num_samples == 10_000
  _, variables = _init(config.width, shapes_only=True, name=config.model)
  assert sum(x.size for x in jax.tree.leaves(variables["params"])) == 61_778
