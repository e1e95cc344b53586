"""The recipe study's two grids, in the order they ran:

* the candidates (``CANDIDATES``: update messages with alpha / period / server variants, and the
  paper's literal reading) on HO and HE1, seeds 0-2 (3-14 for the chosen defaults and AR-SGD),
  compared on the test accuracy: the measurement that chose ``al.Aladdin``'s defaults;
* the same choice re-made on a validation split: every candidate with its workers' rate tuned,
  chosen by the validation accuracy of seeds 100-101 on HO, then the chosen recipe on seeds
  0-9 (test accuracy, HO and HE1) against AR-SGD with its rate tuned alike (pre-registered in
  ``RESULTS.md``; the setting is the baselines study's: 1,000 of the 4,000 training examples
  held out, 30 evaluations).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.aladdin.protocol import best_rate

LR = 0.1

# name -> ALADDIN options (None: AR-SGD). "recipe" is whatever al.Aladdin defaults to.
CANDIDATES: dict[str, dict[str, Any] | None] = {
  "ar_sgd": None,
  "printed": dict(message="gradient", server_tx=("sgd", LR), alpha="count"),
  "update_p4_a0.5": dict(period=4, alpha=0.5),
  "update_p4_npi": dict(period=4, alpha="n_pi"),
  "update_p4_count": dict(period=4, alpha="count"),
  "update_p4_a1": dict(period=4, alpha=1.0),
  "update_p2_a0.5": dict(period=2, alpha=0.5),
  "update_p2_a0.8": dict(period=2, alpha=0.8),
  "update_p1_a0.5": dict(period=1, alpha=0.5),
  "update_p4_a0.5_server_m0.5": dict(period=4, alpha=0.5, server_tx=("sgd_m", 1.0)),
  "update_p4_a0.3": dict(period=4, alpha=0.3),
  "update_p8_a0.5": dict(period=8, alpha=0.5),
  "update_p4_a0.65": dict(period=4, alpha=0.65),
  "update_p6_a0.5": dict(period=6, alpha=0.5),
}


@dataclasses.dataclass(frozen=True)
class Candidates:
  """The first grid: every candidate on every cluster and seed (the chosen defaults and AR-SGD
  on more seeds)."""

  preset: str = "default"
  seeds: tuple[int, ...] = (0, 1, 2)
  clusters: tuple[str, ...] = ("HO", "HE1")
  candidates: tuple[str, ...] = tuple(CANDIDATES)
  more_seeds: tuple[int, ...] = tuple(range(3, 15))
  more_candidates: tuple[str, ...] = ("ar_sgd", "update_p4_a0.5")


@dataclasses.dataclass(frozen=True)
class Run:
  """One candidate on one cluster with one seed."""

  candidate: str
  cluster: str
  seed: int

  @property
  def name(self) -> str:
    return f"{self.candidate}/{self.cluster}/{self.seed}"


def candidate_cells(setup: Candidates, out: Path) -> list[Run]:
  """Seed by seed: every candidate on every cluster, then the more seeds of the defaults."""
  del out  # the grid does not depend on results
  cells = [Run(c, k, s) for s in setup.seeds for k in setup.clusters for c in setup.candidates]
  more = setup.more_candidates
  return cells + [Run(c, k, s) for s in setup.more_seeds for k in setup.clusters for c in more]


# ------------------------------------------------------------------------------------------------
# The choice re-made on validation
# ------------------------------------------------------------------------------------------------

DEFAULT = "update_p4_a0.5"  # al.Aladdin's defaults
BASELINE = "ar_sgd"
# Ties go to the default, then to the earlier candidate of main.py's table.
RECIPES = (DEFAULT, *[c for c in CANDIDATES if c not in (BASELINE, DEFAULT)])


@dataclasses.dataclass(frozen=True)
class Scale:
  preset: str
  num_validation: int
  num_evals: int
  epochs: int
  rates: tuple[float, ...]  # the workers' rate of every recipe
  ar_rates: tuple[float, ...]  # AR-SGD's rate on the mean of n gradients
  tune_seeds: tuple[int, ...]
  seeds: tuple[int, ...]
  clusters: tuple[str, ...]  # the first one tunes
  recipes: tuple[str, ...] = RECIPES


SCALES = {
  "default": Scale(
    "default",
    1000,
    30,
    15,
    (0.05, 0.1, 0.2, 0.4),
    (0.05, 0.1, 0.2, 0.4, 0.8),
    (100, 101),
    tuple(range(10)),
    ("HO", "HE1"),
  ),
  "smoke": Scale(
    "smoke", 200, 3, 1, (0.05,), (0.05,), (100,), (0,), ("HO", "HE1"), (DEFAULT, "update_p8_a0.5")
  ),
}


@dataclasses.dataclass(frozen=True)
class Cell:
  group: str  # "tune" (validation accuracy) or "final" (test accuracy)
  candidate: str  # a recipe of main.CANDIDATES, or "ar_sgd"
  cluster: str
  seed: int
  lr: float

  @property
  def name(self) -> str:
    return f"{self.group}/{self.candidate}/{self.cluster}/lr{self.lr:g}/seed{self.seed}"


def rates_of(scale: Scale, candidate: str) -> tuple[float, ...]:
  """The workers' rates swept for ``candidate`` (AR-SGD's on the mean gradient)."""
  return scale.ar_rates if candidate == BASELINE else scale.rates


def tuning_cells(scale: Scale) -> list[Cell]:
  """AR-SGD, then every recipe, each rate and tuning seed on the tuning cluster."""
  return [
    Cell("tune", c, scale.clusters[0], seed, lr)
    for c in (BASELINE, *scale.recipes)
    for lr in rates_of(scale, c)
    for seed in scale.tune_seeds
  ]


def tuning_means(runs: dict[str, dict], scale: Scale, candidate: str) -> dict[float, list[float]]:
  """The validation accuracies per rate of the tuning seeds finished so far."""
  return {
    lr: [
      runs[n]["test_accuracy"]
      for n in (Cell("tune", candidate, scale.clusters[0], s, lr).name for s in scale.tune_seeds)
      if n in runs
    ]
    for lr in rates_of(scale, candidate)
  }


def fsum_mean(values: Sequence[float]) -> float:
  """The mean of ``values``, summed exactly (so that equal accuracies tie)."""
  return math.fsum(values) / len(values)


def choose_rate(runs: dict[str, dict], scale: Scale, candidate: str) -> float | None:
  """The best mean validation accuracy (ties: the smaller rate); None until tuned."""
  accs = tuning_means(runs, scale, candidate)
  if any(len(v) < len(scale.tune_seeds) for v in accs.values()):
    return None
  return best_rate({lr: fsum_mean(v) for lr, v in accs.items()})


def choose_recipe(runs: dict[str, dict], scale: Scale) -> tuple[str, float] | None:
  """The recipe (at its chosen rate) of the best mean validation accuracy; ties go to the
  earlier of ``scale.recipes`` (the default first). None until every recipe is tuned."""
  best: tuple[str, float] | None = None
  score = -math.inf
  for candidate in scale.recipes:
    lr = choose_rate(runs, scale, candidate)
    if lr is None:
      return None
    mean = fsum_mean(tuning_means(runs, scale, candidate)[lr])
    if mean > score:
      best, score = (candidate, lr), mean
  return best


def final_cells(runs: dict[str, dict], scale: Scale) -> list[Cell]:
  """Seed by seed: AR-SGD on the first cluster (its model does not depend on the cluster), the
  chosen recipe on every cluster, and the default too if another recipe was chosen."""
  chosen, ar_lr = choose_recipe(runs, scale), choose_rate(runs, scale, BASELINE)
  if chosen is None or ar_lr is None:
    return []
  recipes = [chosen]
  if chosen[0] != DEFAULT:
    lr = choose_rate(runs, scale, DEFAULT)
    assert lr is not None  # choose_recipe has tuned every recipe
    recipes.append((DEFAULT, lr))
  cells = []
  for seed in scale.seeds:
    cells.append(Cell("final", BASELINE, scale.clusters[0], seed, ar_lr))
    cells += [Cell("final", c, k, seed, lr) for c, lr in recipes for k in scale.clusters]
  return cells


def validation_cells(scale: Scale, out: Path) -> list[Cell]:
  """The tuning cells, then (once every candidate is tuned) the final ones."""
  return [*tuning_cells(scale), *final_cells(harness.load_summaries(out), scale)]
