"""The float32 library against the independent float64 reference of LENA.md (reference.py).

Every test feeds the SAME float32 per-worker gradients to both sides (the reference gets them as
float64), runs a whole trajectory on each side independently and compares, at every update, the
per-layer gain ratio, warm-up factor, learning-rate multiplier and the parameters. The gradients do
not depend on the parameters, so float32 rounding cannot be amplified by the dynamics and tight
tolerances stay meaningful over the whole run.

The first section checks the reference itself against hand-computed values.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_lena as ol
from tests.lena.reference import ReferenceOptimizer, StepRecord

PyTree = Any

# ---------------------------------------------------------------------------------------------
# Problem used by the library-vs-reference tests.
# ---------------------------------------------------------------------------------------------

S = 8  # per-worker gradients averaged per update
STEPS = 40
LR0 = 0.005
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
EPS = 1e-6
# State-aware threshold in single-worker iterations. Not a multiple of anything the progress can
# reach exactly, so float32 and float64 cannot disagree on which update ends the warm-up (the
# margin is asserted below). With the ratios of LAYERS it ends between update 5 (pure noise,
# ratio ~S) and update 35 (pure signal, ratio 1).
THETA = 34.5
# Fixed warm-up length in base steps: t * S >= W first at t = 21, i.e. mid-run.
WARMUP_STEPS = 164
FIXED_END = math.ceil(WARMUP_STEPS / S)

# (shape, signal scale mu, noise scale sigma) per leaf. In expectation the layer ratio is
# (sigma^2 + mu^2) / (sigma^2 / S + mu^2) (LENA.md step 3).
LAYERS: dict[str, dict[str, tuple[tuple[int, ...], float, float]]] = {
  "conv": {"kernel": ((3, 3, 4, 8), 0.3, 1.0), "bias": ((8,), 1.0, 0.0)},  # ~5.1 / pure signal
  "dense": {"kernel": ((32, 16), 1.0, 1.0), "bias": ((16,), 0.0, 1.0)},  # ~1.8 / pure noise
  "head": {"kernel": ((16, 10), 0.5, 2.0), "bias": ((10,), 2.0, 0.5)},  # ~5.7 / ~1.05
}
PURE_SIGNAL = ("conv", "bias")
PURE_NOISE = ("dense", "bias")


def _leaf_paths(tree: PyTree) -> list[tuple[str, ...]]:
  """String paths of the leaves in jax.tree_util.tree_leaves order (the diagnostics' order)."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [tuple(str(k.key) for k in path) for path, _ in flat]


def make_problem(
  layers: dict[str, dict[str, tuple[tuple[int, ...], float, float]]],
  num_samples: int,
  steps: int,
  seed: int,
) -> tuple[PyTree, list[PyTree]]:
  """Float32 initial parameters and `steps` pytrees of per-worker gradients [S, *shape].

  Gradient of worker i at update t: ``mu * c_t * u + sigma * z_i`` with a fixed random
  direction u per leaf, a slowly varying signal strength c_t (so the ratios move during the
  run) and i.i.d. standard normal z_i. sigma = 0 gives identical workers (ratio 1), mu = 0 a
  zero-mean gradient whose ratio sits around the clip S.
  """
  rng = np.random.RandomState(seed)
  params: dict[str, dict[str, np.ndarray]] = {}
  direction: dict[str, dict[str, np.ndarray]] = {}
  for mod, leaves in layers.items():
    params[mod], direction[mod] = {}, {}
    for name, (shape, _, _) in leaves.items():
      params[mod][name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
      direction[mod][name] = rng.standard_normal(shape)
  grads = []
  for t in range(1, steps + 1):
    c_t = 1.0 + 0.5 * math.sin(0.3 * t)
    g: dict[str, dict[str, np.ndarray]] = {}
    for mod, leaves in layers.items():
      g[mod] = {}
      for name, (shape, mu, sigma) in leaves.items():
        noise = rng.standard_normal((num_samples, *shape))
        g[mod][name] = (mu * c_t * direction[mod][name] + sigma * noise).astype(np.float32)
    grads.append(g)
  return params, grads


@functools.cache
def main_problem() -> tuple[PyTree, list[PyTree]]:
  # Seed 1: the pure-noise layer's unclipped ratio crosses S back and forth during the run.
  return make_problem(LAYERS, S, STEPS, seed=1)


# The spec tuples would be flattened by jax: take the paths from a tree of placeholders.
PATHS = _leaf_paths({mod: dict.fromkeys(leaves, 0) for mod, leaves in LAYERS.items()})
NOISE_INDEX = PATHS.index(PURE_NOISE)
SIGNAL_INDEX = PATHS.index(PURE_SIGNAL)

# ---------------------------------------------------------------------------------------------
# Running both sides.
# ---------------------------------------------------------------------------------------------


def leaves64(tree: PyTree) -> list[np.ndarray]:
  return [np.asarray(x, dtype=np.float64) for x in jax.tree_util.tree_leaves(tree)]


def run_reference(ref: ReferenceOptimizer, params: PyTree, grads: list[PyTree]) -> list[StepRecord]:
  w = leaves64(params)
  for g in grads:
    w = ref.step(w, leaves64(g))
  return ref.history


def run_library(
  tx: optax.GradientTransformationExtraArgs, params: PyTree, grads: list[PyTree]
) -> list[tuple[list[np.ndarray], dict[str, np.ndarray]]]:
  """(parameter leaves, diagnostics) after every update; the step is compiled once."""

  @jax.jit
  def step(params: PyTree, state: PyTree, stacked: PyTree) -> tuple[PyTree, PyTree, PyTree]:
    mean_grads, stats = ol.stacked_grad_stats(stacked)
    updates, state = tx.update(mean_grads, state, params, grad_stats=stats)
    params = optax.apply_updates(params, updates)
    return params, state, ol.diagnostics(state)

  params = jax.tree_util.tree_map(jnp.asarray, params)
  state = tx.init(params)
  out = []
  for g in grads:
    params, state, diag = step(params, state, g)
    diag = {k: np.asarray(v) for k, v in diag.items()}
    out.append((leaves64(params), diag))
  return out


def make_library_tx(rule: str, warmup: str, **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """The library transformation for one cell of the rule x warm-up grid."""
  warm: dict[str, Any] = {}
  if warmup == "fixed":
    warm["warmup_steps"] = WARMUP_STEPS
  elif warmup == "state_aware":
    warm["warmup_threshold"] = THETA
  kwargs = {"momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY, **warm, **kwargs}
  lr = kwargs.pop("learning_rate", LR0)
  if rule == "linear_scaling":
    return ol.linear_scaling(lr, **kwargs)
  kwargs.setdefault("eps", EPS)
  return {"lena": ol.lena, "adascale": ol.adascale}[rule](lr, **kwargs)


def make_reference(rule: str, warmup: str, **kwargs: Any) -> ReferenceOptimizer:
  kwargs = {
    "lr0": LR0,
    "momentum": MOMENTUM,
    "weight_decay": WEIGHT_DECAY,
    "eps": EPS,
    "warmup_threshold": THETA,
    "warmup_steps": WARMUP_STEPS,
    **kwargs,
  }
  return ReferenceOptimizer(rule, warmup, **kwargs)


# float32 tolerances, fixed a priori. The ratios are quotients of float32 EMAs of float32 squared
# norms of a few hundred elements: relative error ~1e-6 (measured: <= 9e-7). Parameters (|w| up
# to ~40 under linear scaling) accumulate 40 float32 roundings and the ratio error of every
# update (measured: <= 6% of the parameter tolerance below).
RATIO_RTOL = 1e-5
PARAM_RTOL = 1e-5
PARAM_ATOL = 1e-5


def assert_trajectories_match(
  lib: list[tuple[list[np.ndarray], dict[str, np.ndarray]]],
  ref: list[StepRecord],
) -> None:
  """Compares every update; failures name the update (and the layer order)."""
  assert len(lib) == len(ref)
  for (params, d), r in zip(lib, ref, strict=True):
    at = f"update t={r.step}, layers {PATHS}"
    for key in ("gain_ratio", "warmup_factor", "warmup_progress", "lr_multiplier"):
      np.testing.assert_allclose(
        d[key], getattr(r, key), rtol=RATIO_RTOL, atol=0, err_msg=f"{key} at {at}"
      )
    np.testing.assert_allclose(
      d["global_ratio"], r.global_ratio, rtol=RATIO_RTOL, err_msg=f"global_ratio at {at}"
    )
    # Integer update indices: exact.
    np.testing.assert_array_equal(
      d["warmup_end_step"], r.warmup_end_step, err_msg=f"warmup_end_step at {at}"
    )
    assert int(d["num_skipped_steps"]) == 0, at
    for k, (w_lib, w_ref) in enumerate(zip(params, r.params, strict=True)):
      np.testing.assert_allclose(
        w_lib, w_ref, rtol=PARAM_RTOL, atol=PARAM_ATOL, err_msg=f"params[{k}] at {at}"
      )


def assert_state_aware_well_posed(ref: list[StepRecord], theta: float) -> None:
  """Guards the test itself: no update may sit so close to theta that float32 could flip it."""
  for r in ref:
    gap = np.abs(r.warmup_progress - theta)
    assert np.all(gap > 1e-3 * theta), f"progress within 1e-3*theta of theta at t={r.step}"


# ---------------------------------------------------------------------------------------------
# Self-checks of the reference (no library involved).
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ["linear_scaling", "adascale", "lena"])
def test_reference_with_one_worker_is_momentum_sgd(rule: str) -> None:
  # S = 1 clips every ratio to [1, 1]: plain PyTorch momentum SGD with coupled weight decay.
  rng = np.random.RandomState(1)
  w = [rng.standard_normal((3, 2)), rng.standard_normal(4)]
  ref = ReferenceOptimizer(rule, lr0=0.1, momentum=0.9, weight_decay=1e-2)
  w_sgd = [x.copy() for x in w]
  m = [np.zeros_like(x) for x in w]
  for _ in range(5):
    g = [rng.standard_normal((1, *x.shape)) for x in w]
    w = ref.step(w, g)
    for k in range(2):
      m[k] = 0.9 * m[k] + g[k][0] + 1e-2 * w_sgd[k]
      w_sgd[k] = w_sgd[k] - 0.1 * m[k]
    np.testing.assert_allclose(ref.last.lr_multiplier, [1.0, 1.0])
    for a, b in zip(w, w_sgd, strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-14)


def test_reference_two_step_hand_calculation() -> None:
  # One layer of two entries, S = 2 workers, beta = 0.5, eps = 0, lr0 = 0.1, mu = 0.5, no decay.
  # t = 1: g_1 = (1, 0), g_2 = (3, 0): top = (1 + 9) / 2 = 5, gbar = (2, 0), bot = 4.
  #   A = 2.5, D = 2, r = 1.25; m = (2, 0); w = (1, 1) - 0.1 * 1.25 * (2, 0) = (0.75, 1).
  # t = 2: g_1 = (0, 2), g_2 = (0, -2): top = 4, gbar = 0, bot = 0.
  #   A = 0.5 * 4 + 0.5 * 2.5 = 3.25, D = 0 + 0.5 * 2 = 1, r = 3.25 -> clipped to S = 2;
  #   m = 0.5 * (2, 0) + 0 = (1, 0); w = (0.75, 1) - 0.1 * 2 * (1, 0) = (0.55, 1).
  ref = ReferenceOptimizer("lena", lr0=0.1, momentum=0.5, eps=0.0, beta=0.5)
  w = ref.step([np.array([1.0, 1.0])], [np.array([[1.0, 0.0], [3.0, 0.0]])])
  np.testing.assert_allclose(ref.last.sq_norm_mean, [5.0])
  np.testing.assert_allclose(ref.last.mean_grad_sq_norm, [4.0])
  np.testing.assert_allclose(ref.last.gain_ratio, [1.25])
  np.testing.assert_allclose(w[0], [0.75, 1.0])
  w = ref.step(w, [np.array([[0.0, 2.0], [0.0, -2.0]])])
  np.testing.assert_allclose(ref.last.lena_ratio, [2.0])
  np.testing.assert_allclose(ref.last.global_ratio, 2.0)
  np.testing.assert_allclose(w[0], [0.55, 1.0])


def test_reference_two_layer_adascale_and_groups_hand_calculation() -> None:
  # Two layers, S = 4, beta = 1 (no memory), eps = 0.
  # Layer 0: all workers (1,) -> top 1, bot 1. Layer 1: (+1, -1, +1, -1) -> top 1, bot 0.
  # Layer ratios: 1 and clip(1 / 0) = 4 (S); global R = (1 + 1) / (1 + 0) = 2.
  g = [np.ones((4, 1)), np.array([1.0, -1.0, 1.0, -1.0])[:, None]]
  w = [np.zeros(1), np.zeros(1)]
  expected = {"linear_scaling": [4.0, 4.0], "adascale": [2.0, 2.0], "lena": [1.0, 4.0]}
  for rule, ratio in expected.items():
    ref = ReferenceOptimizer(rule, lr0=1.0, momentum=0.0, eps=0.0, beta=1.0)
    ref.step(w, g)
    np.testing.assert_allclose(ref.last.gain_ratio, ratio, err_msg=rule)
    np.testing.assert_allclose(ref.last.global_ratio, 2.0)
  # One group over both layers is AdaScale.
  ref = ReferenceOptimizer("lena", lr0=1.0, momentum=0.0, eps=0.0, beta=1.0, groups=["a", "a"])
  ref.step(w, g)
  np.testing.assert_allclose(ref.last.gain_ratio, [2.0, 2.0])


def test_reference_warmups_hand_calculation() -> None:
  # Linear rule, S = 4: progress advances by S per update. theta = 10 -> factors 0.4, 0.8, 1
  # (P = 12 > 10), warm-up ends at t = 3. Fixed W = 10: factors min(4t/10, 1) = 0.4, 0.8, 1.
  w = [np.zeros(2)]
  g = [np.ones((4, 2))]
  sa = ReferenceOptimizer(
    "linear_scaling", "state_aware", lr0=1.0, momentum=0.0, warmup_threshold=10
  )
  fx = ReferenceOptimizer("linear_scaling", "fixed", lr0=1.0, momentum=0.0, warmup_steps=10)
  for t, factor in enumerate([0.4, 0.8, 1.0], start=1):
    sa.step(w, g)
    fx.step(w, g)
    for ref in (sa, fx):
      np.testing.assert_allclose(ref.last.warmup_factor, [factor])
      np.testing.assert_allclose(ref.last.lr_multiplier, [4.0 * factor])
    assert sa.last.warmup_end_step.tolist() == [3 if t == 3 else -1]
    np.testing.assert_allclose(sa.last.warmup_progress, [4.0 * t])
    # The fixed warm-up has no per-layer progress or end step (diagnostics convention).
    assert fx.last.warmup_end_step.tolist() == [-1]
    np.testing.assert_allclose(fx.last.warmup_progress, [0.0])


def test_reference_default_beta() -> None:
  # beta = min(S / 1000, 1): 0.008 for S = 8 and clipped to 1 for S = 1024.
  for num_samples, beta in ((8, 0.008), (1024, 1.0)):
    ref = ReferenceOptimizer("lena", lr0=0.0)
    ref.step([np.zeros(3)], [np.ones((num_samples, 3))])
    assert ref.last.beta == beta


def test_reference_schedule_clocks() -> None:
  # The schedule sees 0 at the first update on both clocks, then t - 1 or (t - 1) * S.
  seen: dict[str, list[float]] = {"updates": [], "samples": []}
  for clock, values in seen.items():
    ref = ReferenceOptimizer(
      "linear_scaling", lr0=2.0, schedule=lambda c, v=values: v.append(c) or 0.5, clock=clock
    )
    for _ in range(3):
      ref.step([np.zeros(1)], [np.zeros((4, 1))])
    assert ref.last.learning_rate == 1.0
  assert seen == {"updates": [0, 1, 2], "samples": [0, 4, 8]}


# ---------------------------------------------------------------------------------------------
# Library against the reference.
# ---------------------------------------------------------------------------------------------


def test_stacked_grad_stats_matches_reference() -> None:
  _, grads = main_problem()
  ref = ReferenceOptimizer("lena", lr0=0.0)
  params = jax.tree_util.tree_map(lambda g: np.zeros(g.shape[1:]), grads[0])
  ref.step(leaves64(params), leaves64(grads[0]))
  mean_grads, stats = jax.jit(ol.stacked_grad_stats)(grads[0])
  assert stats.num_samples == S
  assert jax.tree_util.tree_structure(stats.sq_norm_mean) == jax.tree_util.tree_structure(params)
  for leaf in jax.tree_util.tree_leaves((stats.sq_norm_mean, stats.mean_grad_sq_norm)):
    assert leaf.shape == () and leaf.dtype == jnp.float32
  for a, b in zip(leaves64(mean_grads), ref.last.mean_grad, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(leaves64(stats.sq_norm_mean), ref.last.sq_norm_mean, rtol=1e-6)
  np.testing.assert_allclose(
    leaves64(stats.mean_grad_sq_norm), ref.last.mean_grad_sq_norm, rtol=1e-5
  )


@pytest.mark.parametrize("warmup", ["none", "fixed", "state_aware"])
@pytest.mark.parametrize("rule", ["linear_scaling", "adascale", "lena"])
def test_rule_warmup_grid_matches_reference(rule: str, warmup: str) -> None:
  params, grads = main_problem()
  ref = run_reference(make_reference(rule, warmup), params, grads)
  lib = run_library(make_library_tx(rule, warmup), params, grads)

  # The problem must exercise what the test claims to test.
  if rule == "lena":
    ratios = np.array([r.gain_ratio for r in ref])
    assert np.all(ratios[:, SIGNAL_INDEX] == 1.0)  # pure signal: clipped at 1
    assert np.any(ratios[:, NOISE_INDEX] == S)  # pure noise: hits the clip S ...
    assert np.any(ratios[:, NOISE_INDEX] < S)  # ... but not always
  if warmup == "fixed":
    factors = np.array([r.warmup_factor for r in ref])
    assert np.all(factors[: FIXED_END - 1] < 1) and np.all(factors[FIXED_END - 1 :] == 1)
  if warmup == "state_aware":
    assert_state_aware_well_posed(ref, THETA)
    ends = ref[-1].warmup_end_step
    assert np.all(ends > 0)  # every layer finishes within the run
    if rule == "lena":
      assert len(set(ends.tolist())) >= 4, ends  # ... at its own time

  assert_trajectories_match(lib, ref)


GROUPINGS: dict[str, tuple[Any, Callable[[tuple[str, ...]], Hashable]]] = {
  # name: (library grouping argument, label of a leaf path for the reference)
  "module": ("module", lambda path: path[:-1]),
  "label_tree": (
    {mod: {name: name for name in leaves} for mod, leaves in LAYERS.items()},
    lambda path: path[-1],  # all kernels together, all biases together (across modules)
  ),
  "callable_rank": (
    lambda path, leaf: jnp.ndim(leaf),
    lambda path: len(LAYERS[path[0]][path[1]][0]),
  ),
}


@pytest.mark.parametrize("grouping", list(GROUPINGS))
def test_grouping_matches_reference(grouping: str) -> None:
  lib_grouping, ref_label = GROUPINGS[grouping]
  groups = [ref_label(p) for p in PATHS]
  assert 1 < len(set(groups)) < len(PATHS)
  params, grads = main_problem()
  ref = run_reference(make_reference("lena", "state_aware", groups=groups), params, grads)
  lib = run_library(make_library_tx("lena", "state_aware", grouping=lib_grouping), params, grads)
  assert_state_aware_well_posed(ref, THETA)
  assert_trajectories_match(lib, ref)


@pytest.mark.parametrize("clock", ["updates", "samples"])
def test_schedule_clock_matches_reference(clock: str) -> None:
  # The paper's decay lr0 * 0.01 ** (base_steps / total_base_steps), base steps = samples seen.
  total = STEPS * S
  lib_schedule = lambda count: LR0 * 0.01 ** (count / total)
  ref_schedule = lambda count: 0.01 ** (count / total)
  params, grads = main_problem()
  ref = run_reference(
    make_reference("lena", "state_aware", schedule=ref_schedule, clock=clock), params, grads
  )
  lib = run_library(
    make_library_tx("lena", "state_aware", learning_rate=lib_schedule, clock=clock),
    params,
    grads,
  )
  assert_trajectories_match(lib, ref)
  # Guard: the two clocks really give different rates (the last update decays to ~0.012 on
  # samples, ~0.89 on updates), so a library ignoring `clock` fails one of the two cases.
  assert ref[-1].learning_rate == pytest.approx(
    LR0 * 0.01 ** ((STEPS - 1) * (S if clock == "samples" else 1) / total)
  )


def test_explicit_beta_matches_reference() -> None:
  params, grads = main_problem()
  ref = run_reference(make_reference("lena", "state_aware", beta=0.3), params, grads)
  lib = run_library(make_library_tx("lena", "state_aware", beta=0.3), params, grads)
  assert_trajectories_match(lib, ref)
  # Guard: beta = 0.3 changes the ratios visibly against the default 0.008.
  default = run_reference(make_reference("lena", "state_aware"), params, grads)
  assert not np.allclose([r.gain_ratio for r in ref], [r.gain_ratio for r in default])


def test_default_beta_clips_to_one_for_large_s() -> None:
  # S = 1024 > 1000: the authors' code would use the weight 1.024 (a negative memory term);
  # the spec clips it to 1, i.e. the ratio of the current update's statistics alone.
  big_s, steps = 1024, 6
  layers = {"a": {"w": ((5,), 0.3, 1.0), "b": ((3,), 0.0, 1.0)}, "c": {"w": ((4,), 1.0, 0.5)}}
  params, grads = make_problem(layers, big_s, steps, seed=3)
  ref = run_reference(make_reference("lena", "none"), params, grads)
  assert all(r.beta == 1.0 for r in ref)
  lib = run_library(make_library_tx("lena", "none"), params, grads)
  for (_, d), r in zip(lib, ref, strict=True):
    np.testing.assert_allclose(d["gain_ratio"], r.gain_ratio, rtol=RATIO_RTOL)
    np.testing.assert_allclose(d["global_ratio"], r.global_ratio, rtol=RATIO_RTOL)
  # Guard: an unclipped weight 1.024 would give different ratios on this problem.
  unclipped = run_reference(make_reference("lena", "none", beta=1.024), params, grads)
  assert not np.allclose([r.gain_ratio for r in ref], [r.gain_ratio for r in unclipped])


def test_warmup_end_step_when_progress_equals_theta() -> None:
  # Linear rule, theta = 3 * S: P = 3 * S = theta exactly at t = 3, whose factor P / theta is
  # exactly 1, so that update is the first at full rate and ends the warm-up.
  params, grads = main_problem()
  kwargs = {"warmup_threshold": 3 * S}
  ref = run_reference(make_reference("linear_scaling", "state_aware", **kwargs), params, grads[:5])
  lib = run_library(make_library_tx("linear_scaling", "state_aware", **kwargs), params, grads[:5])
  assert ref[-1].warmup_end_step.tolist() == [3] * len(PATHS)
  assert_trajectories_match(lib, ref)


@pytest.mark.parametrize("rule", ["linear_scaling", "adascale", "lena"])
def test_one_worker_matches_optax_momentum_sgd(rule: str) -> None:
  # S = 1: every rule reduces to optax's momentum SGD with coupled weight decay (an
  # implementation independent of both the library and the reference).
  params, grads = make_problem(LAYERS, 1, 10, seed=5)
  lib = run_library(make_library_tx(rule, "none"), params, grads)
  sgd = optax.chain(optax.add_decayed_weights(WEIGHT_DECAY), optax.sgd(LR0, momentum=MOMENTUM))
  w = jax.tree_util.tree_map(jnp.asarray, params)
  state = sgd.init(w)
  for (w_lib, d), g in zip(lib, grads, strict=True):
    updates, state = sgd.update(jax.tree_util.tree_map(lambda x: x[0], g), state, w)
    w = optax.apply_updates(w, updates)
    np.testing.assert_allclose(d["lr_multiplier"], 1.0)
    for a, b in zip(w_lib, leaves64(w), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_tree_diagnostics_match_vectors() -> None:
  # ol.diagnostics(state, params) gives the per-layer entries as trees shaped like params, in
  # the same layer order as the vectors (checked here on a state whose layers all differ).
  params, grads = main_problem()
  tx = make_library_tx("lena", "state_aware")

  @jax.jit  # one compilation instead of op-by-op dispatch of six updates
  def update(state: PyTree, stacked: PyTree) -> PyTree:
    mean_grads, stats = ol.stacked_grad_stats(stacked)
    return tx.update(mean_grads, state, params, grad_stats=stats)[1]

  state = tx.init(params)
  for g in grads[:6]:
    state = update(state, g)
  vectors, trees = jax.jit(lambda s: (ol.diagnostics(s), ol.diagnostics(s, params)))(state)
  assert len(set(np.asarray(vectors["gain_ratio"]).tolist())) == len(PATHS)
  keys = ("gain_ratio", "warmup_factor", "warmup_progress", "lr_multiplier", "warmup_end_step")
  for key in keys:
    tree = trees[key]
    assert jax.tree_util.tree_structure(tree) == jax.tree_util.tree_structure(params), key
    np.testing.assert_array_equal(
      np.array([np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]),
      np.asarray(vectors[key]),
      err_msg=key,
    )


# Leaves that get weight decay: kernels only (users exclude biases and normalisation scales).
DECAY_TREE = {mod: {name: name == "kernel" for name in leaves} for mod, leaves in LAYERS.items()}
DECAY_LIST = [path[-1] == "kernel" for path in PATHS]


@pytest.mark.parametrize("mask_kind", ["pytree", "callable"])
@pytest.mark.parametrize("rule", ["linear_scaling", "adascale", "lena"])
def test_weight_decay_mask_matches_reference(rule: str, mask_kind: str) -> None:
  # A weight decay large enough that decaying the biases too would move them far beyond the
  # tolerance (guarded below), so the test fails if the mask were ignored or inverted.
  params, grads = main_problem()
  wd = 0.5
  mask = DECAY_TREE if mask_kind == "pytree" else (lambda p: jax.tree.map(lambda x: x.ndim > 1, p))
  warmup = {"linear_scaling": "fixed", "adascale": "none", "lena": "state_aware"}[rule]
  lib = run_library(
    make_library_tx(rule, warmup, weight_decay=wd, weight_decay_mask=mask), params, grads
  )
  ref = run_reference(
    make_reference(rule, warmup, weight_decay=wd, decay_mask=DECAY_LIST), params, grads
  )
  assert_trajectories_match(lib, ref)
  every = run_reference(make_reference(rule, warmup, weight_decay=wd), params, grads)
  for k, decayed in enumerate(DECAY_LIST):
    gap = np.max(np.abs(every[-1].params[k] - ref[-1].params[k]))
    assert gap == 0.0 if decayed else gap > 100 * PARAM_ATOL, PATHS[k]
