"""Memory-wise parameter sharding (ALADDIN, Section 3.3): one server per shard of N bytes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_lena._src.aladdin import checks
from optax_lena._src.aladdin.server import Reply, ServerState, all_finite, build_server

PyTree = Any


@dataclasses.dataclass(frozen=True)
class _Piece:
  leaf: int  # index of the leaf in the flattened tree
  start: int  # first element (of the flattened leaf)
  stop: int  # one past the last element
  whole: bool  # the whole leaf, kept in its own shape


@dataclasses.dataclass(frozen=True)
class ShardSpec:
  """How a pytree is cut into shards of at most ``max_shard_bytes`` (see :func:`shard_params`).

  A shard is a tuple of arrays: a leaf that fits is kept whole (its own shape), a leaf larger
  than the shard size is flattened and cut into 1-D slices over consecutive shards. ``split``
  and ``merge`` are pure and jittable (static slicing), and ``merge(split(tree))`` is ``tree``
  bit for bit, with its structure, shapes and dtypes.

  Attributes:
    treedef: the structure of the tree.
    shapes: the shape of every leaf.
    dtypes: the dtype of every leaf.
    max_shard_bytes: the shard size N in bytes.
    shards: for every shard, the pieces it holds.
  """

  treedef: Any
  shapes: tuple[tuple[int, ...], ...]
  dtypes: tuple[Any, ...]
  max_shard_bytes: int
  shards: tuple[tuple[_Piece, ...], ...]

  @property
  def num_shards(self) -> int:
    return len(self.shards)

  def shard_bytes(self) -> list[int]:
    """Bytes held by every shard."""
    return [
      sum((p.stop - p.start) * jnp.dtype(self.dtypes[p.leaf]).itemsize for p in shard)
      for shard in self.shards
    ]

  def _check_tree(self, tree: PyTree, what: str) -> list[Any]:
    leaves, treedef = jax.tree.flatten(tree)
    if treedef != self.treedef:
      raise ValueError(
        f"The tree structure of {what} does not match the sharded parameters: {treedef} vs "
        f"{self.treedef}. Split trees with the ShardSpec built from the same parameter pytree."
      )
    for k, leaf in enumerate(leaves):
      if tuple(np.shape(leaf)) != self.shapes[k]:
        raise ValueError(
          f"Leaf {k} of {what} has shape {np.shape(leaf)}, the sharded parameters have "
          f"{self.shapes[k]}. Build the ShardSpec from the same parameter pytree."
        )
    return leaves

  def split(self, tree: PyTree) -> list[tuple[jax.Array, ...]]:
    """Cuts ``tree`` (params, gradients or any tree shaped like them) into the shards."""
    leaves = self._check_tree(tree, "the tree to split")
    flat: dict[int, jax.Array] = {}

    def piece(p: _Piece) -> jax.Array:
      if p.whole:
        return jnp.asarray(leaves[p.leaf])
      if p.leaf not in flat:
        flat[p.leaf] = jnp.ravel(leaves[p.leaf])
      return flat[p.leaf][p.start : p.stop]

    return [tuple(piece(p) for p in shard) for shard in self.shards]

  def merge(self, shards: Sequence[Sequence[jax.Array]]) -> PyTree:
    """Reassembles the tree from its shards (exactly: concatenation and reshape only)."""
    if len(shards) != self.num_shards:
      raise ValueError(
        f"merge expects {self.num_shards} shards (one per server), got {len(shards)}."
      )
    parts: list[list[jax.Array]] = [[] for _ in self.shapes]
    for k, (shard, spec) in enumerate(zip(shards, self.shards, strict=True)):
      if len(shard) != len(spec):
        raise ValueError(
          f"Shard {k} holds {len(shard)} arrays, the ShardSpec expects {len(spec)}; pass the "
          "shards in the order split returned them."
        )
      for array, p in zip(shard, spec, strict=True):
        parts[p.leaf].append(array)
    leaves = []
    for k, pieces in enumerate(parts):
      if len(pieces) == 1 and tuple(np.shape(pieces[0])) == self.shapes[k]:
        leaves.append(pieces[0])
      else:
        leaves.append(jnp.concatenate([jnp.ravel(x) for x in pieces]).reshape(self.shapes[k]))
    return jax.tree.unflatten(self.treedef, leaves)


def shard_params(params: PyTree, max_shard_bytes: int) -> ShardSpec:
  """Memory-wise sharding (Section 3.3): shards of at most ``max_shard_bytes`` bytes.

  Leaves are taken in the tree's order and packed greedily: a leaf that fits in the current shard
  joins it, a leaf that does not but fits in an empty shard starts a new one, and a leaf larger
  than ``max_shard_bytes`` is flattened and cut across consecutive shards (filling the current
  shard first). Layer-wise sharding would leave one server with almost all the work on VGG-16,
  whose two fully-connected layers hold over 90% of the parameters.

  Use one :func:`parameter_server` per shard, or :func:`sharded_parameter_server`. Elementwise
  server optimizers (SGD, momentum, Adam) give the same result sharded or not; transformations
  that look across leaves (global-norm clipping, layer-wise ratios) see one shard at a time.

  Args:
    params: the parameter pytree (arrays or ``jax.ShapeDtypeStruct``).
    max_shard_bytes: N >= the largest element size (a positive int).

  Returns:
    A :class:`ShardSpec` with ``split(tree) -> list of shards`` and ``merge(shards) -> tree``.

  References:
    Ko et al., ALADDIN, CIKM 2021, Section 3.3 (parameter sharding).
  """
  if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int | np.integer):
    raise TypeError(
      f"max_shard_bytes must be a positive int (bytes per shard), got {max_shard_bytes!r}."
    )
  if max_shard_bytes < 1:
    raise ValueError(
      f"max_shard_bytes must be >= 1 (bytes per shard, e.g. 64 * 2**20), got {max_shard_bytes}."
    )
  leaves, treedef = jax.tree.flatten(params)
  if not leaves:
    raise ValueError("params has no leaves: there is nothing to shard.")
  shapes = tuple(tuple(int(d) for d in np.shape(x)) for x in leaves)
  dtypes = tuple(jnp.dtype(x.dtype) for x in leaves)
  largest_item = max(d.itemsize for d in dtypes)
  if max_shard_bytes < largest_item:
    raise ValueError(
      f"max_shard_bytes={max_shard_bytes} is smaller than one element ({largest_item} bytes): "
      f"use max_shard_bytes >= {largest_item}."
    )
  shards: list[list[_Piece]] = []
  current: list[_Piece] = []
  used = 0
  for k, (shape, dtype) in enumerate(zip(shapes, dtypes, strict=True)):
    size, item = int(np.prod(shape)), dtype.itemsize
    nbytes = size * item
    if used + nbytes <= max_shard_bytes:
      current.append(_Piece(k, 0, size, True))
      used += nbytes
      continue
    if nbytes <= max_shard_bytes:
      shards.append(current)
      current, used = [_Piece(k, 0, size, True)], nbytes
      continue
    start = 0
    while start < size:  # larger than a shard: fill the current one, then whole shards
      room = (max_shard_bytes - used) // item
      if room == 0:
        shards.append(current)
        current, used = [], 0
        continue
      stop = min(size, start + room)
      current.append(_Piece(k, start, stop, False))
      used += (stop - start) * item
      start = stop
  if current:
    shards.append(current)
  shards = [s for s in shards if s]
  return ShardSpec(treedef, shapes, dtypes, int(max_shard_bytes), tuple(tuple(s) for s in shards))


class ShardedServerState(NamedTuple):
  """State of :func:`sharded_parameter_server`: one :class:`ServerState` per shard."""

  shards: tuple[ServerState, ...]


class ShardedParameterServer(NamedTuple):
  """One ALADDIN server per shard behind the interface of :func:`parameter_server`."""

  init: Callable[[PyTree], ShardedServerState]
  receive: Callable[[ShardedServerState, PyTree, Any], tuple[ShardedServerState, Reply]]
  spec: ShardSpec
  num_workers: int
  period: int
  normalise: str
  alpha: str | float


def sharded_parameter_server(
  num_workers: int,
  server_tx: optax.GradientTransformation,
  spec: ShardSpec,
  *,
  period: int = 4,
  normalise: str = "mean_of_locals",
  alpha: str | float = "count",
) -> ShardedParameterServer:
  """Several parameter servers (one per shard of ``spec``) that act as one.

  Every message is split and reaches every shard in order, each shard runs Algorithm 2 on its
  slice with its own counters (``state.shards[k].count``, ``.worker_counts``) and its own
  ``server_tx`` state. The finiteness of a message is decided once for the whole gradient, so
  all shards accept or reject the same messages: their counters, triggers and alphas are then
  equal, and the reply is one tree (``params`` merged from the shards, ``ready`` and ``alpha``
  those of shard 0). In a deployment where the shards are separate processes, messages may reach
  them in different orders: c~ (and so alpha_i = 1 - 1/sqrt(c~)) can differ slightly between
  shards. Then run one :func:`parameter_server` per shard and merge shard by shard::

    params = spec.merge([al.worker_merge(p, r.params, r.alpha)
                         for p, r in zip(spec.split(params), replies)])

  Args:
    num_workers: n, the number of workers.
    server_tx: the server's Optax transformation (one state per shard; elementwise ones give the
      unsharded result).
    spec: the :class:`ShardSpec` from :func:`shard_params`.
    period, normalise, alpha: as in :func:`parameter_server`.

  Returns:
    A :class:`ShardedParameterServer` with ``init(params)`` and ``receive(state, grads, worker)
    -> (state, Reply)``, ``grads`` the whole gradient tree.

  References:
    Ko et al., ALADDIN, CIKM 2021, Section 3.3 and Algorithm 2.
  """
  if not isinstance(spec, ShardSpec):
    raise TypeError(
      f"spec must be the ShardSpec returned by al.shard_params(params, max_shard_bytes), got "
      f"{type(spec).__name__}."
    )
  server, receive_accepting = build_server(
    num_workers, server_tx, period=period, normalise=normalise, alpha=alpha
  )

  def init_fn(params: PyTree) -> ShardedServerState:
    return ShardedServerState(tuple(server.init(s) for s in spec.split(params)))

  def receive_fn(
    state: ShardedServerState, grads: PyTree, worker: Any
  ) -> tuple[ShardedServerState, Reply]:
    if not isinstance(state, ShardedServerState):
      raise TypeError(
        f"state must be the ShardedServerState returned by init or receive, got "
        f"{type(state).__name__}."
      )
    checks.check_worker(worker, server.num_workers)
    accept = all_finite(grads)
    new_states, replies = [], []
    for shard_state, shard_grads in zip(state.shards, spec.split(grads), strict=True):
      s, r = receive_accepting(shard_state, shard_grads, worker, accept)
      new_states.append(s)
      replies.append(r)
    reply = Reply(
      ready=replies[0].ready,
      params=spec.merge([r.params for r in replies]),
      alpha=replies[0].alpha,
    )
    return ShardedServerState(tuple(new_states)), reply

  return ShardedParameterServer(
    init_fn, receive_fn, spec, server.num_workers, server.period, server.normalise, server.alpha
  )
