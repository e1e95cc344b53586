"""The base learning rate eta0 * schedule, on a selectable clock (Eq. 5's eta0 * schedule(t))."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_lena._src import batch_scale, checks, tree_utils
from optax_lena._src.warmup import num_samples_of

CLOCKS = ("updates", "samples")


class ScaleBySampleClockState(NamedTuple):
  """Base steps (single-worker iterations, sum of S over past updates) seen so far, int32.

  Attributes:
    base_steps: the sample clock, ``t * S`` after t updates of S per-worker gradients (``t *
      k`` with a reference batch), int32: what the schedule of the next update sees.
  """

  base_steps: jax.Array


def check_clock(clock: str) -> None:
  if clock not in CLOCKS:
    raise ValueError(
      f"Unknown clock {clock!r}: use 'updates' (the schedule sees the update count, the Optax "
      "convention) or 'samples' (it sees base steps t * S, the paper's convention)."
    )


def scale_by_learning_rate(
  learning_rate: optax.ScalarOrSchedule,
  *,
  clock: str = "updates",
  flip_sign: bool = True,
  num_samples: int | None = None,
  per_worker_batch_size: int | None = None,
  reference_batch_size: int | None = None,
) -> optax.GradientTransformationExtraArgs:
  """Scales updates by ``-learning_rate``, a constant or a schedule on the chosen clock.

  With ``clock="updates"`` this is ``optax.scale_by_learning_rate`` (the schedule sees 0, 1,
  2, ... ). With ``clock="samples"`` the schedule sees the base steps before the update,
  ``0, S, 2S, ...``: the paper's exponential decay ``eta0 * 0.01 ** (base_steps / total)`` runs
  on samples seen, so the same schedule serves every batch size.

  Args:
    learning_rate: eta0, a positive float or an Optax schedule (an array, as passed by
      ``optax.inject_hyperparams``, may also be 0; on the ``"samples"`` clock an array is
      rejected, because an injected schedule runs on the update count).
    clock: ``"updates"`` or ``"samples"``.
    flip_sign: multiply by ``-learning_rate`` (gradient descent), as Optax does.
    num_samples: S when no ``grad_stats`` are passed to update (``"samples"`` clock only).
    per_worker_batch_size: b, with ``reference_batch_size`` (``"samples"`` clock only).
    reference_batch_size: b0, the batch the rate was tuned at: the sample clock advances by
      ``k = S b / b0`` base steps (iterations at batch b0) per update.

  Returns:
    An ``optax.GradientTransformationExtraArgs``.

  Raises:
    ValueError: at construction, for an unknown ``clock``, a learning rate that is not
      positive, an array rate on the ``"samples"`` clock (what ``optax.inject_hyperparams``
      passes), or one batch size without the other; at ``update`` on the ``"samples"``
      clock, without ``grad_stats`` and without ``num_samples``.
    TypeError: a ``learning_rate`` that is neither a number nor a schedule.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal: A Layer-Wise Adaptive Approach Toward
    Large-Scale DNN Training", WWW 2022: the ``eta0 * schedule(t)`` of Eq. 5, on the sample
    clock of its experiments (``eta0 * 0.01 ** (base_steps / total)``).

  Examples:
    A schedule on the sample clock sees 0, 4, 8, ... base steps at S = 4:

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import optax_lena as ol
    >>> schedule = optax.exponential_decay(0.1, transition_steps=16, decay_rate=0.5)
    >>> tx = ol.scale_by_learning_rate(schedule, clock="samples", num_samples=4)
    >>> updates = {"w": jnp.ones(1)}
    >>> state = tx.init(updates)
    >>> for _ in range(3):  # -0.1 * 0.5 ** (base_steps / 16)
    ...   scaled, state = tx.update(updates, state)
    ...   print(round(float(scaled["w"][0]), 4))
    -0.1
    -0.0841
    -0.0707
  """
  check_clock(clock)
  checks.check_learning_rate(learning_rate)
  batch_scale.check_batch_sizes(per_worker_batch_size, reference_batch_size)
  if clock == "samples" and checks.is_array(learning_rate):
    raise ValueError(
      "clock='samples' got the learning rate as an array, which is what "
      "optax.inject_hyperparams passes: it evaluates a schedule on its own update count, so "
      "the sample clock would be silently ignored. Either keep the schedule on the sample "
      "clock and out of the injected values, optax.inject_hyperparams(ol.lena, "
      "static_args=('learning_rate',))(learning_rate=schedule, clock='samples'), or inject it "
      "on base steps yourself with clock='updates': learning_rate=lambda count: "
      "schedule(count * S) (the same trajectory while S is fixed). A constant rate needs no "
      "clock: pass clock='updates'."
    )
  if clock == "updates" or not callable(learning_rate):
    return optax.with_extra_args_support(
      optax.scale_by_learning_rate(learning_rate, flip_sign=flip_sign)
    )
  sign = -1.0 if flip_sign else 1.0

  def init_fn(params):
    del params
    return ScaleBySampleClockState(jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None, *, grad_stats=None, **extra_args):
    del params, extra_args
    s = num_samples_of(grad_stats, num_samples, "scale_by_learning_rate(clock='samples')")
    k = batch_scale.update_scale(s, per_worker_batch_size, reference_batch_size)
    step_size = sign * learning_rate(state.base_steps)
    updates = tree_utils.map_active(lambda u: jnp.asarray(step_size, u.dtype) * u, updates)
    return updates, ScaleBySampleClockState(state.base_steps + k)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
