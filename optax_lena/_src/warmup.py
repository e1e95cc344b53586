"""Warm-ups: LENA's layer-wise state-aware warm-up and the fixed linear warm-up of LSW.

Both count *single-worker iterations* ("base steps"), so that a warm-up length tuned for the
base batch carries over to any S. Both advance their progress first and then scale, so no update
has rate 0 (docs/LENA.md, Step 5 and the LSW baseline).

The state-aware warm-up has the paper's progress rule by default and two variants
(``progress=``) whose length does not grow with S / r; see :func:`layerwise_warmup`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_lena._src import batch_scale, checks, gain_ratio, stats, tree_utils
from optax_lena._src import grouping as grouping_lib
from optax_lena._src import layer_axes as layer_axes_lib

PyTree = Any

# How a layer's progress P_k advances per update (see layerwise_warmup).
PROGRESS_RULES = ("ratio", "relative_to_max", "relative_to_mean")


class LayerwiseWarmupState(NamedTuple):
  """State of :func:`layerwise_warmup`.

  Attributes:
    ratio_state: the warm-up's own copy of its rule's gain-ratio state (see the note in
      :func:`layerwise_warmup`).
    progress: ``P_k`` per layer, in single-worker iterations.
    factor: the warm-up factor of the last update per layer, ``min(P_k / theta, 1)``.
    end_step: per layer, the 1-based index of the first update at full rate (``P_k >= theta``),
      or -1 while the layer is still warming up (the paper's Figure 7).

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal: A Layer-Wise Adaptive Approach Toward
    Large-Scale DNN Training", WWW 2022: the progress ``P_k`` of Eqs. 6-7 (Algorithm 1, lines
    17-21) and the end of each layer's warm-up (Figure 7).
  """

  ratio_state: gain_ratio.GainRatioState
  progress: jax.Array
  factor: jax.Array
  end_step: jax.Array


def layerwise_warmup(
  warmup_threshold: float,
  *,
  rule: str | gain_ratio.GainRatioRule = "lena",
  progress: str = "ratio",
  beta: float | None = None,
  eps: float | None = None,
  grouping: grouping_lib.Grouping = None,
  num_samples: int | None = None,
  per_worker_batch_size: int | None = None,
  reference_batch_size: int | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> optax.GradientTransformationExtraArgs:
  """LENA's layer-wise state-aware warm-up (Eqs. 6-7, Algorithm 1 lines 17-21).

  Every update, each layer first advances its progress by its gain ratio, ``P_k <- P_k + r_k``
  (the number of single-worker iterations the update is worth), then its update is multiplied
  by ``P_k / theta`` while ``P_k <= theta``. Layers whose gradients are noisy (large ratio)
  therefore finish their warm-up early and low-noise layers keep warming up.

  **Length, and the variants** (``progress=``). With ``theta = alpha * T1`` and a run of T_S
  updates at S workers (T1 = S * T_S single-worker iterations of the same epoch budget), a layer
  whose ratio averages ``r_k`` ends its warm-up after about

  * ``"ratio"`` (the paper, default): ``P_k <- P_k + r_k``; ``theta / r_k = alpha * T1 / r_k``
    updates, i.e. the fraction ``alpha * S / r_k`` of the run. It grows with S / r_k: with
    alpha = 5%, S = 128 and r_k = 9-14 the warm-up lasts about half the run, and a layer with
    r_k = 1 does not leave it within the run when ``alpha * S >= 1``.
  * ``"relative_to_max"``: ``P_k <- P_k + S * r_k / max_j r_j``. The layer with the largest
    ratio of the update is credited S single-worker iterations (as linear scaling would), the
    others in proportion to their ratio. Fraction of the run ``alpha * r_max / r_k``: the layer
    with the largest ratio ends at alpha of the run (the fixed warm-up of theta base steps),
    the others later by their ratio's distance to it. It depends on how different the layers'
    ratios are, not on S / r.
  * ``"relative_to_mean"``: ``P_k <- P_k + min(S * r_k / mean_j r_j, S)``. The same relative to
    the mean ratio (over layers), capped at S: fraction ``alpha * max(1, mean_j r_j / r_k)``.
    Layers at or above the mean ratio end at alpha of the run, those below later.

  Both variants keep the paper's intent (each layer ends on its own, noisier layers first) and
  are bounded per update by ``r_k <= advance <= S``, so a layer's variant warm-up never lasts
  longer than the paper's nor shorter than the fixed warm-up of theta base steps. Under a global
  rule (AdaScale, linear) every layer has the largest ratio: both variants are then exactly the
  fixed warm-up ``min(t * S / theta, 1)``. The fractions above are for constant ratios; the
  state records the actual per-layer end (``end_step``).

  An Optax chain only passes updates from one transformation to the next, so the warm-up keeps
  its own copy of the rule's moving averages (two floats per leaf) and recomputes the ratio
  with the same shared core; give it the same rule as the scaling transformation. Under a
  global rule the progress advances by that rule's ratio (S for linear scaling, R for AdaScale).

  **Power and reference batch.** The progress counts single-worker (reference-batch)
  iterations: it advances by the ratio r_k whatever the rule's ``power`` (an update scaled by
  ``r_k ** 0.5`` for Adam is still worth r_k single-worker iterations), and with a reference
  batch b0 the ratio, its cap and S in the variants are those of the scale ``k = S b / b0``,
  with theta in iterations at batch b0.

  Args:
    warmup_threshold: theta, in single-worker iterations (``alpha * T1``; the paper's alpha is
      5% of the single-worker run's iterations).
    rule: ``"lena"``, ``"adascale"``, ``"linear_scaling"`` or a :class:`GainRatioRule`; must
      match the scaling rule it is chained with.
    progress: how ``P_k`` advances: ``"ratio"`` (the paper), ``"relative_to_max"`` or
      ``"relative_to_mean"`` (see above). ``theta`` keeps its unit (single-worker iterations).
    beta: moving-average weight of the rule; ``None`` means ``min(S / 1000, 1)``.
    eps: stabiliser of the rule's ratio; ``None`` means the rule's default 1e-6.
    grouping: the rule's grouping (``"lena"`` only).
    num_samples: the S the statistics must have, or ``None``.
    per_worker_batch_size: b, with ``reference_batch_size`` (the rule's).
    reference_batch_size: b0, the batch the rate was tuned at (the rule's); theta then counts
      iterations at batch b0.
    layer_axes: where each parameter stacks its layers (the rule's): each slice warms up on its
      own, as in the unrolled model.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` taking ``grad_stats=``.

  Raises:
    ValueError: at construction, for a ``warmup_threshold`` that is not positive and finite,
      an unknown ``rule`` or ``progress``, hyper-parameters given both in a
      :class:`GainRatioRule` and as keywords, or ``grouping`` with a global rule; at ``init``,
      for a ``grouping`` or ``layer_axes`` that does not fit the parameters; at ``update``,
      without ``grad_stats``.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal: A Layer-Wise Adaptive Approach Toward
    Large-Scale DNN Training", WWW 2022, Section 3.3: Eqs. 6-7 and Algorithm 1, lines 17-21
    (the ``"ratio"`` rule); the variants are this library's.

  Examples:
    LENA's ratios followed by their warm-up with theta = 10, three updates with the same
    statistics (made by hand; ``beta=1`` and ``eps=0`` keep the arithmetic exact): the bias
    (ratio 4) reaches theta at update 3, the kernel (ratio 2.5) is at 7.5 / 10.

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import optax_lena as ol
    >>> gbar = {"b": jnp.ones(2), "w": jnp.ones((2, 2))}  # ||gbar||^2: 2 and 4
    >>> stats = ol.GradStats(  # mean_i ||g_i||^2 of S = 4 per-worker gradients, ||gbar||^2
    ...   {"b": jnp.float32(8.0), "w": jnp.float32(10.0)}, 4,
    ...   {"b": jnp.float32(2.0), "w": jnp.float32(4.0)},
    ... )
    >>> rule = ol.lena_rule(beta=1.0, eps=0.0)
    >>> tx = optax.chain(ol.scale_by_gain_ratio(rule), ol.layerwise_warmup(10.0, rule=rule))
    >>> state = tx.init(gbar)
    >>> for _ in range(3):
    ...   updates, state = tx.update(gbar, state, grad_stats=stats)
    >>> print(state[1].progress, state[1].factor, state[1].end_step)
    [12.   7.5] [1.   0.75] [ 3 -1]
  """
  checks.check_warmup_threshold(warmup_threshold)
  if progress not in PROGRESS_RULES:
    raise ValueError(
      f"Unknown warm-up progress rule {progress!r}: use one of {', '.join(PROGRESS_RULES)} "
      "('ratio' is the paper's)."
    )
  rule = gain_ratio.rule_from_name(
    rule,
    beta=beta,
    eps=eps,
    grouping=grouping,
    num_samples=num_samples,
    per_worker_batch_size=per_worker_batch_size,
    reference_batch_size=reference_batch_size,
    layer_axes=layer_axes,
  )

  def init_fn(params):
    ratio_state = gain_ratio.init_gain_ratio_state(params, rule)
    n = ratio_state.ratio.shape[0]
    return LayerwiseWarmupState(
      ratio_state=ratio_state,
      progress=jnp.zeros((n,), jnp.float32),
      factor=jnp.zeros((n,), jnp.float32),
      end_step=jnp.full((n,), -1, jnp.int32),
    )

  def update_fn(updates, state, params=None, *, grad_stats=None, **extra_args):
    del params, extra_args
    ratio_state = gain_ratio.advance_gain_ratio(state.ratio_state, rule, updates, grad_stats)
    advance = progress_advance(ratio_state.ratio, rule.scale(grad_stats.num_samples), progress)
    new_progress = state.progress + advance
    warming = new_progress <= warmup_threshold
    factor = jnp.where(warming, new_progress / warmup_threshold, 1.0).astype(jnp.float32)
    # The warm-up ends at the first update at full rate: P_k = theta already gives factor 1.
    at_full_rate = new_progress >= warmup_threshold
    end_step = jnp.where((state.end_step < 0) & at_full_rate, ratio_state.count, state.end_step)
    new_state = LayerwiseWarmupState(ratio_state, new_progress, factor, end_step)
    return gain_ratio.scale_active_leaves(updates, factor, False, rule.layer_axes), new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def progress_advance(ratio: jax.Array, num_samples: int, progress: str = "ratio") -> jax.Array:
  """Per-layer advance of the warm-up progress ``P_k`` for one update.

  Args:
    ratio: the update's per-layer ratios ``r_k`` (float32, each in ``[1, S]``).
    num_samples: the scale of the update (a Python int): S, or ``k = S b / b0`` with a
      reference batch.
    progress: ``"ratio"`` (``r_k``, the paper's Eq. 6), ``"relative_to_max"``
      (``S * r_k / max_j r_j``) or ``"relative_to_mean"`` (``min(S * r_k / mean_j r_j, S)``,
      the mean over layers).

  Returns:
    The advance per layer, float32, in ``[r_k, S]``.
  """
  if progress == "ratio" or ratio.shape[0] == 0:
    return ratio
  s = jnp.float32(num_samples)
  if progress == "relative_to_max":
    return s * ratio / jnp.max(ratio)  # ratios are >= 1: no division by zero
  return jnp.minimum(s * ratio / jnp.mean(ratio), s)


class FixedWarmupState(NamedTuple):
  """State of :func:`fixed_warmup`: base steps seen (int32) and the last factor.

  Attributes:
    base_steps: single-worker iterations seen so far, ``t * S`` after t updates of S
      per-worker gradients (``t * k`` with a reference batch), int32.
    factor: the factor ``min(base_steps / W, 1)`` of the last update, float32.
  """

  base_steps: jax.Array
  factor: jax.Array


def num_samples_of(grad_stats: stats.GradStats | None, num_samples: int | None, who: str) -> int:
  """S from the statistics when given (checked against ``num_samples``), else ``num_samples``."""
  if grad_stats is None:
    if num_samples is None:
      raise ValueError(
        f"{who} counts base steps t * S and needs S: pass grad_stats=stats (from "
        "ol.stacked_grad_stats / ol.all_reduce_grad_stats) to update, or build it with "
        "num_samples=S."
      )
    return num_samples
  stats.check_grad_stats(grad_stats, num_samples)
  return grad_stats.num_samples


def fixed_warmup(
  warmup_steps: float,
  *,
  num_samples: int | None = None,
  per_worker_batch_size: int | None = None,
  reference_batch_size: int | None = None,
) -> optax.GradientTransformationExtraArgs:
  """The fixed linear warm-up of LSW, counted in base steps.

  The update with index t (1 at the first update) is multiplied by ``min(t * S / W, 1)``
  (``min(t * k / W, 1)`` with a reference batch, ``k = S b / b0``).

  Args:
    warmup_steps: W, the warm-up length in single-worker iterations (the paper: 5.5% of the
      base steps of training); 0 disables it. With a reference batch: iterations at batch b0.
    num_samples: S, needed only when no ``grad_stats`` are passed to update.
    per_worker_batch_size: b, with ``reference_batch_size``.
    reference_batch_size: b0, the batch the rate was tuned at; each update counts k base steps.

  Returns:
    An ``optax.GradientTransformationExtraArgs``.

  Raises:
    ValueError: at construction, for a negative ``warmup_steps``, a ``num_samples`` that is not
      a positive int, or one batch size without the other; at ``update``, without
      ``grad_stats`` and without ``num_samples``.

  References:
    Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017, Section
    2.2 (the gradual warm-up); counted in base steps as in Ko, Lee and Kim, WWW 2022 (the LSW
    baseline).

  Examples:
    W = 8 base steps at S = 4: the factor is 4 / 8, then 1.

    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> tx = ol.fixed_warmup(8, num_samples=4)
    >>> updates = {"w": jnp.ones(2)}
    >>> state = tx.init(updates)
    >>> for _ in range(3):
    ...   scaled, state = tx.update(updates, state)
    ...   print(scaled["w"])
    [0.5 0.5]
    [1. 1.]
    [1. 1.]
  """
  checks.check_warmup_steps(warmup_steps)
  checks.check_num_samples(num_samples)
  batch_scale.check_batch_sizes(per_worker_batch_size, reference_batch_size)

  def init_fn(params):
    del params
    return FixedWarmupState(jnp.zeros([], jnp.int32), jnp.zeros([], jnp.float32))

  def update_fn(updates, state, params=None, *, grad_stats=None, **extra_args):
    del params, extra_args
    s = num_samples_of(grad_stats, num_samples, "fixed_warmup")
    k = batch_scale.update_scale(s, per_worker_batch_size, reference_batch_size)
    base_steps = state.base_steps + k
    safe_w = jnp.maximum(jnp.asarray(warmup_steps, jnp.float32), 1e-30)
    factor = jnp.where(
      jnp.asarray(warmup_steps) > 0, jnp.minimum(base_steps / safe_w, 1.0), 1.0
    ).astype(jnp.float32)
    updates = tree_utils.map_active(lambda u: (u * factor).astype(u.dtype), updates)
    return updates, FixedWarmupState(base_steps, factor)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
