"""The scale of an update: how many reference batches its global batch holds.

By default the learning rate ``eta0`` was tuned for one worker's batch b, and an update that
averages S per-worker gradients has scale S: the gain ratio is capped at S, linear scaling
multiplies by S, the sample clock and the warm-ups count S base steps per update. When
``eta0`` was tuned at another batch b0 (``reference_batch_size``), the global batch S b holds
``k = S b / b0`` reference batches, and k replaces S in all of these, while the statistics still
come from the S per-worker gradients (see :func:`reference_sq_norm`).
"""

from __future__ import annotations

from typing import Any

from optax_lena._src import checks


def check_batch_sizes(per_worker_batch_size: Any, reference_batch_size: Any) -> None:
  """Both or neither, positive Python ints (raised at construction)."""
  given = (per_worker_batch_size is not None, reference_batch_size is not None)
  if given == (False, False):
    return
  if not all(given):
    raise ValueError(
      "reference_batch_size (the batch at which learning_rate was tuned) needs "
      "per_worker_batch_size (the batch of each of the S per-worker gradients) and vice versa: "
      "pass both, e.g. per_worker_batch_size=32, reference_batch_size=256, or neither (the "
      "rate was tuned at the per-worker batch)."
    )
  for name, value in (
    ("per_worker_batch_size", per_worker_batch_size),
    ("reference_batch_size", reference_batch_size),
  ):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      hint = " " + checks.INJECT_FIX.format(name=name) if checks.is_array(value) else ""
      raise ValueError(f"{name} must be a positive int (examples per batch), got {value!r}.{hint}")


def update_scale(
  num_samples: int, per_worker_batch_size: int | None, reference_batch_size: int | None
) -> int:
  """``k = S b / b0`` (S without a reference batch), checked to be a whole number >= 1.

  Raised at trace time, when S is known (it is static in the statistics).
  """
  if reference_batch_size is None or per_worker_batch_size is None:
    return num_samples
  global_batch = num_samples * per_worker_batch_size
  if global_batch < reference_batch_size:
    raise ValueError(
      f"The global batch S * per_worker_batch_size = {num_samples} * {per_worker_batch_size} = "
      f"{global_batch} is smaller than reference_batch_size={reference_batch_size}: the scale "
      "S b / b0 would be below 1. Tune learning_rate at a batch no larger than the global "
      f"batch and pass that (e.g. reference_batch_size={per_worker_batch_size}), or use more "
      "workers or micro-batches."
    )
  if global_batch % reference_batch_size:
    divisors = [d for d in range(1, global_batch + 1) if global_batch % d == 0]
    nearest = min(divisors, key=lambda d: abs(d - reference_batch_size))
    raise ValueError(
      f"The global batch S * per_worker_batch_size = {global_batch} is not a multiple of "
      f"reference_batch_size={reference_batch_size}: the scale S b / b0 = "
      f"{global_batch / reference_batch_size:.4g} would count fractions of reference "
      "iterations in the sample clock and the warm-ups. Choose a reference batch that divides "
      f"the global batch (the nearest is {nearest}), or a global batch that is a multiple of "
      "it."
    )
  return global_batch // reference_batch_size


def reference_sq_norm(top: Any, bot: Any, num_samples: int, scale: int) -> Any:
  """The expected squared norm of a reference-batch gradient, from the S gradients' statistics.

  With ``top = E||g_b||^2 = |G|^2 + tr(Sigma) / b`` (one per-worker batch b) and
  ``bot = E||gbar||^2 = |G|^2 + tr(Sigma) / (S b)``, a batch b0 = S b / k has
  ``E||g_b0||^2 = |G|^2 + k tr(Sigma) / (S b) = ((k - 1) top + (S - k) bot) / (S - 1)``, so the
  gain ratio ``E||g_b0||^2 / E||gbar||^2`` estimates the gain of the update over one reference
  batch (McCandlish et al. 2018's unbiased estimates, Appendix A). It is ``top`` when k = S, and
  returned as ``top`` itself then (bitwise). With S = 1 nothing can be estimated and ``top`` is
  returned (the ratio is then 1).
  """
  if scale == num_samples or num_samples == 1:
    return top
  return ((scale - 1) * top + (num_samples - scale) * bot) / (num_samples - 1)
