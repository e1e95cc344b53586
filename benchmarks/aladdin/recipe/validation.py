"""ALADDIN's recipe re-chosen on a validation split (issue 37, item 2).

The candidates of ``main.py`` (the earlier choice, made on the test set), each with its workers'
rate tuned, chosen by the validation accuracy of seeds 100-101 on HO; then the chosen recipe on
seeds 0-9 (test accuracy, HO and HE1) paired by seed against AR-SGD with its rate tuned alike.
The protocol is pre-registered in ``RESULTS.md``; the setting is the baselines study's
(``../baselines/main.py``: 1,000 of the 4,000 training examples held out, 30 evaluations).

Usage::

  python -m benchmarks.aladdin.recipe.validation                # resumable
  python -m benchmarks.aladdin.recipe.validation --report_only  # tables.md, plot
  python -m benchmarks.aladdin.recipe.validation --smoke --out /tmp/s   # the CI smoke version

Outputs in ``--out`` (default ``results/validation``): ``runs.json``, ``tables.md``,
``validation.png``, ``machine.json``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness, paired_intervals
from benchmarks.aladdin import training
from benchmarks.aladdin.outer_optimizer.main import best_rate
from benchmarks.aladdin.recipe.main import CANDIDATES, make_algorithm

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "validation"
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


def _rates(scale: Scale, candidate: str) -> tuple[float, ...]:
  return scale.ar_rates if candidate == BASELINE else scale.rates


def tuning_cells(scale: Scale) -> list[Cell]:
  """AR-SGD, then every recipe, each rate and tuning seed on the tuning cluster."""
  return [
    Cell("tune", c, scale.clusters[0], seed, lr)
    for c in (BASELINE, *scale.recipes)
    for lr in _rates(scale, c)
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
    for lr in _rates(scale, candidate)
  }


def _mean(values: Sequence[float]) -> float:
  return math.fsum(values) / len(values)


def choose_rate(runs: dict[str, dict], scale: Scale, candidate: str) -> float | None:
  """The best mean validation accuracy (ties: the smaller rate); None until tuned."""
  accs = tuning_means(runs, scale, candidate)
  if any(len(v) < len(scale.tune_seeds) for v in accs.values()):
    return None
  return best_rate({lr: _mean(v) for lr, v in accs.items()})


def choose_recipe(runs: dict[str, dict], scale: Scale) -> tuple[str, float] | None:
  """The recipe (at its chosen rate) of the best mean validation accuracy; ties go to the
  earlier of ``scale.recipes`` (the default first). None until every recipe is tuned."""
  best: tuple[str, float] | None = None
  score = -math.inf
  for candidate in scale.recipes:
    lr = choose_rate(runs, scale, candidate)
    if lr is None:
      return None
    mean = _mean(tuning_means(runs, scale, candidate)[lr])
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


def run_cell(cell: Cell, scale: Scale, cache_dir: Path) -> dict[str, Any]:
  preset = dataclasses.replace(
    training.PRESETS[scale.preset], num_evals=scale.num_evals, epochs=scale.epochs
  )
  evaluate_on = "test" if cell.group == "final" else "validation"
  algorithm = make_algorithm(cell.candidate, cell.lr)
  run = training.simulate_held_out(
    preset, algorithm, cell.cluster, cell.seed, cache_dir, scale.num_validation, evaluate_on
  )
  return {"cell": dataclasses.asdict(cell), **run}


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


def final_accuracy(runs: dict[str, dict], candidate: str, cluster: str) -> dict[int, float]:
  """Test accuracy per seed of the final runs (AR-SGD: its HO runs stand for every cluster)."""
  where = "HO" if candidate == BASELINE else cluster
  return {
    r["cell"]["seed"]: r["test_accuracy"]
    for r in runs.values()
    if r["cell"]["group"] == "final"
    and r["cell"]["candidate"] == candidate
    and r["cell"]["cluster"] == where
  }


def _tuning_table(runs: dict[str, dict], scale: Scale) -> str:
  width = max(len(scale.rates), len(scale.ar_rates))
  chosen = choose_recipe(runs, scale)
  rows = []
  for candidate in (BASELINE, *scale.recipes):
    rates = _rates(scale, candidate)
    accs = tuning_means(runs, scale, candidate)
    cells = [harness.mean_std(accs[lr], ".3f") if accs[lr] else "—" for lr in rates]
    lr = choose_rate(runs, scale, candidate)
    edge = "" if lr is None or lr not in (rates[0], rates[-1]) else " (grid edge)"
    best = "—" if lr is None else f"{lr:g}{edge}"
    mean = "—" if lr is None else f"{_mean(accs[lr]):.4f}"
    mark = " (chosen)" if chosen is not None and chosen[0] == candidate else ""
    grid = ", ".join(f"{x:g}" for x in rates)
    row = [f"{candidate}{mark}", grid, *cells, *[""] * (width - len(rates)), best, mean]
    rows.append(row)
  header = ["candidate", "rates", *[f"rate {i + 1}" for i in range(width)], "best rate"]
  return harness.markdown_table([*header, "mean at best"], rows)


def _final_table(runs: dict[str, dict], scale: Scale) -> str:
  rows = []
  for candidate in (BASELINE, *scale.recipes):
    for cluster in scale.clusters:
      mine = [
        r
        for r in runs.values()
        if r["cell"]["group"] == "final"
        and r["cell"]["candidate"] == candidate
        and r["cell"]["cluster"] == cluster
      ]
      if mine:
        accs = [r["test_accuracy"] for r in mine]
        lr = f"{mine[0]['cell']['lr']:g}"
        rows.append([candidate, cluster, lr, harness.mean_std(accs, ".3f"), len(mine)])
  return harness.markdown_table(["candidate", "cluster", "rate", "test accuracy", "seeds"], rows)


def paired_rows(runs: dict[str, dict], scale: Scale) -> list[tuple[str, paired_intervals.Paired]]:
  """The pre-registered headlines: chosen - AR-SGD per cluster, chosen on the second cluster -
  on the first, and chosen - default per cluster when they differ."""
  chosen = choose_recipe(runs, scale)
  if chosen is None:
    return []
  name, first = chosen[0], scale.clusters[0]
  pairs = [(f"{name} - ar_sgd, {k}", name, k, BASELINE, k) for k in scale.clusters]
  pairs += [(f"{name} {k} - {name} {first}", name, k, name, first) for k in scale.clusters[1:]]
  if name != DEFAULT:
    pairs += [(f"{name} - {DEFAULT}, {k}", name, k, DEFAULT, k) for k in scale.clusters]
  rows = []
  for label, a, ka, b, kb in pairs:
    x, y = final_accuracy(runs, a, ka), final_accuracy(runs, b, kb)
    if set(x) & set(y):
      rows.append((f"{label}, test accuracy", paired_intervals.paired_by_seed(x, y)))
  return rows


def report(runs: dict[str, dict], scale: Scale) -> str:
  tune, final = tuning_cells(scale), final_cells(runs, scale)
  done = sum(c.name in runs for c in tune)
  parts = [
    f"# The recipe chosen on validation: {done} of {len(tune)} tuning cells, "
    f"{sum(c.name in runs for c in final)} of {len(final)} final cells\n",
    f"## Tuning (validation accuracy, {scale.clusters[0]}, mean ± std over the tuning seeds)\n",
    _tuning_table(runs, scale) + "\n",
  ]
  chosen = choose_recipe(runs, scale)
  if chosen is not None:
    same = "the library default" if chosen[0] == DEFAULT else f"not the default {DEFAULT}"
    parts.append(f"Chosen: {chosen[0]} at workers' rate {chosen[1]:g} ({same}).\n")
  if any(c.name in runs for c in final):
    rows = [[*pair.row(label, 2, 100), pair.verdict()] for label, pair in paired_rows(runs, scale)]
    header = ["claim (A - B)", "seeds", "mean (points)", "95% interval (points)", "seeds A > B"]
    parts += [
      "## Final runs (test accuracy, mean ± std)\n",
      _final_table(runs, scale) + "\n",
      "## Paired by seed (Student-t, n - 1 degrees of freedom)\n",
      harness.markdown_table([*header, "verdict"], rows) + "\n",
    ]
  parts += training.not_run_note([*tune, *final], runs)
  return "\n".join(parts)


def plot(runs: dict[str, dict], path: Path, scale: Scale) -> bool:
  """Validation accuracy against the rate per recipe (left); seed 0's test curves (right)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  if not any(c.name in runs for c in tuning_cells(scale)):
    return False
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  for candidate in (BASELINE, *scale.recipes):
    accs = tuning_means(runs, scale, candidate)
    xs = [lr for lr, v in accs.items() if v]
    style = "k-o" if candidate == BASELINE else ("r-o" if candidate == DEFAULT else "-")
    left.plot(xs, [_mean(accs[lr]) for lr in xs], style, label=candidate, lw=1)
  left.set_xscale("log")
  ticks = sorted({*scale.rates, *scale.ar_rates})
  left.set_xticks(ticks, [f"{x:g}" for x in ticks])
  left.minorticks_off()
  left.set_xlabel("workers' rate (AR-SGD: on the mean gradient)")
  left.set_ylabel(f"validation accuracy ({scale.clusters[0]}, mean of tuning seeds)")
  left.legend(fontsize=6)
  left.grid(alpha=0.3)
  seed = scale.seeds[0]
  for _, r in sorted(runs.items()):  # by name: the same plot from a resumed or a loaded run
    cell = r["cell"]
    if cell["group"] == "final" and cell["seed"] == seed:
      curve = r["curve"]
      label = f"{cell['candidate']} {cell['cluster']} lr {cell['lr']:g}"
      right.plot([p[0] for p in curve], [p[1] for p in curve], label=label)
  right.set_xscale("symlog", linthresh=10)
  right.set_xlim(left=0)  # symlog would otherwise add an empty negative axis
  right.set_xlabel("simulated time (worker iterations)")
  right.set_ylabel(f"test accuracy, seed {seed}")
  right.grid(alpha=0.3)
  if right.lines:
    right.legend(fontsize=7)
  training.save_figure(fig, path)
  return True


def passes(runs: dict[str, dict], scale: Any) -> list[Callable[[], list[Any]]]:
  return [lambda: tuning_cells(scale), lambda: final_cells(runs, scale)]


def main(argv: Sequence[str] | None = None) -> str:
  return training.study_main(
    argv,
    __doc__.splitlines()[0],
    DEFAULT_OUT,
    SCALES,
    passes,
    run_cell,
    report,
    plot,
    "validation.png",
  )


if __name__ == "__main__":
  main()
