"""Argument checks: every misuse raises an error that says what to do.

Hyper-parameters may arrive as tracers (``optax.inject_hyperparams`` turns numbers into arrays),
so value checks run only on concrete values; structural checks always run at trace time.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def _require(x: Any, name: str, what: str) -> None:
  if x is None:
    raise ValueError(f"{name} must be {what}, got None.")


def concrete_value(x: Any) -> float | None:
  """The value of a concrete scalar hyper-parameter, or None for tracers and callables."""
  if isinstance(x, jax.core.Tracer) or callable(x):
    return None
  try:
    return float(np.asarray(x))
  except (TypeError, ValueError):
    return None


def check_learning_rate(learning_rate: Any) -> None:
  _require(learning_rate, "learning_rate", "a positive float or an Optax schedule")
  value = concrete_value(learning_rate)
  if value is not None and not value > 0:
    raise ValueError(
      f"learning_rate must be positive, got {value}. It is the base rate eta0 of one worker at "
      "the per-worker batch size; to freeze parameters use optax.set_to_zero() with "
      "optax.multi_transform instead of a zero rate."
    )


def check_warmup_threshold(warmup_threshold: Any) -> None:
  _require(
    warmup_threshold,
    "warmup_threshold",
    "a positive float (to disable the state-aware "
    "warm-up pass warmup_threshold=None to ol.lena / ol.adascale, not to layerwise_warmup)",
  )
  value = concrete_value(warmup_threshold)
  if value is not None and not value > 0:
    raise ValueError(
      f"warmup_threshold must be positive, got {value}. It is theta = alpha * T1 in "
      "single-worker iterations (e.g. 0.05 * iterations of the single-worker run); pass "
      "warmup_threshold=None to disable the state-aware warm-up."
    )


def check_warmup_steps(warmup_steps: Any) -> None:
  _require(warmup_steps, "warmup_steps", "a number >= 0 (0 disables the fixed warm-up)")
  value = concrete_value(warmup_steps)
  if value is not None and not value >= 0:
    raise ValueError(
      f"warmup_steps must be >= 0 (base steps, i.e. single-worker iterations), got {value}; "
      "use 0 to disable the fixed warm-up."
    )


def check_eps(eps: Any) -> None:
  _require(eps, "eps", "a number >= 0 (the paper uses 1e-6)")
  value = concrete_value(eps)
  if value is not None and not value >= 0:
    raise ValueError(f"eps must be >= 0, got {value}; the paper uses 1e-6.")


def check_beta(beta: Any) -> None:
  if beta is None:
    return
  value = concrete_value(beta)
  if value is not None and not 0 < value <= 1:
    raise ValueError(
      f"beta (the moving-average weight of new statistics) must be in (0, 1], got {value}; "
      "pass beta=None for the default min(S / 1000, 1)."
    )


def check_num_samples(num_samples: Any) -> None:
  if num_samples is None:
    return
  if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
    raise ValueError(
      f"num_samples must be a positive int (S, the number of per-worker gradients averaged "
      f"per update) or None, got {num_samples!r}."
    )


def check_grad_stats(grad_stats: Any, expected_num_samples: int | None) -> None:
  """The statistics an update needs are present, of the right type and the expected S."""
  from optax_lena._src.stats import GradStats

  if grad_stats is None:
    raise ValueError(
      "This optax_lena transformation needs the per-worker gradient statistics: call "
      "tx.update(grads, state, params, grad_stats=stats) with (grads, stats) from "
      "ol.stacked_grad_stats(stacked_grads), ol.all_reduce_grad_stats(local_grads, axis_name) "
      "inside pmap/shard_map, or ol.accumulate_grad_stats(loss_fn, params, micro_batches)."
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
