"""The state-aware warm-up's progress variants (``ol.layerwise_warmup(progress=...)``).

The library (float32 JAX) is checked against an independent float64 NumPy reference written
here from the definitions in the docstring of ``layerwise_warmup``:

* ``"ratio"`` (the paper, Eq. 6): ``P_k <- P_k + r_k``;
* ``"relative_to_max"``: ``P_k <- P_k + S * r_k / max_j r_j``;
* ``"relative_to_mean"``: ``P_k <- P_k + min(S * r_k / mean_j r_j, S)``;

then the factor ``P_k / theta`` while ``P_k <= theta`` (else 1), and the end step is the first
1-based update with ``P_k >= theta``. The ratios are the paper's (docs/LENA.md steps 1-3), the
update momentum SGD with coupled weight decay (step 6). Every update is compared: progress,
factor, end step per layer and the parameters.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_lena as ol
from optax_lena._src.warmup import progress_advance

PyTree = Any
PROGRESS = ("ratio", "relative_to_max", "relative_to_mean")
S = 8
STEPS = 40
LR0 = 0.005
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
EPS = 1e-6
# theta in single-worker iterations; off any value the progress reaches exactly (checked below).
THETA = 60.5

# (shape, signal mu, noise sigma) per leaf; expected ratio (sigma^2 + mu^2) / (sigma^2/S + mu^2):
# from 1 (pure signal) to S (pure noise), so the layers end their warm-ups at different updates.
LAYERS = {
  "conv": {"kernel": ((3, 4, 8), 0.3, 1.0), "bias": ((8,), 1.0, 0.0)},
  "dense": {"kernel": ((32, 16), 1.0, 1.0), "bias": ((16,), 0.0, 1.0)},
  "head": {"kernel": ((16, 10), 0.5, 2.0), "bias": ((10,), 2.0, 0.5)},
}


def make_problem(num_samples: int, steps: int, seed: int) -> tuple[PyTree, list[PyTree]]:
  """Float32 parameters and ``steps`` pytrees of per-worker gradients ``[S, *shape]``."""
  rng = np.random.RandomState(seed)
  params: dict[str, dict[str, np.ndarray]] = {}
  direction: dict[str, dict[str, np.ndarray]] = {}
  for m, leaves in LAYERS.items():
    params[m] = {
      n: (0.1 * rng.standard_normal(sh)).astype(np.float32) for n, (sh, _, _) in leaves.items()
    }
    direction[m] = {n: rng.standard_normal(sh) for n, (sh, _, _) in leaves.items()}
  grads = []
  for t in range(1, steps + 1):
    c_t = 1.0 + 0.5 * math.sin(0.3 * t)  # the ratios move during the run
    grads.append(
      {
        m: {
          n: (mu * c_t * direction[m][n] + sigma * rng.standard_normal((num_samples, *sh))).astype(
            np.float32
          )
          for n, (sh, mu, sigma) in ls.items()
        }
        for m, ls in LAYERS.items()
      }
    )
  return params, grads


def leaves64(tree: PyTree) -> list[np.ndarray]:
  return [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]


# ---------------------------------------------------------------------------------------------
# The float64 reference.
# ---------------------------------------------------------------------------------------------


def reference(
  rule: str, progress: str, params: PyTree, grads: list[PyTree], theta: float = THETA
) -> list[dict[str, Any]]:
  """Per update: ratio, progress, factor, end step (per leaf) and the parameters after it."""
  w = leaves64(params)
  n = len(w)
  a = np.zeros(n)
  d = np.zeros(n)
  p = np.zeros(n)
  end = np.full(n, -1)
  m = [np.zeros_like(x) for x in w]
  out = []
  for t, g_tree in enumerate(grads, 1):
    g = leaves64(g_tree)
    s = g[0].shape[0]
    gbar = [x.mean(0) for x in g]
    top = np.array([np.mean(np.sum(x.reshape(s, -1) ** 2, axis=1)) for x in g])
    bot = np.array([np.sum(x**2) for x in gbar])
    beta = min(s / 1000.0, 1.0)
    a = beta * top + (1 - beta) * a
    d = beta * bot + (1 - beta) * d
    layer = np.clip((a + EPS) / (d + EPS), 1.0, s)
    big_r = float(np.clip((a.sum() + EPS) / (d.sum() + EPS), 1.0, s))
    ratio = {"lena": layer, "adascale": np.full(n, big_r), "linear_scaling": np.full(n, float(s))}[
      rule
    ]
    if progress == "ratio":
      advance = ratio
    elif progress == "relative_to_max":
      advance = s * ratio / ratio.max()
    else:
      advance = np.minimum(s * ratio / ratio.mean(), s)
    p = p + advance
    factor = np.where(p <= theta, p / theta, 1.0)
    end = np.where((end < 0) & (p >= theta), t, end)
    mult = ratio * factor
    for k in range(n):
      m[k] = MOMENTUM * m[k] + gbar[k] + WEIGHT_DECAY * w[k]
      w[k] = w[k] - LR0 * mult[k] * m[k]
    out.append(
      {
        "ratio": ratio.copy(),
        "progress": p.copy(),
        "factor": factor.copy(),
        "end_step": end.copy(),
        "params": [x.copy() for x in w],
      }
    )
  return out


# ---------------------------------------------------------------------------------------------
# The library.
# ---------------------------------------------------------------------------------------------


def library_tx(
  rule: str, progress: str | None, theta: float = THETA
) -> optax.GradientTransformation:
  """Momentum SGD, the rule's ratio, the state-aware warm-up with ``progress``, the rate."""
  gain_rule = {
    "lena": ol.lena_rule,
    "adascale": ol.adascale_rule,
    "linear_scaling": ol.linear_scaling_rule,
  }[rule]
  gain_rule = gain_rule() if rule == "linear_scaling" else gain_rule(eps=EPS)
  warm = {} if progress is None else {"progress": progress}
  return optax.chain(
    optax.add_decayed_weights(WEIGHT_DECAY),
    optax.trace(MOMENTUM),
    ol.scale_by_gain_ratio(gain_rule),
    ol.layerwise_warmup(theta, rule=gain_rule, **warm),
    ol.scale_by_learning_rate(LR0),
  )


def run_library(tx: optax.GradientTransformation, params: PyTree, grads: list[PyTree]):
  @jax.jit
  def step(params, state, stacked):
    mean_grads, stats = ol.stacked_grad_stats(stacked)
    updates, state = tx.update(mean_grads, state, params, grad_stats=stats)
    return optax.apply_updates(params, updates), state, ol.diagnostics(state)

  params = jax.tree.map(jnp.asarray, params)
  state = tx.init(params)
  out = []
  for g in grads:
    params, state, diag = step(params, state, g)
    out.append((leaves64(params), {k: np.asarray(v) for k, v in diag.items()}))
  return out


def assert_match(lib, ref, theta: float = THETA) -> None:
  assert len(lib) == len(ref)
  for t, ((params, diag), r) in enumerate(zip(lib, ref, strict=True), 1):
    at = f"update {t}"
    # Guard of the test itself: float32 and float64 must not disagree on P >= theta.
    assert np.all(np.abs(r["progress"] - theta) > 1e-4 * theta), at
    np.testing.assert_allclose(diag["gain_ratio"], r["ratio"], rtol=1e-5, err_msg=at)
    np.testing.assert_allclose(diag["warmup_progress"], r["progress"], rtol=1e-5, err_msg=at)
    np.testing.assert_allclose(diag["warmup_factor"], r["factor"], rtol=1e-5, err_msg=at)
    np.testing.assert_array_equal(diag["warmup_end_step"], r["end_step"], err_msg=at)
    for k, (a, b) in enumerate(zip(params, r["params"], strict=True)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"params[{k}] at {at}")


@pytest.fixture(scope="module")
def problem() -> tuple[PyTree, list[PyTree]]:
  return make_problem(S, STEPS, seed=1)


@pytest.mark.parametrize("progress", PROGRESS)
@pytest.mark.parametrize("rule", ["lena", "adascale", "linear_scaling"])
def test_progress_rules_match_reference(problem, rule: str, progress: str) -> None:
  params, grads = problem
  assert_match(
    run_library(library_tx(rule, progress), params, grads), reference(rule, progress, params, grads)
  )


def test_per_layer_end_steps(problem) -> None:
  """Fig. 7's quantity: each layer's end update, exact, and the variants' bounds per layer.

  The paper's rule ends last; the variants end between the fixed warm-up of theta base steps
  (ceil(theta / S) updates) and the paper's end; the layer with the largest ratio ends exactly
  at ceil(theta / S) under ``relative_to_max``.
  """
  params, grads = problem
  ends = {}
  for progress in PROGRESS:
    diag = run_library(library_tx("lena", progress), params, grads)[-1][1]
    ends[progress] = diag["warmup_end_step"]
    np.testing.assert_array_equal(
      ends[progress], reference("lena", progress, params, grads)[-1]["end_step"]
    )
  fixed_end = math.ceil(THETA / S)
  never = lambda e: np.where(e < 0, STEPS + 1, e)  # -1: not ended within the run
  for progress in ("relative_to_max", "relative_to_mean"):
    assert np.all(never(ends[progress]) >= fixed_end), progress
    assert np.all(never(ends[progress]) <= never(ends["ratio"])), progress
  # The layers end at different updates. The paper's rule leaves the pure-signal bias (ratio 1)
  # warming up past the run; so does relative_to_max (the largest ratio is ~S here, so a ratio-1
  # layer advances by 1 as in the paper); relative_to_mean ends every layer within it.
  signal = jax.tree.leaves(
    {m: {n: (m, n) for n in leaves} for m, leaves in LAYERS.items()},
    is_leaf=lambda x: isinstance(x, tuple),
  ).index(("conv", "bias"))
  assert ends["ratio"][signal] < 0 and ends["relative_to_max"][signal] < 0
  assert np.all(ends["relative_to_mean"] > 0)
  assert len(set(ends["relative_to_max"].tolist())) > 2
  assert never(ends["relative_to_max"]).min() == fixed_end
  assert ends["relative_to_mean"].min() == fixed_end


@pytest.mark.parametrize("progress", ["relative_to_max", "relative_to_mean"])
@pytest.mark.parametrize("rule", ["adascale", "linear_scaling"])
def test_global_rules_reduce_to_fixed_warmup(problem, rule: str, progress: str) -> None:
  """One ratio for every layer: the variants are ``ol.fixed_warmup(theta)`` exactly."""
  params, grads = problem
  gain_rule = ol.adascale_rule(eps=EPS) if rule == "adascale" else ol.linear_scaling_rule()
  fixed = optax.chain(
    optax.add_decayed_weights(WEIGHT_DECAY),
    optax.trace(MOMENTUM),
    ol.scale_by_gain_ratio(gain_rule),
    ol.fixed_warmup(THETA),
    ol.scale_by_learning_rate(LR0),
  )
  lib = run_library(library_tx(rule, progress), params, grads)
  want = run_library(fixed, params, grads)
  for (p_lib, d_lib), (p_fix, d_fix) in zip(lib, want, strict=True):
    np.testing.assert_allclose(d_lib["warmup_factor"], d_fix["warmup_factor"], rtol=1e-6)
    for a, b in zip(p_lib, p_fix, strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_default_is_the_paper_rule(problem) -> None:
  """No ``progress`` argument: bitwise the paper's ``"ratio"`` rule."""
  params, grads = problem
  default = run_library(library_tx("lena", None), params, grads)
  paper = run_library(library_tx("lena", "ratio"), params, grads)
  for (pa, da), (pb, db) in zip(default, paper, strict=True):
    for key in ("warmup_progress", "warmup_factor", "warmup_end_step"):
      np.testing.assert_array_equal(da[key], db[key])
    for a, b in zip(pa, pb, strict=True):
      np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("s", [8, 32, 128, 512])
def test_length_formulas_for_constant_ratios(s: int) -> None:
  """The docstring's lengths: with constant ratios r_k the paper's warm-up lasts theta / r_k
  updates (grows with S / r), ``relative_to_max`` theta * r_max / (S * r_k) and
  ``relative_to_mean`` theta * max(1, mean r / r_k) / S (independent of S / r)."""
  total = 400  # updates of the run
  alpha = 0.05
  theta = alpha * total * s  # alpha * T1
  ratio = np.array([1.0, 0.1 * s, 0.3 * s, s], np.float64).clip(1.0, s)
  expected = {
    "ratio": np.ceil(theta / ratio),
    "relative_to_max": np.ceil(theta * ratio.max() / (s * ratio)),
    "relative_to_mean": np.ceil(theta * np.maximum(1.0, ratio.mean() / ratio) / s),
  }
  for progress, want in expected.items():
    advance = np.asarray(progress_advance(jnp.asarray(ratio, jnp.float32), s, progress))
    got = np.ceil(theta / advance - 1e-6)
    np.testing.assert_array_equal(got, want, err_msg=progress)
  # The variants stay within [alpha, alpha * r_max / r_min] of the run whatever S is.
  rel = expected["relative_to_max"] / total
  assert rel.min() == pytest.approx(alpha) and rel.max() <= alpha * ratio.max() / ratio.min() + 1e-9


def test_jit_and_inject_hyperparams(problem) -> None:
  """The variant composes with inject_hyperparams (theta injected; the strings stay static)."""
  params, grads = problem
  rule = ol.lena_rule(eps=EPS)

  def make(inject: bool, theta: float):
    warm = (
      optax.inject_hyperparams(ol.layerwise_warmup)(
        warmup_threshold=theta, rule=rule, progress="relative_to_max"
      )
      if inject
      else ol.layerwise_warmup(theta, rule=rule, progress="relative_to_max")
    )
    return optax.chain(ol.scale_by_gain_ratio(rule), warm)

  tx_inj, tx_plain = make(True, THETA), make(False, THETA)
  p = jax.tree.map(jnp.asarray, params)
  st_inj, st_plain = tx_inj.init(p), tx_plain.init(p)

  @jax.jit
  def step(st_inj, st_plain, stacked):
    g, stats = ol.stacked_grad_stats(stacked)
    u_inj, st_inj = tx_inj.update(g, st_inj, p, grad_stats=stats)
    u_plain, st_plain = tx_plain.update(g, st_plain, p, grad_stats=stats)
    return u_inj, st_inj, u_plain, st_plain

  for g in grads[:10]:
    u_inj, st_inj, u_plain, st_plain = step(st_inj, st_plain, g)
    for a, b in zip(jax.tree.leaves(u_inj), jax.tree.leaves(u_plain), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-6)  # theta an array instead of a constant
  # Changing the injected theta mid-run changes the factor as a rebuilt warm-up would.
  st_inj[1].hyperparams["warmup_threshold"] = jnp.asarray(2 * THETA)
  g, stats = ol.stacked_grad_stats(grads[10])
  _, new = tx_inj.update(g, st_inj, p, grad_stats=stats)
  warm = new[1].inner_state
  np.testing.assert_allclose(
    warm.factor, np.minimum(np.asarray(warm.progress) / (2 * THETA), 1.0), rtol=1e-6
  )


def test_state_is_arrays_and_unknown_rule_raises() -> None:
  params = {"w": jnp.ones((3,)), "b": jnp.ones(())}
  state = ol.layerwise_warmup(10.0, progress="relative_to_mean").init(params)
  assert isinstance(state, ol.LayerwiseWarmupState)
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(state))
  with pytest.raises(ValueError, match="relative_to_max"):
    ol.layerwise_warmup(10.0, progress="max")


@pytest.mark.parametrize("progress", ["relative_to_max", "relative_to_mean"])
@pytest.mark.parametrize("rule", ["lena", "adascale", "linear_scaling"])
def test_every_alias_takes_the_warmup_progress(problem, rule: str, progress: str) -> None:
  """``ol.lena / ol.adascale / ol.linear_scaling(..., warmup_progress=)`` are the rule's chain
  with ``layerwise_warmup(progress=)``."""
  params, grads = problem
  kwargs = {"momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY, "warmup_threshold": THETA}
  if rule == "linear_scaling":
    alias = ol.linear_scaling(LR0, **kwargs, warmup_progress=progress)
  else:
    alias = {"lena": ol.lena, "adascale": ol.adascale}[rule](
      LR0, **kwargs, eps=EPS, warmup_progress=progress
    )
  by_hand = library_tx(rule, progress)
  for (pa, da), (pb, db) in zip(
    run_library(alias, params, grads), run_library(by_hand, params, grads), strict=True
  ):
    np.testing.assert_array_equal(da["warmup_end_step"], db["warmup_end_step"])
    for key in ("gain_ratio", "warmup_progress", "warmup_factor"):
      if rule == "adascale":  # the global sum may be reduced in another order: 1 ulp apart
        np.testing.assert_allclose(da[key], db[key], rtol=1e-6)
      else:
        np.testing.assert_array_equal(da[key], db[key])
    for a, b in zip(pa, pb, strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  with pytest.raises(ValueError, match="progress"):
    ol.lena(LR0, warmup_threshold=THETA, warmup_progress="linear")
  for alias in (ol.adascale, ol.linear_scaling):
    with pytest.raises(ValueError, match="progress"):
      alias(LR0, warmup_threshold=THETA, warmup_progress="max")
