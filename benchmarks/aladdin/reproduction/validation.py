"""The reproduction study's choices re-made on a validation split (issue 37, item 2).

Two choices of ``main.py`` were made on the test accuracy they are reported with: AR-SGD's rate
(0.1 / 0.2 / 0.4, one seed on HE1) and the options normalise x server_tx x alpha of the
gradient-message ALADDIN (part ``choices``, one seed on HE1). Here both grids run on seeds
100-101 with 1,000 of the 4,000 training examples held out, evaluated on those; the protocol
is pre-registered in ``RESULTS.md``.

Usage::

  python -m benchmarks.aladdin.reproduction.validation                # resumable
  python -m benchmarks.aladdin.reproduction.validation --report_only  # tables.md, plot
  python -m benchmarks.aladdin.reproduction.validation --smoke --out /tmp/s   # CI smoke version

Outputs in ``--out`` (default ``results/validation``): ``runs.json``, ``tables.md``,
``validation.png``, ``machine.json``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.aladdin import training
from benchmarks.aladdin.outer_optimizer.main import best_rate
from benchmarks.aladdin.reproduction.main import ALPHAS, NORMALISES, SERVER_TXS, RunSpec
from benchmarks.aladdin.reproduction.main import make_algorithm as build

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "validation"
# The options main.py's Table 2 runs (the test-chosen ones of its part (e) are reported).
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


def cells(scale: Scale) -> list[RunSpec]:
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


def run_cell(spec: RunSpec, scale: Scale, cache_dir: Path) -> dict[str, Any]:
  preset = training.PRESETS[scale.preset]
  if spec.alg == "ar_sgd":  # main.make_algorithm takes AR-SGD's rate from the preset
    preset = dataclasses.replace(preset, ar_lr=spec.lr)
  run = training.simulate_held_out(
    preset,
    build(spec, preset),
    spec.cluster,
    spec.seed,
    cache_dir,
    scale.num_validation,
    "validation",
  )
  return {"spec": dataclasses.asdict(spec), **run}


def _accs(runs: dict[str, dict], specs: Sequence[RunSpec]) -> list[float]:
  return [runs[s.name]["test_accuracy"] for s in specs if s.name in runs]


def _ar_specs(scale: Scale, lr: float) -> list[RunSpec]:
  return [RunSpec("validation", "ar_sgd", scale.ar_cluster, s, lr=lr) for s in scale.tune_seeds]


def _option_specs(scale: Scale, option: tuple[str, str, str | float]) -> list[RunSpec]:
  n, s, a = option
  return [
    RunSpec("validation", "aladdin", scale.cluster, seed, normalise=n, server_tx=s, alpha=a)
    for seed in scale.tune_seeds
  ]


def _mean(values: Sequence[float]) -> float:
  return math.fsum(values) / len(values)


def choose_ar_rate(runs: dict[str, dict], scale: Scale) -> float | None:
  """The best mean validation accuracy (ties: the smaller rate); None until every cell ran."""
  accs = {lr: _accs(runs, _ar_specs(scale, lr)) for lr in scale.ar_rates}
  if any(len(v) < len(scale.tune_seeds) for v in accs.values()):
    return None
  return best_rate({lr: _mean(v) for lr, v in accs.items()})


def option_ranking(runs: dict[str, dict], scale: Scale) -> list[tuple[tuple, list[float]]]:
  """The options whose cells all ran, by mean validation accuracy (best first; ties: the
  order of ``scale.options``)."""
  done = [(o, _accs(runs, _option_specs(scale, o))) for o in scale.options]
  done = [(o, v) for o, v in done if len(v) == len(scale.tune_seeds)]
  return sorted(done, key=lambda ov: -_mean(ov[1]))


def report(runs: dict[str, dict], scale: Scale) -> str:
  grid = cells(scale)
  seeds = ", ".join(map(str, scale.tune_seeds))
  parts = [
    f"# The reproduction's choices on validation: {sum(c.name in runs for c in grid)} of "
    f"{len(grid)} cells\n",
    f"## AR-SGD's rate (validation accuracy, {scale.ar_cluster}, seeds {seeds})\n",
  ]
  rows = []
  for lr in scale.ar_rates:
    accs = _accs(runs, _ar_specs(scale, lr))
    rows.append([f"{lr:g}", harness.mean_std(accs, ".4f"), len(accs)])
  parts.append(harness.markdown_table(["rate", "validation accuracy", "seeds"], rows) + "\n")
  chosen = choose_ar_rate(runs, scale)
  if chosen is not None:
    edge = " (grid edge)" if chosen in (scale.ar_rates[0], scale.ar_rates[-1]) else ""
    parts.append(f"Chosen: {chosen:g}{edge}; main.py's Table 2 runs 0.2.\n")
  parts.append(
    f"## normalise x server_tx x alpha (validation accuracy, {scale.cluster}, seeds {seeds}; "
    "best first)\n"
  )
  rows = []
  for rank, (option, accs) in enumerate(option_ranking(runs, scale), 1):
    mark = " (Table 2's)" if option == TABLE2 else ""
    rows.append([rank, *option[:2], f"{option[2]}{mark}", harness.mean_std(accs, ".4f")])
  header = ["rank", "normalise", "server_tx", "alpha", "validation accuracy"]
  parts.append(harness.markdown_table(header, rows) + "\n")
  parts += training.not_run_note(grid, runs)
  return "\n".join(parts)


def plot(runs: dict[str, dict], path: Path, scale: Scale) -> bool:
  """Mean validation accuracy of every option, grouped by normalise and server_tx."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  ranking = dict(option_ranking(runs, scale))
  if not ranking:
    return False
  fig, ax = plt.subplots(figsize=(8, 3.5))
  groups = [(n, s) for n in NORMALISES for s in SERVER_TXS]
  width = 0.8 / len(ALPHAS)
  for i, alpha in enumerate(ALPHAS):
    ys = [_mean(ranking[(n, s, alpha)]) if (n, s, alpha) in ranking else 0 for n, s in groups]
    ax.bar([g + i * width for g in range(len(groups))], ys, width, label=f"alpha {alpha}")
  ax.set_xticks([g + width for g in range(len(groups))])
  ax.set_xticklabels([f"{n}\n{s}" for n, s in groups], fontsize=7)
  ax.set_ylabel(f"validation accuracy ({scale.cluster}, mean)")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3, axis="y")
  training.save_figure(fig, path)
  return True


def passes(runs: dict[str, dict], scale: Any) -> list[Callable[[], list[Any]]]:
  return [lambda: cells(scale)]


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
