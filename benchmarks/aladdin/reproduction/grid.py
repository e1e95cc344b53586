"""The reproduction study's grids.

* ``Reproduction``, the first study (its parts, ``--set parts=...``): ``table3`` (the paper's
  Table 3 from the timing-only mode, one measurement), the training runs of ``table2``,
  ``ablation``, ``period``, ``lr`` and ``choices`` (:func:`build_grid`) and ``overhead`` (the
  simulator's host time, one measurement).
* ``Scale``, its two test-set choices re-made on a validation split: AR-SGD's rate and the
  options normalise x server_tx x alpha of the gradient-message ALADDIN, on seeds 100-101 with
  1,000 of the 4,000 training examples held out (pre-registered in ``RESULTS.md``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import driver
from benchmarks.aladdin.protocol import PRESETS, Preset, best_rate

PARTS = ("table3", "table2", "ablation", "period", "choices", "lr", "overhead")
# ALADDIN-L2: an eager global update (the PS updates x~ at every gradient: period 1) and a reply
# to each worker every 4 of its gradients, with Section 3.2's alpha for pi = 4 (with period 1,
# "count" would give alpha = 1 - 1/sqrt(1) = 0 at every update).
L2: dict[str, Any] = dict(period=1, reply_every=4, alpha=round(1 - 1 / math.sqrt(8 * 4), 4))
LR2 = 0.05  # the second learning rate of the "lr" part
NORMALISES: tuple[str, ...] = ("sum", "mean", "mean_of_locals")
SERVER_TXS: tuple[str, ...] = ("sgd", "momentum")
ALPHAS: tuple[str | float, ...] = ("count", "n_pi", 0.5)


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One training run: an algorithm with options on a cluster, one seed."""

  part: str
  alg: str
  cluster: str
  seed: int
  period: int = 4
  normalise: str = "mean_of_locals"
  server_tx: str = "momentum"  # the paper's PS optimizer (momentum SGD 0.9)
  alpha: str | float = "count"
  reply_every: int = 0  # 0: every reply (see sim.Algorithm.reply_every)
  lr: float = 0.0  # 0: the preset's

  @property
  def name(self) -> str:
    base = f"{self.alg}_{self.cluster}_seed{self.seed}" + (f"_lr{self.lr:g}" if self.lr else "")
    if self.alg != "aladdin":
      return base
    name = f"{base}_p{self.period}_{self.normalise}_{self.server_tx}_a{self.alpha}"
    return name + (f"_r{self.reply_every}" if self.reply_every else "")


def build_grid(preset: Preset, parts: Sequence[str]) -> list[RunSpec]:
  """The training runs of ``parts`` (duplicates shared between parts appear once)."""
  runs: list[RunSpec] = []
  if "table2" in parts:
    # The PS baselines last: a partial study still has ALADDIN, AR-SGD and SGP everywhere.
    for alg in ("aladdin", "ar_sgd", "sgp", "asp", "easgd"):
      for cluster in preset.clusters:
        for seed in preset.seeds:
          runs.append(RunSpec("table2", alg, cluster, seed))
  c = preset.study_cluster
  if "ablation" in parts:
    for seed in preset.seeds:
      runs.append(RunSpec("ablation", "aladdin", c, seed, alpha=0.0))  # L1
      runs.append(RunSpec("ablation", "aladdin", c, seed, **L2))
      runs.append(RunSpec("ablation", "aladdin", c, seed))  # full
  if "period" in parts:
    for seed in preset.seeds:
      for period in (1, 2, 4):
        for alpha in ("count", "n_pi"):
          runs.append(RunSpec("period", "aladdin", c, seed, period=period, alpha=alpha))
  if "lr" in parts:
    # The same comparisons at half the learning rate: does the ranking depend on it?
    for seed in preset.seeds:
      for opts in ({}, dict(alpha=0.5), dict(alpha="n_pi"), L2):
        runs.append(RunSpec("lr", "aladdin", c, seed, lr=LR2, **opts))
      runs.append(RunSpec("lr", "aladdin", c, seed, alpha=0.5))  # the best choice, 3 seeds
      for alg in ("easgd", "sgp", "asp"):
        runs.append(RunSpec("lr", alg, c, seed, lr=LR2))
  if "choices" in parts:
    for seed in preset.choice_seeds:
      for normalise in NORMALISES:
        for server_tx in SERVER_TXS:
          for merge in ALPHAS:
            runs.append(
              RunSpec(
                "choices", "aladdin", c, seed, normalise=normalise, server_tx=server_tx, alpha=merge
              )
            )
  seen: set[str] = set()
  unique = []
  for run in runs:
    if run.name not in seen:
      seen.add(run.name)
      unique.append(run)
  return unique


@dataclasses.dataclass(frozen=True)
class Reproduction:
  """The first study's setup: the training problem's preset, the parts and Table 3's horizon
  (:func:`table3.table3`'s arguments)."""

  preset: str = "default"
  parts: tuple[str, ...] = PARTS
  table3_sizes: tuple[int, ...] = (8, 40, 1000)


def cells(setup: Reproduction, out: Path) -> list[driver.Measurement | RunSpec]:
  """Table 3, the training runs of the parts, the overhead measurement."""
  del out  # the grid does not depend on results
  first = [driver.Measurement("table3")] if "table3" in setup.parts else []
  last = [driver.Measurement("overhead")] if "overhead" in setup.parts else []
  return [*first, *build_grid(PRESETS[setup.preset], setup.parts), *last]


# ------------------------------------------------------------------------------------------------
# The choices re-made on validation
# ------------------------------------------------------------------------------------------------

# The options Table 2 runs (the test-chosen ones of the first study's part (e) are reported).
TABLE2 = ("mean_of_locals", "momentum", "count")
OPTIONS = tuple((n, s, a) for n in NORMALISES for s in SERVER_TXS for a in ALPHAS)


@dataclasses.dataclass(frozen=True)
class Scale:
  preset: str
  num_validation: int
  ar_rates: tuple[float, ...]
  tune_seeds: tuple[int, ...]
  options: tuple[tuple[str, str, str | float], ...]
  ar_cluster: str  # AR-SGD's accuracy does not depend on the cluster: the cheapest one
  cluster: str  # where the options run (main.py's study cluster)


SCALES = {
  "default": Scale("default", 1000, (0.1, 0.2, 0.4), (100, 101), OPTIONS, "HO", "HE1"),
  "smoke": Scale("smoke", 200, (0.2,), (100,), (TABLE2, ("sum", "sgd", 0.5)), "HO", "HE1"),
}


def validation_grid(scale: Scale) -> list[RunSpec]:
  """AR-SGD's rates, then every option, each on the tuning seeds (``part`` "validation")."""
  ar = [
    RunSpec("validation", "ar_sgd", scale.ar_cluster, seed, lr=lr)
    for lr in scale.ar_rates
    for seed in scale.tune_seeds
  ]
  options = [
    RunSpec("validation", "aladdin", scale.cluster, seed, normalise=n, server_tx=s, alpha=a)
    for n, s, a in scale.options
    for seed in scale.tune_seeds
  ]
  return ar + options


def accuracies(runs: dict[str, dict], specs: Sequence[RunSpec]) -> list[float]:
  """The (validation) accuracies of the cells of ``specs`` that have run."""
  return [runs[s.name]["test_accuracy"] for s in specs if s.name in runs]


def ar_specs(scale: Scale, lr: float) -> list[RunSpec]:
  """AR-SGD's cells at rate ``lr`` (one per tuning seed)."""
  return [RunSpec("validation", "ar_sgd", scale.ar_cluster, s, lr=lr) for s in scale.tune_seeds]


def option_specs(scale: Scale, option: tuple[str, str, str | float]) -> list[RunSpec]:
  """The cells of one (normalise, server_tx, alpha) option (one per tuning seed)."""
  n, s, a = option
  return [
    RunSpec("validation", "aladdin", scale.cluster, seed, normalise=n, server_tx=s, alpha=a)
    for seed in scale.tune_seeds
  ]


def fsum_mean(values: Sequence[float]) -> float:
  """The mean of ``values``, summed exactly (so that equal accuracies tie)."""
  return math.fsum(values) / len(values)


def choose_ar_rate(runs: dict[str, dict], scale: Scale) -> float | None:
  """The best mean validation accuracy (ties: the smaller rate); None until every cell ran."""
  accs = {lr: accuracies(runs, ar_specs(scale, lr)) for lr in scale.ar_rates}
  if any(len(v) < len(scale.tune_seeds) for v in accs.values()):
    return None
  return best_rate({lr: fsum_mean(v) for lr, v in accs.items()})


def option_ranking(runs: dict[str, dict], scale: Scale) -> list[tuple[tuple, list[float]]]:
  """The options whose cells all ran, by mean validation accuracy (best first; ties: the
  order of ``scale.options``)."""
  done = [(o, accuracies(runs, option_specs(scale, o))) for o in scale.options]
  done = [(o, v) for o, v in done if len(v) == len(scale.tune_seeds)]
  return sorted(done, key=lambda ov: -fsum_mean(ov[1]))


def validation_cells(scale: Scale, out: Path) -> list[RunSpec]:
  """AR-SGD's rates, then every option (the grid does not depend on results)."""
  del out
  return validation_grid(scale)
