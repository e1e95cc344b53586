"""Argument checks: every misuse raises an error that says what to do.

Hyper-parameters may arrive as tracers (``optax.inject_hyperparams`` turns numbers into arrays),
so value checks run only on concrete values; structural checks always run at trace time.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import numpy as np

INJECT_FIX = (
  "optax.inject_hyperparams turns every number it is given into an array; pass "
  "static_args=({name!r},) to keep {name} a Python value, e.g. "
  "optax.inject_hyperparams(ol.lena, static_args=({name!r},))(...)."
)


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


def is_array(x: Any) -> bool:
  """A JAX/NumPy array or a tracer (what ``optax.inject_hyperparams`` passes), not a number."""
  return isinstance(x, (jax.Array, np.ndarray, jax.core.Tracer))


def check_learning_rate(learning_rate: Any) -> None:
  """A static rate must be a finite positive number; an array rate a finite number >= 0.

  Arrays are what ``optax.inject_hyperparams`` passes: the value of a schedule at the current
  step (e.g. ``optax.linear_schedule(0.0, 1.0, 100)`` is 0 at step 0) or a rate the user sets
  in ``state.hyperparams``, so 0 is a valid value there.
  """
  _require(learning_rate, "learning_rate", "a positive float or an Optax schedule")
  is_number = isinstance(learning_rate, numbers.Real) and not isinstance(learning_rate, bool)
  if not (is_number or is_array(learning_rate) or callable(learning_rate)):
    raise TypeError(
      f"learning_rate must be a number (eta0) or an Optax schedule (a callable count -> rate), "
      f"got {type(learning_rate).__name__} {learning_rate!r}: e.g. ol.lena(0.1) or "
      "ol.lena(optax.cosine_decay_schedule(0.1, decay_steps))."
    )
  value = concrete_value(learning_rate)
  if value is None:
    return
  if is_array(learning_rate):
    if not (np.isfinite(value) and value >= 0):
      raise ValueError(
        f"learning_rate must be positive (or 0 for an injected value), got {value}. With "
        "optax.inject_hyperparams this is the value of the schedule or of "
        "state.hyperparams['learning_rate']: use a schedule whose values are finite and >= 0."
      )
  elif not value > 0 or not np.isfinite(value):
    raise ValueError(
      f"learning_rate must be positive, got {value}. It is the base rate eta0 of one worker at "
      "the per-worker batch size; to freeze parameters use optax.set_to_zero() with "
      "optax.multi_transform instead of a zero rate (a schedule may start at 0, e.g. "
      "optax.linear_schedule(0.0, eta0, steps))."
    )


def check_warmup_threshold(warmup_threshold: Any) -> None:
  _require(
    warmup_threshold,
    "warmup_threshold",
    "a positive float (to disable the state-aware "
    "warm-up pass warmup_threshold=None to ol.lena / ol.adascale, not to layerwise_warmup)",
  )
  value = concrete_value(warmup_threshold)
  if value is not None and not (np.isfinite(value) and value > 0):
    raise ValueError(
      f"warmup_threshold must be positive and finite, got {value}. It is theta = alpha * T1 in "
      "single-worker iterations (e.g. 0.05 * iterations of the single-worker run); pass "
      "warmup_threshold=None to disable the state-aware warm-up."
    )


def check_momentum(momentum: Any) -> None:
  """Momentum mu in [0, 1) (None: no momentum); a buffer with mu >= 1 never forgets a gradient
  and grows without bound, a negative mu flips the sign of every other step's contribution."""
  if momentum is None:
    return
  value = concrete_value(momentum)
  if value is not None and not 0 <= value < 1:
    raise ValueError(
      f"momentum must be in [0, 1), got {value}: mu of the heavy-ball buffer m = mu m + g "
      "(0.9 is the usual value; 0 or None for plain SGD)."
    )


def check_weight_decay(weight_decay: Any) -> None:
  """Weight decay lambda: a finite number >= 0."""
  _require(weight_decay, "weight_decay", "a number >= 0 (0 disables weight decay)")
  value = concrete_value(weight_decay)
  if value is not None and not (np.isfinite(value) and value >= 0):
    raise ValueError(
      f"weight_decay must be finite and >= 0, got {value}: lambda of the decay term lambda * w "
      "(0 disables it; e.g. 5e-4 for SGD, 0.05 for AdamW)."
    )


def check_adam_betas(b1: Any, b2: Any) -> None:
  """Adam's moment decays b1 and b2, each in [0, 1)."""
  for name, beta, usual in (("b1", b1, "0.9"), ("b2", b2, "0.999")):
    _require(beta, name, f"a number in [0, 1) (usually {usual})")
    value = concrete_value(beta)
    if value is not None and not 0 <= value < 1:
      raise ValueError(
        f"{name} must be in [0, 1), got {value}: Adam's decay of its "
        f"{'first' if name == 'b1' else 'second'} moment (usually {usual}); at 1 the bias "
        "correction divides by zero."
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


def check_power(power: Any) -> None:
  """A positive finite power; arrays (``optax.inject_hyperparams``) are checked when concrete."""
  if power is None or isinstance(power, bool):
    raise ValueError(f"power must be a positive float, got {power!r}.")
  value = concrete_value(power)
  if value is not None and not (np.isfinite(value) and value > 0):
    raise ValueError(
      f"power must be a positive float (the rate multiplier is r ** power), got {value}: 1 for "
      "SGD (the paper's rule), 0.5 for Adam-type optimizers (the square-root rule)."
    )


def check_num_samples(num_samples: Any) -> None:
  if num_samples is None:
    return
  if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
    hint = " " + INJECT_FIX.format(name="num_samples") if is_array(num_samples) else ""
    raise ValueError(
      f"num_samples must be a positive int (S, the number of per-worker gradients averaged "
      f"per update; static, because it bounds the ratio) or None, got {num_samples!r}.{hint}"
    )


def check_updates_like(updates: Any, reference: Any, what: str) -> None:
  """Every active gradient leaf has the shape of the matching ``reference`` leaf (trace time).

  Catches per-worker gradients ``[S, ...]`` passed as ``grads``: Optax would otherwise
  broadcast them into parameters of shape ``[S, ...]``.
  """
  from optax_lena._src import tree_utils

  if reference is None:
    return
  u_leaves = tree_utils.active_leaves_with_path(updates)
  r_leaves = tree_utils.active_leaves_with_path(reference)
  if len(u_leaves) != len(r_leaves):
    return  # a structural mismatch, reported by the structure checks with their own fix
  for (path, u), (_, r) in zip(u_leaves, r_leaves, strict=True):
    u_shape, r_shape = tuple(np.shape(u)), tuple(np.shape(r))
    if u_shape == r_shape:
      continue
    name = jax.tree_util.keystr(path)
    if len(u_shape) == len(r_shape) + 1 and u_shape[1:] == r_shape:
      fix = (
        f"It looks like per-worker gradients stacked on a leading axis of size S={u_shape[0]}: "
        "reduce them first, grads, stats = ol.stacked_grad_stats(stacked_grads), and call "
        "tx.update(grads, state, params, grad_stats=stats) with the mean grads."
      )
    else:
      fix = "Pass gradients shaped like the parameters the optimizer was initialised with."
    raise ValueError(
      f"The gradient leaf {name} has shape {u_shape} but the {what} has shape {r_shape}. {fix}"
    )
