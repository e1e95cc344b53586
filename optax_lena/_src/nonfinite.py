"""Skipping non-finite steps: a bad batch never corrupts the optimizer state."""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_lena._src import checks, stats, tree_utils
from optax_lena._src import layer_axes as layer_axes_lib

PyTree = Any


class SkipNonFiniteState(NamedTuple):
  """State of :func:`skip_nonfinite_steps`.

  Attributes:
    inner_state: the wrapped transformation's state.
    num_skipped: number of updates skipped because of non-finite gradients (int32).
  """

  inner_state: Any
  num_skipped: jax.Array


# While skip_nonfinite_steps traces its inner update: (the "step is finite" flag, the state
# leaves that inner transformations already kept on a skipped step, by id).
_SKIP_CONTEXT: contextvars.ContextVar[tuple[jax.Array, dict[int, Any]] | None] = (
  contextvars.ContextVar("optax_lena_skip_context", default=None)
)


def keep_state_on_skipped_step(new: PyTree, old: PyTree) -> PyTree:
  """``where(finite, new, old)`` leaf-wise inside :func:`skip_nonfinite_steps`, else ``new``.

  For inner transformations whose updates are read from their new state (e.g. a momentum
  buffer): computing the updates from the value this returns makes the buffer XLA writes and
  the buffer the updates read the same one. When only the wrapper selects, the updates need the
  unselected value, so XLA recomputes it from the old buffer after (with donated buffers)
  overwriting it: one more pass over the buffers, and two full copies of parameters and
  momentum per step (4x the update time of optax.sgd on ResNet-18). The wrapper does not select
  the returned leaves again. The values are the same as the wrapper's own selection.
  """
  context = _SKIP_CONTEXT.get()
  if context is None:
    return new
  finite, kept = context
  out = jax.tree.map(lambda n, o: select_if_finite(finite, n, o), new, old)
  kept.update((id(x), x) for x in jax.tree.leaves(out))  # holds x: ids stay unique
  return out


def select_if_finite(finite: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
  """``where(finite, new, old)`` with a condition that varies along the last axis.

  Every per-leaf kernel of a guarded update chooses between the new and the old buffer by the
  same scalar flag. On a loop-invariant condition LLVM unswitches each of those loops into two
  copies, one per branch, which doubled the compiled code of every guarded kernel (the IR that
  XLA:CPU dumps; benchmarks/overhead, RESULTS.md). Comparing a position along the last axis with
  a limit that the flag sets (the axis's length, or 0) gives the same choice, bitwise, as a
  condition the loops cannot be split on.
  """
  new, old = jnp.asarray(new), jnp.asarray(old)
  if new.ndim == 0:
    return jnp.where(finite, new, old)
  size = new.shape[-1]
  limit = jnp.where(finite, size, 0).astype(jnp.int32)
  # Under an explicit-axis mesh the positions take the leaf's sharding (a select needs one).
  spec = tree_utils.explicit_spec(new)
  position = jax.lax.broadcasted_iota(jnp.int32, new.shape, new.ndim - 1, out_sharding=spec)
  return jnp.where(position < limit, new, old)


def complete_grad_stats(
  updates: PyTree, grad_stats: stats.GradStats, layer_axes: layer_axes_lib.LayerAxes = None
) -> stats.GradStats:
  """Fills ``mean_grad_sq_norm`` from the (raw, mean) gradients when the statistics lack it
  (per slice along the layer axes of ``layer_axes``)."""
  if grad_stats.mean_grad_sq_norm is not None:
    return grad_stats
  layout = layer_axes_lib.resolve(layer_axes, updates)
  mean_sq = tree_utils.map_active_indexed(
    lambda k, u: layer_axes_lib.slice_sq_norms(u, layout.axes[k]), updates
  )
  return dataclasses.replace(grad_stats, mean_grad_sq_norm=mean_sq)


def stats_are_finite(updates: PyTree, grad_stats: stats.GradStats) -> jax.Array:
  """True when every squared norm is finite (read from per-layer scalars: no pass over the
  gradients). A squared norm past the float32 range counts as non-finite: one non-finite slice
  of a stacked leaf skips the whole step, as one non-finite leaf does."""
  top = tree_utils.select_like(grad_stats.sq_norm_mean, updates, "grad_stats.sq_norm_mean")
  bot = tree_utils.select_like(
    grad_stats.mean_grad_sq_norm, updates, "grad_stats.mean_grad_sq_norm"
  )
  # Summed as |x|, the same total for squared norms (>= 0, or non-finite either way). XLA
  # rewrites a plain sum over a stack of scalars into a chain of scalar adds and then copies
  # that chain into every per-leaf kernel reading the flag: O(leaves^2) code, minutes of
  # compile time and many GB of memory at 1000 leaves. The abs keeps it one reduction.
  total = jnp.sum(jnp.abs(_pack(top))) + jnp.sum(jnp.abs(_pack(bot)))
  return jnp.isfinite(total)


def _pack(values: list[Any]) -> jax.Array:
  """Per-leaf statistics as one vector: the scalars stacked as before, or, with length-L vectors
  among them (stacked layers), all of them flattened and concatenated."""
  if all(jnp.ndim(v) == 0 for v in values):
    return tree_utils.pack_scalars(values)
  return tree_utils.pack_vectors([jnp.reshape(v, (-1,)) for v in values])


def skip_nonfinite_steps(
  inner: optax.GradientTransformation,
  *,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> optax.GradientTransformationExtraArgs:
  """Runs ``inner`` and discards the step when the gradients are not finite.

  On a step whose statistics (or, without statistics, gradients) contain NaN or Inf, or whose
  squared norms overflow float32, the updates are zero and the whole inner state (moving
  averages, warm-up progress, momentum, counters) is kept exactly as before, as if the step had
  not happened; ``num_skipped`` counts such steps. Unlike ``optax.apply_if_finite`` the check
  reads the per-leaf squared norms that the statistics already hold.

  When the statistics lack ``mean_grad_sq_norm`` it is computed here from the gradients, before
  any inner transformation (weight decay, momentum) changes them.

  Args:
    inner: the transformation to protect (usually an ``optax.chain``).
    layer_axes: where the parameters stack their layers (the inner rule's), used only to fill
      a missing ``mean_grad_sq_norm`` per slice. A non-finite slice skips the whole step.

  Returns:
    An ``optax.GradientTransformationExtraArgs``.

  Raises:
    ValueError: at construction, for a malformed ``layer_axes``; at ``update``, for gradients
      shaped unlike the parameters.
    TypeError: ``grad_stats`` that is not a :class:`optax_lena.GradStats`.

  Examples:
    A step with a NaN gradient changes neither the parameters nor the momentum:

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import optax_lena as ol
    >>> tx = ol.skip_nonfinite_steps(optax.sgd(0.1, momentum=0.9))
    >>> params = {"w": jnp.ones(2)}
    >>> state = tx.init(params)
    >>> updates, state = tx.update({"w": jnp.array([1.0, jnp.nan])}, state, params)
    >>> print(updates["w"], state.num_skipped, state.inner_state[0].trace["w"])
    [0. 0.] 1 [0. 0.]
  """
  layer_axes_lib.validate(layer_axes)
  inner = optax.with_extra_args_support(inner)

  def init_fn(params):
    return SkipNonFiniteState(inner.init(params), jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None, *, grad_stats=None, **extra_args):
    checks.check_updates_like(updates, params, "parameter")
    if grad_stats is not None:
      if not isinstance(grad_stats, stats.GradStats):
        raise TypeError(
          f"grad_stats must be an ol.GradStats, got {type(grad_stats).__name__}. Use "
          "ol.stacked_grad_stats or ol.all_reduce_grad_stats to compute it."
        )
      grad_stats = complete_grad_stats(updates, grad_stats, layer_axes)
      finite = stats_are_finite(updates, grad_stats)
      extra_args["grad_stats"] = grad_stats
    else:
      flags = [jnp.all(jnp.isfinite(u)) for u in jax.tree.leaves(updates)]
      # The int32 min over the stacked flags (not jnp.all over them) stays one reduction in
      # XLA, for the same reason as in stats_are_finite.
      finite = jnp.min(jnp.stack(flags).astype(jnp.int32)) > 0 if flags else jnp.asarray(True)
    kept: dict[int, Any] = {}
    token = _SKIP_CONTEXT.set((finite, kept))
    try:
      new_updates, new_inner = inner.update(updates, state.inner_state, params, **extra_args)
    finally:
      _SKIP_CONTEXT.reset(token)
    new_updates = tree_utils.map_active(
      lambda u: select_if_finite(finite, u, jnp.zeros_like(u)), new_updates
    )
    new_inner = jax.tree.map(
      lambda new, old: new if kept.get(id(new)) is new else select_if_finite(finite, new, old),
      new_inner,
      state.inner_state,
    )
    num_skipped = state.num_skipped + jnp.where(finite, 0, 1).astype(jnp.int32)
    return new_updates, SkipNonFiniteState(new_inner, num_skipped)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
