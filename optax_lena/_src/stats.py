"""Gradient statistics of the S per-worker gradients (the paper's Eq. 4).

LENA and AdaScale need, besides the averaged gradient, the mean squared norm of the S per-worker
gradients for every layer. This module computes them wherever the per-worker gradients exist:

* stacked on a leading axis (``vmap`` over micro-batches, or ``jit`` with that axis sharded: GSPMD),
* spread over devices inside ``pmap`` / ``shard_map`` (one extra all-reduce of one float per leaf),
* sequentially over K micro-batches inside one step (``lax.scan``, memory independent of K),

and the compositions of these (S = devices x K). All statistics are float32 whatever the gradient
dtype, so float16 gradients whose squares leave the float16 range still give exact statistics.

Under a mesh of explicit axes (``jax.sharding.AxisType.Explicit`` with ``jax.set_mesh``) the
gradients carry their sharding in their types: the reductions here keep it (a sum over trailing
axes, never a reshape across a sharded axis), and new arrays combined with the gradients (the
accumulation's carry) take the gradients' types.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any, overload

import jax
import jax.numpy as jnp

from optax_lena._src import layer_axes as layer_axes_lib
from optax_lena._src import precision, tree_utils

PyTree = Any
AxisName = Hashable | Sequence[Hashable]


@dataclasses.dataclass(frozen=True)
class GradStats:
  """Statistics of the S per-worker gradients of one update.

  A registered pytree: it passes through ``jit``, ``pmap``, ``vmap`` and ``lax.scan`` like any
  other argument. ``num_samples`` is static (part of the tree structure), so the gain-ratio clip
  ``[1, S]`` and the default moving-average weight ``min(S / 1000, 1)`` are known at trace time.

  Attributes:
    sq_norm_mean: a pytree shaped like the gradients holding one float32 scalar per leaf,
      ``(1/S) * sum_i ||g_{i,leaf}||^2`` (the paper's ``top``); for a leaf with a layer axis of
      size L (``layer_axes=``), a float32 vector of length L, one entry per slice.
    num_samples: S, the number of per-worker gradients averaged by the update (workers times
      accumulated micro-batches). Static: a different S retraces a jitted step, and
      transformations built with ``num_samples=`` reject it at trace time.
    mean_grad_sq_norm: optional pytree of float32 scalars ``||(1/S) sum_i g_{i,leaf}||^2`` (the
      paper's ``bot``; length-L vectors for leaves with a layer axis). The functions of this module
      always fill it, from the float32 mean before any down-cast, so the update need not read the
      gradients again. When it is ``None`` the aliases (``lena``, ``adascale``, ``linear_scaling``)
      compute it from the gradients they receive; a bare ``scale_by_*`` building block computes it
      from the updates it receives, which is right only when it is the first transformation of a
      chain.

  Raises:
    ValueError: ``num_samples`` that is not a positive Python int.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal: A Layer-Wise Adaptive Approach Toward
    Large-Scale DNN Training", WWW 2022, Eq. 4 (``top`` and ``bot``).

  Examples:
    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> ol.GradStats({"w": jnp.float32(6.0)}, num_samples=4).num_samples
    4
    >>> ol.GradStats({"w": jnp.float32(6.0)}, num_samples=0)
    Traceback (most recent call last):
    ValueError: GradStats.num_samples must be a positive Python int (...), got 0. ...
  """

  sq_norm_mean: PyTree
  num_samples: int
  mean_grad_sq_norm: PyTree = None

  def __post_init__(self):
    n = self.num_samples
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
      raise ValueError(
        f"GradStats.num_samples must be a positive Python int (the number S of per-worker "
        f"gradients averaged), got {n!r}. Build statistics with ol.stacked_grad_stats, "
        "ol.all_reduce_grad_stats or ol.accumulate_grad_stats."
      )


jax.tree_util.register_dataclass(
  GradStats,
  data_fields=["sq_norm_mean", "mean_grad_sq_norm"],
  meta_fields=["num_samples"],
)


def sq_norm(x: jax.Array) -> jax.Array:
  """Squared Euclidean norm of ``x`` accumulated in float32 (at least)."""
  return layer_axes_lib.slice_sq_norms(x, None)


# From this many elements per worker on, a leaf's two squared norms are two single-output
# reductions instead of one two-output reduction. On XLA:CPU (jax 0.10) a single-output
# reduction runs as a vectorised library kernel while a two-output one is a scalar loop, about
# five times slower per element on large leaves (ResNet-18: 18 ms against 4 ms for the
# reductions of one step, benchmarks/overhead/RESULTS.md); on small leaves the one kernel
# costs less than the two (and their scalings) it replaces.
SEPARATE_NORMS_FROM = 1 << 14


def _sums(operands: tuple[jax.Array, jax.Array], axes: tuple[int, ...]):
  """The sums of two arrays of one shape and dtype over ``axes``, as one variadic reduction."""
  zero = jnp.zeros((), operands[0].dtype)
  return jax.lax.reduce(operands, (zero, zero), lambda a, b: (a[0] + b[0], a[1] + b[1]), axes)


def stacked_grad_stats(
  stacked_grads: PyTree,
  *,
  stacked_stats: GradStats | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> tuple[PyTree, GradStats]:
  """Mean gradient and statistics from per-worker gradients stacked on a leading axis.

  Under ``jit`` with the leading axis sharded across devices this is the GSPMD path: XLA turns
  the reductions over the worker axis into all-reduces.

  Args:
    stacked_grads: a pytree whose every leaf has a leading axis of size S (e.g. from
      ``jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, micro_batches)``).
    stacked_stats: optional statistics of the stacked entries themselves when every entry is
      already a mean over K micro-batches (e.g. ``jax.vmap`` of :func:`accumulate_grad_stats`);
      the result then covers S x K samples.
    layer_axes: where each parameter stacks its layers (axes of the parameter, not counting the
      worker axis): ``None`` (one layer per leaf), a pytree of ``int | None`` shaped like the
      parameters (or a prefix of it) or a callable ``(path, leaf) -> int | None``; a leaf with
      L layers gets length-L statistics, one entry per slice. Pass the optimizer's.

  Returns:
    ``(mean_grads, stats)``: the mean over the leading axis, in the gradients' dtype, and the
    :class:`GradStats` of the S (or S x K) samples.

  Raises:
    ValueError: a tree without leaves, leaves whose leading axes differ, ``stacked_stats`` or
      ``layer_axes`` that do not fit the gradients.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal", WWW 2022, Eq. 4 (``top`` and ``bot``).

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    >>> loss_fn = lambda p, x: jnp.mean((x @ p["w"] + p["b"]) ** 2)
    >>> xs = jax.random.normal(jax.random.key(0), (4, 8, 3))  # 4 batches of 8 examples
    >>> per_worker = jax.vmap(jax.grad(loss_fn), (None, 0))(params, xs)  # S = 4 workers
    >>> grads, stats = ol.stacked_grad_stats(per_worker)
    >>> stats.num_samples, round(float(stats.sq_norm_mean["w"]), 3)
    (4, 10.262)
    >>> float(jnp.mean(jnp.sum(per_worker["w"] ** 2, axis=(1, 2))))  # (1/S) sum_i ||g_i||^2
    10.26...
  """
  leaves = jax.tree.leaves(stacked_grads)
  if not leaves:
    raise ValueError(
      "stacked_grad_stats got a pytree without leaves, so the number of workers S is unknown. "
      "Build GradStats(sq_norm_mean={}, num_samples=S) directly for an empty parameter tree."
    )
  sizes = {jnp.shape(x)[0] if jnp.ndim(x) else None for x in leaves}
  if len(sizes) != 1 or None in sizes:
    raise ValueError(
      "stacked_grad_stats needs every gradient leaf to have the same leading (worker) axis; "
      f"got leading sizes {sorted(str(s) for s in sizes)}. Stack the per-worker gradients with "
      "jax.vmap or jnp.stack on axis 0."
    )
  num_stacked = int(next(iter(sizes)) or 0)
  param_shapes = jax.tree.map(lambda g: jax.ShapeDtypeStruct(g.shape[1:], g.dtype), stacked_grads)
  layout = layer_axes_lib.resolve(layer_axes, param_shapes)

  def per_leaf(g, axis):
    g32 = g.astype(precision.accumulation_dtype(g.dtype))
    # One pass over the S slices: a two-output reduction over the worker axis gives the sums of
    # g_i and of g_i^2, and (1/S) sum_i ||g_i||^2 = (1/S) sum over elements of sum_i g_i^2.
    # Reductions, not a reshape to (S, -1): under an explicit-axis mesh a reshape that merges
    # a sharded axis has no sharding type, while a reduction has one.
    total, total_sq = _sums((g32, jnp.square(g32)), (0,))
    mean = total / num_stacked
    others = _other_axes(mean.ndim, axis)
    if mean.size < SEPARATE_NORMS_FROM:
      sq_sum, mean_sq = _sums((total_sq, jnp.square(mean)), others)
    else:
      sq_sum = jnp.sum(total_sq, axis=others)
      # ||sum||^2 / S^2 rather than ||sum / S||^2: the reduction reads the sum as it is, where a
      # scaled operand makes XLA write the mean (or the scale) to memory first. The two differ
      # only where the squares leave the float32 range (diverged gradients, a skipped step).
      mean_sq = jnp.sum(jnp.square(total), axis=others) / float(num_stacked**2)
    return mean.astype(g.dtype), sq_sum / num_stacked, mean_sq

  treedef: Any = jax.tree.structure(stacked_grads)
  triples = jax.tree.unflatten(
    treedef,
    [
      per_leaf(g, a) for g, a in zip(treedef.flatten_up_to(stacked_grads), layout.axes, strict=True)
    ],
  )
  mean_grads, sq_norm_mean, mean_sq = tree_utils.unzip3(treedef, triples)
  num_samples = num_stacked
  if stacked_stats is not None:
    tree_utils.check_same_structure(stacked_stats.sq_norm_mean, stacked_grads, "stacked_stats")
    entries = jax.tree.leaves(stacked_stats.sq_norm_mean)
    layout.check_stats(
      [jax.ShapeDtypeStruct(jnp.shape(x)[1:], jnp.float32) for x in entries],
      "stacked_stats.sq_norm_mean (without its stacked axis)",
    )
    # Each stacked entry is a mean over K micro-batches: the mean of the K per-micro-batch
    # squared norms averages again over the stacked axis.
    sq_norm_mean = jax.tree.map(
      lambda s: jnp.mean(s.astype(jnp.float32), axis=0), stacked_stats.sq_norm_mean
    )
    num_samples = num_stacked * stacked_stats.num_samples
  cast = lambda t: jax.tree.map(lambda s: s.astype(jnp.float32), t)
  return mean_grads, GradStats(cast(sq_norm_mean), num_samples, cast(mean_sq))


def _other_axes(ndim: int, axis: int | None) -> tuple[int, ...]:
  """The axes a per-layer statistic sums over: all of them, or all but the layer axis."""
  return tuple(d for d in range(ndim) if d != axis)


def _axis_names(axis_name: AxisName) -> tuple[Hashable, ...]:
  return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _axis_size(axis_name: AxisName) -> int:
  size = 1
  for name in _axis_names(axis_name):
    size *= jax.lax.axis_size(name)
  return size


def varying_axes(x: Any) -> frozenset:
  """The mesh axes along which ``x`` varies under ``shard_map(check_vma=True)``; empty
  elsewhere (``pmap``, ``check_vma=False``) and on JAX versions without that typing."""
  aval = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
  vma = getattr(aval, "vma", None)
  if vma is None:
    vma = getattr(getattr(aval, "manual_axis_type", None), "varying", None)
  return frozenset(vma or ())


def _check_not_reduced(local_grads: PyTree, axis_name: AxisName) -> None:
  """Rejects gradients that are already summed over the data-parallel axes.

  Under ``shard_map`` with ``check_vma=True`` (the default), ``jax.grad`` with respect to
  replicated (invariant) parameters returns the gradient already summed over devices: the
  per-worker gradients, and with them the statistics, are gone. ``axis_index`` tells whether
  that typing is active (it varies along its axis only then).
  """
  for name in _axis_names(axis_name):
    if name not in varying_axes(jax.lax.axis_index(name)):
      continue
    reduced = [x for x in jax.tree.leaves(local_grads) if name not in varying_axes(x)]
    if reduced:
      raise ValueError(
        f"all_reduce_grad_stats got gradients that are already reduced over axis {name!r}: "
        "inside shard_map with check_vma=True, jax.grad with respect to replicated params "
        "sums the gradients across devices, so the per-worker gradients are lost. "
        f"Differentiate with respect to jax.lax.pcast(params, {axis_name!r}, to='varying') "
        "(or use shard_map(..., check_vma=False))."
      )


@overload
def all_reduce_grad_stats(
  local_grads: PyTree,
  axis_name: AxisName,
  *,
  local_stats: GradStats | None = None,
  packed: bool = False,
  aux: PyTree,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> tuple[PyTree, GradStats, PyTree]: ...


@overload
def all_reduce_grad_stats(
  local_grads: PyTree,
  axis_name: AxisName,
  *,
  local_stats: GradStats | None = None,
  packed: bool = False,
  aux: None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> tuple[PyTree, GradStats]: ...


def all_reduce_grad_stats(
  local_grads: PyTree,
  axis_name: AxisName,
  *,
  local_stats: GradStats | None = None,
  packed: bool = False,
  aux: PyTree | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> tuple[PyTree, GradStats] | tuple[PyTree, GradStats, PyTree]:
  """All-reduces gradients and their statistics inside ``pmap`` or ``shard_map``.

  Replaces the usual ``lax.pmean(grads, axis_name)``. Besides that mean it issues ONE extra
  all-reduce of a float32 vector with one entry per layer (the local squared norms, packed so
  that XLA sends a single small message instead of one per leaf).

  Args:
    local_grads: this worker's gradient pytree (or its mean over K local micro-batches when
      ``local_stats`` is given).
    axis_name: the mapped axis name, or a tuple of names; S is the total size of those axes.
    local_stats: statistics of this worker's K local micro-batches (from
      :func:`accumulate_grad_stats`); then S = (size of the axes) x K.
    packed: send the gradients, the squared norms and ``aux`` as one flat buffer (per dtype)
      instead of one buffer per leaf. Each element is summed over the same workers, so the
      statistics do not change; a copy of the gradient on each side buys one collective
      exchange instead of one per leaf. Worth it where the collectives pay per buffer: CPU
      devices of several processes joined by ``jax.distributed`` (gloo). On GPU and TPU, XLA
      combines the leaves' all-reduces by itself: leave it off. Pass the step's other averages
      as ``aux`` so that the step makes one all-reduce of one buffer: across CPU processes,
      when a process is killed mid-step, the devices of a survivor whose exchange failed then
      have no second buffer of the same collective to start on while the others still send
      the first, a mismatch on which gloo aborts the survivor (``gloo::EnforceNotMet``)
      instead of letting it report the dead peer.
    aux: other per-worker values to average over the same workers (metrics, BatchNorm
      statistics), in the same collective as the gradients (``lax.pmean(aux, axis_name)``).
    layer_axes: where each parameter stacks its layers (see :func:`stacked_grad_stats`); a leaf
      with L layers gets length-L statistics. Pass the optimizer's.

  Returns:
    ``(mean_grads, stats)``, identical on every worker; ``(mean_grads, stats, mean_aux)`` when
    ``aux`` is given.

  Raises:
    ValueError: gradients already reduced over ``axis_name`` (``jax.grad`` of replicated
      parameters inside ``shard_map(check_vma=True)``), or ``local_stats`` / ``layer_axes``
      that do not fit the gradients.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal", WWW 2022, Eq. 4 (``top`` and ``bot``).

  Examples:
    Inside ``shard_map`` or ``pmap`` each worker is a device; ``jax.vmap`` with an axis name
    runs the same code on one device (S = 4 workers, the statistics of
    :func:`stacked_grad_stats`):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    >>> loss_fn = lambda p, x: jnp.mean((x @ p["w"] + p["b"]) ** 2)
    >>> xs = jax.random.normal(jax.random.key(0), (4, 8, 3))  # 4 batches of 8 examples
    >>> def worker_step(x):  # one worker's batch
    ...   return ol.all_reduce_grad_stats(jax.grad(loss_fn)(params, x), "batch")
    >>> grads, stats = jax.vmap(worker_step, axis_name="batch")(xs)
    >>> stats.num_samples, round(float(stats.sq_norm_mean["w"][0]), 3)  # worker 0's copy
    (4, 10.262)
  """
  if isinstance(axis_name, list):
    axis_name = tuple(axis_name)
  num_workers = _axis_size(axis_name)
  _check_not_reduced(local_grads, axis_name)
  layout = layer_axes_lib.resolve(layer_axes, local_grads)
  if local_stats is None:
    local_sq = [
      layer_axes_lib.slice_sq_norms(g, a)
      for g, a in zip(jax.tree.leaves(local_grads), layout.axes, strict=True)
    ]
    local_samples = 1
  else:
    tree_utils.check_same_structure(local_stats.sq_norm_mean, local_grads, "local_stats")
    local_sq = jax.tree.leaves(local_stats.sq_norm_mean)
    layout.check_stats(local_sq, "local_stats.sq_norm_mean")
    local_samples = local_stats.num_samples
  treedef = jax.tree.structure(local_grads)
  sq_packed = layout.pack(local_sq)
  # lax.pmean, spelled out: the squared norms below read the sum. A mean of per-worker means
  # of squared norms over equally sized groups is the global mean.
  psum = functools.partial(tree_utils.psum_flat if packed else jax.lax.psum, axis_name=axis_name)
  summed, sq_sum, aux_sum = psum((local_grads, sq_packed, aux))
  mean_grads = jax.tree.map(lambda v: v / num_workers, summed)
  sq_packed = sq_sum / num_workers
  sq_norm_mean = jax.tree.unflatten(
    treedef, layout.unpack_like(sq_packed, jax.tree.leaves(mean_grads))
  )
  mean_sq = jax.tree.unflatten(
    treedef,
    [
      _mean_sq_norm(v, m, num_workers, a)
      for v, m, a in zip(
        jax.tree.leaves(summed), jax.tree.leaves(mean_grads), layout.axes, strict=True
      )
    ],
  )
  stats = GradStats(sq_norm_mean, num_workers * local_samples, mean_sq)
  if aux is None:
    return mean_grads, stats
  return mean_grads, stats, jax.tree.map(lambda v: v / num_workers, aux_sum)


def _mean_sq_norm(
  summed: jax.Array, mean: jax.Array, num_workers: int, axis: int | None = None
) -> jax.Array:
  """``||mean||^2``, from the all-reduced sum where that gives the same number.

  ``||sum||^2 / S^2`` is one reduction reading the all-reduce's output, while ``||sum / S||^2``
  makes XLA write the mean to a temporary buffer first (an extra write and read of the whole
  gradient per step: 1.3x the data-parallel step of pmean + SGD on ResNet-18, CPU). With the
  exponent range of float32 the two agree (exactly when S is a power of two, else to rounding;
  they differ only where squares leave the float32 range, i.e. for diverged gradients); for
  float16, whose means go subnormal, the norm is taken of the mean as before.
  """
  if jnp.finfo(summed.dtype).minexp > jnp.finfo(jnp.float32).minexp:
    return layer_axes_lib.slice_sq_norms(mean, axis)
  return layer_axes_lib.slice_sq_norms(summed, axis) / float(num_workers * num_workers)


def accumulate_grad_stats(
  loss_fn: Callable[..., Any],
  params: PyTree,
  micro_batches: PyTree,
  *args: Any,
  has_aux: bool = False,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> tuple[Any, PyTree, GradStats]:
  """Loss, mean gradient and statistics over K sequential micro-batches in one step.

  A ``lax.scan`` over the leading axis of ``micro_batches`` carries float32 running sums of the
  gradients and of the per-micro-batch squared norms, so memory does not grow with K (only the
  input batch does). Inside ``pmap``/``shard_map`` pass the result to
  ``all_reduce_grad_stats(..., local_stats=stats)``; under ``jax.vmap`` over workers pass it to
  ``stacked_grad_stats(..., stacked_stats=stats)``. Either gives S = workers x K.

  Args:
    loss_fn: ``loss_fn(params, batch, *args) -> loss`` (or ``(loss, aux)`` with ``has_aux``).
    params: the parameters to differentiate.
    micro_batches: a pytree whose leaves have a leading axis of size K.
    *args: extra arguments passed unchanged to ``loss_fn`` (e.g. a PRNG key).
    has_aux: whether ``loss_fn`` returns ``(loss, aux)``; aux is averaged over micro-batches.
    layer_axes: where each parameter stacks its layers (see :func:`stacked_grad_stats`); a leaf
      with L layers gets length-L statistics. Pass the optimizer's.

  Returns:
    ``(loss, mean_grads, stats)`` where loss is the mean over the K micro-batches (or
    ``(loss, aux)`` with ``has_aux``), mean_grads has the parameters' dtypes and stats covers K
    samples.

  Raises:
    ValueError: ``micro_batches`` without leaves, with leading axes that differ or with K
      sharded across devices, or ``layer_axes`` that do not fit ``params``.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal", WWW 2022, Eq. 4 (S counts micro-batches).

  Examples:
    K = 4 micro-batches, one after the other (the statistics of :func:`stacked_grad_stats`):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    >>> loss_fn = lambda p, x: jnp.mean((x @ p["w"] + p["b"]) ** 2)
    >>> xs = jax.random.normal(jax.random.key(0), (4, 8, 3))  # 4 batches of 8 examples
    >>> loss, grads, stats = ol.accumulate_grad_stats(loss_fn, params, xs)
    >>> stats.num_samples, round(float(stats.sq_norm_mean["w"]), 3)
    (4, 10.262)
  """
  leaves = jax.tree.leaves(micro_batches)
  if not leaves:
    raise ValueError("accumulate_grad_stats needs micro_batches with a leading axis of size K.")
  sizes = {jnp.shape(x)[0] if jnp.ndim(x) else None for x in leaves}
  if len(sizes) != 1 or None in sizes:
    raise ValueError(
      "accumulate_grad_stats needs every micro_batches leaf to have the same leading axis K; "
      f"got {sorted(str(s) for s in sizes)}. Reshape the batch to [K, micro_batch, ...]."
    )
  k = int(next(iter(sizes)) or 0)
  for x in leaves:
    spec = tree_utils.explicit_spec(x)
    if spec is not None and spec[0] is not None:
      raise ValueError(
        f"accumulate_grad_stats got micro_batches whose leading axis K is sharded along mesh "
        f"axis {spec[0]!r} (type {jax.typeof(x)}); lax.scan runs the K micro-batches one "
        "after another and needs that axis unsharded. Shard an axis of the micro-batch "
        f"instead, e.g. jax.sharding.reshard(x, P(None, {spec[0]!r})) for [K, batch, ...]."
      )
  grad_fn = jax.value_and_grad(loss_fn, has_aux=has_aux)
  layout = layer_axes_lib.resolve(layer_axes, params)
  slice_sq_norms = lambda grads: [
    layer_axes_lib.slice_sq_norms(g, a)
    for g, a in zip(jax.tree.leaves(grads), layout.axes, strict=True)
  ]

  def step(carry, batch):
    grad_sum, sq_sum, value_sum = carry
    value, grads = grad_fn(params, batch, *args)
    grad_sum = jax.tree.map(lambda s, g: s + g.astype(s.dtype), grad_sum, grads)
    sq_sum = sq_sum + layout.pack(slice_sq_norms(grads))
    value_sum = jax.tree.map(lambda s, v: s + jnp.asarray(v, s.dtype), value_sum, value)
    return (grad_sum, sq_sum, value_sum), None

  acc_dtype = lambda x: precision.accumulation_dtype(jnp.result_type(x))
  zeros = lambda x: jnp.zeros(jnp.shape(x), acc_dtype(x), out_sharding=tree_utils.explicit_spec(x))
  value_shape = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro_batches), *args)[
    0
  ]
  init = (
    jax.tree.map(zeros, params),
    jnp.zeros((layout.total,), jnp.float32),
    jax.tree.map(zeros, value_shape),
  )
  # scan needs the carry's types to match the body's outputs: under shard_map(check_vma=True)
  # those vary across devices while the zeros do not, and under an explicit-axis mesh they
  # carry the gradients' sharding (which may differ from the parameters', e.g. for a loss
  # that reshards), so give the zeros the body's varying axes and sharding.
  first = jax.tree.map(lambda x: x[0], micro_batches)
  carry_types = jax.eval_shape(step, init, first)[0]
  init = jax.tree.map(_cast_like, init, carry_types)
  (grad_sum, sq_sum, value_sum), _ = jax.lax.scan(step, init, micro_batches)
  mean_grads32 = jax.tree.map(lambda s: s / k, grad_sum)
  mean_grads = jax.tree.map(lambda g, p: g.astype(jnp.result_type(p)), mean_grads32, params)
  treedef = jax.tree.structure(params)
  sq_norm_mean = jax.tree.unflatten(
    treedef, layout.unpack_like(sq_sum / k, jax.tree.leaves(mean_grads32))
  )
  stats = GradStats(sq_norm_mean, k, jax.tree.unflatten(treedef, slice_sq_norms(mean_grads32)))
  value = jax.tree.map(lambda s, v: (s / k).astype(v.dtype), value_sum, value_shape)
  return value, mean_grads, stats


def _cast_like(x: jax.Array, like: jax.ShapeDtypeStruct) -> jax.Array:
  axes = tuple(sorted(varying_axes(like) - varying_axes(x), key=str))
  if axes:
    x = jax.lax.pcast(x, axes, to="varying")
  spec = tree_utils.explicit_spec(like)
  if spec is not None and tree_utils.explicit_spec(x) != spec:
    x = jax.sharding.reshard(x, spec)
  return x


def check_grad_stats(grad_stats: Any, expected_num_samples: int | None) -> None:
  """The statistics an update needs are present, of the right type and the expected S."""
  if grad_stats is None:
    raise ValueError(
      _called_from_flax_train_state()
      + "This optax_lena transformation needs the per-worker gradient statistics: call "
      "tx.update(grads, state, params, grad_stats=stats) with (grads, stats) from "
      "ol.stacked_grad_stats(stacked_grads), ol.all_reduce_grad_stats(local_grads, axis_name) "
      "inside pmap/shard_map, or ol.accumulate_grad_stats(loss_fn, params, micro_batches). "
      "With Flax use optax_lena.flax.TrainState, whose apply_gradients(grads=grads, "
      "grad_stats=stats) passes them on (flax.training.train_state.TrainState does not), or "
      "nnx.Optimizer(...).update(model, grads, grad_stats=stats)."
    )
  if not isinstance(grad_stats, GradStats):
    raise TypeError(
      f"grad_stats must be an ol.GradStats, got {type(grad_stats).__name__}. Use "
      "ol.stacked_grad_stats or ol.all_reduce_grad_stats to compute it."
    )
  if expected_num_samples is not None and grad_stats.num_samples != expected_num_samples:
    raise ValueError(
      f"The statistics cover S={grad_stats.num_samples} per-worker gradients but this "
      f"transformation was built with num_samples={expected_num_samples}. Check the number of "
      "devices x micro-batches, or build the optimizer with the right num_samples (or None)."
    )


def _called_from_flax_train_state() -> str:
  """A first sentence for the missing-statistics error when Flax's own TrainState called us.

  ``flax.training.train_state.TrainState.apply_gradients(grads=g, grad_stats=s)`` hands
  ``grad_stats`` to ``.replace()`` (it becomes an unknown field) and calls ``tx.update``
  without it, so the user did pass statistics: say where they went.
  """
  frame = inspect.currentframe()
  try:
    while frame is not None:
      code = frame.f_code
      if code.co_name == "apply_gradients" and frame.f_globals.get("__name__", "").startswith(
        "flax."
      ):
        return (
          "flax.training.train_state.TrainState.apply_gradients does not pass grad_stats to "
          "the optimizer: use optax_lena.flax.TrainState (a drop-in replacement, same fields "
          "and create()) and call state.apply_gradients(grads=grads, grad_stats=stats). "
        )
      frame = frame.f_back
    return ""
  finally:
    del frame
