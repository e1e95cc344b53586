"""The baselines study's grid: every method's rate sweep on the validation split at each
budget (tuning seeds, HO), then the final seeds at each method's chosen rate on every cluster.
The protocol is pre-registered in ``RESULTS.md``; the setting and the tuning rule are the
outer-optimizer study's (``../outer_optimizer/grid.py``)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from benchmarks import harness
from benchmarks.aladdin.protocol import best_rate

METHODS = ("ar_sgd", "aladdin", "sgp", "easgd", "asp_momentum", "asp_plain")
BASELINE = METHODS[0]
LABELS = {
  "ar_sgd": "AR-SGD",
  "aladdin": "ALADDIN",
  "sgp": "SGP",
  "easgd": "EASGD",
  "asp_momentum": "ASP (momentum 0.9 server)",
  "asp_plain": "ASP (plain SGD server)",
}


@dataclasses.dataclass(frozen=True)
class Scale:
  preset: str
  num_validation: int
  num_evals: int
  budgets: tuple[int, ...]  # epochs of the training split
  rates: dict[str, tuple[float, ...]]  # per method (ASP: the server's rate)
  tune_seeds: tuple[int, ...]
  seeds: tuple[int, ...]
  clusters: tuple[str, ...]


_WORKER = (0.025, 0.05, 0.1, 0.2, 0.4)
_SERVER = (0.0125, 0.025, 0.05, 0.1, 0.2)
SCALES = {
  "default": Scale(
    "default",
    1000,
    30,
    (15, 45),
    {
      "ar_sgd": (0.05, 0.1, 0.2, 0.4, 0.8),
      "aladdin": _WORKER,
      "sgp": _WORKER,
      "easgd": _WORKER,
      "asp_momentum": _SERVER,
      "asp_plain": _SERVER,
    },
    (100, 101),
    tuple(range(10)),
    ("HO", "HE1", "HE2"),
  ),
  "smoke": Scale(
    "smoke", 200, 3, (1, 2), {m: (0.05,) for m in METHODS}, (100,), (0,), ("HO", "HE1")
  ),
}


@dataclasses.dataclass(frozen=True)
class Cell:
  group: str  # "tune" (validation accuracy) or "final" (test accuracy)
  method: str
  cluster: str
  epochs: int
  seed: int
  lr: float  # the workers' rate (AR-SGD: on the mean of n gradients); ASP: the server's

  @property
  def name(self) -> str:
    return (
      f"{self.group}/{self.method}/{self.cluster}/{self.epochs}ep/lr{self.lr:g}/seed{self.seed}"
    )


def tuning_cells(scale: Scale) -> list[Cell]:
  """Budget by budget (the short one first), every method, rate and tuning seed on HO."""
  return [
    Cell("tune", method, scale.clusters[0], epochs, seed, lr)
    for epochs in scale.budgets
    for method in METHODS
    for lr in scale.rates[method]
    for seed in scale.tune_seeds
  ]


def _tuning_means(runs: dict[str, dict], scale: Scale, method: str, epochs: int) -> dict:
  """Mean validation accuracy per rate, over the tuning seeds finished so far."""
  means = {}
  for lr in scale.rates[method]:
    names = [Cell("tune", method, scale.clusters[0], epochs, s, lr).name for s in scale.tune_seeds]
    accs = [runs[n]["test_accuracy"] for n in names if n in runs]
    means[lr] = (math.fsum(accs) / len(accs) if accs else None, len(accs))
  return means


def choose_rate(runs: dict[str, dict], scale: Scale, method: str, epochs: int) -> float | None:
  """The outer study's rule (best mean validation accuracy, ties: the smaller rate); None until
  every tuning cell of the method at this budget has run."""
  means = _tuning_means(runs, scale, method, epochs)
  if any(k < len(scale.tune_seeds) for _, k in means.values()):
    return None
  return best_rate({lr: m for lr, (m, _) in means.items()})


def final_cells(runs: dict[str, dict], scale: Scale) -> list[Cell]:
  """Budget by budget, seed by seed, every tuned method; AR-SGD off HO on the first seed only
  (its model does not depend on the cluster, only its time)."""
  cells = []
  for epochs in scale.budgets:
    chosen = {m: choose_rate(runs, scale, m, epochs) for m in METHODS}
    for seed in scale.seeds:
      for cluster in scale.clusters:
        for method in METHODS:
          lr = chosen[method]
          off_ho = method == BASELINE and cluster != "HO" and seed != scale.seeds[0]
          if lr is not None and not off_ho:
            cells.append(Cell("final", method, cluster, epochs, seed, lr))
  return cells


def cells(scale: Scale, out: Path) -> list[Cell]:
  """The pre-registered order: tune and run the short budget first, so a partial run has it."""
  runs = harness.load_summaries(out)
  finals = final_cells(runs, scale)
  return [
    c for epochs in scale.budgets for c in (*tuning_cells(scale), *finals) if c.epochs == epochs
  ]
