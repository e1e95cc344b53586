"""Flax integration: a linen ``TrainState`` that passes the statistics on, and per-worker
gradients with statistics for Flax NNX and linen models (BatchNorm and Dropout included).

This is the only module of ``optax_lena`` that imports flax (``pip install
'optax_lena[flax]'``, flax 0.12 or later); ``import optax_lena`` does not import it.

* :class:`TrainState`: a drop-in for ``flax.training.train_state.TrainState`` whose
  ``apply_gradients(grads=grads, grad_stats=stats)`` hands the statistics to
  ``tx.update(..., grad_stats=stats)``. Flax's own ``apply_gradients`` would pass them to
  ``.replace()`` instead, and the optimizer would then ask for them.
* :func:`nnx_grad_stats`: for an NNX model and a batch with a leading worker axis S, the mean
  loss, the mean gradient and the :class:`optax_lena.GradStats` of the S per-worker gradients,
  for ``nnx.Optimizer(model, ol.lena(...), wrt=nnx.Param).update(model, grads,
  grad_stats=stats)``. The model's batch statistics are updated with their mean over workers.
* :func:`linen_grad_stats`: the same for a linen model's ``params`` and ``batch_stats``.
* :func:`layer_axes`: the ``layer_axes`` of a model whose repeated blocks are stacked (linen
  ``nn.scan`` / NNX ``nnx.vmap`` + ``nnx.scan``), read from Flax's partition metadata, so that
  every block is a layer of its own for LENA (docs/guides/scanned_layers.md).

Both helpers ``jax.vmap`` over the worker axis: under ``jit`` with that axis sharded across
devices (``NamedSharding(mesh, P("batch"))``, parameters replicated), XLA runs the workers in
parallel and reduces their gradients and statistics with all-reduces (the GSPMD path of
``ol.stacked_grad_stats``). The per-worker gradients exist as one ``[S, ...]`` array per
parameter; with S larger than the number of devices, memory grows with S (use
``ol.accumulate_grad_stats`` inside ``shard_map`` for a sequential accumulation instead).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

try:
  from flax import nnx
  from flax.core import meta as linen_meta
  from flax.training import train_state
except ImportError as err:  # name the extra instead of a bare "No module named 'flax'"
  raise ImportError(
    "optax_lena.flax needs flax (0.12 or later), an optional dependency of optax_lena: install "
    "it with pip install 'optax_lena[flax]'."
  ) from err

from optax_lena._src import layer_axes as layer_axes_lib
from optax_lena._src import stats as stats_lib
from optax_lena._src import tree_utils

PyTree = Any
__all__ = ["TrainState", "layer_axes", "linen_grad_stats", "nnx_grad_stats"]
# Where an NNX Variable keeps its partition names (flax 0.12: out_sharding; earlier releases).
_NNX_SHARDING_KEYS = ("out_sharding", "sharding_names", "sharding")


class TrainState(train_state.TrainState):
  """``flax.training.train_state.TrainState`` whose ``apply_gradients`` takes ``grad_stats``.

  Same fields, ``create`` and pytree behaviour as Flax's (it is a subclass); subclass it to add
  fields, e.g. ``batch_stats: Any``.

  Examples:
    One LENA update of a linen ``Dense`` from S = 4 per-worker gradients:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import flax.linen as nn
    >>> import optax_lena as ol
    >>> import optax_lena.flax as olf
    >>> model = nn.Dense(2)
    >>> x = jax.random.normal(jax.random.key(0), (4, 8, 3))  # [S, per-worker batch, features]
    >>> params = model.init(jax.random.key(1), x[0])["params"]
    >>> state = olf.TrainState.create(apply_fn=model.apply, params=params, tx=ol.lena(0.1))
    >>> loss_fn = lambda p, x: jnp.mean((model.apply({"params": p}, x) - 1.0) ** 2)
    >>> per_worker = jax.vmap(jax.grad(loss_fn), (None, 0))(state.params, x)
    >>> grads, stats = ol.stacked_grad_stats(per_worker)
    >>> state = state.apply_gradients(grads=grads, grad_stats=stats)
    >>> int(state.step), sorted(ol.diagnostics(state.opt_state, state.params)["gain_ratio"])
    (1, ['bias', 'kernel'])
  """

  def apply_gradients(self, *, grads: PyTree, grad_stats: Any = None, **kwargs: Any) -> Any:
    """Updates ``step``, ``params`` and ``opt_state``; ``**kwargs`` are ``.replace()``-ed.

    Args:
      grads: the mean gradient, shaped like ``params``.
      grad_stats: the :class:`optax_lena.GradStats` of the per-worker gradients, passed to
        ``tx.update(grads, opt_state, params, grad_stats=grad_stats)``; ``None`` calls
        ``tx.update`` without it (for transformations that need no statistics).
      **kwargs: other fields to replace, as in Flax (e.g. ``batch_stats=...``).

    Returns:
      The new state, with ``step`` incremented by one.

    Raises:
      TypeError: ``grad_stats`` that is not a :class:`optax_lena.GradStats`.
    """
    if grad_stats is not None and not isinstance(grad_stats, stats_lib.GradStats):
      raise TypeError(
        f"grad_stats must be an ol.GradStats, got {type(grad_stats).__name__}. Use "
        "ol.stacked_grad_stats, ol.all_reduce_grad_stats or optax_lena.flax.linen_grad_stats."
      )
    extra = {} if grad_stats is None else {"grad_stats": grad_stats}
    overwrite = train_state.OVERWRITE_WITH_GRADIENT
    if overwrite in grads:
      grads_with_opt, params_with_opt = grads["params"], self.params["params"]
      if grad_stats is not None:
        extra["grad_stats"] = _sub_stats(grad_stats, "params")
    else:
      grads_with_opt, params_with_opt = grads, self.params
    updates, new_opt_state = self.tx.update(
      grads_with_opt, self.opt_state, params_with_opt, **extra
    )
    new_params_with_opt = optax.apply_updates(params_with_opt, updates)
    if overwrite in grads:
      new_params = {"params": new_params_with_opt, overwrite: grads[overwrite]}
    else:
      new_params = new_params_with_opt
    return self.replace(step=self.step + 1, params=new_params, opt_state=new_opt_state, **kwargs)


def _sub_stats(grad_stats: stats_lib.GradStats, key: str) -> stats_lib.GradStats:
  """The statistics of ``grads[key]`` (Flax's fp8 ``OVERWRITE_WITH_GRADIENT`` layout)."""
  sub = lambda tree: tree[key] if isinstance(tree, dict) and key in tree else tree
  return stats_lib.GradStats(
    sub(grad_stats.sq_norm_mean), grad_stats.num_samples, sub(grad_stats.mean_grad_sq_norm)
  )


def layer_axes(tree: PyTree, name: str = "layers") -> PyTree:
  """The ``layer_axes`` of a Flax model whose repeated blocks are stacked, from its metadata.

  ``nn.scan(..., variable_axes={"params": 0}, metadata_params={nn.PARTITION_NAME: name})``
  (linen) and ``nnx.vmap(..., transform_metadata={nnx.PARTITION_NAME: name})`` (NNX) insert
  ``name`` into the partition names of every parameter they stack, at the layer axis; Flax
  records it only on parameters that carry partition annotations (``nn.with_partitioning``,
  ``nn.with_logical_partitioning``, ``nnx.with_partitioning``). This reads it back.

  Args:
    tree: linen variables or params as ``model.init`` returns them (with their
      ``nn.Partitioned`` boxes), or an NNX state (``nnx.state(model, nnx.Param)``).
    name: the partition name the scan or vmap recorded (``"layers"``, MaxText's name).

  Returns:
    A pytree shaped like ``tree`` (boxes and ``Variable`` wrappers replaced) holding each
    parameter's layer axis, or ``None`` for the parameters without one: the ``layer_axes=``
    of the optimizer and of the statistics.

  Raises:
    ValueError: when no parameter carries ``name`` (unannotated parameters, already unboxed
      linen params, or another name).

  Examples:
    Two blocks stacked by ``nn.scan``: their kernel has the layer axis 0, and each of its two
    slices is a layer of its own for the optimizer and the statistics.

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import flax.linen as nn
    >>> import optax_lena as ol
    >>> import optax_lena.flax as olf
    >>> class Block(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x, _):
    ...     init = nn.with_partitioning(nn.initializers.lecun_normal(), (None, None))
    ...     return nn.Dense(3, kernel_init=init, use_bias=False)(x), None
    >>> Blocks = nn.scan(
    ...   Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=2,
    ...   metadata_params={nn.PARTITION_NAME: "layers"},
    ... )
    >>> variables = Blocks().init(jax.random.key(0), jnp.zeros((1, 3)), None)  # boxed
    >>> axes = olf.layer_axes(variables["params"])
    >>> axes
    {'Dense_0': {'kernel': 0}}
    >>> tx = ol.lena(0.1, layer_axes=axes)  # and ol.stacked_grad_stats(..., layer_axes=axes)
    >>> olf.layer_axes(nn.unbox(variables["params"]))  # unboxed: the names are gone
    Traceback (most recent call last):
    ValueError: optax_lena.flax.layer_axes found no parameter whose partition names include ...
  """

  def is_boxed(x: Any) -> bool:
    return isinstance(x, (linen_meta.AxisMetadata, nnx.Variable))

  found: list[str] = []

  def axis_of(path: Any, x: Any) -> int | None:
    names = _partition_names(x)
    for axis, entry in enumerate(names):
      if entry == name or (isinstance(entry, tuple) and name in entry):
        found.append(jax.tree_util.keystr(path))
        return axis
    return None

  axes = jax.tree_util.tree_map_with_path(axis_of, tree, is_leaf=is_boxed)
  if not found:
    raise ValueError(
      f"optax_lena.flax.layer_axes found no parameter whose partition names include {name!r}. "
      "Flax records the layer axis only on annotated parameters: create them with "
      "nn.with_partitioning / nn.with_logical_partitioning (linen, and stack them with "
      f"nn.scan(..., metadata_params={{nn.PARTITION_NAME: {name!r}}}); pass the variables "
      "model.init returns, before nn.unbox) or nnx.with_partitioning (NNX, stacked with "
      f"nnx.vmap(..., transform_metadata={{nnx.PARTITION_NAME: {name!r}}})). Or pass "
      "layer_axes as a callable (path, leaf) -> int | None, e.g. lambda path, leaf: 0 if "
      "'blocks' in path else None."
    )
  return axes


def _partition_names(x: Any) -> tuple[Any, ...]:
  """The partition names of a boxed linen parameter or an NNX ``Variable`` (``()``: none)."""
  if isinstance(x, linen_meta.Partitioned):
    return tuple(x.names)
  if isinstance(x, nnx.Variable):
    metadata = x.get_metadata()
    for key in _NNX_SHARDING_KEYS:
      names = metadata.get(key)
      if names:
        return tuple(names)
  return ()


def _num_workers(worker_batches: PyTree, who: str) -> int:
  leaves = jax.tree.leaves(worker_batches)
  sizes = {jnp.shape(x)[0] if jnp.ndim(x) else None for x in leaves}
  if not leaves or len(sizes) != 1 or None in sizes:
    raise ValueError(
      f"{who} needs worker_batches whose every leaf has the same leading worker axis S, got "
      f"leading sizes {sorted(str(s) for s in sizes)}. Reshape the global batch to "
      "[S, per_worker_batch, ...], e.g. x.reshape(S, -1, *x.shape[1:])."
    )
  return int(next(iter(sizes)) or 0)


def _worker_keys(key: jax.Array, num_workers: int, worker_batches: PyTree) -> jax.Array:
  """Worker i's key: ``jax.random.fold_in(key, i)``, stacked on a leading axis.

  Under an explicit-axis mesh ``vmap`` needs every mapped input's worker axis sharded alike, so
  the keys take the sharding of the batches' worker axis.
  """
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(num_workers))
  spec = tree_utils.explicit_spec(jax.tree.leaves(worker_batches)[0])
  if spec is not None and spec[0] is not None:
    keys = jax.sharding.reshard(keys, jax.sharding.PartitionSpec(spec[0]))
  return keys


def _mean_over_workers(x: jax.Array) -> jax.Array:
  """Floating state (batch statistics) is averaged over workers, as data-parallel training
  does with ``pmean``; integer state (e.g. RNG counters, equal on every worker) is worker 0's."""
  spec = tree_utils.explicit_spec(x)
  if spec is not None and spec[0] is not None:
    # Under an explicit-axis mesh worker 0's slice of a worker axis sharded across devices has
    # no sharding type: gather that axis first (batch statistics are small).
    x = jax.sharding.reshard(x, jax.sharding.PartitionSpec(None, *spec[1:]))
  if jnp.issubdtype(x.dtype, jnp.inexact):
    # Worker 0's value plus the mean deviation: exactly unchanged when the workers agree (e.g.
    # running statistics in eval mode, frozen variables) for any S, not only powers of two.
    x0 = x[0]
    return (x0 + jnp.mean(x - x0, axis=0)).astype(x.dtype)
  return x[0]


def _split_loss(out: Any, has_aux: bool, who: str) -> tuple[jax.Array, Any]:
  if has_aux:
    if not (isinstance(out, tuple) and len(out) == 2):
      raise ValueError(f"{who}: with has_aux=True loss_fn must return (loss, aux).")
    return out
  if isinstance(out, tuple):
    raise ValueError(
      f"{who}: loss_fn returned a tuple; pass has_aux=True when it returns (loss, aux)."
    )
  return out, None


def nnx_grad_stats(
  loss_fn: Callable[..., Any],
  model: nnx.Module,
  worker_batches: PyTree,
  *args: Any,
  wrt: Any = nnx.Param,
  has_aux: bool = False,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> tuple[Any, PyTree, stats_lib.GradStats]:
  """Per-worker gradients of an NNX model, their mean and statistics, in one ``vmap``.

  Every worker i runs ``loss_fn(model_i, worker_batches[i], *args)`` on its own copy of the
  model (same parameters) and differentiates it with respect to the ``wrt`` variables. The
  copies' other state is handled as data-parallel training does: BatchNorm normalises with the
  worker's own batch, and the model's ``BatchStat`` variables (any floating non-``wrt`` state)
  become the mean over workers of the workers' updated values; integer state (RNG counters) is
  worker 0's. Each RNG stream of the model (e.g. ``nnx.Dropout(rate, rngs=rngs)``) draws on
  worker i from ``jax.random.fold_in(key, i)``, so the workers' dropout masks differ; keys passed
  in ``*args`` are the same for every worker. Call ``model.train()`` / ``model.eval()`` before,
  as usual.

  Works eagerly, under ``nnx.jit`` and inside ``jax.jit`` after ``nnx.merge``; shard the worker
  axis of ``worker_batches`` across devices to run the workers in parallel (GSPMD).

  Args:
    loss_fn: ``loss_fn(model, batch, *args) -> loss`` (or ``(loss, aux)`` with ``has_aux``),
      with ``batch`` one worker's slice of ``worker_batches``.
    model: the NNX model; its non-``wrt`` state (batch statistics, RNG counters) is updated in
      place.
    worker_batches: a pytree whose leaves have a leading worker axis of size S.
    *args: passed unchanged to every worker's ``loss_fn``.
    wrt: the ``nnx`` filter of the variables to differentiate (as for ``nnx.Optimizer``).
    has_aux: whether ``loss_fn`` returns ``(loss, aux)``; aux is averaged over workers.
    layer_axes: where the parameters stack their layers (e.g. :func:`layer_axes` of
      ``nnx.state(model, nnx.Param)``): per-slice statistics, for an optimizer built with the
      same ``layer_axes``.

  Returns:
    ``(loss, grads, stats)``: the loss averaged over workers (``(loss, aux)`` with
    ``has_aux``), the mean gradient as an ``nnx.State`` shaped like ``nnx.state(model, wrt)``,
    and the :class:`optax_lena.GradStats` of the S per-worker gradients.

  Raises:
    ValueError: ``worker_batches`` whose leaves do not share one leading worker axis, or a
      ``loss_fn`` whose result does not match ``has_aux``.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal", WWW 2022, Eq. 4 (the statistics).

  Examples:
    One LENA update of an NNX model from S = 4 workers' batches (wrap the step in ``nnx.jit``
    for speed):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> import optax_lena as ol
    >>> import optax_lena.flax as olf
    >>> model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    >>> optimizer = nnx.Optimizer(model, ol.lena(0.1, warmup_threshold=50.0), wrt=nnx.Param)
    >>> def loss_fn(model, batch):
    ...   x, y = batch
    ...   return jnp.mean((model(x) - y) ** 2)
    >>> x = jax.random.normal(jax.random.key(0), (4, 8, 3))  # [S, per-worker batch, features]
    >>> loss, grads, stats = olf.nnx_grad_stats(loss_fn, model, (x, jnp.ones((4, 8, 2))))
    >>> _ = optimizer.update(model, grads, grad_stats=stats)
    >>> stats.num_samples, ol.diagnostics(optimizer.opt_state)["gain_ratio"].shape  # 2 leaves
    (4, (2,))
  """
  who = "optax_lena.flax.nnx_grad_stats"
  num_workers = _num_workers(worker_batches, who)
  parts: Any = nnx.split(model, wrt, nnx.RngKey, ...)
  graphdef, params, keys, rest = parts[0], parts[1], parts[2], parts[3]
  worker_keys = jax.tree.map(lambda k: _worker_keys(k, num_workers, worker_batches), keys)

  def worker(params, keys, rest, batch):
    def loss_of(params):
      # copy=True: fresh Variables at this trace level, so BatchNorm may update its statistics
      # inside vmap and grad (the caller's Variables belong to an outer trace).
      local = nnx.merge(graphdef, params, keys, rest, copy=True)
      loss, aux = _split_loss(loss_fn(local, batch, *args), has_aux, who)
      new_rest = nnx.split(local, wrt, nnx.RngKey, ...)[-1]
      return loss, (aux, new_rest)

    (loss, (aux, new_rest)), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
    return loss, aux, grads, new_rest

  losses, auxes, stacked, new_rests = jax.vmap(worker, in_axes=(None, 0, None, 0))(
    params, worker_keys, rest, worker_batches
  )
  grads, grad_stats = stats_lib.stacked_grad_stats(stacked, layer_axes=layer_axes)
  nnx.update(model, jax.tree.map(_mean_over_workers, new_rests))
  loss = jnp.mean(losses)
  if has_aux:
    return (loss, jax.tree.map(lambda a: jnp.mean(a, axis=0), auxes)), grads, grad_stats
  return loss, grads, grad_stats


def linen_grad_stats(
  loss_fn: Callable[..., Any],
  params: PyTree,
  batch_stats: PyTree,
  worker_batches: PyTree,
  rng: jax.Array | None = None,
  *,
  has_aux: bool = False,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> tuple[Any, PyTree, stats_lib.GradStats, PyTree]:
  """Per-worker gradients of a linen model, their mean and statistics, and mean batch stats.

  Every worker i evaluates ``loss_fn(params, batch_stats, worker_batches[i], rng_i)`` with
  ``rng_i = jax.random.fold_in(rng, i)`` (``None`` when ``rng`` is ``None``), which returns the
  loss and the worker's updated ``batch_stats`` (``model.apply(..., mutable=["batch_stats"])``);
  the new batch statistics are their mean over workers, as ``lax.pmean`` of the batch
  statistics gives in data-parallel training. Shard the worker axis across devices under
  ``jit`` to run the workers in parallel (GSPMD).

  With BatchNorm and Dropout, ``loss_fn`` applies the model with ``mutable=["batch_stats"]``
  and ``rngs={"dropout": rng}`` and returns ``(loss, updates["batch_stats"])``; the new batch
  statistics go to ``state.apply_gradients(..., batch_stats=new_batch_stats)`` of a
  :class:`TrainState` subclass with a ``batch_stats`` field.

  Args:
    loss_fn: ``loss_fn(params, batch_stats, batch, rng) -> (loss, new_batch_stats)``, or
      ``(loss, (new_batch_stats, aux))`` with ``has_aux``.
    params: the parameters to differentiate.
    batch_stats: the model's ``batch_stats`` collection (any pytree; ``{}`` without BatchNorm).
    worker_batches: a pytree whose leaves have a leading worker axis of size S.
    rng: a PRNG key split per worker with ``fold_in``, or ``None``.
    has_aux: whether ``loss_fn`` also returns aux (averaged over workers).
    layer_axes: where the parameters stack their layers (e.g. :func:`layer_axes` of the boxed
      params): per-slice statistics, for an optimizer built with the same ``layer_axes``.

  Returns:
    ``(loss, grads, stats, new_batch_stats)``: the loss averaged over workers (``(loss, aux)``
    with ``has_aux``), the mean gradient, the :class:`optax_lena.GradStats` of the S
    per-worker gradients and the worker-mean batch statistics.

  Raises:
    ValueError: ``worker_batches`` whose leaves do not share one leading worker axis, or a
      ``loss_fn`` that does not return ``(loss, new_batch_stats)``.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal", WWW 2022, Eq. 4 (the statistics).

  Examples:
    A linen model with BatchNorm, S = 4 workers; each normalises with its own batch, and the
    new running statistics are their mean over the workers:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import flax.linen as nn
    >>> import optax_lena as ol
    >>> import optax_lena.flax as olf
    >>> class Net(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x, train):
    ...     return nn.BatchNorm(use_running_average=not train)(nn.Dense(2)(x))
    >>> class State(olf.TrainState):
    ...   batch_stats: dict
    >>> model = Net()
    >>> x = jax.random.normal(jax.random.key(0), (4, 8, 3))  # [S, per-worker batch, features]
    >>> variables = model.init(jax.random.key(1), x[0], train=False)
    >>> state = State.create(
    ...   apply_fn=model.apply, params=variables["params"], tx=ol.lena(0.1),
    ...   batch_stats=variables["batch_stats"],
    ... )
    >>> def loss_fn(params, batch_stats, batch, rng):
    ...   out, updates = model.apply(
    ...     {"params": params, "batch_stats": batch_stats}, batch, train=True,
    ...     mutable=["batch_stats"],
    ...   )
    ...   return jnp.mean((out - 1.0) ** 2), updates["batch_stats"]
    >>> loss, grads, stats, batch_stats = olf.linen_grad_stats(
    ...   loss_fn, state.params, state.batch_stats, x
    ... )
    >>> state = state.apply_gradients(grads=grads, grad_stats=stats, batch_stats=batch_stats)
    >>> stats.num_samples, jax.tree.map(jnp.shape, state.batch_stats)
    (4, {'BatchNorm_0': {'mean': (2,), 'var': (2,)}})
  """
  who = "optax_lena.flax.linen_grad_stats"
  num_workers = _num_workers(worker_batches, who)
  keys = None if rng is None else _worker_keys(rng, num_workers, worker_batches)

  def loss_of(params, batch, key):
    out = loss_fn(params, batch_stats, batch, key)
    if not (isinstance(out, tuple) and len(out) == 2):
      raise ValueError(
        f"{who}: loss_fn must return (loss, new_batch_stats) (with has_aux: (loss, "
        "(new_batch_stats, aux))); return batch_stats unchanged for models without BatchNorm."
      )
    loss, rest = out
    new_batch_stats, aux = rest if has_aux else (rest, None)
    return loss, (new_batch_stats, aux)

  grad_fn = jax.value_and_grad(loss_of, has_aux=True)
  (losses, (new_stats, auxes)), stacked = jax.vmap(
    grad_fn, in_axes=(None, 0, None if keys is None else 0)
  )(params, worker_batches, keys)
  grads, grad_stats = stats_lib.stacked_grad_stats(stacked, layer_axes=layer_axes)
  new_batch_stats = jax.tree.map(_mean_over_workers, new_stats)
  loss: Any = jnp.mean(losses)
  if has_aux:
    loss = (loss, jax.tree.map(lambda a: jnp.mean(a, axis=0), auxes))
  return loss, grads, grad_stats, new_batch_stats
