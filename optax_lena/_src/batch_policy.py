"""Batch-size advice: the next S from the critical-batch estimate already in the state.

The gain-ratio rules keep moving averages of the per-worker gradient statistics, from which
:func:`optax_lena.diagnostics` reads the critical batch B_crit (the simple noise scale B_simple
of McCandlish et al. 2018, in per-worker batches). An update of S per-worker gradients is
efficient while S stays below about B_crit: there, k times more samples per update do nearly the
work of k updates. :func:`advise_num_samples` turns the estimate into the S of the next updates,
so a training loop of one's own can grow its batch as the noise scale grows (a batch ramp).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from optax_lena._src import diagnostics as diagnostics_lib

PyTree = Any


def _check_positive_int(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"advise_num_samples: {name} must be a positive Python int, got {value!r}.")


def advise_num_samples(
  opt_state: PyTree,
  *,
  max_num_samples: int,
  multiple: int = 1,
  factor: float = 1.0,
  min_num_samples: int | None = None,
  max_growth: float | None = 2.0,
) -> jax.Array:
  """The number S of per-worker gradients to use for the next updates (jittable, int32).

  The policy: ``S_next = clip(ceil(factor * B_crit / multiple) * multiple, S, upper)``, where
  B_crit is ``ol.diagnostics(opt_state)["critical_batch_size"]`` (per-worker batches), S the
  state's last S (``min_num_samples`` before the first update, and never below it), and
  ``upper = min(max_num_samples, floor(max_growth * S / multiple) * multiple)``. So the advice
  never shrinks the batch, is a multiple of ``multiple`` (what the devices allow: S = devices x
  micro-batches), grows by at most ``max_growth`` per call and never exceeds
  ``max_num_samples``. Where the estimate is not finite (S < 2, or a signal estimate <= 0, the
  noise dominating the moving averages) S is kept: the estimate gives no usable advice there.

  The averages mix the statistics of the S in force while they were collected: right after a
  change of S the estimate still reflects the earlier S (its ``||gbar||^2`` is larger), so read
  the advice every N updates with N about ``1 / beta`` (the averages' memory) or more.

  Args:
    opt_state: the state of an optax_lena optimizer with one gain-ratio rule (as for
      :func:`optax_lena.diagnostics`).
    max_num_samples: the largest S to advise (a multiple of ``multiple``).
    multiple: the advised S is a multiple of it (e.g. the number of data-parallel devices).
    factor: k in ``S = k * B_crit``; below 1 stays on the efficient side of the critical batch.
    min_num_samples: the smallest S to advise (a multiple of ``multiple``; None: ``multiple``).
    max_growth: the largest factor by which one call may grow S (None: no limit).

  Returns:
    An int32 scalar, the advised S.

  Raises:
    ValueError: bounds that are not positive ints, not multiples of ``multiple``, or
      ``min_num_samples > max_num_samples``, or ``factor`` / ``max_growth`` not positive
      (``max_growth`` must be at least 1).

  References:
    McCandlish, Kaplan, Amodei and the OpenAI Dota Team, "An Empirical Model of Large-Batch
    Training", 2018 (Section 2: the simple noise scale B_simple and the critical batch).

  Examples:
    After one update of S = 4 per-worker gradients whose statistics (made by hand) give
    B_crit = 8 per-worker batches, the advice doubles S (``max_growth=2``):

    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> params = {"b": jnp.ones(2), "w": jnp.ones((2, 2))}  # used as the mean gradient too
    >>> stats = ol.GradStats(
    ...   {"b": jnp.float32(8.0), "w": jnp.float32(10.0)}, 4,
    ...   {"b": jnp.float32(2.0), "w": jnp.float32(4.0)},
    ... )
    >>> tx = ol.lena(0.1)
    >>> _, opt_state = tx.update(params, tx.init(params), params, grad_stats=stats)
    >>> print(round(float(ol.diagnostics(opt_state)["critical_batch_size"]), 3))
    8.0
    >>> int(ol.advise_num_samples(opt_state, max_num_samples=64, multiple=4))
    8
  """
  if min_num_samples is None:
    min_num_samples = multiple if isinstance(multiple, int) else 1
  for name, value in (
    ("max_num_samples", max_num_samples),
    ("multiple", multiple),
    ("min_num_samples", min_num_samples),
  ):
    _check_positive_int(name, value)
  for name, value in (("max_num_samples", max_num_samples), ("min_num_samples", min_num_samples)):
    if value % multiple:
      raise ValueError(
        f"advise_num_samples: {name}={value} is not a multiple of multiple={multiple}; use "
        f"{max(1, value // multiple) * multiple}."
      )
  if min_num_samples > max_num_samples:
    raise ValueError(
      f"advise_num_samples: min_num_samples={min_num_samples} exceeds "
      f"max_num_samples={max_num_samples}."
    )
  if not factor > 0:
    raise ValueError(f"advise_num_samples: factor must be positive, got {factor!r}.")
  if max_growth is not None and not max_growth >= 1:
    raise ValueError(
      f"advise_num_samples: max_growth must be >= 1 (the advice never shrinks S) or None, got "
      f"{max_growth!r}."
    )
  diag = diagnostics_lib.diagnostics(opt_state)
  m = jnp.float32(multiple)
  last = jnp.asarray(diag["num_samples"], jnp.int32)
  current = jnp.maximum(last, min_num_samples)
  target = jnp.float32(factor) * jnp.asarray(diag["critical_batch_size"], jnp.float32)
  target = jnp.where(jnp.isfinite(target), target, current.astype(jnp.float32))
  # Clipped in float before the cast: B_crit can be far beyond int32.
  target = jnp.minimum(target, jnp.float32(max_num_samples))
  wanted = (jnp.ceil(target / m) * m).astype(jnp.int32)
  upper = jnp.int32(max_num_samples)
  if max_growth is not None:
    grown = jnp.floor(jnp.float32(max_growth) * current.astype(jnp.float32) / m) * m
    upper = jnp.minimum(upper, grown.astype(jnp.int32))
  return jnp.maximum(current, jnp.minimum(wanted, upper))
