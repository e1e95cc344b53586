"""The trainer's ``reference_batch_size``: forwarded with the per-worker batch to the optimizers
that scale with the batch, so that an update of S per-worker batches b has scale k = S b / b0.

Checked against a float64 NumPy expectation of linear scaling's rate, against the library
optimizers built by hand, and end to end through ``train_and_evaluate`` (8 simulated CPU
devices, see conftest.py).
"""

import dataclasses
import json
import sys
from pathlib import Path

# `examples` is a top-level package of the repository, not part of the installed distribution.
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
  sys.path.insert(0, _REPO_ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import optax_lena as ol  # noqa: E402
from examples import metrics, optimizers  # noqa: E402
from examples.lena import configs, train  # noqa: E402

TOTAL_STEPS = 40


def _params():
  return {"dense": {"kernel": jnp.full((3, 2), 0.5), "bias": jnp.zeros((2,))}}


def _grads_and_stats(s: int, seed: int = 0):
  rng = np.random.RandomState(seed)
  stacked = jax.tree.map(lambda p: jnp.asarray(rng.randn(s, *p.shape), jnp.float32), _params())
  return ol.stacked_grad_stats(stacked)


def _run_updates(tx, s: int, steps: int = 4) -> list[list[np.ndarray]]:
  """The updates of ``steps`` calls (fresh gradients and statistics each), as NumPy leaves."""
  params = _params()
  state = tx.init(params)
  out = []
  for t in range(steps):
    grads, stats = _grads_and_stats(s, seed=t)
    updates, state = tx.update(grads, state, params, grad_stats=stats)
    out.append([np.asarray(u) for u in jax.tree.leaves(updates)])
  return out


@pytest.mark.parametrize(
  ("s", "b", "b0"), [(8, 32, 64), (16, 8, 64), (4, 16, 16), (6, 4, 8)], ids=str
)
def test_linear_scaling_rate_is_s_b_over_b0(s: int, b: int, b0: int) -> None:
  """Without momentum or weight decay LSW's update is ``-eta_t * g``; eta_t in float64: eta0 x k
  x the decay on the sample clock t k / T1 x the fixed warm-up min((t + 1) k / W, 1), with
  k = S b / b0 and T1 = T k, W = fraction x T1 in reference-batch iterations."""
  eta0, decay, fraction = 0.1, 0.5, 0.1
  config = configs.Config(
    optimizer="linear_scaling",
    warmup="fixed",
    learning_rate=eta0,
    momentum=0.0,
    weight_decay=0.0,
    lr_decay=decay,
    warmup_fraction=fraction,
    per_worker_batch=b,
    reference_batch_size=b0,
  )
  tx = train.create_optimizer(config, s, TOTAL_STEPS)
  k = s * b / b0
  t1 = TOTAL_STEPS * k
  for t, leaves in enumerate(_run_updates(tx, s, steps=6)):  # the warm-up ends after 4 updates
    grads, _ = _grads_and_stats(s, seed=t)
    rate = eta0 * k * decay ** (t * k / t1) * min((t + 1) * k / (fraction * t1), 1.0)
    for update, g in zip(leaves, jax.tree.leaves(grads), strict=True):
      expected = -rate * np.asarray(g, np.float64)
      np.testing.assert_allclose(update, expected, rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize("name", ["adascale", "lena"])
def test_gain_ratio_optimizers_get_both_batches(name: str) -> None:
  """The trainer's entry equals the library alias built by hand with ``per_worker_batch_size``
  and ``reference_batch_size`` (bitwise), and differs from the one without them."""
  s, b, b0 = 8, 16, 64
  k = s * b // b0
  config = configs.Config(optimizer=name, per_worker_batch=b, reference_batch_size=b0)
  t1 = TOTAL_STEPS * k
  warmup = {"warmup_threshold": config.warmup_alpha * t1} if name == "lena" else {}
  by_hand = getattr(ol, name)(
    lambda base_steps: config.learning_rate * config.lr_decay ** (base_steps / t1),
    momentum=config.momentum,
    weight_decay=config.weight_decay,
    clock="samples",
    num_samples=s,
    per_worker_batch_size=b,
    reference_batch_size=b0,
    **warmup,
  )
  trainer = _run_updates(train.create_optimizer(config, s, TOTAL_STEPS), s)
  for got, want in zip(trainer, _run_updates(by_hand, s), strict=True):
    for a, c in zip(got, want, strict=True):
      np.testing.assert_array_equal(a, c)
  without = _run_updates(train.create_optimizer(configs.Config(optimizer=name), s, TOTAL_STEPS), s)
  assert not all(np.array_equal(a, c) for a, c in zip(trainer[-1], without[-1], strict=True))


@pytest.mark.parametrize("name", ["linear_scaling", "adascale", "lena"])
def test_zero_is_the_per_worker_batch(name: str) -> None:
  """``reference_batch_size=0`` (the default) and ``= per_worker_batch`` give k = S and the same
  updates, bitwise; the default passes no batch sizes to the library."""
  config = configs.Config(optimizer=name, per_worker_batch=8)
  assert train.hyperparams(config, 4, TOTAL_STEPS).batch_kwargs() == {}
  assert train.hyperparams(config, 4, TOTAL_STEPS).scale == 4
  same = dataclasses.replace(config, reference_batch_size=8)
  for a_leaves, c_leaves in zip(
    _run_updates(train.create_optimizer(config, 4, TOTAL_STEPS), 4),
    _run_updates(train.create_optimizer(same, 4, TOTAL_STEPS), 4),
    strict=True,
  ):
    for a, c in zip(a_leaves, c_leaves, strict=True):
      np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize(
  ("changes", "message"),
  [
    (
      {"optimizer": "sgd", "reference_batch_size": 64},
      r"reference_batch_size=64 .* optimizer 'sgd'.*use one of linear_scaling, adascale, lena, "
      r"linear_scaling_adamw, adascale_adamw, lena_adamw, "
      r"or leave reference_batch_size unset \(0",
    ),
    ({"optimizer": "lamb", "reference_batch_size": 64}, r"optimizer 'lamb'"),
    (
      {"optimizer": "lena", "per_worker_batch": 8, "reference_batch_size": 24},
      r"global batch .* = 32 is not a multiple of reference_batch_size=24.*nearest is 16",
    ),
    (
      {"optimizer": "adascale", "per_worker_batch": 8, "reference_batch_size": 64},
      r"= 32 is smaller than reference_batch_size=64",
    ),
    ({"optimizer": "lena", "reference_batch_size": -8}, r"reference_batch_size must be >= 0"),
  ],
)
def test_errors_name_the_fix(changes: dict, message: str) -> None:
  config = dataclasses.replace(configs.Config(), **changes)
  with pytest.raises(configs.ConfigError, match=message):
    train.create_optimizer(config, 4, TOTAL_STEPS)


def test_set_reference_batch_size_reaches_the_run(cache_dir: str, tmp_path: Path) -> None:
  """``--set reference_batch_size=...`` through ``train_and_evaluate``: the records count k base
  steps per update and the parameters differ from the default run's."""
  tiny = dataclasses.replace(
    configs.get_config("tiny_test"), cache_dir=cache_dir, optimizer="linear_scaling", num_steps=2
  )
  config = configs.override(tiny, ["reference_batch_size=32"])
  s, b = config.batch_scale, config.per_worker_batch
  k = s * b // 32
  assert config.reference_batch_size == 32 and k == 2
  state = train.train_and_evaluate(config, tmp_path / "ref")
  default = train.train_and_evaluate(tiny, tmp_path / "default")
  evals = metrics.read_metrics(tmp_path / "ref", "eval")
  assert [r["base_steps"] for r in evals] == [r["iteration"] * k for r in evals]
  assert [r["base_steps"] for r in metrics.read_metrics(tmp_path / "default", "eval")] == [
    r["iteration"] * s for r in evals
  ]
  assert json.loads((tmp_path / "ref" / "config.json").read_text())["reference_batch_size"] == 32
  leaves = zip(jax.tree.leaves(state.params), jax.tree.leaves(default.params), strict=True)
  assert not all(np.array_equal(np.asarray(a), np.asarray(c)) for a, c in leaves)


def test_registry_flags() -> None:
  takers = [n for n in optimizers.names() if optimizers.get(n).takes_reference_batch]
  assert takers[:3] == ["linear_scaling", "adascale", "lena"]
  assert not any(optimizers.get(n).takes_reference_batch for n in ("sgd", "lars", "lamb", "adamw"))
