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
) -> list[Row]:
  log(f"  (a) update only, statistics given: {tree_name} {tree_info(shapes)}")
  grads = materialize(shapes, seed=1)
  stats = grad_stats_for(grads)
  opts = optimizers()
  runners = {}
  for name in names:
    tx, uses_stats = opts[name]

    def step(params, opt_state, grads, stats, tx=tx, uses_stats=uses_stats):
      return apply_update(tx, uses_stats, grads, opt_state, params, stats)

    runners[name] = update_stepper(step, tx, materialize(shapes, seed=0), (grads, stats))
  return timed_rows(
    "a. update only", tree_name, runners, repeats, "sgd_momentum", {"lena": "update_only"}
  )


# ----------------------------------------------------------------------------------------------
# (b) Statistics plus update from S stacked worker gradients.


def bench_stacked(
  tree_name: str, shapes: PyTree, repeats: int, num_workers: int = NUM_WORKERS
) -> list[Row]:
  log(f"  (b) stacked statistics + update, S={num_workers}: {tree_name} {tree_info(shapes)}")
  stacked = materialize(shapes, seed=1, lead=(num_workers,))
  opts = optimizers(num_workers)

  def baseline(params, opt_state, stacked):
    mean = jax.tree.map(lambda g: jnp.mean(g, axis=0), stacked)
    return apply_update(opts["sgd_momentum"][0], False, mean, opt_state, params)

  def lena(params, opt_state, stacked):
    mean, stats = ol.stacked_grad_stats(stacked)
    return apply_update(opts["lena"][0], True, mean, opt_state, params, stats)

  runners: dict[str, Stepper] = {}
  for name, fn in (("mean+sgd_momentum", baseline), ("stacked_grad_stats+lena", lena)):
    tx = opts["sgd_momentum" if name.endswith("momentum") else "lena"][0]
    runners[name] = update_stepper(fn, tx, materialize(shapes, seed=0), (stacked,))
  targets = {"stacked_grad_stats+lena": "stacked"}
  return timed_rows(
    "b. stacked stats + update", tree_name, runners, repeats, "mean+sgd_momentum", targets
  )
