"""The example package's extension points: the optimizer registry and the parallel strategies.

Runs on 8 simulated CPU devices (see conftest.py).
"""

import dataclasses
import sys
from pathlib import Path

# `examples` is a top-level package of the repository, not part of the installed distribution.
_REPO_ROOT = Path(__file__).resolve().parents[2]
if str(_REPO_ROOT) not in sys.path:
  sys.path.insert(0, str(_REPO_ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

import optax_lena as ol  # noqa: E402
from examples import metrics, optimizers  # noqa: E402
from examples.lena import configs, parallel, train  # noqa: E402

BUILTIN = ("sgd", "linear_scaling", "adascale", "lena", "lars", "lamb")


def _params():
  return {"dense": {"kernel": jnp.full((3, 2), 0.5), "bias": jnp.zeros((2,))}}


def _grads_and_stats(s: int = 4):
  rng = np.random.RandomState(0)
  stacked = jax.tree.map(lambda p: jnp.asarray(rng.randn(s, *p.shape), jnp.float32), _params())
  return ol.stacked_grad_stats(stacked)


def test_builtin_entries() -> None:
  assert optimizers.names()[: len(BUILTIN)] == BUILTIN
  paper = {name: optimizers.get(name).paper_warmup for name in BUILTIN}
  assert paper == {
    "sgd": "none",
    "linear_scaling": "fixed",
    "adascale": "none",
    "lena": "state_aware",
    "lars": "none",
    "lamb": "none",
  }
  assert [n for n in BUILTIN if optimizers.get(n).diagnostics] == [
    "linear_scaling",
    "adascale",
    "lena",
  ]
  assert optimizers.get("lena").label == "LENA"
  with pytest.raises(
    ValueError, match=r"Unknown optimizer 'nope'; valid optimizers: sgd, linear_scaling"
  ):
    optimizers.get("nope")


@pytest.mark.parametrize("name", BUILTIN)
def test_every_builtin_takes_grad_stats(name: str) -> None:
  """One update with grad_stats= for every entry: Optax's chain hands it only to the members
  that accept it, so the plain optimizers need no flag."""
  entry = optimizers.get(name)
  hp = optimizers.Hyperparams(
    learning_rate=0.1, num_samples=4, total_steps=10, warmup=entry.paper_warmup
  )
  tx = optimizers.build(name, hp)
  params = _params()
  grads, stats = _grads_and_stats()
  state = tx.init(params)
  updates, state = tx.update(grads, state, params, grad_stats=stats)
  assert all(np.isfinite(u).all() for u in jax.tree.leaves(updates))
  if entry.diagnostics:
    assert "lr_multiplier/dense/kernel" in ol.flat_diagnostics(state, params)


@pytest.mark.parametrize(
  "tx", [optax.sgd(0.1, momentum=0.9), optax.lars(0.1), optax.lamb(0.1), optax.adam(1e-3)]
)
def test_optax_chains_ignore_grad_stats(tx: optax.GradientTransformation) -> None:
  """The installed Optax forwards extra keyword arguments only to members that take them."""
  params = _params()
  grads, stats = _grads_and_stats()
  plain, _ = tx.update(grads, tx.init(params), params)
  extra, _ = tx.update(grads, tx.init(params), params, grad_stats=stats)
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(extra), strict=True):
    np.testing.assert_array_equal(a, b)


def test_bare_transformation_is_wrapped() -> None:
  """A builder may return a transformation without extra-args support: build wraps it."""
  entry = optimizers.Optimizer("bare_adam", lambda hp: optax.scale_by_adam(), "bare")
  with optimizers.registered(entry):
    tx = optimizers.build("bare_adam", optimizers.Hyperparams(learning_rate=0.1))
    params = _params()
    grads, stats = _grads_and_stats()
    tx.update(grads, tx.init(params), params, grad_stats=stats)
  assert "bare_adam" not in optimizers.names()  # registered() undoes the registration


def test_schedules_and_warmups_are_the_papers() -> None:
  hp = optimizers.Hyperparams(learning_rate=0.05, num_samples=8, total_steps=100, warmup="fixed")
  assert hp.base_steps_total == 800
  assert hp.sample_schedule()(400) == 0.05 * 0.01 ** (400 / 800)
  assert hp.warmup_kwargs() == {"warmup_steps": 0.055 * 800}
  # On the update count, the fixed warm-up is folded into the rate: W / S = 5.5 updates.
  np.testing.assert_allclose(hp.update_schedule()(0), 0.05 / 5.5, rtol=1e-6)
  aware = dataclasses.replace(hp, warmup="state_aware")
  assert aware.warmup_kwargs() == {"warmup_threshold": 0.05 * 800}
  assert dataclasses.replace(hp, lr_decay=None, warmup="none").update_schedule() == 0.05
  with pytest.raises(
    ValueError, match=r"warmup='state_aware'.*'lars'.*linear_scaling, adascale, lena"
  ):
    optimizers.build("lars", aware)


def test_register_rejects_duplicates_and_bad_warmups() -> None:
  with pytest.raises(ValueError, match="already registered"):
    optimizers.register(optimizers.get("lena"))
  with pytest.raises(ValueError, match="paper_warmup"):
    optimizers.register(optimizers.Optimizer("x", lambda hp: optax.sgd(0.1), "x", "cosine"))


def test_user_registered_optimizer_runs_from_a_config_file(tmp_path: Path) -> None:
  """configs/user_optimizer.py registers 'lena_nesterov'; --config makes it runnable."""
  config = configs.get_config(
    str(_REPO_ROOT / "examples" / "lena" / "configs" / "user_optimizer.py")
  )
  assert config.optimizer == "lena_nesterov" and "lena_nesterov" in optimizers.names()
  tiny = configs.get_config("tiny_test")
  config = dataclasses.replace(
    tiny,
    optimizer=config.optimizer,
    cache_dir=str(tmp_path / "cache"),
    num_steps=2,
    eval_every=2,
  )
  state = train.train_and_evaluate(config, tmp_path / "run")
  assert int(state.step) == 2
  (rec,) = metrics.read_metrics(tmp_path / "run")
  assert set(rec["lr_multiplier"]) >= {"Dense_0/kernel", "Conv_0/kernel"}
  assert all(v == -1 or v > 0 for v in rec["warmup_end_step"].values())


# ----------------------------------------------------------------------------------------------
# Parallel strategies
# ----------------------------------------------------------------------------------------------


def _toy_worker(state, micro_batches):
  """Gradient of sum(mean_b(w * x)) over one worker's micro-batches: the mean of its x."""

  def loss(w, batch):
    return jnp.sum(jnp.mean(w * batch["x"], axis=0)), {"seen": jnp.mean(batch["x"])}

  (_, aux), grads, stats = ol.accumulate_grad_stats(loss, state["w"], micro_batches, has_aux=True)
  return grads, stats, aux


def _toy_update(state, grads, stats, aux):
  return {"w": state["w"] - grads, "s": jnp.asarray(stats.num_samples, jnp.float32)}, aux


@pytest.mark.parametrize("name", list(parallel.STRATEGIES))
def test_strategy_averages_all_workers(name: str) -> None:
  """Every path hands `update` the mean over devices x micro-batches and S = their product."""
  layout = parallel.BatchLayout(per_worker_batch=2, num_devices=4, micro_batches=2)
  strategy = parallel.create(name, layout, _toy_worker, _toy_update)
  assert isinstance(strategy, parallel.STRATEGIES[name]) and strategy.name == name
  x = np.arange(layout.global_batch * 3, dtype=np.float32).reshape(layout.global_batch, 3)
  state = strategy.to_device({"w": jnp.zeros(3), "s": jnp.zeros([])})
  state, aux = strategy.step(state, strategy.shard_batch({"x": x}))
  state = strategy.from_device(state)
  np.testing.assert_allclose(state["w"], -x.mean(0), rtol=1e-6)
  assert float(state["s"]) == layout.num_samples == 8
  np.testing.assert_allclose(np.asarray(aux["seen"]).ravel()[0], x.mean(), rtol=1e-6)


def test_unknown_strategy() -> None:
  layout = parallel.BatchLayout(per_worker_batch=2, num_devices=1, micro_batches=1)
  with pytest.raises(configs.ConfigError, match="valid parallels: shard_map, pmap, gspmd"):
    parallel.create("pjit", layout, _toy_worker, _toy_update)
