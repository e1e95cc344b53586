"""Small pytree helpers shared by the statistics, gain-ratio and warm-up modules."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

PyTree = Any


def unzip3(treedef: Any, triples: PyTree) -> tuple[PyTree, PyTree, PyTree]:
  """Splits a tree of 3-tuples (with structure ``treedef`` above them) into three trees."""
  flat = treedef.flatten_up_to(triples)
  return tuple(jax.tree.unflatten(treedef, [t[i] for t in flat]) for i in range(3))


def pack_scalars(scalars: Sequence[jax.Array]) -> jax.Array:
  """Packs per-leaf float32 scalars into one vector (the layer axis of the optimizer state)."""
  if not scalars:
    return jnp.zeros((0,), jnp.float32)
  values = [jnp.asarray(s, jnp.float32) for s in scalars]
  # reshape(()) of a scalar would still add one operation per leaf to the traced program.
  return jnp.stack([v if v.ndim == 0 else v.reshape(()) for v in values])


def unpack_scalars(vector: jax.Array) -> list[jax.Array]:
  return [vector[i] for i in range(vector.shape[0])]


def pack_vectors(vectors: Sequence[jax.Array]) -> jax.Array:
  """Concatenates float32 vectors into one (the per-layer vectors of the optimizer state).

  Under an explicit-axis mesh a vector sharded along a mesh axis (the statistics of a layer axis
  sharded over a ``stage`` axis) is gathered first: the state's vectors are replicated.
  """
  if not vectors:
    return jnp.zeros((0,), jnp.float32)
  replicated = jax.sharding.PartitionSpec()
  values = [
    v if explicit_spec(v) is None else jax.sharding.reshard(v, replicated)
    for v in (jnp.asarray(v, jnp.float32) for v in vectors)
  ]
  return jnp.concatenate(values)


def _max_of_pairs(a: Sequence[jax.Array], b: Sequence[jax.Array]) -> tuple[jax.Array, ...]:
  return tuple(jnp.maximum(x, y) for x, y in zip(a, b, strict=True))


def _select_each(x: jax.Array, axis: int) -> tuple[jax.Array, ...]:
  """The entries of ``x`` along ``axis`` as separate outputs of one variadic reduce.

  Output ``j`` is the max over ``axis`` of ``x`` with every other position set to -inf: that is
  ``x``'s entry ``j`` bitwise (signed zeros and NaN included), whatever order XLA reduces in.
  """
  size = x.shape[axis]
  neg = jnp.asarray(-jnp.inf, x.dtype)
  position = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis)
  masked = tuple(jnp.where(position == j, x, neg) for j in range(size))
  return tuple(jax.lax.reduce(masked, (neg,) * size, _max_of_pairs, (axis,)))


def unstack_scalars(vector: jax.Array) -> list[jax.Array]:
  """``[vector[k] for k]``, bitwise, with every scalar its own buffer and no per-k kernel.

  A per-leaf kernel that reads ``vector[k]`` has the constant k baked in, so XLA compiles a
  distinct kernel for every leaf where SGD-momentum compiles one per leaf shape; and XLA fuses
  the elementwise arithmetic that computed the vector into each of those kernels, so every
  leaf's kernel compiles that arithmetic again. Here the scalars are the outputs of variadic
  reduces (which XLA does not fuse into their consumers), in two levels over the vector laid
  out as a ``(g, m)`` matrix (``m ~ sqrt(n)``): one reduce gives its m columns, and m identical
  reduces split each column into g scalars. The kernels that consume the scalars then take them
  as arguments and are identical across leaves of one shape; the split itself is 1 + m small
  kernels of two kinds, O(n sqrt(n)) comparisons at run time.
  """
  n = vector.shape[0]
  if n <= 1:
    return unpack_scalars(vector)
  m = math.isqrt(n - 1) + 1  # ceil(sqrt(n))
  g = -(-n // m)
  matrix = jnp.pad(vector, (0, g * m - n)).reshape(g, m)
  scalars: list[Any] = [None] * (g * m)
  for j, column in enumerate(_select_each(matrix, 1)):
    for i, s in enumerate(_select_each(column, 0)):
      scalars[i * m + j] = s
  return scalars[:n]


def unstack_rows(matrix: jax.Array) -> list[jax.Array]:
  """``[matrix[j] for j]``, bitwise, each row its own buffer (one variadic reduce, as in
  :func:`unstack_scalars`): a kernel that consumes a row takes it as an argument and does not
  compile again the arithmetic that computed the matrix. O(rows^2 x columns) comparisons."""
  return list(_select_each(matrix, 0))


def psum_flat(tree: PyTree, axis_name: Any) -> PyTree:
  """``lax.psum(tree, axis_name)`` sent as one flat buffer per dtype instead of one per leaf.

  Each element is summed over the same workers as by ``lax.psum``; only the message layout
  changes. The price is a copy of the tree into the buffer and out of it; the gain is one
  collective exchange instead of one per leaf where the collectives library pays per buffer
  (CPU processes joined over gloo: a tuple all-reduce of N leaves makes N exchanges).
  """
  leaves, treedef = jax.tree.flatten(tree)
  groups: dict[Any, list[int]] = {}
  out: list[Any] = [None] * len(leaves)
  # A leaf sharded along an explicit mesh axis that the collective does not reduce (a model
  # axis left out of shard_map's axis_names) cannot be flattened into a buffer without
  # gathering it: it is summed on its own.
  sharded = [i for i, leaf in enumerate(leaves) if explicit_spec(leaf) is not None]
  if sharded:
    summed = jax.lax.psum([leaves[i] for i in sharded], axis_name)
    for i, s in zip(sharded, summed, strict=True):
      out[i] = s
  for i, leaf in enumerate(leaves):
    if out[i] is None:
      groups.setdefault(jnp.result_type(leaf), []).append(i)
  for indices in groups.values():
    flat = jax.lax.psum(jnp.concatenate([jnp.ravel(leaves[i]) for i in indices]), axis_name)
    offset = 0
    for i in indices:
      shape = jnp.shape(leaves[i])
      size = math.prod(shape)
      out[i] = flat[offset : offset + size].reshape(shape)
      offset += size
  return jax.tree.unflatten(treedef, out)


def explicit_spec(x: Any) -> jax.sharding.PartitionSpec | None:
  """The sharding of ``x`` in its type under an explicit-axis mesh, else None (no constraint).

  Arrays under an ``AxisType.Explicit`` mesh (``jax.set_mesh``) carry their sharding in their
  type; a new array built to be combined with them (a ``lax.scan`` carry) must carry the same,
  and a reshape or slice across a sharded axis needs it spelled out.
  """
  aval = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
  sharding = getattr(aval, "sharding", None)
  mesh = getattr(sharding, "mesh", None)
  if sharding is None or mesh is None or not getattr(mesh, "explicit_axes", ()):
    return None
  spec: Any = getattr(sharding, "spec", ())
  return spec if any(p is not None for p in spec) else None


def is_masked(x: Any) -> bool:
  """Leaves that ``optax.masked`` / ``optax.multi_transform`` hide from an inner transform."""
  return x is None or isinstance(x, optax.MaskedNode)


def check_same_structure(tree: PyTree, reference: PyTree, what: str) -> None:
  treedef: Any = jax.tree.structure(tree)
  if treedef != jax.tree.structure(reference):
    raise ValueError(
      f"The tree structure of {what} does not match the gradients: "
      f"{jax.tree.structure(tree)} vs {jax.tree.structure(reference)}. Compute the statistics "
      "from the same gradient pytree the optimizer receives."
    )


def path_to_strings(path: Sequence[Any]) -> tuple[str, ...]:
  """A jax key path as plain strings, e.g. ``('Dense_0', 'kernel')``."""
  out = []
  for key in path:
    for attr in ("key", "name", "idx"):
      if hasattr(key, attr):
        out.append(str(getattr(key, attr)))
        break
    else:
      out.append(str(key))
  return tuple(out)


def active_leaves_with_path(tree: PyTree) -> list[tuple[tuple[Any, ...], Any]]:
  """(path, leaf) pairs of a possibly masked tree, masked entries dropped."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_masked)
  return [(path, leaf) for path, leaf in flat if not is_masked(leaf)]


def select_like(stats_tree: PyTree, updates: PyTree, what: str) -> list[Any]:
  """Leaves of ``stats_tree`` that correspond to the active leaves of ``updates``.

  ``optax.masked`` and ``optax.multi_transform`` hand an inner transformation the updates with
  hidden leaves replaced by ``MaskedNode`` while extra arguments such as ``grad_stats`` arrive
  whole; this picks the entries of the visible leaves. Any other difference of structure is a
  user error and raises at trace time.
  """
  u_flat, _ = jax.tree_util.tree_flatten_with_path(updates, is_leaf=is_masked)
  s_flat, _ = jax.tree_util.tree_flatten_with_path(stats_tree, is_leaf=is_masked)
  u_paths = [p for p, _ in u_flat]
  s_paths = [p for p, _ in s_flat]
  if u_paths != s_paths:
    raise ValueError(
      f"The tree structure of {what} does not match the gradients: statistics have leaves "
      f"{[jax.tree_util.keystr(p) for p in s_paths][:8]}..., gradients have "
      f"{[jax.tree_util.keystr(p) for p in u_paths][:8]}... Compute the statistics (with "
      "ol.stacked_grad_stats / ol.all_reduce_grad_stats) from the same gradient pytree that "
      "the optimizer receives."
    )
  selected = [s for (_, u), (_, s) in zip(u_flat, s_flat, strict=True) if not is_masked(u)]
  if any(is_masked(s) for s in selected):
    raise ValueError(f"{what} has no entry for some unmasked gradient leaves.")
  return selected


def map_active_indexed(fn: Any, tree: PyTree) -> PyTree:
  """``fn(k, leaf)`` on the k-th active leaf; masked entries are kept as they are."""
  flat, treedef = jax.tree.flatten(tree, is_leaf=is_masked)
  out, k = [], 0
  for leaf in flat:
    if is_masked(leaf):
      out.append(leaf)
    else:
      out.append(fn(k, leaf))
      k += 1
  return jax.tree.unflatten(treedef, out)


def map_active(fn: Any, tree: PyTree) -> PyTree:
  """``fn(leaf)`` on every active leaf; masked entries are kept as they are."""
  return map_active_indexed(lambda _, leaf: fn(leaf), tree)
