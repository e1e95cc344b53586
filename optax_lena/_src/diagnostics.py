"""What the optimizer is doing, per layer: ratios, warm-up, rates and gradient noise scales."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from optax_lena._src import gain_ratio, nonfinite, tree_utils, warmup

PyTree = Any
_STATES = (
  gain_ratio.GainRatioState,
  warmup.LayerwiseWarmupState,
  warmup.FixedWarmupState,
  nonfinite.SkipNonFiniteState,
)
PER_LAYER = (
  "gain_ratio",
  "warmup_progress",
  "warmup_factor",
  "lr_multiplier",
  "warmup_end_step",
  "noise_scale",
)


def noise_scale(sq_norm_mean: jax.Array, mean_grad_sq_norm: jax.Array, s: jax.Array) -> jax.Array:
  """The simple gradient noise scale B_simple = tr(Sigma) / |G|^2, in per-worker batches.

  With ``top = mean_i ||g_i||^2`` (batch b) and ``bot = ||gbar||^2`` (batch S b), the unbiased
  estimates of McCandlish et al. (2018, Appendix A) are
  ``|G|^2 = (S bot - top) / (S - 1)`` and ``tr(Sigma) = b S (top - bot) / (S - 1)``, so
  ``B_simple / b = S (top - bot) / (S bot - top)``. Multiply by the per-worker batch size for
  examples. Infinite when the signal estimate is not positive (noise dominates); NaN for S < 2,
  where the noise cannot be estimated.
  """
  s = jnp.asarray(s, jnp.float32)
  signal = s * mean_grad_sq_norm - sq_norm_mean
  noise = s * (sq_norm_mean - mean_grad_sq_norm)
  safe = jnp.where(signal > 0, signal, 1.0)
  out = jnp.where(signal > 0, noise / safe, jnp.inf)
  return jnp.where(s >= 2, out, jnp.nan)


def _find_states(opt_state: PyTree) -> dict[type, list[Any]]:
  found: dict[type, list[Any]] = {t: [] for t in _STATES}
  for kind in _STATES:
    for leaf in jax.tree.leaves(opt_state, is_leaf=lambda x, kind=kind: isinstance(x, kind)):
      if isinstance(leaf, kind):
        found[kind].append(leaf)
  # The warm-up's private copy of its rule's state is not a rule of its own.
  inner = {id(w.ratio_state) for w in found[warmup.LayerwiseWarmupState]}
  found[gain_ratio.GainRatioState] = [
    s for s in found[gain_ratio.GainRatioState] if id(s) not in inner
  ]
  return found


def diagnostics(opt_state: PyTree, params: PyTree | None = None) -> dict[str, Any]:
  """Per-layer gain ratios, warm-up state, rate multipliers and noise scales (jittable).

  Args:
    opt_state: the state of an optax_lena optimizer (or of any chain containing its blocks).
    params: optional parameters (or any tree shaped like them); when given, per-layer entries
      are returned as trees shaped like it instead of vectors in ``jax.tree.leaves`` order.

  Returns:
    A dict with, per layer (leaf): ``gain_ratio`` (r_k of the last update), ``warmup_progress``
    (P_k, 0 without a state-aware warm-up), ``warmup_factor``, ``lr_multiplier``
    (``r_k * warmup_factor_k``: the layer's rate is this times ``eta0 * schedule``),
    ``warmup_end_step`` (1-based update at which the layer's warm-up ended, -1 if not yet or
    without state-aware warm-up) and ``noise_scale`` (B_simple in per-worker batches); and the
    scalars ``global_ratio`` (AdaScale's R), ``global_noise_scale``, ``num_samples`` (S of the
    last update), ``num_updates`` and ``num_skipped_steps``.
  """
  found = _find_states(opt_state)
  ratio_states = found[gain_ratio.GainRatioState]
  layer_warmups = found[warmup.LayerwiseWarmupState]
  if not ratio_states and layer_warmups:
    ratio_states = [w.ratio_state for w in layer_warmups]
  if len(ratio_states) != 1 or len(layer_warmups) > 1 or len(found[warmup.FixedWarmupState]) > 1:
    raise ValueError(
      "ol.diagnostics needs the state of exactly one optax_lena gain-ratio rule (and at most "
      f"one warm-up of each kind); found {len(ratio_states)} rule states. For several rules "
      "(e.g. optax.multi_transform) call ol.diagnostics on each inner state."
    )
  rs = ratio_states[0]
  n = rs.ratio.shape[0]
  factor = jnp.ones((n,), jnp.float32)
  progress = jnp.zeros((n,), jnp.float32)
  end_step = jnp.full((n,), -1, jnp.int32)
  if layer_warmups:
    lw = layer_warmups[0]
    factor, progress, end_step = lw.factor, lw.progress, lw.end_step
  for fw in found[warmup.FixedWarmupState]:
    factor = factor * fw.factor
  skip = found[nonfinite.SkipNonFiniteState]
  out = {
    "gain_ratio": rs.ratio,
    "warmup_progress": progress,
    "warmup_factor": factor,
    "lr_multiplier": rs.ratio * factor,
    "warmup_end_step": end_step,
    "noise_scale": noise_scale(rs.sq_norm_mean_avg, rs.mean_grad_sq_norm_avg, rs.num_samples),
    "global_ratio": rs.global_ratio,
    "global_noise_scale": noise_scale(
      jnp.sum(rs.sq_norm_mean_avg), jnp.sum(rs.mean_grad_sq_norm_avg), rs.num_samples
    ),
    "num_samples": rs.num_samples,
    "num_updates": rs.count,
    "num_skipped_steps": skip[0].num_skipped if skip else jnp.zeros([], jnp.int32),
  }
  if params is not None:
    for key in PER_LAYER:
      out[key] = per_layer_tree(out[key], params)
  return out


def per_layer_tree(vector: jax.Array, params: PyTree) -> PyTree:
  """A per-layer vector as a tree shaped like ``params`` (masked entries kept masked)."""
  n = len(tree_utils.active_leaves_with_path(params))
  if vector.shape[0] != n:
    raise ValueError(
      f"The optimizer state has {vector.shape[0]} layers but params has {n} leaves: pass the "
      "parameter tree the optimizer was initialised with."
    )
  return tree_utils.map_active_indexed(lambda k, _: vector[k], params)
