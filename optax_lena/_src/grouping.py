"""Which layers of the parameter pytree share one gain ratio and one warm-up.

LENA's default layer is one leaf (the authors' code treats weights and biases separately), or
one slice of a leaf that stacks its layers along a layer axis (``layer_axes=``). A user may
group layers instead, e.g. a Flax module's kernel and bias; the ratio and the warm-up progress
are then per group. AdaScale is the special case of one group for the whole model. Groups are
resolved at trace time from the tree structure, so they cost nothing at run time.

With stacked layers the groups are those of the unrolled model: ``"module"`` makes slice l of
a module's stacked leaves one group (their layer axes must have one size), and a label (from a
pytree or a callable) is joined by the slice index, so slice l of every leaf labelled ``x`` is
one group.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import jax

from optax_lena._src import layer_axes as layer_axes_lib
from optax_lena._src import tree_utils

PyTree = Any
# None / "leaf": one group per leaf. "module": leaves with the same parent path. "global": one
# group. A pytree of hashable labels shaped like the parameters, or a callable
# (path: tuple[str, ...], leaf) -> label.
Grouping = None | str | PyTree | Callable[[tuple[str, ...], Any], Hashable]

_NAMED = ("leaf", "module", "global")


def group_by_module(path: tuple[str, ...], leaf: Any) -> Hashable:
  """Groups a leaf with its siblings: e.g. a Flax ``Dense``'s ``kernel`` and ``bias``.

  A ``grouping=`` callable for :func:`optax_lena.lena` and the other layer-wise rules (the
  same groups as ``grouping="module"``): the leaves of one module then share one gain ratio
  and one warm-up, computed from their summed statistics.

  Args:
    path: the leaf's key path as strings, e.g. ``("Dense_0", "kernel")``.
    leaf: the leaf (unused).

  Returns:
    The label of the leaf's group: its parent's path.

  Examples:
    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> ol.group_by_module(("Dense_0", "kernel"), None)
    ('Dense_0',)
    >>> params = {"dense": {"bias": jnp.ones(2), "kernel": jnp.ones((2, 2))}}
    >>> stats = ol.GradStats(  # made by hand, S = 4
    ...   {"dense": {"bias": jnp.float32(8.0), "kernel": jnp.float32(10.0)}}, 4,
    ...   {"dense": {"bias": jnp.float32(2.0), "kernel": jnp.float32(4.0)}},
    ... )
    >>> tx = ol.scale_by_lena(grouping=ol.group_by_module, beta=1.0, eps=0.0)
    >>> _, state = tx.update(params, tx.init(params), grad_stats=stats)
    >>> print(state.ratio)  # (8 + 10) / (2 + 4) for both leaves of the module
    [3. 3.]
  """
  del leaf
  return path[:-1]


class SliceLabel(NamedTuple):
  """The group label of slice ``index`` of a stacked leaf labelled ``label`` (never equal to a
  user's label, which a NamedTuple of this class cannot be by accident)."""

  label: Hashable
  slice_index: int


class Groups(NamedTuple):
  """Static assignment of the layers (entries of the per-layer vectors) to groups, in order."""

  index: tuple[int, ...]  # type: ignore[assignment]  # group id of each layer, ids by first appearance
  num_groups: int

  @property
  def is_per_leaf(self) -> bool:
    return self.num_groups == len(self.index)


def validate_grouping(grouping: Grouping) -> None:
  """Errors that can be raised before any tree is seen."""
  if isinstance(grouping, str) and grouping not in _NAMED:
    raise ValueError(
      f"Unknown grouping {grouping!r}: use one of {_NAMED}, a pytree of labels shaped like the "
      "parameters, or a callable (path, leaf) -> label."
    )


def resolve_groups(
  grouping: Grouping, tree: PyTree, layout: layer_axes_lib.Layout | None = None
) -> Groups:
  """Assigns every layer of the active (unmasked) leaves of ``tree`` to a group.

  Args:
    grouping: see :data:`Grouping`.
    tree: the parameters or updates (possibly with ``optax.MaskedNode`` entries).
    layout: where the leaves stack their layers (:func:`layer_axes.resolve`); ``None``: one
      layer per leaf.

  Returns:
    The static :class:`Groups`, one entry per layer.
  """
  validate_grouping(grouping)
  leaves = tree_utils.active_leaves_with_path(tree)
  if layout is None:
    layout = layer_axes_lib.resolve(None, tree)
  n = layout.total
  if grouping is None or grouping == "leaf":
    return Groups(tuple(range(n)), n)
  if grouping == "global":
    return Groups((0,) * n, 1 if n else 0)
  if grouping == "module":
    labels = [group_by_module(tree_utils.path_to_strings(p), x) for p, x in leaves]
    _check_module_sizes(labels, layout)
  elif callable(grouping):
    labels = [grouping(tree_utils.path_to_strings(p), x) for p, x in leaves]
  else:
    labels = _labels_from_tree(grouping, tree)
  ids: dict[Hashable, int] = {}
  index: list[int] = []
  for path, label, axis, size in zip(
    (p for p, _ in leaves), labels, layout.axes, layout.sizes, strict=True
  ):
    entries = [label] if axis is None else [SliceLabel(label, i) for i in range(size)]
    try:
      index.extend(ids.setdefault(entry, len(ids)) for entry in entries)
    except TypeError as err:
      raise ValueError(
        f"The grouping gave the unhashable label {label!r} for the leaf "
        f"{jax.tree_util.keystr(path)}; labels must be hashable (str, int, tuple)."
      ) from err
  return Groups(tuple(index), len(ids))


def _check_module_sizes(labels: list[Any], layout: layer_axes_lib.Layout) -> None:
  """The leaves of one module stack the same number of layers (or none), so that slice l of
  each is layer l of the module."""
  seen: dict[Hashable, int] = {}
  for k, label in enumerate(labels):
    first = seen.setdefault(label, k)
    if layout.stats_shape(first) != layout.stats_shape(k):
      raise ValueError(
        f"grouping='module' groups slice l of a module's stacked leaves, but in the module "
        f"{'/'.join(map(str, label))!r} the parameter {layout.names[first]} has "
        f"{layout.describe(first)} and {layout.names[k]} has {layout.describe(k)}. Give them "
        "layer axes of one size (both stacked, or neither), or group with a label pytree or a "
        "callable (path, leaf) -> label instead."
      )


def _labels_from_tree(labels: PyTree, tree: PyTree) -> list[Hashable]:
  flat_labels, _ = jax.tree_util.tree_flatten_with_path(labels, is_leaf=lambda x: x is None)
  label_by_path = {path: label for path, label in flat_labels}
  out = []
  for path, _ in tree_utils.active_leaves_with_path(tree):
    if path not in label_by_path or label_by_path[path] is None:
      raise ValueError(
        f"The grouping does not cover the parameter {jax.tree_util.keystr(path)}: give a label "
        "pytree with one hashable label for every parameter leaf (same structure as the "
        "parameters), or a callable (path, leaf) -> label such as ol.group_by_module."
      )
    out.append(label_by_path[path])
  active = {p for p, _ in tree_utils.active_leaves_with_path(tree)}
  extra = [p for p in label_by_path if p not in active]
  flat_tree, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=tree_utils.is_masked)
  all_paths = {p for p, _ in flat_tree}
  stray = [p for p in extra if p not in all_paths]
  if stray:
    raise ValueError(
      f"The grouping labels leaves that the parameters do not have: "
      f"{[jax.tree_util.keystr(p) for p in stray][:5]}. Build the label pytree from the "
      "parameters (e.g. jax.tree_util.tree_map_with_path over params)."
    )
  return out
