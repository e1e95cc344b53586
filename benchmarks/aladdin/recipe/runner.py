"""Runs one cell of either recipe grid in the simulator."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import optax

from benchmarks import driver
from benchmarks.aladdin import training
from benchmarks.aladdin.protocol import PRESETS
from benchmarks.aladdin.recipe.grid import CANDIDATES, LR, Candidates, Cell, Run, Scale
from optax_lena import aladdin as al
from optax_lena.aladdin import simulator as sim


def _server_tx(key: tuple[str, float]) -> optax.GradientTransformation:
  kind, lr = key
  return optax.sgd(lr, momentum=0.5) if kind == "sgd_m" else optax.sgd(lr)


def make_algorithm(candidate: str, lr: float = LR) -> sim.Algorithm:
  """The candidate with the workers' rate ``lr`` ("printed": the server's rate too)."""
  options = CANDIDATES[candidate]
  worker_tx = al.local_optimizer(lr)
  if options is None:
    return sim.algorithm("ar_sgd", worker_tx=worker_tx)
  options = dict(options, message=options.get("message", "update"))
  if "server_tx" in options:
    kind, server_lr = options["server_tx"]
    options["server_tx"] = _server_tx((kind, lr if kind == "sgd" else server_lr))
  return sim.algorithm("aladdin", worker_tx=worker_tx, **options)


def run_candidate(run: Run, setup: Candidates, context: driver.Context) -> dict[str, Any]:
  """One candidate's run on the whole training set, evaluated on the test set."""
  preset = PRESETS[setup.preset]
  problem = training.make_problem(preset, run.seed, context.cache_dir)
  nbytes = float(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(problem.params)))
  cluster = training.training_cluster(preset, run.cluster, nbytes)
  result = sim.simulate(
    make_algorithm(run.candidate),
    cluster,
    batch_size=preset.batch_size,
    problem=problem,
    num_samples=int(preset.epochs * len(problem.x_train)),
    num_evals=preset.num_evals,
    seed=run.seed,
  )
  last = result.evals[-1]
  return {
    "candidate": run.candidate,
    "cluster": run.cluster,
    "seed": run.seed,
    "test_accuracy": last.test_accuracy,
    "local_accuracy": None if math.isnan(last.local_accuracy) else last.local_accuracy,
    "time": result.time,
    "wall_time": result.wall_time,
  }


def run_cell(cell: Cell, scale: Scale, context: driver.Context) -> dict[str, Any]:
  """A validation-grid cell's summary (:func:`training.simulate_cell`)."""
  preset = PRESETS[scale.preset]
  preset = dataclasses.replace(preset, num_evals=scale.num_evals, epochs=scale.epochs)
  algorithm = make_algorithm(cell.candidate, cell.lr)
  return training.simulate_cell(cell, preset, algorithm, context.cache_dir, scale.num_validation)
