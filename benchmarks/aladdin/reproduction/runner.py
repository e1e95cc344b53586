"""Runs one cell of the reproduction's grids: a simulated training run, or one of the first
study's two measurements (Table 3 timing-only, the simulator's overhead)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import jax
import optax

from benchmarks import driver
from benchmarks.aladdin import training
from benchmarks.aladdin.protocol import PRESETS, Preset
from benchmarks.aladdin.reproduction.grid import Reproduction, RunSpec, Scale
from benchmarks.aladdin.reproduction.table3 import table3
from optax_lena import aladdin as al
from optax_lena.aladdin import simulator as sim

_TXS: dict[tuple, Any] = {}


def _tx(key: tuple) -> Any:
  """Optax transformations built once per configuration (the simulator's jit cache keys on
  them)."""
  if key not in _TXS:
    kind, lr = key[0], key[1]
    if kind == "local":
      _TXS[key] = al.local_optimizer(lr)  # momentum 0.9, weight decay 1e-4
    elif kind == "sgd":
      _TXS[key] = optax.sgd(lr)
    elif kind == "momentum":
      _TXS[key] = optax.sgd(lr, momentum=0.9)
    else:
      raise ValueError(key)
  return _TXS[key]


def make_algorithm(spec: RunSpec, preset: Preset) -> sim.Algorithm:
  """The algorithm of a run, with the study's learning rates.

  * ALADDIN, EASGD (``tau`` 2, the default), SGP workers: ``al.local_optimizer(lr)`` (momentum
    SGD 0.9, weight decay 1e-4, the paper's local optimizer). ALADDIN's PS: ``optax.sgd(lr)``
    (the printed plain step) or ``optax.sgd(lr, momentum=0.9)`` on the normalised g~.
  * AR-SGD: ``al.local_optimizer(ar_lr)`` on the mean of the n gradients.
  * ASP: the PS applies each gradient with ``optax.sgd(lr)`` (the printed Hogwild step).
  """
  lr = spec.lr or preset.lr
  if spec.alg == "aladdin":
    return sim.algorithm(
      "aladdin",
      message="gradient",  # the first study's ALADDIN: raw gradients (Algorithm 1 as printed)
      worker_tx=_tx(("local", lr)),
      server_tx=_tx((spec.server_tx, lr)),
      period=spec.period,
      normalise=spec.normalise,
      alpha=spec.alpha,
      reply_every=spec.reply_every or None,
    )
  if spec.alg == "ar_sgd":
    lr = preset.ar_lr
  # The optimizer that trains the model: the workers' local one, or ASP's server's plain step.
  on_server = sim.algorithm(spec.alg).optimizer_field == "server_tx"
  return sim.algorithm(spec.alg, optimizer=_tx(("sgd" if on_server else "local", lr)))


def run_one(spec: RunSpec, preset: Preset, cache_dir: Path, *, profile: bool = False) -> dict:
  """Simulates one training run and returns its JSON summary."""
  problem = training.make_problem(preset, spec.seed, cache_dir)
  nbytes = float(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(problem.params)))
  cluster = training.training_cluster(preset, spec.cluster, nbytes)
  budget = int(preset.epochs * len(problem.x_train))
  result = sim.simulate(
    make_algorithm(spec, preset),
    cluster,
    batch_size=preset.batch_size,
    problem=problem,
    num_samples=budget,
    num_evals=preset.num_evals,
    seed=spec.seed,
    profile=profile,
  )
  out = result.summary()
  out["spec"] = dataclasses.asdict(spec)
  out["name"] = spec.name
  out["model_bytes"] = nbytes
  return out


def measure_overhead(preset: Preset, cache_dir: Path) -> dict:
  """Runs ALADDIN on the study cluster twice (the first compiles) and times the JAX calls of
  the second (``overhead.json``)."""
  spec = RunSpec("overhead", "aladdin", preset.study_cluster, 0)
  run_one(spec, preset, cache_dir)
  t0 = time.perf_counter()
  result = run_one(spec, preset, cache_dir, profile=True)
  result["outer_wall_time"] = time.perf_counter() - t0
  result["overhead_fraction"] = (result["wall_time"] - result["jax_time"]) / result["wall_time"]
  keep = {
    k: result[k]
    for k in ("name", "wall_time", "jax_time", "num_events", "overhead_fraction", "outer_wall_time")
  }
  return keep


def run(cell: driver.Measurement | RunSpec, setup: Reproduction, context: driver.Context) -> dict:
  """A training run's summary, or a measurement's result."""
  preset = PRESETS[setup.preset]
  if isinstance(cell, RunSpec):
    return run_one(cell, preset, context.cache_dir)
  if cell.name == "table3":
    return table3(*setup.table3_sizes)
  return measure_overhead(preset, context.cache_dir)


def run_cell(spec: RunSpec, scale: Scale, context: driver.Context) -> dict[str, Any]:
  """A validation cell: AR-SGD at its rate or an option, evaluated on the validation split."""
  preset = PRESETS[scale.preset]
  if spec.alg == "ar_sgd":  # main.make_algorithm takes AR-SGD's rate from the preset
    preset = dataclasses.replace(preset, ar_lr=spec.lr)
  run = training.simulate_held_out(
    preset,
    make_algorithm(spec, preset),
    spec.cluster,
    spec.seed,
    context.cache_dir,
    scale.num_validation,
    "validation",
  )
  return {"spec": dataclasses.asdict(spec), **run}
