"""Sections (a) and (b): the update alone, and the statistics plus update from stacked gradients."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

import optax_lena as ol
from benchmarks.overhead.common import (
  NUM_WORKERS,
  Row,
  Stepper,
  apply_update,
  log,
  optimizers,
  slices_mean,
  timed_rows,
  update_stepper,
)
from benchmarks.overhead.trees import grad_stats_for, materialize, tree_info

PyTree = Any


# ----------------------------------------------------------------------------------------------
# (a) Update only, statistics given.


def bench_update_only(
  tree_name: str,
  shapes: PyTree,
  repeats: int,
  names: Sequence[str] = ("sgd_momentum", "lena", "adascale", "lars", "lamb"),
  layer_axes: Any = None,
  target: str = "update_only",
) -> list[Row]:
  """The update of each optimizer in ``names`` (the first is the baseline) with the statistics
  given; with ``layer_axes`` (a scanned tree) the optax_lena optimizers are per slice and their
  statistics per-slice vectors. ``target``: the target LENA's row is checked against."""
  log(f"  (a) update only, statistics given: {tree_name} {tree_info(shapes)}")
  grads = materialize(shapes, seed=1)
  stats = grad_stats_for(grads, layer_axes=layer_axes)
  opts = optimizers(layer_axes=layer_axes)
  runners = {}
  for name in names:
    tx, uses_stats = opts[name]

    def step(params, opt_state, grads, stats, tx=tx, uses_stats=uses_stats):
      return apply_update(tx, uses_stats, grads, opt_state, params, stats)

    runners[name] = update_stepper(step, tx, materialize(shapes, seed=0), (grads, stats))
  return timed_rows("a. update only", tree_name, runners, repeats, names[0], {"lena": target})


# ----------------------------------------------------------------------------------------------
# (b) Statistics plus update from S stacked worker gradients.

BASELINE = "slices_mean+sgd_momentum"
# The baseline written with jnp.mean over the worker axis, for context (what this section
# compared against before issue 49): a scalar loop on XLA:CPU, many times slower.
SLOW_BASELINE = "jnp.mean+sgd_momentum"


def bench_stacked(
  tree_name: str,
  shapes: PyTree,
  repeats: int,
  num_workers: int = NUM_WORKERS,
  layer_axes: Any = None,
  with_slow_mean: bool = False,
) -> list[Row]:
  """``ol.stacked_grad_stats`` + LENA against the mean as a sum of slices + SGD-momentum, from S
  stacked worker gradients; with ``layer_axes`` the statistics and LENA are per slice;
  ``with_slow_mean`` adds the ``jnp.mean`` baseline as a context row."""
  log(f"  (b) stacked statistics + update, S={num_workers}: {tree_name} {tree_info(shapes)}")
  stacked = materialize(shapes, seed=1, lead=(num_workers,))
  opts = optimizers(num_workers, layer_axes=layer_axes)
  sgd, lena = opts["sgd_momentum"][0], opts["lena"][0]

  def baseline(params, opt_state, stacked):
    return apply_update(sgd, False, slices_mean(stacked), opt_state, params)

  def slow_baseline(params, opt_state, stacked):
    mean = jax.tree.map(lambda g: jnp.mean(g, axis=0), stacked)
    return apply_update(sgd, False, mean, opt_state, params)

  def statistics_and_lena(params, opt_state, stacked):
    mean, stats = ol.stacked_grad_stats(stacked, layer_axes=layer_axes)
    return apply_update(lena, True, mean, opt_state, params, stats)

  steps = [(BASELINE, baseline, sgd), ("stacked_grad_stats+lena", statistics_and_lena, lena)]
  if with_slow_mean:
    steps.append((SLOW_BASELINE, slow_baseline, sgd))
  runners: dict[str, Stepper] = {
    name: update_stepper(fn, tx, materialize(shapes, seed=0), (stacked,)) for name, fn, tx in steps
  }
  targets = {"stacked_grad_stats+lena": "stacked"}
  return timed_rows("b. stacked stats + update", tree_name, runners, repeats, BASELINE, targets)
