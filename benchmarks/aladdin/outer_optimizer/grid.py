"""The outer-optimizer study's grid: each method's rate tuned on the validation split (HO, the
tuning seeds), the final seeds at the chosen rates on every cluster, then the exploratory cells.
The protocol is pre-registered in ``RESULTS.md``."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from benchmarks import harness
from benchmarks.aladdin.protocol import best_rate

# nesterov_gain1 is post hoc (added after the pre-registered cells had run), tuned alike.
METHODS = ("ar_sgd", "plain", "nesterov", "delayed_nesterov", "nesterov_gain1")
VARIANTS = METHODS[1:]
LABELS = {
  "ar_sgd": "AR-SGD",
  "plain": "ALADDIN-plain",
  "nesterov": "ALADDIN-Nesterov",
  "delayed_nesterov": "ALADDIN-delayed-Nesterov",
  "nesterov_gain1": "ALADDIN-Nesterov-0.1 (post hoc)",
}


@dataclasses.dataclass(frozen=True)
class Scale:
  preset: str
  num_validation: int
  num_evals: int
  ar_rates: tuple[float, ...]
  worker_rates: tuple[float, ...]
  tune_seeds: tuple[int, ...]
  seeds: tuple[int, ...]
  clusters: tuple[str, ...]
  periods: tuple[int, ...] = ()  # exploratory, besides the default 4
  alphas: tuple[float, ...] = ()  # exploratory, besides the default 0.5
  extra: tuple[tuple[str, float], ...] = ()  # exploratory (server, worker rate) pairs


SCALES = {
  "default": Scale(
    "default",
    1000,
    30,
    (0.05, 0.1, 0.2, 0.4, 0.8),
    (0.025, 0.05, 0.1, 0.2, 0.4),
    (100, 101),
    tuple(range(10)),
    ("HO", "HE1", "HE2"),
    periods=(1, 2, 8, 16),
    alphas=(0.25, 1.0),
    extra=(
      *[("nesterov", lr) for lr in (0.0125, 0.00625, 0.003125)],  # below the grid
      *[("nesterov_gain1", lr) for lr in (0.1, 0.2)],
    ),
  ),
  "smoke": Scale("smoke", 200, 3, (0.2,), (0.05,), (100,), (0,), ("HO", "HE1"), periods=(8,)),
}


@dataclasses.dataclass(frozen=True)
class Cell:
  group: str  # "tune", "explore" (validation accuracy) or "final" (test accuracy)
  method: str
  cluster: str
  seed: int
  lr: float  # AR-SGD's rate on the mean of n gradients, or ALADDIN's worker rate
  period: int = 4  # ALADDIN's lazy global-update period (al.Aladdin's default)
  alpha: float = 0.5  # ALADDIN's merge weight (al.Aladdin's default)

  @property
  def name(self) -> str:
    name = f"{self.group}/{self.method}/{self.cluster}/lr{self.lr:g}/seed{self.seed}"
    # The defaults stay out of the name, so the pre-registered cells keep theirs.
    if self.period != 4:
      name += f"/period{self.period}"
    if self.alpha != 0.5:
      name += f"/alpha{self.alpha:g}"
    return name


def tuning_cells(scale: Scale) -> list[Cell]:
  cells = []
  for method in METHODS:
    rates = scale.ar_rates if method == "ar_sgd" else scale.worker_rates
    for lr in rates:
      for seed in scale.tune_seeds:
        cells.append(Cell("tune", method, scale.clusters[0], seed, lr))
  return cells


def choose_rate(runs: dict[str, dict], scale: Scale, method: str) -> float | None:
  """The rate of the best mean validation accuracy (ties: the smaller), None until tuned."""
  rates = scale.ar_rates if method == "ar_sgd" else scale.worker_rates
  means = {}
  for lr in rates:
    accs = [
      runs[c.name]["test_accuracy"]
      for c in tuning_cells(scale)
      if c.method == method and c.lr == lr and c.name in runs
    ]
    if len(accs) < len(scale.tune_seeds):
      return None
    means[lr] = math.fsum(accs) / len(accs)
  return best_rate(means)


def final_cells(runs: dict[str, dict], scale: Scale) -> list[Cell]:
  """Seed by seed, every tuned method; AR-SGD off HO on the first seed only (its accuracy does
  not depend on the cluster, only its time)."""
  chosen = {m: choose_rate(runs, scale, m) for m in METHODS}
  cells = []
  for seed in scale.seeds:
    for cluster in scale.clusters:
      for method in METHODS:
        lr = chosen[method]
        if lr is None or (method == "ar_sgd" and cluster != "HO" and seed != scale.seeds[0]):
          continue
        cells.append(Cell("final", method, cluster, seed, lr))
  return cells


def explore_cells(runs: dict[str, dict], scale: Scale) -> list[Cell]:
  """Exploratory, after the pre-registered cells: each tuned variant at its chosen rate with
  other periods and alphas, and ``scale.extra`` (validation, tuning seeds, HO)."""
  cells = []
  for method in VARIANTS:
    lr = choose_rate(runs, scale, method)
    if lr is None:
      continue
    options = [(p, 0.5) for p in scale.periods] + [(4, a) for a in scale.alphas]
    for period, alpha in options:
      for seed in scale.tune_seeds:
        cells.append(Cell("explore", method, scale.clusters[0], seed, lr, period, alpha))
  for method, lr in scale.extra:
    for seed in scale.tune_seeds:
      cells.append(Cell("explore", method, scale.clusters[0], seed, lr))
  return cells


def cells(scale: Scale, out: Path) -> list[Cell]:
  """The tuning cells, then (once a method is tuned) its final cells, then the exploratory ones."""
  runs = harness.load_summaries(out)
  return [*tuning_cells(scale), *final_cells(runs, scale), *explore_cells(runs, scale)]
