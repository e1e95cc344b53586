"""The baselines study's tables and plot, from ``runs.json`` and the grid."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks import driver, harness, paired_intervals
from benchmarks.aladdin import protocol
from benchmarks.aladdin.baselines.grid import (
  BASELINE,
  LABELS,
  METHODS,
  Cell,
  Scale,
  choose_rate,
  final_cells,
  tuning_cells,
)
from examples import analysis

PARITY = 0.01  # parity with AR-SGD: the paired interval lies within [-1, +1] points
CONVERGED_LOSS = 0.01  # AR-SGD has converged at a budget if its final training loss is below


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
        hits = [t for t in (protocol.time_to(r, protocol.TARGET) for r in mine) if t is not None]
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
    [*header, f"time to {protocol.TARGET}", "time to finish", "seeds"], rows
  )


def _never_reached(runs: dict[str, dict], scale: Scale) -> str:
  lines = []
  for epochs in scale.budgets:
    for cluster in scale.clusters:
      for method in METHODS:
        here = _final(runs, method, cluster, epochs)
        never = sorted(s for s, r in here.items() if protocol.time_to(r, protocol.TARGET) is None)
        if never:
          seeds = ", ".join(map(str, never))
          lines.append(f"- {epochs} epochs, {cluster}, {LABELS[method]}: seeds {seeds}")
  target, evals = protocol.TARGET, scale.num_evals
  head = f"Seeds whose test accuracy never reached {target} (of the {evals} evaluations):"
  return "\n".join([head, *lines]) if lines else f"Every final run reached {protocol.TARGET}."


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


def tables(runs: dict[str, dict], scale: Scale) -> str:
  """The study's tables (``tables.md``)."""
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
  parts += protocol.not_run_note([*tune, *final], runs)
  return "\n".join(parts)


def plot(runs: dict[str, dict], path: Path, scale: Scale) -> bool:
  """The final runs' test accuracy against simulated time, seed 0, one panel per budget and
  cluster (False: no final run yet)."""
  plt = analysis.pyplot()
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
    ax.axhline(protocol.TARGET, color="grey", lw=0.8, ls=":")
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(left=0)  # symlog would otherwise add an empty negative axis
    ax.set_title(f"{cluster}, {epochs} epochs, seed {seed}")
    ax.set_xlabel("simulated time (worker iterations)")
    ax.set_ylabel("test accuracy (global model)")
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(panels) :]:
    ax.set_visible(False)
  axes[0][0].legend(fontsize=7)
  analysis.save_figure(fig, path, dpi=110)
  return True


def report(scale: Scale, out: Path) -> driver.Report:
  """``tables.md`` and ``accuracy_vs_time.png`` from ``out/runs.json``."""
  runs = harness.load_summaries(out)
  text = tables(runs, scale)
  plot(runs, out / "accuracy_vs_time.png", scale)
  return driver.Report(text, {"tables.md": text})
