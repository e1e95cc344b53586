"""Beyond the paper, against the float64 reference (reference.py): the power of the gain ratio
(the square-root rule), a reference batch b0 other than the per-worker batch, and the ready
AdamW optimizers. Same problem, same tolerances as test_numerics.py."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax
import pytest

import optax_lena as ol
from tests.lena.test_numerics import (
  EPS,
  LAYERS,
  LR0,
  PATHS,
  WEIGHT_DECAY,
  assert_state_aware_well_posed,
  assert_trajectories_match,
  main_problem,
  make_library_tx,
  make_problem,
  make_reference,
  run_library,
  run_reference,
)

RULES = ["linear_scaling", "adascale", "lena"]
WARMUPS = ["none", "fixed", "state_aware"]
PER_WORKER_BATCH = 16


@pytest.mark.parametrize("warmup", WARMUPS)
@pytest.mark.parametrize("rule", RULES)
def test_square_root_power_matches_reference(rule: str, warmup: str) -> None:
  params, grads = main_problem()
  ref = run_reference(make_reference(rule, warmup, power=0.5), params, grads)
  lib = run_library(make_library_tx(rule, warmup, power=0.5), params, grads)
  if warmup == "state_aware":
    assert_state_aware_well_posed(ref, 34.5)
  assert_trajectories_match(lib, ref)
  # The rate multiplier is r ** 0.5 while the warm-up's progress still counts r.
  last = ref[-1]
  np.testing.assert_allclose(last.lr_multiplier, np.sqrt(last.gain_ratio) * last.warmup_factor)
  if warmup == "state_aware":
    np.testing.assert_allclose(last.warmup_progress, sum(r.gain_ratio for r in ref))


@pytest.mark.parametrize("power", [0.25, 2.0])
def test_any_power_matches_reference(power: float) -> None:
  params, grads = main_problem()
  ref = run_reference(make_reference("lena", "state_aware", power=power), params, grads)
  lib = run_library(make_library_tx("lena", "state_aware", power=power), params, grads)
  assert_trajectories_match(lib, ref)


# (reference batch b0, power): scale k = S b / b0 = 4 (b0 above b), 16 (b0 below b), 1 (b0 the
# whole global batch: plain SGD at eta0), and the square root with a reference batch.
REFERENCE_CASES = [(32, 1.0), (8, 1.0), (128, 1.0), (32, 0.5)]


@pytest.mark.parametrize("warmup", WARMUPS)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("reference_batch, power", REFERENCE_CASES)
def test_reference_batch_matches_reference(
  rule: str, warmup: str, reference_batch: int, power: float
) -> None:
  params, grads = main_problem()
  batches = {"per_worker_batch_size": PER_WORKER_BATCH, "reference_batch_size": reference_batch}
  # The paper's exponential decay on the sample clock, which counts k base steps per update.
  total = 40 * 8 * PER_WORKER_BATCH // reference_batch

  def lib_schedule(count):
    return LR0 * 0.01 ** (count / total)

  kwargs: dict[str, Any] = {"power": power, "clock": "samples", **batches}
  if warmup == "state_aware":
    kwargs["warmup_threshold"] = 34.5 * PER_WORKER_BATCH / reference_batch
  ref = run_reference(
    make_reference(rule, warmup, schedule=lambda c: 0.01 ** (c / total), **kwargs),
    params,
    grads,
  )
  lib = run_library(
    make_library_tx(rule, warmup, learning_rate=lib_schedule, **kwargs), params, grads
  )
  if warmup == "state_aware":
    assert_state_aware_well_posed(ref, kwargs["warmup_threshold"])
  assert_trajectories_match(lib, ref)
  k = 8 * PER_WORKER_BATCH // reference_batch
  assert all(np.all(r.gain_ratio <= k) for r in ref)
  if rule == "linear_scaling":
    np.testing.assert_allclose(ref[-1].gain_ratio, k)


def test_reference_batch_ratio_differs_from_a_clipped_per_worker_ratio() -> None:
  """With b0 = 2 b the ratio estimates the gain over two per-worker batches, not just the
  per-worker ratio capped at S / 2: guards the reference-batch numerator."""
  params, grads = main_problem()
  batches = {"per_worker_batch_size": PER_WORKER_BATCH, "reference_batch_size": 32}
  ref = run_reference(make_reference("lena", "none", **batches), params, grads)
  plain = run_reference(make_reference("lena", "none"), params, grads)
  k = 4
  for r, p in zip(ref, plain, strict=True):
    assert not np.allclose(r.gain_ratio, np.minimum(p.gain_ratio, k), rtol=1e-3)


def test_power_one_and_the_per_worker_reference_are_bitwise_the_default() -> None:
  params, grads = main_problem()
  for rule, warmup in [("lena", "state_aware"), ("adascale", "fixed"), ("linear_scaling", "none")]:
    default = run_library(make_library_tx(rule, warmup), params, grads)
    explicit = run_library(
      make_library_tx(
        rule,
        warmup,
        power=1.0,
        per_worker_batch_size=PER_WORKER_BATCH,
        reference_batch_size=PER_WORKER_BATCH,
      ),
      params,
      grads,
    )
    for (pa, da), (pb, db) in zip(default, explicit, strict=True):
      for key in ("gain_ratio", "lr_multiplier", "warmup_factor", "global_ratio"):
        np.testing.assert_array_equal(da[key], db[key], err_msg=f"{rule} {warmup} {key}")
      for a, b in zip(pa, pb, strict=True):
        np.testing.assert_array_equal(a, b)


ADAMW = {
  "lena": ol.lena_adamw,
  "adascale": ol.adascale_adamw,
  "linear_scaling": ol.linear_scaling_adamw,
}
B1, B2, ADAM_EPS = 0.9, 0.99, 1e-8
DECAY_LIST = [path[-1] == "kernel" for path in PATHS]


def adamw_tx(rule: str, warmup: str, **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  warm = {"fixed": {"warmup_steps": 164}, "state_aware": {"warmup_threshold": 34.5}}.get(warmup, {})
  extra = {} if rule == "linear_scaling" else {"eps": EPS}
  return ADAMW[rule](
    LR0, b1=B1, b2=B2, adam_eps=ADAM_EPS, weight_decay=WEIGHT_DECAY, **warm, **extra, **kwargs
  )


def adamw_reference(rule: str, warmup: str, **kwargs: Any):
  return make_reference(
    rule, warmup, inner="adamw", b1=B1, b2=B2, adam_eps=ADAM_EPS, power=0.5, **kwargs
  )


@pytest.mark.parametrize("warmup", WARMUPS)
@pytest.mark.parametrize("rule", RULES)
def test_adamw_optimizers_match_reference(rule: str, warmup: str) -> None:
  params, grads = main_problem()
  mask = lambda p: jax.tree.map(lambda x: x.ndim > 1, p)
  lib = run_library(adamw_tx(rule, warmup, weight_decay_mask=mask), params, grads)
  ref = run_reference(adamw_reference(rule, warmup, decay_mask=DECAY_LIST), params, grads)
  assert_trajectories_match(lib, ref)


def test_adamw_with_a_reference_batch_matches_reference() -> None:
  params, grads = main_problem()
  batches = {"per_worker_batch_size": PER_WORKER_BATCH, "reference_batch_size": 64}
  lib = run_library(adamw_tx("lena", "fixed", **batches), params, grads)
  ref = run_reference(adamw_reference("lena", "fixed", **batches), params, grads)
  assert_trajectories_match(lib, ref)


def test_adamw_at_one_worker_is_optax_adamw() -> None:
  """S = 1: every ratio is 1, so the chain is optax.adamw (an independent implementation)."""
  params, grads = make_problem(LAYERS, 1, 10, seed=5)
  sgd = optax.adamw(LR0, b1=B1, b2=B2, eps=ADAM_EPS, weight_decay=WEIGHT_DECAY)
  for rule in RULES:
    lib = run_library(adamw_tx(rule, "none"), params, grads)
    w = jax.tree.map(np.asarray, params)
    state = sgd.init(w)
    for (w_lib, _), g in zip(lib, grads, strict=True):
      updates, state = sgd.update(jax.tree.map(lambda x: x[0], g), state, w)
      w = optax.apply_updates(w, updates)
      for a, b in zip(w_lib, jax.tree.leaves(w), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=rule)


def test_injected_power_equals_the_static_power() -> None:
  """``optax.inject_hyperparams`` turns the power into an array: same updates, and a power set
  to 1 in ``state.hyperparams`` gives exactly the paper's rule."""
  params, grads = main_problem()
  p = jax.tree.map(np.asarray, params)
  injected = optax.inject_hyperparams(ol.lena)(LR0, power=0.5, warmup_threshold=34.5)
  static = ol.lena(LR0, power=0.5, warmup_threshold=34.5)
  st_i, st_s = injected.init(p), static.init(p)
  for g in grads[:5]:
    mean, stats = ol.stacked_grad_stats(g)
    u_i, st_i = injected.update(mean, st_i, p, grad_stats=stats)
    u_s, st_s = static.update(mean, st_s, p, grad_stats=stats)
    for a, b in zip(jax.tree.leaves(u_i), jax.tree.leaves(u_s), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-6)
  diag = ol.diagnostics(st_i)
  np.testing.assert_allclose(
    diag["lr_multiplier"], np.sqrt(diag["gain_ratio"]) * diag["warmup_factor"], rtol=1e-6
  )
  st_i.hyperparams["power"] = np.float32(1.0)
  mean, stats = ol.stacked_grad_stats(grads[5])
  _, st_i = injected.update(mean, st_i, p, grad_stats=stats)
  diag = ol.diagnostics(st_i)
  np.testing.assert_array_equal(diag["lr_multiplier"], diag["gain_ratio"] * diag["warmup_factor"])
