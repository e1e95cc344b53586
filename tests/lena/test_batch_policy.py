"""``ol.advise_num_samples`` against a float64 NumPy reference of the critical-batch estimate.

The reference is written from the definitions, not from the library: the moving averages of
``top = mean_i ||g_i||^2`` and ``bot = ||mean_i g_i||^2`` summed over the layers, McCandlish et
al.'s unbiased B_simple = S (A - D) / (S D - A) in per-worker batches, then the documented
policy (ceil to a multiple, never below the last S, at most ``max_growth`` times it, at most the
maximum; the last S kept where the estimate is not finite).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optax_lena as ol

BETA = 0.5
SHAPES = {"a": (3, 4), "b": (5,)}


def _worker_grads(rng: np.random.Generator, s: int, signal: float, noise: float) -> list[dict]:
  """S per-worker gradients: one shared mean per leaf plus independent noise."""
  mean = {k: signal * rng.standard_normal(v) for k, v in SHAPES.items()}
  return [
    {k: mean[k] + noise * rng.standard_normal(v) for k, v in SHAPES.items()} for _ in range(s)
  ]


def _reference(history: list[list[dict]], **policy) -> float:
  """The advised S of the float64 reference after the updates of ``history``."""
  a = d = 0.0
  for grads in history:
    s = len(grads)
    top = np.mean([sum(np.sum(g[k] ** 2) for k in SHAPES) for g in grads])
    bot = sum(np.sum(np.mean([g[k] for g in grads], axis=0) ** 2) for k in SHAPES)
    a, d = BETA * top + (1 - BETA) * a, BETA * bot + (1 - BETA) * d
  s = len(history[-1]) if history else 0
  signal = s * d - a
  b_crit = s * (a - d) / signal if s >= 2 and signal > 0 else math.nan
  m = policy.get("multiple", 1)
  current = max(s, policy.get("min_num_samples") or m)
  upper = policy["max_num_samples"]
  growth = policy.get("max_growth", 2.0)
  if growth is not None:
    upper = min(upper, math.floor(growth * current / m) * m)
  if not math.isfinite(b_crit):
    return current
  target = min(policy.get("factor", 1.0) * b_crit, policy["max_num_samples"])
  wanted = math.ceil(target / m) * m
  return max(current, min(wanted, upper))


def _state_after(history: list[list[dict]]):
  tx = ol.adascale(0.1, beta=BETA)  # num_samples=None: S may change between updates
  params = {k: jnp.zeros(v, jnp.float32) for k, v in SHAPES.items()}
  state = tx.init(params)
  for grads in history:
    stacked = {k: jnp.asarray(np.stack([g[k] for g in grads]), jnp.float32) for k in SHAPES}
    mean, stats = ol.stacked_grad_stats(stacked)
    _, state = tx.update(mean, state, params, grad_stats=stats)
  return state


POLICIES = [
  {"max_num_samples": 64},
  {"max_num_samples": 64, "multiple": 4, "factor": 0.5},
  {"max_num_samples": 48, "multiple": 8, "max_growth": None},
  {"max_num_samples": 12, "multiple": 2, "factor": 3.0, "max_growth": 1.5},
  {"max_num_samples": 64, "min_num_samples": 16, "multiple": 4},
]


@pytest.mark.parametrize("noise", [0.3, 1.0, 3.0])
def test_advice_matches_float64_reference(noise: float) -> None:
  rng = np.random.default_rng(int(noise * 10))
  # S changes between updates (2, then 4, then 8): the averages mix them, as in a ramp.
  history = [_worker_grads(rng, s, 1.0, noise) for s in (2, 4, 8)]
  state = _state_after(history)
  diag = ol.diagnostics(state)
  # The estimate itself first (the policy's only input besides S).
  a = d = 0.0
  for grads in history:
    top = np.mean([sum(np.sum(g[k] ** 2) for k in SHAPES) for g in grads])
    bot = sum(np.sum(np.mean([g[k] for g in grads], axis=0) ** 2) for k in SHAPES)
    a, d = BETA * top + (1 - BETA) * a, BETA * bot + (1 - BETA) * d
  np.testing.assert_allclose(float(diag["critical_batch_size"]), 8 * (a - d) / (8 * d - a), 1e-4)
  advised = set()
  for policy in POLICIES:
    got = ol.advise_num_samples(state, **policy)
    assert got.dtype == jnp.int32 and got.shape == ()
    want = _reference(history, **policy)
    assert int(got) == want, (policy, float(diag["critical_batch_size"]))
    assert int(got) % policy.get("multiple", 1) == 0 and int(got) >= 8
    advised.add(int(got))
  assert len(advised) > 1  # the cases do exercise different branches of the policy


def test_noise_dominated_or_unestimable_keeps_s() -> None:
  rng = np.random.default_rng(1)
  # Mean exactly zero: ||gbar||^2 = 0 < top / S, the signal estimate is negative (B infinite).
  g = _worker_grads(rng, 1, 0.0, 1.0)[0]
  pure_noise = [[g, {k: -v for k, v in g.items()}]]
  state = _state_after(pure_noise)
  assert math.isinf(float(ol.diagnostics(state)["critical_batch_size"]))
  assert int(ol.advise_num_samples(state, max_num_samples=64)) == 2
  assert _reference(pure_noise, max_num_samples=64) == 2
  # S = 1: the noise cannot be estimated (NaN); before any update S is the minimum.
  one = [_worker_grads(rng, 1, 1.0, 1.0)]
  assert int(ol.advise_num_samples(_state_after(one), max_num_samples=8)) == 1
  fresh = _state_after([])
  assert int(ol.advise_num_samples(fresh, max_num_samples=8, min_num_samples=2, multiple=2)) == 2


def test_jittable_and_never_shrinks_past_the_maximum() -> None:
  rng = np.random.default_rng(2)
  history = [_worker_grads(rng, 8, 1.0, 0.2)]  # little noise: B_crit well below S = 8
  state = _state_after(history)
  assert float(ol.diagnostics(state)["critical_batch_size"]) < 8
  advise = jax.jit(lambda st: ol.advise_num_samples(st, max_num_samples=32, multiple=4))
  assert int(advise(state)) == 8 == _reference(history, max_num_samples=32, multiple=4)
  # Already above the maximum: S is kept, never cut.
  assert int(ol.advise_num_samples(state, max_num_samples=4, multiple=4)) == 8


@pytest.mark.parametrize(
  ("kwargs", "match"),
  [
    ({"max_num_samples": 10, "multiple": 4}, "not a multiple of multiple=4; use 8"),
    ({"max_num_samples": 0}, "max_num_samples must be a positive Python int"),
    ({"max_num_samples": 8, "min_num_samples": 16}, "exceeds"),
    ({"max_num_samples": 8, "factor": 0.0}, "factor must be positive"),
    ({"max_num_samples": 8, "max_growth": 0.5}, "max_growth must be >= 1"),
  ],
)
def test_bad_policy_raises(kwargs: dict, match: str) -> None:
  with pytest.raises(ValueError, match=match):
    ol.advise_num_samples(_state_after([]), **kwargs)
