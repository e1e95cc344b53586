"""What the optimizer is doing, per layer: ratios, warm-up, rates and gradient noise scales."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from optax_lena._src import gain_ratio, nonfinite, tree_utils, warmup
from optax_lena._src import layer_axes as layer_axes_lib

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
  """The simple gradient noise scale ``B_simple = tr(Sigma) / |G|^2``, in per-worker batches.

  With ``top = mean_i ||g_i||^2`` (batch b) and ``bot = ||gbar||^2`` (batch S b), the unbiased
  estimates of McCandlish et al. (2018, Appendix A) are
  ``|G|^2 = (S bot - top) / (S - 1)`` and ``tr(Sigma) = b S (top - bot) / (S - 1)``, so
  ``B_simple / b = S (top - bot) / (S bot - top)``. Multiply by the per-worker batch size for
  examples. Infinite when the signal estimate is not positive (noise dominates); NaN for S < 2,
  where the noise cannot be estimated.

  Args:
    sq_norm_mean: ``top``, the mean squared norm of the S per-worker gradients (or its moving
      average), a float or an array of them (one per layer).
    mean_grad_sq_norm: ``bot``, the squared norm of their mean (or its moving average), shaped
      like ``sq_norm_mean``.
    s: S, the number of per-worker gradients.

  Returns:
    ``B_simple / b``, float32, shaped like the statistics.

  References:
    McCandlish, Kaplan, Amodei and the OpenAI Dota Team, "An Empirical Model of Large-Batch
    Training", 2018: the simple noise scale (Eq. 2.8) and its unbiased estimates (Appendix A).

  Examples:
    >>> import optax_lena as ol
    >>> print(ol.noise_scale(2.0, 1.0, 4))  # 4 (2 - 1) / (4 * 1 - 2)
    2.0
    >>> print(ol.noise_scale(2.0, 0.4, 4), ol.noise_scale(2.0, 1.0, 1))  # noise only; S < 2
    inf nan
  """
  s = jnp.asarray(s, jnp.float32)
  signal = s * mean_grad_sq_norm - sq_norm_mean
  noise = s * (sq_norm_mean - mean_grad_sq_norm)
  safe = jnp.where(signal > 0, signal, 1.0)
  out = jnp.where(signal > 0, noise / safe, jnp.inf)
  return jnp.where(s >= 2, out, jnp.nan)


def expected_speedup(critical_batch: Any, current_scale: Any, candidate_scales: Any) -> jax.Array:
  """Fewer updates (a factor) to the same loss at each candidate scale S' than at the current S.

  The critical batch B_crit of McCandlish et al. (2018, Section 2.2) is estimated by the noise
  scale B_simple. Below it, an update over k times more samples does nearly the work of k
  updates; above it the return of a larger batch diminishes: the updates to a given loss number
  about ``S_min (1 + B_crit / B)`` at batch B. Hence the factor is
  ``(1 + B_crit / S) / (1 + B_crit / S')`` with B_crit in per-worker batches, ``S' / S`` when the
  noise dominates the estimate (B_crit infinite), NaN where it cannot be estimated (S < 2). At
  ``S = 1`` it is the expected gain ratio of S' workers, ``E[r] = (1 + B) / (1 + B / S')``.

  Args:
    critical_batch: B_crit in per-worker batches (e.g. ``diagnostics(...)["critical_batch_size"]``).
    current_scale: S, the number of per-worker gradients of the current updates.
    candidate_scales: the candidate S', a number or an array of them.

  Returns:
    float32, shaped like ``candidate_scales``: the factor for each candidate (above 1: fewer
    updates than at S).

  References:
    McCandlish, Kaplan, Amodei and the OpenAI Dota Team, "An Empirical Model of Large-Batch
    Training", 2018, Section 2.2 (Eq. 2.11: the steps to a given loss, ``S_min (1 + B_crit /
    B)``).

  Examples:
    >>> import optax_lena as ol
    >>> speedup = ol.expected_speedup(4.0, 4, [8, 16, 64])  # B_crit = S = 4: at most 2
    >>> print([round(float(x), 3) for x in speedup])
    [1.333, 1.6, 1.882]
  """
  b = jnp.asarray(critical_batch, jnp.float32)
  s = jnp.asarray(current_scale, jnp.float32)
  c = jnp.asarray(candidate_scales, jnp.float32)
  finite = jnp.isfinite(b)
  safe_b = jnp.where(finite, b, 0.0)
  out = jnp.where(finite, (1.0 + safe_b / s) / (1.0 + safe_b / c), c / s)
  return jnp.where(jnp.isnan(b), jnp.nan, out)


def _find_states(opt_state: PyTree) -> dict[type, list[Any]]:
  found: dict[type, list[Any]] = {t: [] for t in _STATES}
  for kind in _STATES:

    def is_kind(x: Any, kind: type = kind) -> bool:
      return isinstance(x, kind)

    for leaf in jax.tree.leaves(opt_state, is_leaf=is_kind):
      if is_kind(leaf):
        found[kind].append(leaf)
  # The warm-up's private copy of its rule's state is not a rule of its own.
  inner = {id(w.ratio_state) for w in found[warmup.LayerwiseWarmupState]}
  found[gain_ratio.GainRatioState] = [
    s for s in found[gain_ratio.GainRatioState] if id(s) not in inner
  ]
  return found


def diagnostics(
  opt_state: PyTree,
  params: PyTree | None = None,
  *,
  candidate_scales: Sequence[float] | jax.Array | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> dict[str, Any]:
  """Per-layer gain ratios, warm-up state, rate multipliers and noise scales (jittable).

  Args:
    opt_state: the state of an optax_lena optimizer (or of any chain containing its blocks),
      also ``nnx.Optimizer(...).opt_state``.
    params: optional parameters (or any tree shaped like them); when given, per-layer entries
      are returned as trees shaped like it instead of vectors in ``jax.tree.leaves`` order.
    candidate_scales: optional numbers of per-worker gradients S' to consider for the next
      updates; adds ``expected_speedup`` (one entry per candidate).
    layer_axes: the optimizer's ``layer_axes``, with ``params``: a leaf with L stacked layers
      then gets a length-L vector in the trees (one entry per slice).

  Returns:
    A dict with, per layer (a leaf, or a slice of a leaf with a layer axis): ``gain_ratio`` (r_k of
    the last update), ``warmup_progress`` (P_k, 0 without a state-aware warm-up), ``warmup_factor``,
    ``lr_multiplier`` (``r_k ** p * warmup_factor_k``, p the rule's power: the layer's rate is this
    times ``eta0 * schedule``), ``warmup_end_step`` (int32, the 1-based update at which the layer's
    warm-up ended; the sentinel ``-1`` means "not ended yet", and is also reported without a
    state-aware warm-up, where no layer has a warm-up of its own to end) and ``noise_scale``
    (B_simple in per-worker batches, ``inf`` when noise dominates the estimate and NaN for S < 2,
    see :func:`noise_scale`); and the scalars ``global_ratio`` (AdaScale's R),
    ``global_noise_scale``, ``critical_batch_size`` (McCandlish et al.'s critical batch estimated by
    the global noise scale, in per-worker batches: multiply by the per-worker batch size for
    examples; see :func:`expected_speedup`; both count every layer, every slice of a stacked leaf
    included), ``num_samples`` (S of the last update), ``num_updates`` and ``num_skipped_steps``;
    with ``candidate_scales``, ``expected_speedup``: for each candidate S', the factor by which the
    updates needed for the same progress shrink at S' per-worker gradients instead of the current S
    (above 1: fewer updates; see :func:`expected_speedup`). All from the statistics already in the
    state. Per-layer entries are vectors in ``jax.tree.leaves`` order (a stacked leaf's L layers
    consecutive), or trees shaped like ``params`` when it is given (Flax NNX ``Variable`` wrappers
    such as ``Param`` are removed, so the trees hold plain arrays). For logging use
    :func:`flat_diagnostics`, whose values are finite Python floats keyed by parameter path.

  Raises:
    ValueError: ``opt_state`` without exactly one gain-ratio rule's state (or with two warm-ups
      of a kind), or ``params`` with another number of layers than the state.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal: A Layer-Wise Adaptive Approach Toward
    Large-Scale DNN Training", WWW 2022: the ratios (Eq. 5), the warm-up's progress and end
    (Eqs. 6-7, Figure 7); McCandlish et al., "An Empirical Model of Large-Batch Training",
    2018: the noise scales and the critical batch (Section 2.2, Appendix A).

  Examples:
    One LENA update from statistics made by hand (S = 4); each layer's rate multiplier is its
    ratio times its warm-up factor ``ratio / theta``:

    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> params = {"b": jnp.ones(2), "w": jnp.ones((2, 2))}  # used as the mean gradient too
    >>> stats = ol.GradStats(  # made by hand: S = 4, mean_i ||g_i||^2 and ||gbar||^2
    ...   {"b": jnp.float32(8.0), "w": jnp.float32(10.0)}, 4,
    ...   {"b": jnp.float32(2.0), "w": jnp.float32(4.0)},
    ... )
    >>> tx = ol.lena(0.1, warmup_threshold=10.0)
    >>> _, opt_state = tx.update(params, tx.init(params), params, grad_stats=stats)
    >>> diag = ol.diagnostics(opt_state, params, candidate_scales=[8, 16])
    >>> print({name: round(float(x), 3) for name, x in diag["gain_ratio"].items()})
    {'b': 4.0, 'w': 2.5}
    >>> print({name: round(float(x), 3) for name, x in diag["lr_multiplier"].items()})
    {'b': 1.6, 'w': 0.625}
    >>> print(round(float(diag["critical_batch_size"]), 3))  # B_crit, in per-worker batches
    8.0
    >>> print([round(float(x), 3) for x in diag["expected_speedup"]])  # at S' = 8 and 16
    [1.5, 2.0]
  """
  # nnx.Optimizer keeps its state as OptArray / OptVariable wrappers: read the plain arrays.
  found = _find_states(unwrap_variables(opt_state))
  return _diagnostics_of(found, params, candidate_scales, layer_axes)


def _diagnostics_of(
  found: dict[type, list[Any]],
  params: PyTree | None,
  candidate_scales: Sequence[float] | jax.Array | None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> dict[str, Any]:
  """:func:`diagnostics` of the states :func:`_find_states` found."""
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
  global_noise = noise_scale(
    jnp.sum(rs.sq_norm_mean_avg), jnp.sum(rs.mean_grad_sq_norm_avg), rs.num_samples
  )
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
    "lr_multiplier": gain_ratio.rate_multiplier(rs.ratio, rs.power) * factor,
    "warmup_end_step": end_step,
    "noise_scale": noise_scale(rs.sq_norm_mean_avg, rs.mean_grad_sq_norm_avg, rs.num_samples),
    "global_ratio": rs.global_ratio,
    "global_noise_scale": global_noise,
    "critical_batch_size": global_noise,
    "num_samples": rs.num_samples,
    "num_updates": rs.count,
    "num_skipped_steps": skip[0].num_skipped if skip else jnp.zeros([], jnp.int32),
  }
  if candidate_scales is not None:
    out["expected_speedup"] = expected_speedup(global_noise, rs.num_samples, candidate_scales)
  if params is not None:
    for key in PER_LAYER:
      out[key] = per_layer_tree(out[key], params, layer_axes=layer_axes)
  return out


@functools.partial(jax.jit, static_argnums=1)
def _host_diagnostics(
  states: list[list[Any]], candidate_scales: tuple[float, ...] | None
) -> dict[str, Any]:
  return _diagnostics_of(dict(zip(_STATES, states, strict=True)), None, candidate_scales)


def per_layer_tree(
  vector: jax.Array, params: PyTree, *, layer_axes: layer_axes_lib.LayerAxes = None
) -> PyTree:
  """A per-layer vector as a tree shaped like ``params`` (masked entries kept masked).

  A leaf without a layer axis gets its entry (a scalar), a leaf with L stacked layers
  (``layer_axes``, the optimizer's) its L entries as a vector. Flax NNX ``Variable`` wrappers
  (e.g. the ``Param`` leaves of ``nnx.state(model, nnx.Param)``) are replaced by the plain
  per-layer value, so the result is a named tree of arrays.

  Args:
    vector: one entry per layer, in ``jax.tree.leaves`` order (a stacked leaf's L layers
      consecutive), e.g. ``GainRatioState.ratio``.
    params: the parameters (or any tree shaped like them) the optimizer was initialised with.
    layer_axes: the optimizer's ``layer_axes``.

  Returns:
    A tree shaped like ``params`` holding each leaf's entry (or its L entries).

  Raises:
    ValueError: a ``params`` / ``layer_axes`` pair with another number of layers than
      ``vector``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> params = {"b": jnp.zeros(2), "w": jnp.zeros((3, 2))}
    >>> print(ol.per_layer_tree(jnp.array([4.0, 2.5]), params))
    {'b': Array(4., dtype=float32), 'w': Array(2.5, dtype=float32)}
  """
  params = unwrap_variables(params)
  layout = _layout(vector.shape[0], params, layer_axes)
  values = layout.unpack(vector)
  return tree_utils.map_active_indexed(lambda k, _: values[k], params)


def _layout(num_layers: int, params: PyTree, layer_axes: Any) -> layer_axes_lib.Layout:
  """The layout of ``params``, checked against the number of layers of the state."""
  layout = layer_axes_lib.resolve(layer_axes, params)
  if layout.total != num_layers:
    stacked = "" if layer_axes is not None else " (with stacked layers, pass layer_axes=)"
    raise ValueError(
      f"The optimizer state has {num_layers} layers but params has {layout.total} (leaves: "
      f"{len(layout.axes)}): pass the parameter tree the optimizer was initialised with and "
      f"the optimizer's layer_axes{stacked}."
    )
  return layout


def unwrap_variables(tree: PyTree) -> PyTree:
  """``tree`` with every Flax NNX ``Variable`` replaced by its value (no-op without flax).

  Reads ``flax.nnx`` only when the caller has already imported it: ``optax_lena`` itself never
  imports flax.
  """
  nnx = sys.modules.get("flax.nnx")
  variable = getattr(nnx, "Variable", None)
  if variable is None:
    return tree

  def is_variable(x: Any) -> bool:
    return isinstance(x, variable)

  def value(x: Any) -> Any:
    if not is_variable(x):
      return x
    get_value = getattr(x, "get_value", None)
    return get_value() if callable(get_value) else x.value

  return jax.tree.map(value, tree, is_leaf=is_variable)


def _path_name(path: tuple[Any, ...]) -> str:
  return "/".join(tree_utils.path_to_strings(path))


def flat_diagnostics(
  opt_state: PyTree,
  params: PyTree | None = None,
  prefix: str = "",
  *,
  candidate_scales: Sequence[float] | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> dict[str, float]:
  """:func:`diagnostics` as a flat ``{name: float}`` dict for metric writers (not jittable).

  Ready for TensorBoard, Weights & Biases or CLU writers (``writer.write_scalars(step, d)``,
  ``wandb.log(d)``) and for ``json.dumps(d, allow_nan=False)``: every value is a finite Python
  float. Call it outside ``jit`` (it reads the state once with ``jax.device_get``), e.g. every
  N steps.

  Keys are ``f"{prefix}{metric}"`` for the scalars (``global_ratio``, ``global_noise_scale``,
  ``critical_batch_size``, ``num_samples``, ``num_updates``, ``num_skipped_steps``, ``num_layers``,
  ``num_layers_warmed_up``) and ``f"{prefix}{metric}/{layer}"`` for the per-layer metrics of
  :func:`diagnostics` (``gain_ratio``, ``warmup_progress``, ``warmup_factor``,
  ``lr_multiplier``, ``warmup_end_step``, ``noise_scale``), where ``layer`` is the parameter's
  path joined by ``/`` (e.g. ``gain_ratio/Dense_0/kernel``) when ``params`` is given, else the
  leaf's index in ``jax.tree.leaves`` order (``gain_ratio/3``). A leaf with L stacked layers
  (``layer_axes``) has one key per slice, its path followed by the slice index
  (``gain_ratio/blocks/kernel/3``); without ``params`` the index counts layers. Metric-first
  keys put each metric's layers on one TensorBoard / W&B panel.

  Values that have no finite meaning are left out rather than encoded:

  * ``warmup_end_step/<layer>`` is present only once that layer's warm-up has ended (its value
    is the 1-based update at which it reached full rate); absent means "still warming up" (or no
    state-aware warm-up). ``num_layers_warmed_up`` counts the layers whose key is present.
  * ``noise_scale/<layer>``, ``global_noise_scale`` and ``critical_batch_size`` are absent when
    the estimate is not finite: S < 2 (the noise cannot be estimated) or a signal estimate <= 0
    (noise dominates, B_simple is infinite). Log ``gain_ratio`` for a value that always exists.

  Args:
    opt_state: the state of an optax_lena optimizer (as for :func:`diagnostics`).
    params: optional parameters the optimizer was initialised with (or any tree shaped like
      them, Flax NNX ``nnx.State`` included) to name the layers by path.
    prefix: prepended to every key, e.g. ``"lena/"``.
    candidate_scales: optional candidate numbers of per-worker gradients S'; adds
      ``expected_speedup/<S'>`` (e.g. ``expected_speedup/64``), left out where not finite.
    layer_axes: the optimizer's ``layer_axes`` (with ``params``), to name each slice of a
      stacked leaf.

  Returns:
    A ``dict[str, float]`` of finite values.

  Raises:
    ValueError: as :func:`diagnostics`.

  Examples:
    The metrics of one LENA update from statistics made by hand (S = 4), ready for a writer:

    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> params = {"b": jnp.ones(2), "w": jnp.ones((2, 2))}  # used as the mean gradient too
    >>> stats = ol.GradStats(  # made by hand: S = 4, mean_i ||g_i||^2 and ||gbar||^2
    ...   {"b": jnp.float32(8.0), "w": jnp.float32(10.0)}, 4,
    ...   {"b": jnp.float32(2.0), "w": jnp.float32(4.0)},
    ... )
    >>> tx = ol.lena(0.1, warmup_threshold=10.0)
    >>> _, opt_state = tx.update(params, tx.init(params), params, grad_stats=stats)
    >>> metrics = ol.flat_diagnostics(opt_state, params, prefix="lena/")
    >>> print({k: round(v, 3) for k, v in metrics.items() if "ratio" in k})
    {'lena/global_ratio': 3.0, 'lena/gain_ratio/b': 4.0, 'lena/gain_ratio/w': 2.5}
    >>> metrics["lena/num_layers_warmed_up"], "lena/warmup_end_step/b" in metrics
    (0.0, False)
  """
  found = _find_states(unwrap_variables(opt_state))
  # One read of the small per-layer states, then one compiled call on the host's default
  # device: eagerly, on arrays replicated over a mesh, each of its ~25 operations would be a
  # program of every device (40 ms per call for the examples' CNN on 8 CPU devices).
  skip = nonfinite.SkipNonFiniteState
  host = [
    [skip(None, jax.device_get(s.num_skipped)) for s in found[kind]]
    if kind is skip
    else jax.device_get(found[kind])
    for kind in _STATES
  ]
  scales = None if candidate_scales is None else tuple(float(c) for c in candidate_scales)
  diag = jax.device_get(_host_diagnostics(host, scales))
  n = int(np.shape(diag["gain_ratio"])[0])
  if params is None:
    names = [str(k) for k in range(n)]
  else:
    plain = unwrap_variables(params)
    layout = _layout(n, plain, layer_axes)
    names = []
    for (path, _), axis, size in zip(
      tree_utils.active_leaves_with_path(plain), layout.axes, layout.sizes, strict=True
    ):
      name = _path_name(path)
      names.extend([name] if axis is None else [f"{name}/{i}" for i in range(size)])
  out: dict[str, float] = {}

  def put(key: str, value: Any) -> None:
    value = float(value)
    if math.isfinite(value):
      out[prefix + key] = value

  for key in ("global_ratio", "global_noise_scale", "critical_batch_size"):
    put(key, diag[key])
  for key in ("num_samples", "num_updates"):
    put(key, diag[key])
  if candidate_scales is not None:
    for scale, value in zip(candidate_scales, np.asarray(diag["expected_speedup"]), strict=True):
      put(f"expected_speedup/{float(scale):g}", value)
  put("num_skipped_steps", diag["num_skipped_steps"])
  end_step = np.asarray(diag["warmup_end_step"])
  put("num_layers", n)
  put("num_layers_warmed_up", int(np.sum(end_step > 0)))
  for key in PER_LAYER:
    values = np.asarray(diag[key])
    for name, value in zip(names, values.tolist(), strict=True):
      if key == "warmup_end_step" and value <= 0:
        continue
      put(f"{key}/{name}", value)
  return out
