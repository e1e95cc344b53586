"""The attention model in the trainer: ``examples.models.PatchTransformer``, the AdamW entries of
the optimizer registry and ``--config mnist1d_attention``.

Tiny MNIST-1D runs on 8 simulated CPU devices (see conftest.py).
"""

import dataclasses
import sys
from pathlib import Path

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
  sys.path.insert(0, _REPO_ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

import optax_lena as ol  # noqa: E402
from examples import metrics, models, optimizers  # noqa: E402
from examples.lena import configs, train  # noqa: E402

ADAMW = ("adamw", "linear_scaling_adamw", "adascale_adamw", "lena_adamw")
# The kernels of the embedding, the 4 attention projections, the 2 MLP layers and the head.
KERNELS = {
  "embed/kernel",
  "head/kernel",
  "Block_0/Dense_0/kernel",
  "Block_0/Dense_1/kernel",
  *(f"Block_0/MultiHeadDotProductAttention_0/{p}/kernel" for p in ("query", "key", "value", "out")),
}


def _tiny(cache_dir: str, **changes) -> configs.Config:
  """``mnist1d_attention`` at the tiny test configuration's sizes."""
  tiny = dict(
    mnist1d_num_samples=1000,
    width=8,
    per_worker_batch=8,
    batch_scale=4,
    num_epochs=1,
    num_steps=2,
    eval_every=2,
    eval_batch_size=200,
    progress_bar=False,
    rng_impl="rbg",
    cache_dir=cache_dir,
  )
  return dataclasses.replace(configs.get_config("mnist1d_attention"), **{**tiny, **changes})


def _name(path) -> str:
  return jax.tree_util.keystr(path, simple=True, separator="/")


def _names(tree) -> list[str]:
  return [_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _params(width: int = 8):
  model = models.create_model("patch_transformer", 10, width=width)
  return model.init(jax.random.key(0), jnp.zeros((1, 40)))["params"]


def _grads_and_stats(params, s: int = 4):
  rng = np.random.RandomState(0)
  stacked = jax.tree.map(lambda p: jnp.asarray(rng.randn(s, *p.shape), jnp.float32), params)
  return ol.stacked_grad_stats(stacked)


def test_config_and_model() -> None:
  config = configs.get_config("mnist1d_attention")
  assert (config.model, config.optimizer, config.per_worker_batch) == (
    "patch_transformer",
    "lena_adamw",
    64,
  )
  assert train.create_model(config, 10).width == 24  # width 0: the model's default
  assert train.create_model(dataclasses.replace(config, width=8), 10).width == 8
  names = _names(_params())
  decayed = [
    n for n, d in zip(names, jax.tree.leaves(models.decay_mask(_params())), strict=True) if d
  ]
  # No bias, LayerNorm scale or the position table.
  assert set(decayed) == KERNELS and len(decayed) == len(KERNELS) and "position" in names


def test_trains_through_the_trainer_with_lena_adamw(tmp_path: Path, cache_dir: str) -> None:
  config = _tiny(cache_dir)
  state = train.train_and_evaluate(config, tmp_path)
  assert int(state.step) == 2
  assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(state.params))
  (record,) = metrics.read_metrics(tmp_path, "eval")
  assert 0.0 <= record["eval_accuracy"] <= 1.0 and np.isfinite(record["eval_loss"])
  assert set(record["lr_multiplier"]) == set(_names(state.params))
  assert all(1.0 <= v <= 4.0 for v in record["gain_ratio"].values())
  # What batch_ramp='noise' reads: a critical-batch estimate and the policy's advice.
  host = jax.device_get(state.opt_state)
  assert "critical_batch_size" in ol.flat_diagnostics(host)
  advice = int(ol.advise_num_samples(host, max_num_samples=16, min_num_samples=4))
  assert 4 <= advice <= 8  # never below S, at most max_growth = 2 times it


def test_adamw_entry_against_numpy() -> None:
  """One update of the plain entry in float64: Adam's first step is g / (|g| + eps), plus the
  decoupled weight decay on kernels only, times the rate at update 0."""
  hp = optimizers.Hyperparams(learning_rate=1e-2, total_steps=10, weight_decay=0.1, momentum=0.8)
  tx = optimizers.build("adamw", hp)
  params = _params()
  grads, stats = _grads_and_stats(params)
  updates, _ = tx.update(grads, tx.init(params), params, grad_stats=stats)
  mask = jax.tree.leaves(models.decay_mask(params))
  for u, g, w, m in zip(*(jax.tree.leaves(t) for t in (updates, grads, params)), mask, strict=True):
    g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
    expected = -1e-2 * (g / (np.abs(g) + 1e-8) + (0.1 * w if m else 0.0))
    np.testing.assert_allclose(np.asarray(u), expected, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("name", ADAMW[1:])
def test_large_batch_entries_are_the_library_aliases(name: str) -> None:
  """The registry passes the Hyperparams to ``ol.*_adamw`` as the SGD entries do: two updates
  equal to a direct call (b1 = momentum, decay masked to kernels, sample clock, warm-up)."""
  entry = optimizers.get(name)
  hp = optimizers.Hyperparams(
    learning_rate=1e-2,
    num_samples=4,
    total_steps=10,
    momentum=0.8,
    weight_decay=0.1,
    warmup=entry.paper_warmup,
  )
  alias = {
    "linear_scaling_adamw": ol.linear_scaling_adamw,
    "adascale_adamw": ol.adascale_adamw,
    "lena_adamw": ol.lena_adamw,
  }[name]
  mask = jax.tree_util.tree_map_with_path(lambda p, _: _name(p) in KERNELS, _params())
  direct = alias(
    hp.sample_schedule(),
    b1=0.8,
    weight_decay=0.1,
    weight_decay_mask=mask,
    clock="samples",
    num_samples=4,
    **hp.warmup_kwargs(),
  )
  registry = optimizers.build(name, hp)
  params = _params()
  grads, stats = _grads_and_stats(params)
  states = [tx.init(params) for tx in (direct, registry)]
  for _ in range(2):
    outs = [
      tx.update(grads, st, params, grad_stats=stats)
      for tx, st in zip((direct, registry), states, strict=True)
    ]
    for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1]), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    states = [o[1] for o in outs]
    params = optax.apply_updates(params, outs[0][0])
  assert entry.diagnostics and entry.takes_reference_batch
