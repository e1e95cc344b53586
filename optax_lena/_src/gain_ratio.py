"""Gain ratios: the one core shared by linear scaling, AdaScale and LENA.

All three rules multiply a layer's update by a gain ratio r in [1, S]:

* linear scaling (Goyal et al. 2017): r = S for every layer;
* AdaScale (Johnson et al. 2020): one ratio for the whole model from the moving averages of the
  summed statistics;
* LENA (Ko et al. 2022, Eqs. 4, 5 and 8): one ratio per layer (or per user-defined group).

AdaScale is LENA with a single group, and linear scaling is the ratio's upper clip, so one
function, :func:`advance_gain_ratio`, implements them all. Per-layer quantities live in float32
vectors with one entry per layer: per (unmasked) leaf in ``jax.tree.leaves`` order, and L
consecutive entries for a leaf that stacks L layers along a layer axis (``layer_axes=``, see
:mod:`optax_lena._src.layer_axes`). The scalar work is a handful of vector operations whatever
the number of layers, which keeps compile time flat.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_lena._src import batch_scale, checks, stats, tree_utils
from optax_lena._src import grouping as grouping_lib
from optax_lena._src import layer_axes as layer_axes_lib

PyTree = Any


class GainRatioState(NamedTuple):
  """State of a gain-ratio rule.

  Attributes:
    count: number of updates applied (int32).
    sq_norm_mean_avg: ``A_k``, per layer, moving average of ``(1/S) sum_i ||g_ik||^2`` (Eq. 8).
    mean_grad_sq_norm_avg: ``D_k``, per layer, moving average of ``||gbar_k||^2`` (Eq. 8).
    ratio: the clipped gain ratio ``r_k`` used by the last update, per layer (a group's ratio is
      repeated on each of its layers).
    global_ratio: the AdaScale ratio ``R`` of the whole model at the last update, clipped.
    num_samples: S of the last update (int32; 0 before the first).
    power: the rule's power p (float32): the update is multiplied by ``ratio ** p``.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal: A Layer-Wise Adaptive Approach Toward
    Large-Scale DNN Training", WWW 2022: ``A_k`` and ``D_k`` are the moving averages of Eq. 8
    of the statistics of Eq. 4, ``ratio`` the clipped gain ratio of Eq. 5; ``global_ratio`` is
    AdaScale's (Johnson et al., ICML 2020).
  """

  count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as in optax's states
  sq_norm_mean_avg: jax.Array
  mean_grad_sq_norm_avg: jax.Array
  ratio: jax.Array
  global_ratio: jax.Array
  num_samples: jax.Array
  power: jax.Array


@dataclasses.dataclass(frozen=True)
class GainRatioRule:
  """Static description of a gain-ratio rule.

  Attributes:
    adaptive: ``False`` for linear scaling (r = S), ``True`` for the variance-based ratio.
    grouping: which leaves share one ratio (see :mod:`optax_lena._src.grouping`); ``"global"``
      is AdaScale, ``None`` (one ratio per leaf) is LENA.
    beta: moving-average weight of the new statistics; ``None`` means ``min(S / 1000, 1)``.
    eps: added to numerator and denominator of the ratio (Step 3 of docs/LENA.md).
    num_samples: the S the statistics must have, or ``None`` to accept any.
    power: p, the update is multiplied by ``r ** p`` (in ``[1, k ** p]``); 1 is the paper's
      rule for SGD, 0.5 the square-root rule for Adam-type optimizers. The warm-up's progress
      still advances by r (single-worker iterations), whatever p.
    per_worker_batch_size: b, with ``reference_batch_size``: the batch of each per-worker
      gradient.
    reference_batch_size: b0, the batch at which the learning rate was tuned; the scale (the
      ratio's cap, linear scaling's factor) becomes ``k = S b / b0`` instead of S, and the
      ratio estimates the gain over one reference batch (see ``batch_scale``).
    layer_axes: where each parameter stacks its layers (``None``: one layer per leaf; a pytree
      of ``int | None`` shaped like the parameters or a prefix of it; a callable ``(path, leaf)
      -> int | None``): each slice along a leaf's layer axis is a layer of its own, exactly as
      in the unrolled model (see :mod:`optax_lena._src.layer_axes`). The statistics must be
      made with the same ``layer_axes``.

  Raises:
    ValueError: at construction, for a field outside its domain (``eps`` < 0, ``beta`` outside
      (0, 1], ``power`` not positive, ``num_samples`` not a positive int), an unknown
      ``grouping``, a malformed ``layer_axes``, or one batch size without the other.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal: A Layer-Wise Adaptive Approach Toward
    Large-Scale DNN Training", WWW 2022: Eqs. 4, 5 and 8 (the per-layer ratio); Johnson et al.,
    "AdaScale SGD", ICML 2020 (one group); Goyal et al., 2017 (linear scaling, the ratio's cap).

  Examples:
    LENA's rule with one ratio per module, for a learning rate tuned at a batch of 64 while
    each per-worker gradient averages 32 examples: 8 per-worker gradients make k = 4
    reference batches, the ratio's cap.

    >>> import optax_lena as ol
    >>> rule = ol.GainRatioRule(
    ...   grouping="module", per_worker_batch_size=32, reference_batch_size=64
    ... )
    >>> rule.scale(8)
    4
    >>> ol.GainRatioRule(eps=-1.0)
    Traceback (most recent call last):
    ValueError: eps must be >= 0, got -1.0; the paper uses 1e-6.
  """

  adaptive: bool = True
  grouping: grouping_lib.Grouping = None
  beta: Any = None
  eps: Any = 1e-6
  num_samples: int | None = None
  power: float = 1.0
  per_worker_batch_size: int | None = None
  reference_batch_size: int | None = None
  layer_axes: layer_axes_lib.LayerAxes = None

  def __post_init__(self):
    grouping_lib.validate_grouping(self.grouping)
    layer_axes_lib.validate(self.layer_axes)
    checks.check_eps(self.eps)
    checks.check_beta(self.beta)
    checks.check_num_samples(self.num_samples)
    checks.check_power(self.power)
    batch_scale.check_batch_sizes(self.per_worker_batch_size, self.reference_batch_size)

  def scale(self, num_samples: int) -> int:
    """k, the number of reference batches in the global batch of S per-worker gradients."""
    return batch_scale.update_scale(
      num_samples, self.per_worker_batch_size, self.reference_batch_size
    )


def lena_rule(**kwargs: Any) -> GainRatioRule:
  """LENA's rule: one ratio per leaf (or per group of ``grouping=``); keywords as the class.

  Args:
    **kwargs: the fields of :class:`GainRatioRule` but ``adaptive`` (``grouping``, ``beta``,
      ``eps``, ``num_samples``, ``power``, the batch sizes, ``layer_axes``).

  Returns:
    The :class:`GainRatioRule` with ``adaptive=True``.

  Raises:
    ValueError: a field outside its domain (see :class:`GainRatioRule`).
    TypeError: a keyword that is not a field of :class:`GainRatioRule`.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal: A Layer-Wise Adaptive Approach Toward
    Large-Scale DNN Training", WWW 2022: Eqs. 4, 5 and 8.

  Examples:
    >>> import optax_lena as ol
    >>> rule = ol.lena_rule(grouping="module", eps=0.0)
    >>> rule.adaptive, rule.grouping, rule.eps
    (True, 'module', 0.0)
    >>> tx = ol.large_batch_sgd(0.1, rule, warmup_threshold=50.0)  # LENA, a ratio per module
  """
  return GainRatioRule(adaptive=True, **kwargs)


def adascale_rule(**kwargs: Any) -> GainRatioRule:
  """AdaScale's rule: one ratio for the whole model; keywords as :class:`GainRatioRule`.

  Args:
    **kwargs: the fields of :class:`GainRatioRule` but ``adaptive`` and ``grouping``.

  Returns:
    The :class:`GainRatioRule` with ``adaptive=True`` and ``grouping="global"``.

  Raises:
    ValueError: a field outside its domain (see :class:`GainRatioRule`).
    TypeError: a keyword that is not a field of :class:`GainRatioRule`, or ``grouping``.

  References:
    Johnson, Agrawal, Gu and Guestrin, "AdaScale SGD: A User-Friendly Algorithm for
    Distributed Training", ICML 2020; Ko, Lee and Kim, WWW 2022 (Eqs. 4, 5 and 8 with one
    group).

  Examples:
    >>> import optax_lena as ol
    >>> ol.adascale_rule(beta=0.1).grouping
    'global'
    >>> tx = ol.large_batch_adamw(1e-3, ol.adascale_rule(power=0.5))  # AdaScale-AdamW
  """
  return GainRatioRule(adaptive=True, grouping="global", **kwargs)


def linear_scaling_rule(**kwargs: Any) -> GainRatioRule:
  """Linear scaling's rule: ratio S for every leaf; keywords as :class:`GainRatioRule`.

  Args:
    **kwargs: the fields of :class:`GainRatioRule` but ``adaptive`` and ``grouping`` (``beta``
      and ``eps`` only shape the statistics that :func:`optax_lena.diagnostics` reports).

  Returns:
    The :class:`GainRatioRule` with ``adaptive=False`` and ``grouping="global"``.

  Raises:
    ValueError: a field outside its domain (see :class:`GainRatioRule`).
    TypeError: a keyword that is not a field of :class:`GainRatioRule`, or ``grouping``.

  References:
    Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017
    (Section 2.1); ``power=0.5``: the square-root rule (Malladi et al., NeurIPS 2022).

  Examples:
    >>> import optax_lena as ol
    >>> rule = ol.linear_scaling_rule(power=0.5)
    >>> rule.adaptive, rule.scale(16)  # ratio 16, the rate multiplied by 16 ** 0.5
    (False, 16)
  """
  return GainRatioRule(adaptive=False, grouping="global", **kwargs)


# The one identifier of each rule (rule names, the "rule=" strings, the examples' registry keys).
RULES = {"lena": lena_rule, "adascale": adascale_rule, "linear_scaling": linear_scaling_rule}
# Labels for tables and plots only; never accepted as rule names.
RULE_LABELS = {"lena": "LENA", "adascale": "AdaScale", "linear_scaling": "LSW"}
# Spellings used before one identifier was chosen: an error names the current one.
RENAMED_RULES = {"linear": "linear_scaling", "lsw": "linear_scaling", "LSW": "linear_scaling"}


def check_rule_name(rule: str) -> None:
  """Raises for an unknown rule name; an old spelling gets the current one in the message."""
  if rule in RULES:
    return
  if rule in RENAMED_RULES:
    raise ValueError(
      f"The gain-ratio rule {rule!r} is now called {RENAMED_RULES[rule]!r}: pass "
      f"rule={RENAMED_RULES[rule]!r} ({rule!r} is only a display label, if anything)."
    )
  raise ValueError(f"Unknown gain-ratio rule {rule!r}: use one of {sorted(RULES)}.")


def rule_from_name(
  rule: str | GainRatioRule,
  *,
  beta: Any = None,
  eps: Any = None,
  grouping: grouping_lib.Grouping = None,
  num_samples: int | None = None,
  per_worker_batch_size: int | None = None,
  reference_batch_size: int | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> GainRatioRule:
  """A rule by name with its hyper-parameters (``None``: the default), or a given rule."""
  if isinstance(rule, GainRatioRule):
    given = (
      beta,
      eps,
      grouping,
      num_samples,
      per_worker_batch_size,
      reference_batch_size,
      layer_axes,
    )
    if any(x is not None for x in given):
      raise ValueError(
        "Pass the hyper-parameters either inside the GainRatioRule or as keywords, not both."
      )
    return rule
  check_rule_name(rule)
  if grouping is not None and rule != "lena":
    raise ValueError(
      f"grouping applies to the layer-wise rule 'lena' only; rule {rule!r} uses one ratio "
      "for the whole model."
    )
  kwargs = {
    "beta": beta,
    "num_samples": num_samples,
    "per_worker_batch_size": per_worker_batch_size,
    "reference_batch_size": reference_batch_size,
    "layer_axes": layer_axes,
  }
  if eps is not None:
    kwargs["eps"] = eps
  if rule == "lena":
    kwargs["grouping"] = grouping
  return RULES[rule](**kwargs)


def init_gain_ratio_state(params: PyTree, rule: GainRatioRule | None = None) -> GainRatioState:
  """The state before the first update: one entry per layer of ``params`` (checked against the
  rule's ``layer_axes`` and ``grouping`` here, so that a misfit raises at ``init``)."""
  rule = GainRatioRule() if rule is None else rule
  layout = layer_axes_lib.resolve(rule.layer_axes, params)
  if rule.adaptive:
    grouping_lib.resolve_groups(rule.grouping, params, layout)
  n = layout.total
  # Distinct arrays for every field: a shared buffer could not be donated to a jitted step.
  return GainRatioState(
    count=jnp.zeros([], jnp.int32),
    sq_norm_mean_avg=jnp.zeros((n,), jnp.float32),
    mean_grad_sq_norm_avg=jnp.zeros((n,), jnp.float32),
    ratio=jnp.ones((n,), jnp.float32),
    global_ratio=jnp.ones([], jnp.float32),
    num_samples=jnp.zeros([], jnp.int32),
    power=jnp.asarray(rule.power, jnp.float32),
  )


def statistics_vectors(
  updates: PyTree,
  grad_stats: stats.GradStats | None,
  expected_num_samples: int | None,
  layout: layer_axes_lib.Layout,
) -> tuple[jax.Array, jax.Array, int]:
  """Per-layer ``top`` and ``bot`` (Eq. 4) as float32 vectors, and S, validated."""
  stats.check_grad_stats(grad_stats, expected_num_samples)
  assert grad_stats is not None  # for the type checker: check_grad_stats raised otherwise
  top = tree_utils.select_like(grad_stats.sq_norm_mean, updates, "grad_stats.sq_norm_mean")
  layout.check_stats(top, "grad_stats.sq_norm_mean")
  if grad_stats.mean_grad_sq_norm is None:
    bot = [
      layer_axes_lib.slice_sq_norms(u, a)
      for (_, u), a in zip(tree_utils.active_leaves_with_path(updates), layout.axes, strict=True)
    ]
  else:
    bot = tree_utils.select_like(
      grad_stats.mean_grad_sq_norm, updates, "grad_stats.mean_grad_sq_norm"
    )
    layout.check_stats(bot, "grad_stats.mean_grad_sq_norm")
  return layout.pack(top), layout.pack(bot), grad_stats.num_samples


def clipped_ratio(numerator: jax.Array, denominator: jax.Array, eps: Any, s: int) -> jax.Array:
  """``clip((A + eps) / (D + eps), 1, S)`` (Step 3), defined for eps = 0 too (S: the scale k).

  With eps = 0 a zero denominator means a zero mean gradient: ratio S if there is noise, and 1
  for a frozen layer (no gradient at all) rather than NaN.
  """
  num = numerator + eps
  den = denominator + eps
  safe_den = jnp.where(den > 0, den, 1.0)
  ratio = jnp.where(den > 0, num / safe_den, jnp.where(num > 0, float(s), 1.0))
  return jnp.clip(ratio, 1.0, float(s))


def _group_sum(values: jax.Array, groups: grouping_lib.Groups) -> jax.Array:
  if groups.is_per_leaf:
    return values
  if groups.num_groups == 1:
    return jnp.sum(values, keepdims=True)
  return jax.ops.segment_sum(values, jnp.asarray(groups.index), groups.num_groups)


def _to_leaves(per_group: jax.Array, groups: grouping_lib.Groups) -> jax.Array:
  if groups.is_per_leaf:
    return per_group
  if groups.num_groups == 1:
    return jnp.broadcast_to(per_group, (len(groups.index),))
  return per_group[jnp.asarray(groups.index)]


def advance_gain_ratio(
  state: GainRatioState, rule: GainRatioRule, updates: PyTree, grad_stats: stats.GradStats | None
) -> GainRatioState:
  """One update of the moving averages (Eq. 8) and the clipped ratios (Step 3).

  Args:
    state: the previous :class:`GainRatioState`.
    rule: the rule.
    updates: the updates the calling transformation receives (their structure, possibly masked,
      selects the statistics; their values are read only when the statistics lack
      ``mean_grad_sq_norm``).
    grad_stats: the statistics of this update.

  Returns:
    The new state; ``new_state.ratio`` holds this update's per-layer ratios.
  """
  layout = layer_axes_lib.resolve(rule.layer_axes, updates)
  top, bot, s = statistics_vectors(updates, grad_stats, rule.num_samples, layout)
  if top.shape != state.sq_norm_mean_avg.shape:
    raise ValueError(
      f"The optimizer state was initialised for {state.sq_norm_mean_avg.shape[0]} layers but "
      f"the update has {top.shape[0]}: call tx.init with the same parameter tree that the "
      "updates have (and build the optimizer with the same layer_axes)."
    )
  k = rule.scale(s)
  beta = min(s / 1000.0, 1.0) if rule.beta is None else rule.beta
  avg_top = beta * top + (1.0 - beta) * state.sq_norm_mean_avg
  avg_bot = beta * bot + (1.0 - beta) * state.mean_grad_sq_norm_avg

  def ratio_of(a: jax.Array, d: jax.Array) -> jax.Array:
    return clipped_ratio(batch_scale.reference_sq_norm(a, d, s, k), d, rule.eps, k)

  global_ratio = ratio_of(jnp.sum(avg_top), jnp.sum(avg_bot))
  if rule.adaptive:
    groups = grouping_lib.resolve_groups(rule.grouping, updates, layout)
    per_group = ratio_of(_group_sum(avg_top, groups), _group_sum(avg_bot, groups))
    ratio = _to_leaves(per_group, groups)
  else:
    ratio = jnp.full(top.shape, float(k), jnp.float32)
  return GainRatioState(
    count=optax.safe_increment(state.count),
    sq_norm_mean_avg=avg_top,
    mean_grad_sq_norm_avg=avg_bot,
    ratio=ratio,
    global_ratio=global_ratio,
    num_samples=jnp.asarray(s, jnp.int32),
    power=jnp.asarray(rule.power, jnp.float32),
  )


def is_uniform(rule: GainRatioRule, updates: PyTree) -> bool:
  """Whether the rule gives every layer the same ratio (linear scaling, one group)."""
  if not rule.adaptive:
    return True
  layout = layer_axes_lib.resolve(rule.layer_axes, updates)
  return grouping_lib.resolve_groups(rule.grouping, updates, layout).num_groups == 1


def rate_multiplier(ratio: jax.Array, power: Any) -> jax.Array:
  """``ratio ** power``, and exactly the ratio at power 1 (bitwise the paper's rule), also when
  the power is an array (``optax.inject_hyperparams``)."""
  if isinstance(power, (int, float)):
    return ratio if power == 1 else jnp.power(ratio, jnp.float32(power))
  power = jnp.asarray(power, jnp.float32)
  return jnp.where(power == 1.0, ratio, jnp.power(ratio, power))


def scale_active_leaves(
  updates: PyTree,
  factors: jax.Array,
  uniform: bool = False,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> PyTree:
  """Multiplies each layer of ``updates`` by its entry of ``factors`` (in float32, then back).

  A leaf without a layer axis is multiplied by its entry; a leaf with L layers by its L entries,
  broadcast along its layer axis. The factors reach the leaves' kernels as buffers of their own
  (``layer_axes.leaf_factors``: scalars, and one small vector per stacked leaf), not as slices
  of the vector at constant offsets: the kernels are then the same for all leaves of one shape,
  XLA compiles each once, as for SGD-momentum, and none of them recomputes the rule's
  arithmetic on the whole vector (benchmarks/overhead/RESULTS.md, section (i)). The values are
  the same either way (bitwise). ``uniform=True`` says that all entries are equal (a global
  rule): every leaf then reads ``factors[0]``.
  """
  layout = layer_axes_lib.resolve(layer_axes, updates)
  if uniform and factors.shape[0] > 0:
    per_leaf = [factors[0]] * len(layout.axes)
    axes: tuple[int | None, ...] = (None,) * len(layout.axes)
  else:
    per_leaf, axes = layer_axes_lib.leaf_factors(factors, layout), layout.axes

  def scale(k: int, u: jax.Array) -> jax.Array:
    return (u * layer_axes_lib.along_axis(per_leaf[k], u, axes[k])).astype(u.dtype)

  return tree_utils.map_active_indexed(scale, updates)


def scale_by_gain_ratio(rule: GainRatioRule) -> optax.GradientTransformationExtraArgs:
  """Multiplies each layer's update by its gain ratio (Eq. 5 without the base rate).

  With ``rule.power = p`` the multiplier is ``r_k ** p`` (in ``[1, k ** p]``). It reads the
  statistics ``grad_stats`` of the S per-worker gradients, and the values of the updates only
  when the statistics lack ``mean_grad_sq_norm``: chain it first, or give it complete
  statistics.

  Args:
    rule: the :class:`GainRatioRule`.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose update takes ``grad_stats=``.

  Raises:
    ValueError: at ``init``, for a ``grouping`` or ``layer_axes`` of the rule that does not
      fit the parameters; at ``update``, without ``grad_stats``, with statistics of another S
      than ``rule.num_samples`` or of another tree, or with updates shaped unlike the
      parameters.
    TypeError: ``grad_stats`` that is not a :class:`GradStats`.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal: A Layer-Wise Adaptive Approach Toward
    Large-Scale DNN Training", WWW 2022: Eq. 8 (the moving averages) and Eq. 5 (the clipped
    ratio, without the base rate); Johnson et al., ICML 2020 (AdaScale's gain ratio).

  Examples:
    Statistics made by hand for S = 4 per-worker gradients whose mean is ``gbar``:
    ``mean_i ||g_i||^2 = 6`` and ``||gbar||^2 = 3``. With ``eps=0`` the ratio is their ratio,
    2, in ``[1, S]``:

    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> gbar = {"w": jnp.ones(3)}
    >>> stats = ol.GradStats({"w": jnp.float32(6.0)}, 4, {"w": jnp.float32(3.0)})
    >>> tx = ol.scale_by_gain_ratio(ol.lena_rule(eps=0.0))
    >>> updates, state = tx.update(gbar, tx.init(gbar), grad_stats=stats)
    >>> print(state.ratio, updates["w"])
    [2.] [2. 2. 2.]
  """

  def init_fn(params):
    return init_gain_ratio_state(params, rule)

  def update_fn(updates, state, params=None, *, grad_stats=None, **extra_args):
    del extra_args
    checks.check_updates_like(updates, params, "parameter")
    new_state = advance_gain_ratio(state, rule, updates, grad_stats)
    multiplier = rate_multiplier(new_state.ratio, rule.power)
    uniform = is_uniform(rule, updates)
    return scale_active_leaves(updates, multiplier, uniform, rule.layer_axes), new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
