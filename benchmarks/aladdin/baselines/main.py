"""ALADDIN against its baselines, each tuned on a validation split (issue 37, item 3).

ALADDIN (``al.Aladdin``'s defaults), AR-SGD, SGP, EASGD and ASP (momentum and plain SGD
servers), each with its rate chosen on the validation split at each budget (15 and 45 epochs),
then seeds 0-9 on HO, HE1 and HE2, paired by seed against AR-SGD. The protocol is pre-registered
in ``RESULTS.md``; the setting and the tuning rule are the outer-optimizer study's
(``../outer_optimizer/main.py``), the baselines are built as in the retired equal-tuning study
(``../equal_tuning/RESULTS.md``).

Usage::

  python -m benchmarks.aladdin.baselines.main                # resumable
  python -m benchmarks.aladdin.baselines.main --report_only  # tables.md, plot
  python -m benchmarks.aladdin.baselines.main --smoke --out /tmp/s   # the CI smoke version

Outputs in ``--out``: ``runs.json`` (one summary per finished cell), ``tables.md``,
``accuracy_vs_time.png``, ``machine.json``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optax

from benchmarks import harness, paired_intervals
from benchmarks.aladdin import training
from benchmarks.aladdin.outer_optimizer.main import best_rate
from optax_lena import aladdin as al
from optax_lena.aladdin import simulator as sim

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
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
PARITY = 0.01  # parity with AR-SGD: the paired interval lies within [-1, +1] points
CONVERGED_LOSS = 0.01  # AR-SGD has converged at a budget if its final training loss is below


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


def run_cell(cell: Cell, scale: Scale, cache_dir: Path) -> dict[str, Any]:
  preset = dataclasses.replace(
    training.PRESETS[scale.preset], num_evals=scale.num_evals, epochs=cell.epochs
  )
  evaluate_on = "test" if cell.group == "final" else "validation"  # tuning: validation accuracy
  run = training.simulate_held_out(
    preset,
    make_algorithm(cell.method, cell.lr),
    cell.cluster,
    cell.seed,
    cache_dir,
    scale.num_validation,
    evaluate_on,
  )
  return {"cell": dataclasses.asdict(cell), **run}


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


def _final(runs: dict[str, dict], method: str, cluster: str, epochs: int) -> dict[int, dict]:
  return {
    r["cell"]["seed"]: r
    for r in runs.values()
    if r["cell"]["group"] == "final"
    and r["cell"]["method"] == method
    and r["cell"]["cluster"] == cluster
    and r["cell"]["epochs"] == epochs
  }


def _losses(runs: list[dict]) -> str:
  values = [r["train_loss"] for r in runs if r.get("train_loss") is not None]
  return harness.mean_std(values, ".4f")


def _tuning_table(runs: dict[str, dict], scale: Scale) -> str:
  width = max(len(r) for r in scale.rates.values())
  rows = []
  for epochs in scale.budgets:
    for method in METHODS:
      rates = scale.rates[method]
      cells = []
      for lr in rates:
        names = [
          Cell("tune", method, scale.clusters[0], epochs, s, lr).name for s in scale.tune_seeds
        ]
        accs = [runs[n]["test_accuracy"] for n in names if n in runs]
        cells.append(harness.mean_std(accs, ".3f") if accs else "—")
      cells += [""] * (width - len(rates))
      best = choose_rate(runs, scale, method, epochs)
      edge = "" if best is None or best not in (rates[0], rates[-1]) else " (grid edge)"
      loss = "—"
      if best is not None:
        names = [Cell("tune", method, "HO", epochs, s, best).name for s in scale.tune_seeds]
        loss = _losses([runs[n] for n in names])
      grid = ", ".join(f"{x:g}" for x in rates)
      chosen = "—" if best is None else f"{best:g}{edge}"
      rows.append([epochs, LABELS[method], grid, *cells, chosen, loss])
  header = ["epochs", "method", "grid", *[f"rate {i + 1}" for i in range(width)], "chosen"]
  return harness.markdown_table([*header, "train loss at chosen"], rows)


def _final_table(runs: dict[str, dict], scale: Scale) -> str:
  rows = []
  for epochs in scale.budgets:
    for cluster in scale.clusters:
      for method in METHODS:
        mine = list(_final(runs, method, cluster, epochs).values())
        if not mine:
          continue
        hits = [t for t in (training.time_to(r, training.TARGET) for r in mine) if t is not None]
        rows.append([
          epochs,
          cluster,
          LABELS[method],
          f"{mine[0]['cell']['lr']:g}",
          harness.mean_std([r["test_accuracy"] for r in mine], ".3f"),
          _losses(mine),
          harness.mean_std_reached(hits, len(mine)),
          harness.mean_std([r["time"] for r in mine], ".0f"),
          len(mine),
        ])  # fmt: skip
  header = ["epochs", "cluster", "method", "rate", "test accuracy", "final train loss"]
  return harness.markdown_table(
    [*header, f"time to {training.TARGET}", "time to finish", "seeds"], rows
  )


def _never_reached(runs: dict[str, dict], scale: Scale) -> str:
  lines = []
  for epochs in scale.budgets:
    for cluster in scale.clusters:
      for method in METHODS:
        here = _final(runs, method, cluster, epochs)
        never = sorted(s for s, r in here.items() if training.time_to(r, training.TARGET) is None)
        if never:
          seeds = ", ".join(map(str, never))
          lines.append(f"- {epochs} epochs, {cluster}, {LABELS[method]}: seeds {seeds}")
  target, evals = training.TARGET, scale.num_evals
  head = f"Seeds whose test accuracy never reached {target} (of the {evals} evaluations):"
  return "\n".join([head, *lines]) if lines else f"Every final run reached {training.TARGET}."


def _accuracy(runs: dict[str, dict], method: str, cluster: str, epochs: int) -> dict[int, float]:
  # AR-SGD's model does not depend on the cluster: its HO runs stand for every cluster.
  where = "HO" if method == BASELINE else cluster
  return {s: r["test_accuracy"] for s, r in _final(runs, method, where, epochs).items()}


def verdict(pair: paired_intervals.Paired) -> tuple[str, str]:
  """The pre-registered rule: (parity with AR-SGD, ahead / behind / not distinguishable)."""
  if pair.n < 2:
    return "one seed: no interval", "one seed: no interval"
  parity = "parity" if pair.low >= -PARITY and pair.high <= PARITY else "not parity"
  return parity, pair.verdict()


def _paired_table(runs: dict[str, dict], scale: Scale) -> str:
  rows = []
  for epochs in scale.budgets:
    for cluster in scale.clusters:
      for method in METHODS[1:]:
        a = _accuracy(runs, method, cluster, epochs)
        b = _accuracy(runs, BASELINE, cluster, epochs)
        if not set(a) & set(b):
          continue
        pair = paired_intervals.paired_by_seed(a, b)
        label = f"{LABELS[method]} - AR-SGD, {cluster}, {epochs} epochs"
        rows.append([*pair.row(label, 2, 100), *verdict(pair)])
  header = ["claim (A - B), test accuracy", "seeds", "mean (points)", "95% interval (points)"]
  return harness.markdown_table([*header, "seeds A > B", "within ±1 point", "sign"], rows)


def _convergence(runs: dict[str, dict], scale: Scale) -> str:
  """The pre-registered convergence check of AR-SGD at the longest budget."""
  epochs = scale.budgets[-1]
  mine = [r for r in _final(runs, BASELINE, "HO", epochs).values() if r["train_loss"] is not None]
  if not mine:
    return f"AR-SGD at {epochs} epochs: no final run yet."
  loss = math.fsum(r["train_loss"] for r in mine) / len(mine)
  status = "converged" if loss < CONVERGED_LOSS else "NOT converged"
  return (
    f"AR-SGD at {epochs} epochs (HO, {len(mine)} seeds): mean final training loss {loss:.4f}, "
    f"{status} by the pre-registered threshold {CONVERGED_LOSS}."
  )


def _ar_sgd_cluster_check(runs: dict[str, dict], scale: Scale) -> str:
  seed, lines = scale.seeds[0], []
  for epochs in scale.budgets:
    accs = {c: _final(runs, BASELINE, c, epochs).get(seed) for c in scale.clusters}
    if any(r is None for r in accs.values()):
      lines.append(f"AR-SGD off HO at {epochs} epochs: not run yet.")
      continue
    values = {c: r["test_accuracy"] for c, r in accs.items() if r is not None}
    same = "identical" if len(set(values.values())) == 1 else "DIFFER"
    text = ", ".join(f"{c} {v:.4f}" for c, v in values.items())
    lines.append(f"AR-SGD test accuracy, {epochs} epochs, seed {seed}: {text} ({same}).")
  return "\n".join(lines)


def report(runs: dict[str, dict], scale: Scale) -> str:
  tune, final = tuning_cells(scale), final_cells(runs, scale)
  done_t = sum(c.name in runs for c in tune)
  finals = sum(r["cell"]["group"] == "final" for r in runs.values())
  parts = [
    f"# ALADDIN against its baselines: {done_t} of {len(tune)} tuning cells, {finals} final "
    "cells\n",
    "## Tuning (validation accuracy, HO, mean ± std over the tuning seeds)\n",
    _tuning_table(runs, scale) + "\n",
  ]
  if finals:
    parts += [
      "## Final runs (test accuracy)\n",
      _final_table(runs, scale) + "\n",
      _ar_sgd_cluster_check(runs, scale) + "\n",
      _convergence(runs, scale) + "\n",
      _never_reached(runs, scale) + "\n",
      "## Paired by seed against AR-SGD (Student-t, n - 1 degrees of freedom)\n",
      _paired_table(runs, scale) + "\n",
    ]
  parts += training.not_run_note([*tune, *final], runs)
  return "\n".join(parts)


def plot(runs: dict[str, dict], path: Path, scale: Scale) -> bool:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  seed = scale.seeds[0]
  panels = [
    (e, c)
    for e in scale.budgets
    for c in scale.clusters
    if any(seed in _final(runs, m, c, e) for m in METHODS)
  ]
  if not panels:
    return False
  cols = len(scale.clusters)
  rows = math.ceil(len(panels) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.5 * rows), squeeze=False)
  for ax, (epochs, cluster) in zip(axes.flat, panels, strict=False):
    for method in METHODS:
      run = _final(runs, method, cluster, epochs).get(seed)
      if run is not None:
        curve = run["curve"]
        ax.plot([p[0] for p in curve], [p[1] for p in curve], label=LABELS[method])
    ax.axhline(training.TARGET, color="grey", lw=0.8, ls=":")
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(left=0)  # symlog would otherwise add an empty negative axis
    ax.set_title(f"{cluster}, {epochs} epochs, seed {seed}")
    ax.set_xlabel("simulated time (worker iterations)")
    ax.set_ylabel("test accuracy (global model)")
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(panels) :]:
    ax.set_visible(False)
  axes[0][0].legend(fontsize=7)
  training.save_figure(fig, path)
  return True


def passes(runs: dict[str, dict], scale: Any) -> list[Callable[[], list[Any]]]:
  """The pre-registered order: tune and run the short budget first, so a partial run has it."""

  def of_budget(cells: Any, epochs: int) -> Callable[[], list[Any]]:
    return lambda: [c for c in cells(scale) if c.epochs == epochs]

  return [
    of_budget(cells, epochs)
    for epochs in scale.budgets
    for cells in (tuning_cells, lambda s: final_cells(runs, s))
  ]


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
    "accuracy_vs_time.png",
  )


if __name__ == "__main__":
  main()
