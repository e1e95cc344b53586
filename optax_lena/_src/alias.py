"""Ready optimizers: LENA, AdaScale and linear scaling (LSW), chained from the public blocks.

Each is ``skip_nonfinite_steps(chain(weight decay, momentum, gain ratio, warm-up, rate))``, the
momentum SGD of the paper's experiments (PyTorch semantics, docs/LENA.md Step 6):
``d = gbar + lambda w``, ``m <- mu m + d``, ``w <- w - eta_k m`` with
``eta_k = r_k * warmup_k * eta0 * schedule``. Every rule takes either warm-up: the state-aware
``warmup_threshold`` (theta, single-worker iterations) or the fixed ``warmup_steps`` (W, base
steps), which gives the paper's 3x3 ablation (Table 2).
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax
import optax

from optax_lena._src import checks, gain_ratio, nonfinite, schedule, warmup
from optax_lena._src import grouping as grouping_lib
from optax_lena._src import layer_axes as layer_axes_lib

PyTree = Any
# None (every leaf), a pytree of bools shaped like the parameters, or params -> such a pytree.
WeightDecayMask = PyTree | Callable[[PyTree], PyTree] | None


def large_batch_sgd(
  learning_rate: optax.ScalarOrSchedule,
  rule: gain_ratio.GainRatioRule,
  *,
  momentum: float | None = 0.9,
  nesterov: bool = False,
  weight_decay: float = 0.0,
  weight_decay_mask: WeightDecayMask = None,
  warmup_threshold: float | None = None,
  warmup_steps: float = 0,
  clock: str = "updates",
  warmup_progress: str = "ratio",
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> optax.GradientTransformationExtraArgs:
  """Momentum SGD whose per-layer rate is scaled by ``rule`` and warmed up.

  The chain behind :func:`lena`, :func:`adascale` and :func:`linear_scaling`, for any
  :class:`GainRatioRule` (e.g. LENA with ``eps=0``, or per-module ratios):
  ``skip_nonfinite_steps(chain(coupled weight decay, momentum, gain ratio, warm-up, -eta0 *
  schedule))``, i.e. ``m <- mu m + gbar + lambda w`` and ``w <- w - r_k ** p * warmup_k * eta0 *
  schedule(t) * m`` for every layer k.

  Args:
    learning_rate: eta0 at the per-worker batch size, a float or an Optax schedule.
    rule: the gain-ratio rule.
    momentum: mu in [0, 1) (None or 0 for none).
    nesterov: Nesterov momentum.
    weight_decay: lambda >= 0, coupled (added to the gradient before momentum, as in PyTorch).
    weight_decay_mask: which leaves get weight decay: None (all), a pytree of bools shaped like
      the parameters (True: decayed) or a callable ``params -> such a pytree``, as
      ``optax.adamw(mask=)``; e.g. exclude biases and normalisation scales.
    warmup_threshold: theta of the state-aware warm-up, or None.
    warmup_steps: W of the fixed warm-up in base steps, or 0.
    clock: ``"updates"`` or ``"samples"`` for the schedule.
    warmup_progress: how the state-aware warm-up's progress advances (``progress=`` of
      :func:`layerwise_warmup`; ``"ratio"`` is the paper's rule).
    layer_axes: where each parameter stacks its layers (see :func:`optax_lena.lena`), for a
      rule built without them (not both).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` taking ``grad_stats=``.

  Raises:
    ValueError: at construction, for a hyper-parameter outside its domain (learning rate,
      momentum, weight decay, warm-up length), both warm-ups at once, an unknown ``clock`` or
      ``warmup_progress``, or ``layer_axes`` given here and in ``rule``; at ``init``, for a
      ``weight_decay_mask`` or a rule's ``grouping`` / ``layer_axes`` that does not fit the
      parameters; at ``update``, without ``grad_stats`` or with statistics of another S than
      the rule's ``num_samples``.
    TypeError: a ``learning_rate`` that is neither a number nor a schedule, or ``grad_stats``
      that is not a :class:`optax_lena.GradStats`.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal: A Layer-Wise Adaptive Approach Toward
    Large-Scale DNN Training", WWW 2022: Eq. 5 (the layer's rate), Eqs. 6-7 and Algorithm 1
    (the state-aware warm-up), with the momentum SGD and coupled weight decay of its
    experiments.

  Examples:
    LENA's rule without its stabiliser (``eps=0``: exactly invariant to the gradients' scale)
    and with the fixed warm-up, one update from S = 4 per-worker gradients:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    >>> loss_fn = lambda p, x: jnp.mean((x @ p["w"] + p["b"]) ** 2)
    >>> xs = jax.random.normal(jax.random.key(0), (4, 8, 3))  # 4 batches of 8 examples
    >>> per_worker = jax.vmap(jax.grad(loss_fn), (None, 0))(params, xs)  # S = 4 workers
    >>> grads, stats = ol.stacked_grad_stats(per_worker)
    >>> tx = ol.large_batch_sgd(0.1, ol.lena_rule(eps=0.0), warmup_steps=8)
    >>> opt_state = tx.init(params)
    >>> updates, opt_state = tx.update(grads, opt_state, params, grad_stats=stats)
    >>> lr = ol.diagnostics(opt_state, params)["lr_multiplier"]  # r_k * min(t S / W, 1)
    >>> print({name: round(float(x), 3) for name, x in lr.items()})
    {'b': 2.0, 'w': 0.611}
  """
  rule = with_layer_axes(rule, layer_axes)
  checks.check_momentum(momentum)
  checks.check_weight_decay(weight_decay)
  inner: list[optax.GradientTransformation] = []
  if not is_zero(weight_decay):
    inner.append(decayed_weights(weight_decay, weight_decay_mask))
  if momentum is not None and not is_zero(momentum):
    inner.append(_momentum(momentum, nesterov))
  return gain_ratio_chain(
    inner,
    learning_rate,
    rule,
    warmup_threshold=warmup_threshold,
    warmup_steps=warmup_steps,
    clock=clock,
    warmup_progress=warmup_progress,
  )


def gain_ratio_chain(
  inner: list[optax.GradientTransformation],
  learning_rate: optax.ScalarOrSchedule,
  rule: gain_ratio.GainRatioRule,
  *,
  warmup_threshold: float | None,
  warmup_steps: float,
  clock: str,
  warmup_progress: str,
) -> optax.GradientTransformationExtraArgs:
  """``skip_nonfinite_steps(chain(*inner, gain ratio, warm-up, rate))``: the one place that puts
  a rule, a warm-up and the base rate after an inner update (momentum SGD or Adam)."""
  checks.check_learning_rate(learning_rate)
  checks.check_warmup_steps(warmup_steps)
  schedule.check_clock(clock)
  if warmup_threshold is not None and _may_be_nonzero(warmup_steps):
    raise ValueError(
      "Choose one warm-up: warmup_threshold (state-aware, layer-wise) or warmup_steps (fixed "
      "linear), not both."
    )
  batches: dict[str, Any] = {
    "per_worker_batch_size": rule.per_worker_batch_size,
    "reference_batch_size": rule.reference_batch_size,
  }
  blocks = [*inner, gain_ratio.scale_by_gain_ratio(rule)]
  if warmup_threshold is not None:
    blocks.append(warmup.layerwise_warmup(warmup_threshold, rule=rule, progress=warmup_progress))
  elif not is_zero(warmup_steps):
    blocks.append(warmup.fixed_warmup(warmup_steps, num_samples=rule.num_samples, **batches))
  blocks.append(schedule.scale_by_learning_rate(learning_rate, clock=clock, **batches))
  return nonfinite.skip_nonfinite_steps(optax.chain(*blocks), layer_axes=rule.layer_axes)


def with_layer_axes(
  rule: gain_ratio.GainRatioRule, layer_axes: layer_axes_lib.LayerAxes
) -> gain_ratio.GainRatioRule:
  """``rule`` with ``layer_axes`` (given to an optimizer that takes a rule), refusing two."""
  if layer_axes is None:
    return rule
  if rule.layer_axes is not None:
    raise ValueError(
      "layer_axes was given both to the optimizer and inside its GainRatioRule: pass it once, "
      "either as layer_axes= or in the rule (e.g. ol.lena_rule(layer_axes=...))."
    )
  return dataclasses.replace(rule, layer_axes=layer_axes)


def decayed_weights(
  weight_decay: float, mask: WeightDecayMask = None
) -> optax.GradientTransformation:
  """``optax.add_decayed_weights(weight_decay, mask)`` whose mask is checked against the
  parameters at ``init`` (optax would fail later, inside the update, without naming the fix)."""
  base = optax.add_decayed_weights(weight_decay, mask)
  if mask is None:
    return base

  def init_fn(params):
    labels = mask(params) if callable(mask) else mask
    labels_def: Any = jax.tree.structure(labels)
    if labels_def != jax.tree.structure(params):
      raise ValueError(
        "weight_decay_mask must have the structure of the parameters (one bool per leaf, True "
        f"for the leaves that get weight decay), got {jax.tree.structure(labels)} for "
        f"parameters {jax.tree.structure(params)}. Build it from the parameters, e.g. "
        "weight_decay_mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)."
      )
    return base.init(params)

  return optax.GradientTransformation(init_fn, base.update)


def _momentum(decay: float, nesterov: bool) -> optax.GradientTransformation:
  """``optax.trace`` (same state, same values) that reads its updates from the buffer it keeps.

  Inside :func:`skip_nonfinite_steps` the new buffer is selected here rather than by the
  wrapper, so that the momentum XLA writes is the one the parameter update reads (see
  ``nonfinite.keep_state_on_skipped_step``); on a skipped step the buffer is unchanged, as before,
  and the updates are zeroed by the wrapper.
  """
  base = optax.trace(decay=decay)

  def update_fn(updates, state, params=None):
    # Also without params: the buffer has the parameters' shapes (stacked [S, ...] gradients).
    checks.check_updates_like(updates, state.trace, "momentum buffer (shaped like the parameter)")
    _, new_state = base.update(updates, state, params)
    trace = nonfinite.keep_state_on_skipped_step(new_state.trace, state.trace)
    updates = jax.tree.map(lambda g, t: g + decay * t, updates, trace) if nesterov else trace
    return updates, optax.TraceState(trace=trace)

  return optax.GradientTransformation(base.init, update_fn)


def _may_be_nonzero(x: Any) -> bool:
  """False for a concrete 0 (also the array 0 that optax.inject_hyperparams makes of the default
  warmup_steps=0) and for a traced value (inject_hyperparams' init saw it concrete)."""
  value = checks.concrete_value(x)
  return value is not None and value != 0


def is_zero(x: Any) -> bool:
  """A hyper-parameter that is literally 0 (injected hyper-parameters are arrays: kept)."""
  return isinstance(x, (int, float)) and x == 0


# The options of an alias that configure its rule (the others configure the optimizer around it).
RULE_OPTIONS = frozenset(f.name for f in dataclasses.fields(gain_ratio.GainRatioRule)) - {
  "adaptive"
}


def with_rule(
  make_rule: Callable[..., gain_ratio.GainRatioRule],
  make_optimizer: Callable[..., optax.GradientTransformationExtraArgs],
  options: Mapping[str, Any],
) -> optax.GradientTransformationExtraArgs:
  """``make_optimizer(learning_rate, make_rule(**rule options), **other options)``.

  How every alias turns its arguments (``options``: its ``locals()`` on entry) into a rule and an
  optimizer, in one place: an option reaches the rule when it is a field of
  :class:`GainRatioRule`, the optimizer otherwise, so no alias can drop one (an option neither
  takes is a ``TypeError`` at construction).
  """
  rest = dict(options)
  learning_rate = rest.pop("learning_rate")
  rule = make_rule(**{k: rest.pop(k) for k in sorted(RULE_OPTIONS & rest.keys())})
  return make_optimizer(learning_rate, rule, **rest)


# Docstring entries (Args, Raises) that read the same in several aliases, written once: a
# docstring line ``{key}`` (alone, indented like the entries) becomes these entries (see
# ``shared_args``).
SHARED_ARGS: dict[str, tuple[str, ...]] = {
  "weight_decay_mask": (
    "weight_decay_mask: which leaves get weight decay (None: all; a pytree of bools or a "
    "callable ``params -> pytree of bools``, as ``optax.adamw(mask=)``).",
  ),
  "power": (
    "power: p, each layer's rate is multiplied by ``r ** p`` instead of r (see "
    ":class:`optax_lena.GainRatioRule`); the warm-up still counts single-worker iterations.",
  ),
  "power_adamw": (
    "power: p, the rate multiplier is ``r ** p``; 0.5 (the default) is the square-root rule for "
    "Adam, 1 the linear rule.",
  ),
  "reference_batch": (
    "per_worker_batch_size: b, the batch of each per-worker gradient (with "
    "``reference_batch_size``).",
    "reference_batch_size: b0, the batch at which ``learning_rate`` was tuned, when it is not the "
    "per-worker batch: the scale becomes ``k = S b / b0`` (the ratio's cap, linear scaling's "
    "factor, the sample clock and the warm-ups' base steps; ``warmup_threshold`` and "
    "``warmup_steps`` then count iterations at batch b0). ``S b`` must be a multiple of b0.",
  ),
  "layer_axes": (
    "layer_axes: where each parameter stacks its layers (``lax.scan`` / ``nn.scan`` models): "
    "None (one layer per leaf), a pytree of ``int | None`` shaped like the parameters (or a "
    "prefix of it) or a callable ``(path, leaf) -> int | None``. Each slice along a layer axis "
    "is a layer of its own (ratio, warm-up, diagnostics), as in the unrolled model; give the "
    "statistics the same ``layer_axes``.",
  ),
  "layer_axes_of_rule": (
    "layer_axes: where each parameter stacks its layers (see :func:`optax_lena.lena`), for a "
    "rule built without them (not both).",
  ),
  "global_warmup_progress": (
    "warmup_progress: how the state-aware warm-up's progress advances (``progress=`` of "
    ":func:`optax_lena.layerwise_warmup`); under this global rule both variants equal the fixed "
    "warm-up of ``warmup_threshold`` base steps.",
  ),
  "adam": (
    "b1: Adam's first-moment decay.",
    "b2: Adam's second-moment decay.",
    "adam_eps: Adam's eps (added to the root of the second moment).",
  ),
  "construction_errors": (
    "ValueError: at construction, for a hyper-parameter outside its domain (e.g. a learning "
    "rate that is not positive, a momentum or an Adam beta outside [0, 1), a negative weight "
    "decay, eps or warm-up length), both warm-ups at once, an unknown ``clock``, "
    "``warmup_progress`` or ``grouping``, or one of "
    "``per_worker_batch_size`` / ``reference_batch_size`` without the other; at ``init``, for a "
    "``grouping``, ``layer_axes`` or ``weight_decay_mask`` that does not fit the parameters; at "
    "``update``, without ``grad_stats``, with statistics of another S than ``num_samples``, or "
    "with gradients shaped unlike the parameters.",
    "TypeError: a ``learning_rate`` that is neither a number nor a schedule, or ``grad_stats`` "
    "that is not a :class:`optax_lena.GradStats`.",
  ),
  "adamw_clock": (
    'clock: ``"updates"`` or ``"samples"``.',
    "num_samples: the S the statistics must have, or None.",
    "warmup_progress: the state-aware warm-up's progress rule.",
  ),
}

F = TypeVar("F", bound=Callable[..., Any])


def shared_args(fn: F) -> F:
  """Fills the ``{key}`` lines of ``fn``'s docstring with ``SHARED_ARGS[key]``, indented and
  wrapped like the entries around them (``help(fn)`` shows every argument)."""

  def entries(match: re.Match[str]) -> str:
    indent = match.group(1)
    return "\n".join(
      textwrap.fill(text, 100, initial_indent=indent, subsequent_indent=indent + "  ")
      for text in SHARED_ARGS[match.group(2)]
    )

  assert fn.__doc__ is not None
  fn.__doc__ = re.sub(r"^( *)\{(\w+)\}$", entries, fn.__doc__, flags=re.MULTILINE)
  return fn


@shared_args
def lena(
  learning_rate: optax.ScalarOrSchedule,
  *,
  momentum: float | None = 0.9,
  weight_decay: float = 0.0,
  weight_decay_mask: WeightDecayMask = None,
  warmup_threshold: float | None = None,
  eps: float = 1e-6,
  beta: float | None = None,
  grouping: grouping_lib.Grouping = None,
  warmup_steps: float = 0,
  nesterov: bool = False,
  clock: str = "updates",
  num_samples: int | None = None,
  warmup_progress: str = "ratio",
  power: float = 1.0,
  per_worker_batch_size: int | None = None,
  reference_batch_size: int | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> optax.GradientTransformationExtraArgs:
  """LENA: layer-wise gain ratios with the layer-wise state-aware warm-up (docs/LENA.md 1-6).

  Momentum SGD in which every layer k (a parameter leaf, a group of ``grouping=``, or a slice
  along a ``layer_axes`` axis) gets its own rate ``r_k * warmup_k * eta0 * schedule(t)``. The
  gain ratio ``r_k`` in ``[1, S]`` estimates how many single-worker iterations the update of
  S per-worker gradients is worth for that layer, from the moving averages of their statistics:
  near S where the gradient noise dominates (linear scaling), near 1 where the signal does. The
  state-aware warm-up advances each layer's progress by its ratio and scales its rate by
  ``min(progress / theta, 1)``, so noisy layers leave the warm-up first. The update needs the
  statistics of the per-worker gradients: ``tx.update(grads, state, params, grad_stats=stats)``
  with ``(grads, stats)`` from :func:`stacked_grad_stats`, :func:`all_reduce_grad_stats` or
  :func:`accumulate_grad_stats`.

  Args:
    learning_rate: eta0, the rate of one worker at the per-worker batch size (float or schedule).
    momentum: mu.
    weight_decay: lambda, coupled and therefore scaled by the layer's rate.
    {weight_decay_mask}
    warmup_threshold: theta in single-worker iterations (``alpha * T1``); None disables it.
    eps: stabiliser of the ratio (1e-6); 0 makes the ratio exactly scale invariant.
    beta: moving-average weight of new statistics; None means ``min(S / 1000, 1)``.
    grouping: which leaves share a ratio and a warm-up (None: one per leaf; ``"module"``; a
      label pytree; a callable ``(path, leaf) -> label``).
    warmup_steps: a fixed linear warm-up of W base steps instead (ablation; excludes
      ``warmup_threshold``).
    nesterov: Nesterov momentum.
    clock: ``"updates"`` (Optax convention) or ``"samples"`` (base steps t * S) for schedules.
    num_samples: the S the statistics must have (checked at trace time), or None. With None a
      change of S between updates is accepted (the clip and the default beta follow the new
      S); the state's last S is traced under ``jit`` and cannot be compared at trace time, so
      pass ``num_samples=S`` to make a change an error.
    warmup_progress: how a layer's warm-up progress advances: ``"ratio"`` (the paper, the
      default), or ``"relative_to_max"`` / ``"relative_to_mean"``, whose warm-up length does not
      grow with S / r (see :func:`optax_lena.layerwise_warmup`).
    {power}
    {reference_batch}
    {layer_axes}

  Returns:
    An ``optax.GradientTransformationExtraArgs``: ``update(grads, state, params,
    grad_stats=stats)``.

  Raises:
    {construction_errors}

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal: A Layer-Wise Adaptive Approach Toward
    Large-Scale DNN Training", WWW 2022: Eq. 4 (the statistics of the S per-worker gradients),
    Eq. 8 (their moving averages), Eq. 5 (the layer's rate ``r_k eta0``), Eqs. 6-7 and
    Algorithm 1, lines 17-21 (the state-aware warm-up); docs/LENA.md, Steps 1-6, with the
    places where the authors' code differs from the paper.

    Related layer-wise rules: LARS (You, Gitman and Ginsburg, "Large Batch Training of
    Convolutional Networks", 2017) and LAMB (You et al., "Large Batch Optimization for Deep
    Learning: Training BERT in 76 Minutes", ICLR 2020) scale a layer's rate by the trust ratio
    of its weight norm to its update norm (``optax.lars``, ``optax.lamb``); LENA scales it by
    the gain ratio of the layer's gradient noise.

  Examples:
    One update from S = 4 per-worker gradients (stacked on a leading axis, as ``jax.vmap``
    over the workers' batches gives them; inside ``pmap`` / ``shard_map`` use
    :func:`all_reduce_grad_stats` instead):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import optax_lena as ol
    >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    >>> loss_fn = lambda p, x: jnp.mean((x @ p["w"] + p["b"]) ** 2)
    >>> xs = jax.random.normal(jax.random.key(0), (4, 8, 3))  # 4 batches of 8 examples
    >>> per_worker = jax.vmap(jax.grad(loss_fn), (None, 0))(params, xs)  # S = 4 workers
    >>> grads, stats = ol.stacked_grad_stats(per_worker)
    >>> tx = ol.lena(0.1, weight_decay=5e-4, warmup_threshold=20.0)
    >>> opt_state = tx.init(params)
    >>> updates, opt_state = tx.update(grads, opt_state, params, grad_stats=stats)
    >>> params = optax.apply_updates(params, updates)

    The bias's gradients are mostly noise, so its ratio is at the cap S = 4; the kernel's are
    mostly signal. Each layer's warm-up advanced by its ratio (of theta = 20):

    >>> diag = ol.diagnostics(opt_state, params)
    >>> print({name: round(float(r), 3) for name, r in diag["gain_ratio"].items()})
    {'b': 4.0, 'w': 1.221}
    >>> print({name: round(float(f), 3) for name, f in diag["warmup_factor"].items()})
    {'b': 0.2, 'w': 0.061}
  """
  return with_rule(gain_ratio.lena_rule, large_batch_sgd, locals())


@shared_args
def adascale(
  learning_rate: optax.ScalarOrSchedule,
  *,
  momentum: float | None = 0.9,
  weight_decay: float = 0.0,
  weight_decay_mask: WeightDecayMask = None,
  warmup_threshold: float | None = None,
  eps: float = 1e-6,
  beta: float | None = None,
  warmup_steps: float = 0,
  nesterov: bool = False,
  clock: str = "updates",
  num_samples: int | None = None,
  warmup_progress: str = "ratio",
  power: float = 1.0,
  per_worker_batch_size: int | None = None,
  reference_batch_size: int | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> optax.GradientTransformationExtraArgs:
  """AdaScale SGD: one gain ratio for the whole model (the paper's AS baseline).

  Args:
    learning_rate: eta0 (float or schedule).
    momentum: mu.
    weight_decay: lambda (coupled).
    {weight_decay_mask}
    warmup_threshold: state-aware warm-up advancing by the global ratio R, or None (the
      paper's AdaScale default).
    eps: stabiliser of the ratio.
    beta: moving-average weight; None means ``min(S / 1000, 1)``.
    warmup_steps: fixed linear warm-up in base steps (excludes ``warmup_threshold``).
    nesterov: Nesterov momentum.
    clock: ``"updates"`` or ``"samples"``.
    num_samples: expected S, or None.
    {global_warmup_progress}
    {power}
    {reference_batch}
    {layer_axes}

  Returns:
    An ``optax.GradientTransformationExtraArgs`` taking ``grad_stats=``.

  Raises:
    {construction_errors}

  References:
    Johnson, Agrawal, Gu and Guestrin, "AdaScale SGD: A User-Friendly Algorithm for
    Distributed Training", ICML 2020 (the gain ratio of the summed moving averages); it is
    the AS baseline of Ko, Lee and Kim, WWW 2022 (Eqs. 4, 5 and 8 with one
    group for the whole model).

  Examples:
    One gain ratio, the same for every layer, from S = 4 per-worker gradients:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    >>> loss_fn = lambda p, x: jnp.mean((x @ p["w"] + p["b"]) ** 2)
    >>> xs = jax.random.normal(jax.random.key(0), (4, 8, 3))  # 4 batches of 8 examples
    >>> per_worker = jax.vmap(jax.grad(loss_fn), (None, 0))(params, xs)  # S = 4 workers
    >>> grads, stats = ol.stacked_grad_stats(per_worker)
    >>> tx = ol.adascale(0.1, weight_decay=5e-4)
    >>> opt_state = tx.init(params)
    >>> updates, opt_state = tx.update(grads, opt_state, params, grad_stats=stats)
    >>> diag = ol.diagnostics(opt_state, params)
    >>> print(round(float(diag["global_ratio"]), 3))
    1.304
    >>> print({name: round(float(r), 3) for name, r in diag["gain_ratio"].items()})
    {'b': 1.304, 'w': 1.304}
  """
  return with_rule(gain_ratio.adascale_rule, large_batch_sgd, locals())


@shared_args
def linear_scaling(
  learning_rate: optax.ScalarOrSchedule,
  *,
  momentum: float | None = 0.9,
  weight_decay: float = 0.0,
  weight_decay_mask: WeightDecayMask = None,
  warmup_steps: float = 0,
  warmup_threshold: float | None = None,
  nesterov: bool = False,
  clock: str = "updates",
  num_samples: int | None = None,
  warmup_progress: str = "ratio",
  power: float = 1.0,
  per_worker_batch_size: int | None = None,
  reference_batch_size: int | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> optax.GradientTransformationExtraArgs:
  """Linear scaling with warm-up (LSW): every layer's rate is S * eta0 (``S ** p * eta0``).

  Args:
    learning_rate: eta0 (float or schedule).
    momentum: mu.
    weight_decay: lambda (coupled).
    {weight_decay_mask}
    warmup_steps: W of the fixed linear warm-up in base steps (the paper: 5.5% of training).
    warmup_threshold: a state-aware warm-up instead (progress advances by S each update).
    nesterov: Nesterov momentum.
    clock: ``"updates"`` or ``"samples"``.
    num_samples: expected S, or None.
    {global_warmup_progress}
    {power}
    {reference_batch}
    {layer_axes}

  Returns:
    An ``optax.GradientTransformationExtraArgs`` taking ``grad_stats=``.

  Raises:
    {construction_errors}

  References:
    Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017
    (Section 2.1: the linear scaling rule; Section 2.2: the gradual warm-up), the LSW baseline
    of Ko, Lee and Kim, WWW 2022; ``power=0.5`` is the square-root rule (Krizhevsky, "One weird
    trick for parallelizing convolutional neural networks", 2014; for adaptive optimizers
    Malladi, Lyu, Panigrahi and Arora, "On the SDEs and Scaling Rules for Adaptive Gradient
    Algorithms", NeurIPS 2022).

  Examples:
    Every layer at S = 4 times the rate, warmed up over W = 8 base steps: the first update of
    S = 4 per-worker gradients is at ``min(t S / W, 1) = 1/2`` of it.

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    >>> loss_fn = lambda p, x: jnp.mean((x @ p["w"] + p["b"]) ** 2)
    >>> xs = jax.random.normal(jax.random.key(0), (4, 8, 3))  # 4 batches of 8 examples
    >>> per_worker = jax.vmap(jax.grad(loss_fn), (None, 0))(params, xs)  # S = 4 workers
    >>> grads, stats = ol.stacked_grad_stats(per_worker)
    >>> tx = ol.linear_scaling(0.1, warmup_steps=8)
    >>> opt_state = tx.init(params)
    >>> updates, opt_state = tx.update(grads, opt_state, params, grad_stats=stats)
    >>> lr = ol.diagnostics(opt_state, params)["lr_multiplier"]
    >>> print({name: float(x) for name, x in lr.items()})
    {'b': 2.0, 'w': 2.0}
  """
  return with_rule(gain_ratio.linear_scaling_rule, large_batch_sgd, locals())
