"""The training problem and simulated cluster the ALADDIN studies' runners share (MNIST-1D,
CNN1D); their declared sizes and rules are in ``protocol.py``.

``make_problem`` builds the example CNN on MNIST-1D (one data draw for every run, the model
initialised from the run's seed); ``training_cluster`` scales the paper's ResNet-50 cluster to
it, so that communication weighs on the small CNN as it did on ResNet-50.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks.aladdin.protocol import Preset
from examples import input_pipeline, losses
from examples.models import CNN1D
from optax_lena.aladdin import simulator as cl
from optax_lena.aladdin import simulator as sim

# The training cluster reproduces the ResNet-50 paper cluster's ratios (see training_cluster).
REFERENCE_MODEL = "ResNet-50"


_PROBLEMS: dict[tuple, sim.Problem] = {}
_TXS: dict[tuple, Any] = {}


def make_problem(
  preset: Preset,
  seed: int,
  cache_dir: Path,
  num_validation: int = 0,
  evaluate_on: str = "test",
) -> sim.Problem:
  """MNIST-1D (data seed 0, the same draw for every run) and CNN1D initialised from ``seed``.

  ``num_validation > 0`` holds out the last ``num_validation`` training examples: the problem
  trains on the others and evaluates on the test set, or on the held-out examples with
  ``evaluate_on="validation"`` (so that tuning never sees the test set). The defaults are the
  whole training set and the test set.

  The loss and accuracy functions are shared by every problem of one preset, so the simulator's
  jitted functions are compiled once per algorithm configuration, not once per run."""
  if evaluate_on not in ("test", "validation"):
    raise ValueError(f"evaluate_on must be 'test' or 'validation', got {evaluate_on!r}.")
  if evaluate_on == "validation" and num_validation <= 0:
    raise ValueError("evaluate_on='validation' needs num_validation > 0.")
  key = (preset, seed, num_validation, evaluate_on)
  if key in _PROBLEMS:
    return _PROBLEMS[key]
  data = input_pipeline.load_mnist1d(
    cache_dir, seed=0, num_samples=preset.num_samples, num_validation=num_validation
  )
  x_eval, y_eval = data["x_test"], data["y_test"]
  if evaluate_on == "validation":
    x_eval, y_eval = data["x_val"], data["y_val"]
  model, fns = _model_fns(preset)
  params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, 40)))["params"]
  problem = sim.Problem(params, fns[0], fns[1], data["x_train"], data["y_train"], x_eval, y_eval)
  _PROBLEMS[key] = problem
  return problem


def simulate_held_out(
  preset: Preset,
  algorithm: sim.Algorithm,
  cluster: str,
  seed: int,
  cache_dir: Path,
  num_validation: int,
  evaluate_on: str,
) -> dict[str, Any]:
  """One simulated run of ``algorithm`` on the problem with ``num_validation`` training examples
  held out, for ``preset.epochs`` passes over the rest, evaluated on ``evaluate_on``.

  Returns:
    ``test_accuracy`` (the evaluated split's, at the end), ``train_loss`` (the workers'
    mini-batch losses since the last evaluation; None if NaN), simulated ``time``, ``curve``
    (``[time, accuracy, train_loss]`` per evaluation) and ``wall_time``.
  """
  problem = make_problem(preset, seed, cache_dir, num_validation, evaluate_on)
  nbytes = float(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(problem.params)))
  result = sim.simulate(
    algorithm,
    training_cluster(preset, cluster, nbytes),
    batch_size=preset.batch_size,
    problem=problem,
    num_samples=int(preset.epochs * len(problem.x_train)),
    num_evals=preset.num_evals,
    seed=seed,
  )

  def finite(x: float) -> float | None:
    return None if math.isnan(x) else x

  last = result.evals[-1]
  return {
    "test_accuracy": last.test_accuracy,
    "train_loss": finite(last.train_loss),
    "time": result.time,
    "curve": [[p.time, p.test_accuracy, finite(p.train_loss)] for p in result.evals],
    "wall_time": result.wall_time,
  }


def _model_fns(preset: Preset) -> tuple[CNN1D, tuple[Any, Any]]:
  key = ("model", preset.width)
  if key not in _TXS:
    model = CNN1D(features=preset.width)
    _TXS[key] = (model, (losses.ClassifierLoss(model), losses.ClassifierAccuracy(model)))
  return _TXS[key]


def training_cluster(preset: Preset, name: str, model_bytes: float) -> cl.Cluster:
  """The simulated cluster of the MNIST-1D runs, scaled from the paper's ResNet-50 cluster.

  One time unit is a worker's iteration. The wire time of a message, the PS's processing time
  and the latency are those of ResNet-50 on the paper's cluster divided by its compute time, so
  communication weighs on the small CNN exactly as it did on ResNet-50. Training runs one PS
  (the simulator does not split the server's computation); its NIC and processing are those of
  the paper's four shards together (4x a worker NIC's bandwidth, a quarter of the cost per
  byte).
  """
  ref = cl.PAPER_MODELS[REFERENCE_MODEL]
  paper = cl.paper_cluster(ref.compute_time)
  wire_ratio = paper.wire_time(ref.nbytes) / ref.compute_time
  ps_ratio = paper.ps_time(ref.nbytes, update=False) / ref.compute_time
  bandwidth = model_bytes / wire_ratio
  return cl.make_cluster(
    preset.num_workers,
    1.0,
    slowdown=cl.PAPER_SLOWDOWNS[name],
    bandwidth=bandwidth,
    latency=paper.latency / ref.compute_time,
    ps_cost_per_byte=ps_ratio / model_bytes / paper.num_shards,
    ps_bandwidth=bandwidth * paper.num_shards,
    num_shards=1,
    workers_per_machine=2,
    ps_colocated=False,
    jitter=preset.jitter,
  )


def simulate_cell(
  cell: Any, preset: Preset, algorithm: sim.Algorithm, cache_dir: Path, num_validation: int
) -> dict[str, Any]:
  """A cell of a study tuned on the validation split: its summary
  (:func:`simulate_held_out`) and the cell itself. The cell has ``group`` ("final": evaluated
  on the test set; any other: tuning, on the held-out validation examples), ``cluster`` and
  ``seed``."""
  evaluate_on = "test" if cell.group == "final" else "validation"
  run = simulate_held_out(
    preset, algorithm, cell.cluster, cell.seed, cache_dir, num_validation, evaluate_on
  )
  return {"cell": dataclasses.asdict(cell), **run}
