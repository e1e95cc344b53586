"""Runs one cell of the outer-optimizer study in the simulator, with its outer optimizers
(:func:`delayed_nesterov` among them)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from benchmarks import driver
from benchmarks.aladdin import training
from benchmarks.aladdin.outer_optimizer.grid import VARIANTS, Cell, Scale
from benchmarks.aladdin.protocol import PRESETS
from optax_lena import aladdin as al
from optax_lena.aladdin import simulator as sim

OUTER_LR = 0.7  # DiLoCo's outer Nesterov (Douillard et al. 2023), fixed, not tuned
OUTER_MOMENTUM = 0.9


class DelayedNesterovState(NamedTuple):
  """State of ``delayed_nesterov``."""

  num_updates: jax.Array  # int32: server updates so far
  momentum: optax.Updates  # m, applied once every ``delay`` updates
  accumulated: optax.Updates  # the outer gradients since the last momentum update


def delayed_nesterov(
  learning_rate: float, momentum: float = 0.9, delay: int = 8
) -> optax.GradientTransformation:
  """Delayed Nesterov momentum for an asynchronous outer optimizer.

  Each update ``g_t`` (an outer gradient) is added to a buffer ``D``. On every ``delay``-th
  update the momentum absorbs the buffer's mean, ``m <- momentum * m + D / delay``, the step is
  Nesterov's ``-learning_rate * (momentum * m + g_t)`` and ``D`` is reset; on the others the
  step is plain, ``-learning_rate * g_t``, and ``m`` is left as is. So a single stale outer
  gradient never moves the momentum by itself; with ``delay = 1`` this is
  ``optax.sgd(learning_rate, momentum, nesterov=True)``.

  Args:
    learning_rate: the outer rate.
    momentum: the momentum decay, in [0, 1).
    delay: N >= 1, the updates between two momentum updates.

  Returns:
    An ``optax.GradientTransformation``; its state is a ``DelayedNesterovState``.

  References:
    Liu, Chhaparia, Douillard, Kale, Rusu, Shen, Szlam, Ranzato, "Asynchronous Local-SGD
    Training for Language Modeling", 2024 (arXiv:2401.09135), the Delayed Nesterov update.
  """
  if not 0.0 <= momentum < 1.0:
    raise ValueError(f"momentum must be in [0, 1), got {momentum}.")
  if int(delay) != delay or delay < 1:
    raise ValueError(f"delay must be a positive integer, got {delay}.")

  def init(params: optax.Params) -> DelayedNesterovState:
    return DelayedNesterovState(
      jnp.zeros([], jnp.int32), optax.tree.zeros_like(params), optax.tree.zeros_like(params)
    )

  def update(
    updates: optax.Updates, state: DelayedNesterovState, params: optax.Params | None = None
  ) -> tuple[optax.Updates, DelayedNesterovState]:
    del params
    num_updates = state.num_updates + 1
    apply = num_updates % delay == 0
    accumulated = jax.tree.map(lambda d, g: d + g, state.accumulated, updates)
    new_m = jax.tree.map(lambda m, d: momentum * m + d / delay, state.momentum, accumulated)
    m = jax.tree.map(lambda a, b: jnp.where(apply, a, b), new_m, state.momentum)
    steps = jax.tree.map(
      lambda g, m: -learning_rate * jnp.where(apply, momentum * m + g, g), updates, m
    )
    accumulated = jax.tree.map(lambda d: jnp.where(apply, jnp.zeros_like(d), d), accumulated)
    return steps, DelayedNesterovState(num_updates, m, accumulated)

  return optax.GradientTransformation(init, update)


def server_tx(method: str, num_workers: int) -> optax.GradientTransformation:
  """The outer optimizer of an ALADDIN variant (N = n for the delayed Nesterov)."""
  if method == "plain":
    return optax.sgd(1.0)
  if method == "nesterov":
    return optax.sgd(OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True)
  if method == "delayed_nesterov":
    return delayed_nesterov(OUTER_LR, OUTER_MOMENTUM, delay=num_workers)
  if method == "nesterov_gain1":  # exploratory: steady-state gain 0.1 / (1 - 0.9) = 1, as plain's
    return optax.sgd(0.1, momentum=OUTER_MOMENTUM, nesterov=True)
  raise ValueError(f"unknown ALADDIN variant {method!r}; variants are {VARIANTS}.")


def make_algorithm(cell: Cell, num_workers: int) -> sim.Algorithm:
  worker_tx = al.local_optimizer(cell.lr)
  if cell.method == "ar_sgd":
    return sim.algorithm("ar_sgd", worker_tx=worker_tx)
  return sim.algorithm(
    "aladdin",
    worker_tx=worker_tx,
    server_tx=server_tx(cell.method, num_workers),
    period=cell.period,
    alpha=cell.alpha,
    label=cell.method,
  )


def run_cell(cell: Cell, scale: Scale, context: driver.Context) -> dict[str, Any]:
  """The cell's summary (:func:`training.simulate_cell`)."""
  preset = dataclasses.replace(PRESETS[scale.preset], num_evals=scale.num_evals)
  algorithm = make_algorithm(cell, preset.num_workers)
  return training.simulate_cell(cell, preset, algorithm, context.cache_dir, scale.num_validation)
