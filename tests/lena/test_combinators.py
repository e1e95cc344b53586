"""Optax combinators: inject_hyperparams (schedules from 0, the sample clock, static_args) and
gradients whose shapes differ from the parameters'."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_lena as ol

S = 4
PARAMS = {"w": jnp.zeros((3, 2)), "b": jnp.zeros((2,))}


def stacked(t: int) -> dict:
  rng = np.random.RandomState(t)
  return {
    "w": jnp.asarray(rng.normal(size=(S, 3, 2)) + 0.5, jnp.float32),
    "b": jnp.asarray(rng.normal(size=(S, 2)), jnp.float32),
  }


def trajectory(tx, steps: int = 5, with_params: bool = True) -> list[dict]:
  @jax.jit
  def step(params, state, g):
    grads, stats = ol.stacked_grad_stats(g)
    updates, state = tx.update(grads, state, params if with_params else None, grad_stats=stats)
    return optax.apply_updates(params, updates), state

  params, state, out = PARAMS, tx.init(PARAMS), []
  for t in range(steps):
    params, state = step(params, state, stacked(t))
    out.append(params)
  return out


def assert_same(a: list[dict], b: list[dict]) -> None:
  for pa, pb in zip(a, b, strict=True):
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), strict=True):
      np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


# -- learning rates and schedules that start at 0 ---------------------------------------------


def test_injected_schedule_starting_at_zero_matches_plain_and_float64():
  sched = optax.linear_schedule(0.0, 1.0, 100)
  for alias in (ol.lena, ol.adascale, ol.linear_scaling):
    injected = optax.inject_hyperparams(alias)(learning_rate=sched, momentum=0.9)
    assert_same(trajectory(injected), trajectory(alias(sched, momentum=0.9)))
  # Linear scaling without momentum: w_t = w_{t-1} - sched(t - 1) * S * mean_i g_i (float64).
  tx = optax.inject_hyperparams(ol.linear_scaling)(learning_rate=sched, momentum=None)
  got = trajectory(tx)
  w = np.zeros((3, 2))
  for t in range(5):
    w = w - (t / 100.0) * S * np.asarray(stacked(t)["w"], np.float64).mean(axis=0)
    np.testing.assert_allclose(got[t]["w"], w, rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(got[0]["w"], 0.0)  # rate 0 at the first update


def test_injected_rate_can_be_set_to_zero_and_back():
  tx = optax.inject_hyperparams(ol.lena)(learning_rate=0.1)
  state = tx.init(PARAMS)
  state.hyperparams["learning_rate"] = jnp.asarray(0.0)
  grads, stats = ol.stacked_grad_stats(stacked(0))
  updates, state = jax.jit(tx.update)(grads, state, PARAMS, grad_stats=stats)
  assert all(np.all(np.asarray(u) == 0) for u in jax.tree.leaves(updates))


@pytest.mark.parametrize("bad", [0.0, -0.1, float("inf"), float("nan")])
def test_static_rate_must_be_finite_and_positive(bad):
  with pytest.raises(ValueError, match="learning_rate must be positive"):
    ol.lena(bad)


@pytest.mark.parametrize("bad", [-0.1, float("inf"), float("nan")])
def test_injected_rate_must_be_finite_and_non_negative(bad):
  with pytest.raises(ValueError, match=r"learning_rate must be positive \(or 0"):
    optax.inject_hyperparams(ol.lena)(learning_rate=lambda count: bad + 0.0 * count).init(PARAMS)
  ol.lena(jnp.asarray(0.0))  # an array 0 is a valid injected value


# -- the sample clock -------------------------------------------------------------------------


def test_injected_schedule_on_the_sample_clock_raises_with_both_fixes_and_fixes_match():
  sched = optax.exponential_decay(0.1, transition_steps=8, decay_rate=0.5)
  plain = trajectory(ol.lena(sched, clock="samples"))
  with pytest.raises(ValueError, match=r"clock='samples'.*static_args=\('learning_rate',\)"):
    optax.inject_hyperparams(ol.lena)(learning_rate=sched, clock="samples").init(PARAMS)
  with pytest.raises(ValueError, match=r"schedule\(count \* S\)"):
    optax.inject_hyperparams(ol.lena)(learning_rate=sched, clock="samples").init(PARAMS)
  static = optax.inject_hyperparams(ol.lena, static_args=("learning_rate",))(
    learning_rate=sched, clock="samples"
  )
  assert_same(trajectory(static), plain)
  on_base_steps = optax.inject_hyperparams(ol.lena)(learning_rate=lambda count: sched(count * S))
  assert_same(trajectory(on_base_steps), plain)
  # The sample clock does differ from the update clock here, so the checks above mean something.
  assert not np.allclose(trajectory(ol.lena(sched))[-1]["w"], plain[-1]["w"])


def test_injected_num_samples_names_static_args():
  with pytest.raises(ValueError, match=r"num_samples must be a positive int.*static_args"):
    optax.inject_hyperparams(ol.lena)(learning_rate=0.1, num_samples=S).init(PARAMS)
  tx = optax.inject_hyperparams(ol.lena, static_args=("num_samples",))(0.1, num_samples=S)
  assert len(trajectory(tx, 1)) == 1


# -- gradients shaped unlike the parameters ---------------------------------------------------


@pytest.mark.parametrize(
  "make, with_params",
  [
    (lambda: ol.lena(0.1), True),
    (lambda: ol.lena(0.1), False),  # caught by the momentum buffer's shapes
    (lambda: ol.lena(0.1, momentum=None), True),
    (lambda: optax.chain(ol.scale_by_lena(), optax.scale(-0.1)), True),
    (lambda: optax.inject_hyperparams(ol.adascale, static_args="weight_decay")(0.1), False),
  ],
)
def test_stacked_gradients_passed_as_grads_raise_naming_stacked_grad_stats(make, with_params):
  tx = make()
  state = tx.init(PARAMS)
  g = stacked(0)
  _, stats = ol.stacked_grad_stats(g)
  with pytest.raises(
    ValueError, match=r"has shape \(4, 2\) but .* shape \(2,\).*S=4.*ol.stacked_grad_stats"
  ):
    jax.jit(tx.update)(g, state, PARAMS if with_params else None, grad_stats=stats)


def test_gradient_of_another_shape_raises():
  tx = ol.lena(0.1)
  grads = {"w": jnp.zeros((2, 3)), "b": jnp.zeros((2,))}
  _, stats = ol.stacked_grad_stats(jax.tree.map(lambda g: g[None], grads))
  with pytest.raises(ValueError, match=r"\['w'\] has shape \(2, 3\).*shaped like the parameters"):
    tx.update(grads, tx.init(PARAMS), PARAMS, grad_stats=stats)


def test_change_of_s_is_caught_with_num_samples_and_followed_without():
  """S is static in GradStats: with num_samples=S a different S raises at trace time. Without
  it a change of S is legitimate (e.g. a growing batch; AdaScale's moving averages take it) and
  the ratio's clip follows the new S; the state's last S is only a traced value under jit, so
  it cannot be compared at trace time."""
  g8 = {k: jnp.concatenate([v, v + 1.0]) for k, v in stacked(0).items()}
  grads4, stats4 = ol.stacked_grad_stats(stacked(0))
  grads8, stats8 = ol.stacked_grad_stats(g8)
  pinned = ol.lena(0.1, num_samples=S)
  state = pinned.init(PARAMS)
  _, state = pinned.update(grads4, state, PARAMS, grad_stats=stats4)
  with pytest.raises(ValueError, match=r"S=8 .* num_samples=4"):
    pinned.update(grads8, state, PARAMS, grad_stats=stats8)
  free = ol.lena(0.1)
  state = free.init(PARAMS)
  _, state = free.update(grads4, state, PARAMS, grad_stats=stats4)
  _, state = free.update(grads8, state, PARAMS, grad_stats=stats8)
  assert int(ol.diagnostics(state)["num_samples"]) == 8
