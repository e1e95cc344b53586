"""Runs one cell of the baselines study in the simulator."""

from __future__ import annotations

import dataclasses
from typing import Any

import optax

from benchmarks import driver
from benchmarks.aladdin import training
from benchmarks.aladdin.baselines.grid import METHODS, Cell, Scale
from benchmarks.aladdin.protocol import PRESETS
from optax_lena import aladdin as al
from optax_lena.aladdin import simulator as sim


def make_algorithm(method: str, lr: float) -> sim.Algorithm:
  """The method at rate ``lr``; every other option is the algorithm's default (EASGD tau 2,
  beta 0.9 / n; SGP overlap 1; ALADDIN period 4, alpha 0.5, server ``optax.sgd(1.0)``)."""
  if method == "asp_momentum":
    return sim.algorithm("asp", server_tx=optax.sgd(lr, momentum=0.9), label=method)
  if method == "asp_plain":
    return sim.algorithm("asp", server_tx=optax.sgd(lr), label=method)
  if method not in METHODS:
    raise ValueError(f"unknown method {method!r}; methods are {METHODS}.")
  return sim.algorithm(method, worker_tx=al.local_optimizer(lr))


def run_cell(cell: Cell, scale: Scale, context: driver.Context) -> dict[str, Any]:
  """The cell's summary (:func:`training.simulate_cell`)."""
  preset = dataclasses.replace(PRESETS[scale.preset], num_evals=scale.num_evals, epochs=cell.epochs)
  algorithm = make_algorithm(cell.method, cell.lr)
  return training.simulate_cell(cell, preset, algorithm, context.cache_dir, scale.num_validation)
