"""Argument checks of the ALADDIN servers: every misuse raises an error that names the fix."""

from __future__ import annotations

import operator
from typing import Any

import jax
import numpy as np
import optax

PyTree = Any

NORMALISE_OPTIONS = ("sum", "mean", "mean_of_locals")


def _count(value: Any, name: str, meaning: str, too_small: str = "") -> int:
  """``value`` is an int >= 1: a TypeError, or a ValueError (``meaning``, then ``too_small``)."""
  if isinstance(value, bool) or not isinstance(value, int | np.integer):
    raise TypeError(f"{name} must be a positive int ({meaning}), got {value!r}.")
  if value < 1:
    raise ValueError(f"{name} must be >= 1 ({meaning}{too_small}), got {value}.")
  return int(value)


def check_num_workers(num_workers: Any) -> int:
  return _count(num_workers, "num_workers", "the number n of workers that send gradients")


def check_period(period: Any) -> int:
  meaning = "pi: the server replies to a worker once every pi of its gradients; the paper uses 4"
  return _count(period, "period", meaning, ", period=1 replies to every message")


def check_normalise(normalise: Any) -> str:
  if normalise not in NORMALISE_OPTIONS:
    raise ValueError(
      f"normalise must be one of {NORMALISE_OPTIONS}, got {normalise!r}: 'sum' applies the "
      "accumulated gradients as they are, 'mean' divides them by their count, 'mean_of_locals' "
      "(the default) divides them by the number of workers."
    )
  return normalise


def check_alpha(alpha: Any) -> str | float:
  if isinstance(alpha, str):
    if alpha not in ("count", "n_pi"):
      raise ValueError(
        f"alpha must be 'count' (1 - 1/sqrt(c~), Algorithm 2), 'n_pi' (1 - 1/sqrt(n * period), "
        f"Section 3.2) or a float in [0, 1], got {alpha!r}."
      )
    return alpha
  if isinstance(alpha, bool) or alpha is None:
    raise TypeError(f"alpha must be 'count', 'n_pi' or a float in [0, 1], got {alpha!r}.")
  try:
    value = float(alpha)
  except (TypeError, ValueError) as e:
    raise TypeError(f"alpha must be 'count', 'n_pi' or a float in [0, 1], got {alpha!r}.") from e
  if not 0.0 <= value <= 1.0:
    raise ValueError(
      f"alpha must be in [0, 1] (0: the worker keeps its own model, 1: it adopts the global "
      f"model), got {value}. Use 'count' or 'n_pi' for the paper's rules."
    )
  return value


def check_tx(tx: Any, field: str, example: str, optional: bool = False) -> None:
  """``tx`` is an Optax transformation (or, ``optional``, None)."""
  if not (isinstance(tx, optax.GradientTransformation) or (optional and tx is None)):
    raise TypeError(
      f"{field} must be an Optax GradientTransformation (e.g. {example})"
      f"{' or None' if optional else ''}, got {type(tx).__name__}."
    )


def check_positive_int(value: Any, field: str, meaning: str) -> None:
  """``value`` is an int >= 1 (a ValueError naming ``meaning`` otherwise)."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{field} must be an int >= 1 ({meaning}), got {value!r}.")


def check_beta(beta: Any, optional: bool = False) -> None:
  """``beta``, the elastic moving rate, is a number in (0, 1] (or, ``optional``, None)."""
  if optional and beta is None:
    return
  if isinstance(beta, bool) or not 0.0 < float(beta) <= 1.0:
    allowed = "None (0.9 / n, the paper's) or in (0, 1]" if optional else "in (0, 1]"
    why = "" if optional else "; the paper uses 0.9 / n"
    raise ValueError(f"beta must be {allowed} (the elastic moving rate{why}), got {beta!r}.")


def check_worker(worker: Any, num_workers: int) -> None:
  """A concrete worker index must be an int in [0, num_workers); traced ones are guarded later."""
  if isinstance(worker, jax.core.Tracer):
    if not np.issubdtype(worker.dtype, np.integer) or worker.shape != ():
      raise TypeError(
        f"worker must be an integer scalar (e.g. jnp.int32), got a traced {worker.dtype} array "
        f"of shape {worker.shape}."
      )
    return
  try:
    value = operator.index(worker)
  except TypeError:
    arr = np.asarray(worker)
    if arr.shape != () or not np.issubdtype(arr.dtype, np.integer):
      raise TypeError(
        f"worker must be an integer scalar in [0, {num_workers}), got {worker!r}."
      ) from None
    value = int(arr)
  if not 0 <= value < num_workers:
    raise IndexError(
      f"Unknown worker index {value}: this server was built for num_workers={num_workers}, so "
      f"worker must be in [0, {num_workers}). Build the server with the right num_workers."
    )


def check_like_params(tree: PyTree, params: PyTree, what: str, fix: str) -> None:
  """``tree`` has the structure, shapes and dtypes of ``params`` (trace-time check)."""
  t_struct: Any = jax.tree.structure(tree)  # Any: PyTreeDef's stubs lack comparisons
  p_struct: Any = jax.tree.structure(params)
  if t_struct != p_struct:
    raise ValueError(
      f"The tree structure of {what} does not match the server's parameters: {t_struct} vs "
      f"{p_struct}. {fix}"
    )
  paths = jax.tree_util.tree_flatten_with_path(params)[0]
  for (path, p), t in zip(paths, jax.tree.leaves(tree), strict=True):
    name = jax.tree_util.keystr(path) or "<root>"
    if np.shape(t) != np.shape(p):
      raise ValueError(
        f"{what} leaf {name} has shape {np.shape(t)} but the server's parameter has shape "
        f"{np.shape(p)}. {fix}"
      )
    if jax.numpy.result_type(t) != jax.numpy.result_type(p):
      raise ValueError(
        f"{what} leaf {name} has dtype {jax.numpy.result_type(t)} but the server's parameter "
        f"has dtype {jax.numpy.result_type(p)}. Cast it, e.g. jax.tree.map(lambda g, p: "
        f"g.astype(p.dtype), grads, params), or build the server with params of that dtype."
      )
