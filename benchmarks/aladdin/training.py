"""The training problem and simulated cluster the ALADDIN studies share (MNIST-1D, CNN1D).

``make_problem`` builds the example CNN on MNIST-1D (one data draw for every run, the model
initialised from the run's seed); ``training_cluster`` scales the paper's ResNet-50 cluster to
it, so that communication weighs on the small CNN as it did on ResNet-50.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import harness
from examples import input_pipeline, losses
from examples.models import CNN1D
from optax_lena.aladdin import simulator as cl
from optax_lena.aladdin import simulator as sim

ALGORITHMS = sim.ALGORITHMS
CLUSTERS = ("HO", "HE0", "HE1", "HE2")
LABELS = {"aladdin": "ALADDIN", "ar_sgd": "AR-SGD", "asp": "ASP", "easgd": "EASGD", "sgp": "SGP"}
# The training cluster reproduces the ResNet-50 paper cluster's ratios (see training_cluster).
REFERENCE_MODEL = "ResNet-50"


@dataclasses.dataclass(frozen=True)
class Preset:
  """Sizes of the study."""

  num_samples: int  # MNIST-1D examples before the 80/20 split
  batch_size: int  # per worker
  epochs: float  # the sample budget of every run, in passes over the training set
  lr: float  # the workers' (and one-gradient) learning rate
  ar_lr: float  # AR-SGD's rate on the mean of n gradients
  num_workers: int
  seeds: tuple[int, ...]
  clusters: tuple[str, ...]  # Table 2's clusters
  study_cluster: str  # where the ablation, period and choices run
  choice_seeds: tuple[int, ...]
  num_evals: int
  width: int  # CNN1D features
  jitter: float = 0.1  # +-10% per-iteration compute time: equal workers drift out of phase


PRESETS = {
  "default": Preset(
    num_samples=5000,
    batch_size=32,
    epochs=15,
    lr=0.1,
    ar_lr=0.2,
    num_workers=8,
    seeds=(0, 1, 2),
    clusters=("HO", "HE1", "HE2"),
    study_cluster="HE1",
    choice_seeds=(0,),
    num_evals=15,
    width=32,
  ),
  "smoke": Preset(
    num_samples=1000,
    batch_size=16,
    epochs=1,
    lr=0.05,
    ar_lr=0.2,
    num_workers=4,
    seeds=(0,),
    clusters=("HE1",),
    study_cluster="HE1",
    choice_seeds=(0,),
    num_evals=3,
    width=8,
  ),
}


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


def study_arguments(description: str, out: Path) -> argparse.ArgumentParser:
  """The options every resumable simulator study takes (``--out``, default ``out``,
  ``--cache_dir``, ``--smoke``, ``--max_cells``, ``--report_only``)."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--out", type=Path, default=out)
  parser.add_argument("--cache_dir", type=Path, default=Path.home() / ".cache" / "mnist1d")
  parser.add_argument("--smoke", action="store_true", help="the tiny CI version")
  parser.add_argument("--max_cells", type=int, default=None, help="run at most this many")
  parser.add_argument("--report_only", action="store_true")
  return parser


def run_in_passes(
  passes: Sequence[Callable[[], list[Any]]],
  run_cell: Callable[[Any], dict[str, Any]],
  runs: dict[str, dict],
  out: Path,
  limit: int | None,
) -> int:
  """Runs the unfinished cells of each pass in order (a pass's cells may depend on the earlier
  passes' results, e.g. the rates tuned), at most ``limit`` in all, saving ``runs`` after each
  cell; writes ``machine.json`` when any cell ran. Returns the number of cells run."""
  path, trained = harness.summaries_path(out), 0
  for cells in passes:
    if limit is not None and limit <= 0:
      break
    save = lambda summaries: harness.save_summaries(path, summaries)
    done, _ = harness.run_summaries(cells(), run_cell, runs, save, limit=limit)
    trained += done
    limit = None if limit is None else limit - done
  if trained:
    harness.write_json(out / "machine.json", harness.machine_info())
  return trained


def not_run_note(cells: Sequence[Any], runs: dict[str, dict]) -> list[str]:
  """The report's footer naming the cells without a result yet (none when every one ran)."""
  missing = [c.name for c in cells if c.name not in runs]
  return [f"Not run yet ({len(missing)} cells), e.g. `{missing[0]}`.\n"] if missing else []


def study_main(
  argv: Sequence[str] | None,
  description: str,
  default_out: Path,
  scales: dict[str, Any],
  passes: Callable[[dict[str, dict], Any], Sequence[Callable[[], list[Any]]]],
  run_cell: Callable[[Any, Any, str], dict[str, Any]],
  report: Callable[[dict[str, dict], Any], str],
  plot: Callable[[dict[str, dict], Path, Any], bool],
  plot_name: str,
) -> str:
  """A resumable study's command line: runs ``passes(runs, scale)`` (unless ``--report_only``),
  then writes ``tables.md`` and the plot from every finished cell; returns the tables."""
  args = study_arguments(description, default_out).parse_args(argv)
  scale = scales["smoke" if args.smoke else "default"]
  out = args.out
  out.mkdir(parents=True, exist_ok=True)
  runs = harness.load_summaries(harness.summaries_path(out))
  if not args.report_only:
    run = lambda cell: run_cell(cell, scale, args.cache_dir)
    run_in_passes(passes(runs, scale), run, runs, out, args.max_cells)
  text = report(runs, scale)
  harness.write_text(out / "tables.md", text)
  plot(runs, out / plot_name, scale)
  print(text)
  return text


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


def save_figure(fig: Any, path: Path) -> None:
  """Writes ``fig`` as PNG and closes it."""
  import matplotlib.pyplot as plt

  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


TARGET = 0.8  # test accuracy of the time-to-target columns


def accuracy_at(run: dict[str, Any], time: float) -> float:
  """The last accuracy of ``run`` evaluated at or before simulated ``time`` (nan before any)."""
  acc = math.nan
  for t, a, _ in run["curve"]:
    if t <= time + 1e-9:
      acc = a
  return acc


def time_to(run: dict[str, Any], target: float) -> float | None:
  """The simulated time of ``run``'s first evaluation at or above ``target``, or None."""
  return next((t for t, a, _ in run["curve"] if a >= target), None)
