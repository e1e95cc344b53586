"""Layers stacked in one leaf: which axis of a parameter holds its layers (``layer_axes=``).

Models that run their repeated blocks with ``lax.scan`` (Flax ``nn.scan`` / ``nnx.scan``,
MaxText's ``scan_layers``, Levanter's ``Stacked``) keep the parameters of all blocks in one
array per kind, with a layer axis of size L. LENA's layer is then a slice along that axis: its
statistics, gain ratio, warm-up and diagnostics are per slice, exactly as if the model were
unrolled into L leaves (docs/LENA.md, "What a layer is").

``layer_axes`` says where that axis is, per parameter leaf (:data:`LayerAxes`):

* ``None``: one layer per leaf (the default everywhere);
* a pytree of ``int | None`` shaped like the parameters, or a prefix of them: a value on a
  subtree covers every leaf under it, and a single int covers the whole tree;
* a callable ``(path, leaf) -> int | None``, with ``path`` the leaf's key path as strings (as
  ``grouping=`` callables get it) and ``leaf`` a ``jax.ShapeDtypeStruct`` of the parameter.

Negative axes count from the end. :func:`resolve` turns it into a static :class:`Layout` against
a parameter tree: per active leaf its axis and L, and where its L entries sit in the flat
float32 per-layer vectors of the optimizer state (a leaf without a layer axis owns one entry, so
with ``layer_axes=None`` the vectors are today's per-leaf vectors, bitwise).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from optax_lena._src import checks, tree_utils

PyTree = Any
LayerAxes = None | int | PyTree | Callable[[tuple[str, ...], Any], int | None]

SAME_LAYER_AXES_FIX = (
  "Pass the same layer_axes to the statistics (ol.stacked_grad_stats, ol.all_reduce_grad_stats, "
  "ol.accumulate_grad_stats, optax_lena.flax's *_grad_stats) and to the optimizer."
)


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where the layers of each active leaf are (static, resolved at trace or init time).

  Attributes:
    names: each active leaf's key path (``jax.tree_util.keystr``), for error messages.
    axes: each active leaf's layer axis (non-negative), or ``None`` for one layer.
    sizes: each active leaf's number of layers L (1 without a layer axis).
  """

  names: tuple[str, ...]
  axes: tuple[int | None, ...]
  sizes: tuple[int, ...]

  @property
  def offsets(self) -> tuple[int, ...]:
    """The index of each leaf's first entry in the flat per-layer vectors."""
    return tuple(itertools.accumulate(self.sizes, initial=0))[:-1]

  @property
  def total(self) -> int:
    """The length of the flat per-layer vectors: the number of layers."""
    return sum(self.sizes)

  @property
  def is_per_leaf(self) -> bool:
    """No leaf has a layer axis: one entry per leaf, as without ``layer_axes``."""
    return all(a is None for a in self.axes)

  def stats_shape(self, k: int) -> tuple[int, ...]:
    """The shape of leaf k's statistics: ``()`` without a layer axis, ``(L,)`` with one."""
    return () if self.axes[k] is None else (self.sizes[k],)

  def describe(self, k: int) -> str:
    if self.axes[k] is None:
      return "one layer (no layer axis)"
    return f"{self.sizes[k]} layers along axis {self.axes[k]}"

  def pack(self, values: Sequence[jax.Array]) -> jax.Array:
    """Per-leaf statistics (scalars or length-L vectors) as one flat float32 vector."""
    if self.is_per_leaf:
      return tree_utils.pack_scalars(values)
    return tree_utils.pack_vectors([jnp.reshape(v, (-1,)) for v in values])

  def unpack(self, vector: jax.Array) -> list[jax.Array]:
    """The inverse of :meth:`pack`: each leaf's scalar or length-L slice of ``vector``."""
    if self.is_per_leaf:
      return tree_utils.unpack_scalars(vector)
    return [
      vector[o] if a is None else vector[o : o + n]
      for o, a, n in zip(self.offsets, self.axes, self.sizes, strict=True)
    ]

  def unpack_like(self, vector: jax.Array, leaves: Sequence[Any]) -> list[jax.Array]:
    """:meth:`unpack`, each length-L slice sharded like the layer axis of its leaf under an
    explicit-axis mesh (as the statistics a reduction over the other axes gives)."""
    return [
      v if a is None else _like_axis(v, leaf, a)
      for v, leaf, a in zip(self.unpack(vector), leaves, self.axes, strict=True)
    ]

  def check_stats(self, values: Sequence[Any], what: str) -> None:
    """Each leaf's statistics have the shape this layout gives it (raised at trace time)."""
    for k, value in enumerate(values):
      shape = tuple(np.shape(value))
      if shape == self.stats_shape(k):
        continue
      got = "one value (no layer axis)" if shape == () else f"shape {shape}"
      raise ValueError(
        f"{what} has {got} for the parameter {self.names[k]}, but the optimizer's layer_axes "
        f"give that parameter {self.describe(k)}, i.e. statistics of shape "
        f"{self.stats_shape(k)}. {SAME_LAYER_AXES_FIX}"
      )


def validate(layer_axes: LayerAxes) -> None:
  """The errors that can be raised before any tree is seen (at construction)."""
  if layer_axes is None or callable(layer_axes):
    return
  if checks.is_array(layer_axes):
    raise ValueError(
      f"layer_axes must be a Python int, a pytree of ints and None, or a callable, got an array "
      f"{layer_axes!r}. " + checks.INJECT_FIX.format(name="layer_axes")
    )
  for value in jax.tree.leaves(layer_axes, is_leaf=lambda x: x is None):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
      raise TypeError(
        f"layer_axes must hold Python ints (the layer axis of a parameter) or None (no layer "
        f"axis), got {value!r} of type {type(value).__name__}: e.g. layer_axes={{'blocks': 0}} "
        "for blocks stacked on their leading axis, or a callable (path, leaf) -> int | None."
      )


def resolve(layer_axes: LayerAxes, tree: PyTree) -> Layout:
  """The static :class:`Layout` of ``layer_axes`` over the active leaves of ``tree``.

  Args:
    layer_axes: see :data:`LayerAxes`.
    tree: the parameters, gradients or updates (possibly with ``optax.MaskedNode`` entries),
      or a tree of ``jax.ShapeDtypeStruct`` shaped like them.

  Returns:
    The :class:`Layout`.

  Raises:
    ValueError: an axis outside a leaf's rank, or a ``layer_axes`` pytree that does not match
      the parameters (a leaf it does not cover, or an entry for a parameter the tree lacks).
  """
  validate(layer_axes)
  leaves = tree_utils.active_leaves_with_path(tree)
  names = tuple(jax.tree_util.keystr(path) for path, _ in leaves)
  if layer_axes is None:
    return Layout(names, (None,) * len(leaves), (1,) * len(leaves))
  if callable(layer_axes):
    given = [_call(layer_axes, path, leaf) for path, leaf in leaves]
  else:
    given = _from_prefix_tree(layer_axes, tree)
  axes, sizes = [], []
  for name, (_, leaf), axis in zip(names, leaves, given, strict=True):
    axis = _normalize(axis, np.shape(leaf), name)
    axes.append(axis)
    sizes.append(1 if axis is None else int(np.shape(leaf)[axis]))
  return Layout(names, tuple(axes), tuple(sizes))


def _call(fn: Callable[..., Any], path: tuple[Any, ...], leaf: Any) -> int | None:
  struct = jax.ShapeDtypeStruct(np.shape(leaf), jnp.result_type(leaf))
  axis = fn(tree_utils.path_to_strings(path), struct)
  if axis is not None and (isinstance(axis, bool) or not isinstance(axis, (int, np.integer))):
    raise TypeError(
      f"The layer_axes callable returned {axis!r} for the parameter "
      f"{jax.tree_util.keystr(path)}; it must return an int (the layer axis) or None."
    )
  return None if axis is None else int(axis)


def _normalize(axis: int | None, shape: tuple[int, ...], name: str) -> int | None:
  if axis is None:
    return None
  ndim = len(shape)
  if not -ndim <= axis < ndim:
    raise ValueError(
      f"layer_axes gives the parameter {name} of shape {shape} the layer axis {axis}, outside "
      f"its rank {ndim}: give an axis in [{-ndim}, {ndim}) (negative axes count from the end), "
      "or None for a parameter without stacked layers."
    )
  return axis % ndim


def _from_prefix_tree(layer_axes: PyTree, tree: PyTree) -> list[int | None]:
  """Each active leaf's value in a ``layer_axes`` tree shaped like ``tree`` or a prefix of it.

  Paths are compared as strings (``tree_utils.path_to_strings``), so a plain dict describes a
  ``FrozenDict``, an ``nnx.State`` or a dataclass with the same keys.
  """
  flat, _ = jax.tree_util.tree_flatten_with_path(layer_axes, is_leaf=lambda x: x is None)
  entries = {tree_utils.path_to_strings(path): value for path, value in flat}
  tree_flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=tree_utils.is_masked)
  prefixes: set[tuple[str, ...]] = {()}
  for path, _ in tree_flat:
    strings = tree_utils.path_to_strings(path)
    prefixes.update(strings[:k] for k in range(len(strings) + 1))
  stray = [p for p in entries if p not in prefixes]
  if stray:
    raise ValueError(
      f"layer_axes has entries for parameters that the tree does not have: "
      f"{['/'.join(p) for p in stray][:5]}. Build it from the parameters, e.g. "
      "optax_lena.flax.layer_axes(variables['params']) or jax.tree.map(lambda p: 0, "
      "params['blocks']) under the key 'blocks', or pass a callable (path, leaf) -> int | None."
    )
  out = []
  for path, _ in tree_utils.active_leaves_with_path(tree):
    strings = tree_utils.path_to_strings(path)
    covering = [strings[:k] for k in range(len(strings), -1, -1) if strings[:k] in entries]
    if not covering:
      raise ValueError(
        f"layer_axes does not cover the parameter {jax.tree_util.keystr(path)}: give a pytree "
        "with the parameters' structure (or a prefix of it) holding an int (the layer axis) "
        "or None for every parameter, or a callable (path, leaf) -> int | None."
      )
    out.append(entries[covering[0]])
  return out


def slice_sq_norms(x: jax.Array, axis: int | None) -> jax.Array:
  """``||x||^2`` in float32 (at least), per slice along ``axis`` (a length-L vector), or of the
  whole leaf (a scalar) when ``axis`` is None."""
  x = jnp.asarray(x)
  acc = jnp.promote_types(x.dtype, jnp.float32)
  if axis is None:
    return jnp.sum(jnp.square(x.astype(acc)), dtype=acc).astype(jnp.float32)
  axes = tuple(d for d in range(x.ndim) if d != axis)
  return jnp.sum(jnp.square(x.astype(acc)), axis=axes, dtype=acc).astype(jnp.float32)


def leaf_factors(factors: jax.Array, layout: Layout) -> list[jax.Array]:
  """Each active leaf's factor: a scalar, or for a leaf with a layer axis a length-L vector.

  The factors reach each leaf's kernel as their own buffers, outputs of variadic reduces that
  XLA does not fuse into their consumers (``tree_utils.unstack_scalars``): the leaves' kernels
  then take them as arguments, as SGD-momentum's take the learning rate, and none of them
  compiles the rule's arithmetic on the whole vector again. A stacked leaf's L factors come as
  one vector, so a scanned model's compile does not grow with its depth.
  """
  if layout.is_per_leaf:
    return tree_utils.unstack_scalars(factors)
  single = [k for k, a in enumerate(layout.axes) if a is None]
  stacked = [k for k, a in enumerate(layout.axes) if a is not None]
  out: list[Any] = [None] * len(layout.axes)
  offsets = layout.offsets
  if single:
    picked = factors[np.asarray([offsets[k] for k in single])]
    for k, scalar in zip(single, tree_utils.unstack_scalars(picked), strict=True):
      out[k] = scalar
  if stacked:
    width = max(layout.sizes[k] for k in stacked)
    # Row j holds leaf j's factors (padded by repeating its last one): one gather, then each
    # row its own buffer.
    rows = np.asarray(
      [[offsets[k] + min(i, layout.sizes[k] - 1) for i in range(width)] for k in stacked]
    )
    for k, row in zip(stacked, tree_utils.unstack_rows(factors[rows]), strict=True):
      out[k] = row[: layout.sizes[k]]
  return out


def _like_axis(vector: jax.Array, leaf: Any, axis: int) -> jax.Array:
  """A length-L vector sharded like ``leaf``'s axis ``axis`` (explicit-axis meshes only)."""
  spec = tree_utils.explicit_spec(leaf)
  if spec is None or len(spec) <= axis or spec[axis] is None:
    return vector
  return jax.sharding.reshard(vector, jax.sharding.PartitionSpec(spec[axis]))


def along_axis(factor: jax.Array, leaf: jax.Array, axis: int | None) -> jax.Array:
  """``factor`` shaped to multiply ``leaf``: a scalar as it is, a length-L vector broadcast
  along the layer axis (with the leaf's sharding of that axis under an explicit-axis mesh)."""
  if axis is None:
    return factor
  shape = [1] * jnp.ndim(leaf)
  shape[axis] = factor.shape[0]
  return jnp.reshape(_like_axis(factor, leaf, axis), shape)
