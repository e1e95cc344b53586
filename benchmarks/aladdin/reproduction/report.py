"""The reproduction's reports: the first study's tables, summary and plots (``tables.md``,
``summary.json``), and the validation re-choice's (``validation/tables.md``)."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import driver, harness
from benchmarks.aladdin import protocol
from benchmarks.aladdin.protocol import ALGORITHMS, LABELS, PRESETS, Preset
from benchmarks.aladdin.reproduction.grid import (
  ALPHAS,
  L2,
  LR2,
  NORMALISES,
  SERVER_TXS,
  TABLE2,
  Reproduction,
  Scale,
  accuracies,
  ar_specs,
  choose_ar_rate,
  fsum_mean,
  option_ranking,
  validation_grid,
)
from benchmarks.aladdin.reproduction.table3 import plot_speedups, table3_markdown
from examples import analysis


def _mean_std(values: Sequence[float], fmt: str = ".4f") -> str:
  """:func:`harness.mean_std` of the values that exist (NaN: none); a time to target that some
  runs never reached (inf) is this study's ``"never (n/n)"`` or ``"mean (k/n reached)"``."""
  values = [v for v in values if not math.isnan(v)]
  finite = [v for v in values if math.isfinite(v)]
  if len(finite) == len(values):
    return harness.mean_std(values, fmt)
  if not finite:
    return f"never ({len(values)}/{len(values)})"
  return f"{statistics.mean(finite):{fmt}} ({len(finite)}/{len(values)} reached)"


def _acc_at(run: dict, t: float) -> float:
  acc = math.nan
  for point in run["evals"]:
    if point["time"] <= t + 1e-9:
      acc = point["test_accuracy"]
  return acc


def _time_to(run: dict, target: float) -> float:
  for point in run["evals"]:
    if point["test_accuracy"] >= target:
      return point["time"]
  return math.inf


def tables(out: Path, preset: Preset, runs: dict[str, dict], t3: dict | None) -> tuple[str, str]:
  """The first study's tables and ``summary.json``; writes its plots."""
  lines: list[str] = []
  plots: list[str] = []
  if t3 is not None:
    lines += table3_markdown(t3)
    plots.append(plot_speedups(out, t3))

  def cell(alg, cluster, **opts):
    key_opts = dict(
      period=4, normalise="mean_of_locals", server_tx="momentum", alpha="count", reply_every=0
    )
    lr = opts.pop("lr", 0.0)
    key_opts.update(opts)
    found = []
    for run in runs.values():
      s = run["spec"]
      if s["alg"] != alg or s["cluster"] != cluster or float(s.get("lr", 0.0)) != lr:
        continue
      if alg == "aladdin" and any(str(s.get(k, 0)) != str(v) for k, v in key_opts.items()):
        continue
      found.append(run)
    return sorted(found, key=lambda r: r["spec"]["seed"])

  # Table 2.
  ar_ho = cell("ar_sgd", "HO")
  target = 0.95 * statistics.mean(r["evals"][-1]["test_accuracy"] for r in ar_ho) if ar_ho else 0
  if any(cell(a, c) for a in ALGORITHMS for c in preset.clusters):
    lines += [
      "## Table 2 (shape): MNIST-1D, CNN1D, 8 simulated workers",
      "",
      f"Budget: {preset.epochs:g} epochs of samples over all workers; per-worker batch "
      f"{preset.batch_size}; time unit = one worker iteration. Accuracy at time T: T = the "
      "shortest mean total time among the algorithms on that cluster (when the fastest has "
      f"finished). Target = 95% of AR-SGD's final accuracy on HO ({target:.4f}).",
      "",
      "| cluster | algorithm | final test acc | total time | acc @ T | time to target | "
      "throughput (samples/unit) | mean wait fraction | final acc, average of local models | "
      "seeds |",
      "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cluster in preset.clusters:
      done = {a: cell(a, cluster) for a in ALGORITHMS}
      times = [statistics.mean(r["time"] for r in rs) for rs in done.values() if rs]
      budget_t = min(times) if times else math.nan
      for alg in ALGORITHMS:
        rs = done[alg]
        if not rs:
          lines.append(f"| {cluster} | {LABELS[alg]} | — | — | — | — | — | — | — | 0 |")
          continue
        lines.append(
          f"| {cluster} | {LABELS[alg]} | "
          f"{_mean_std([r['evals'][-1]['test_accuracy'] for r in rs])} | "
          f"{_mean_std([r['time'] for r in rs], '.0f')} | "
          f"{_mean_std([_acc_at(r, budget_t) for r in rs])} (T={budget_t:.0f}) | "
          f"{_mean_std([_time_to(r, target) for r in rs], '.0f')} | "
          f"{_mean_std([r['throughput'] for r in rs], '.0f')} | "
          f"{_mean_std([statistics.mean(r['wait_time']) / r['time'] for r in rs], '.2f')} | "
          f"{_mean_std([r['evals'][-1].get('local_accuracy', math.nan) for r in rs])} | "
          f"{len(rs)} |"
        )
    lines.append("")
    curves = {c: {a: cell(a, c) for a in ALGORITHMS} for c in preset.clusters}
    plots.append(_plot_curves(out, preset, curves))

  c = preset.study_cluster
  variants: list[tuple[str, str, dict[str, Any]]] = [
    ("ablation", "L1: local self-update only (alpha = 0)", dict(alpha=0.0)),
    (
      "ablation",
      f"L2: + PS-triggered local update, eager global update (period 1, reply "
      f"every 4, alpha {L2['alpha']})",
      L2,
    ),
    ("ablation", "full ALADDIN (period 4, alpha count)", {}),
    ("period", "period 1, alpha count (= alpha 0 at every update)", dict(period=1)),
    ("period", "period 2, alpha count", dict(period=2)),
    ("period", "period 4, alpha count (full)", {}),
    ("period", "period 1, alpha n_pi", dict(period=1, alpha="n_pi")),
    ("period", "period 2, alpha n_pi", dict(period=2, alpha="n_pi")),
    ("period", "period 4, alpha n_pi", dict(period=4, alpha="n_pi")),
  ]
  rows = [(label, cell("aladdin", c, **opts)) for _, label, opts in variants]
  if any(rs for _, rs in rows):
    lines += [
      f"## Ablation and period ({c})",
      "",
      "| variant | final test acc | acc @ 50% of the budget | seeds |",
      "|---|---|---|---|",
    ]
    for label, rs in rows:
      half = [r["evals"][len(r["evals"]) // 2]["test_accuracy"] for r in rs]
      lines.append(
        f"| {label} | {_mean_std([r['evals'][-1]['test_accuracy'] for r in rs])} | "
        f"{_mean_std(half)} | {len(rs)} |"
      )
    lines.append("")

  lr_rows = [
    (f"ALADDIN ({label})", cell("aladdin", c, lr=lr, **opts))
    for lr in (0.0, LR2)
    for label, opts in (
      ("alpha count", {}),
      ("alpha 0.5", dict(alpha=0.5)),
      ("alpha n_pi", dict(alpha="n_pi")),
      ("L2", dict(L2)),
    )
  ] + [(LABELS[alg], cell(alg, c, lr=lr)) for lr in (0.0, LR2) for alg in ("easgd", "sgp", "asp")]
  if any(cell("aladdin", c, lr=LR2)):
    lines += [
      f"## Learning rate {preset.lr:g} vs {LR2:g} ({c})",
      "",
      f"| method | final test acc, lr {preset.lr:g} | final test acc, lr {LR2:g} |",
      "|---|---|---|",
    ]
    pairs = list(zip(lr_rows[:4], lr_rows[4:8], strict=True)) + list(
      zip(lr_rows[8:11], lr_rows[11:14], strict=True)
    )
    for (label, rs_a), (_, rs_b) in pairs:
      lines.append(
        f"| {label} | {_mean_std([r['evals'][-1]['test_accuracy'] for r in rs_a])} | "
        f"{_mean_std([r['evals'][-1]['test_accuracy'] for r in rs_b])} |"
      )
    lines.append("")

  choice_rows = []
  for normalise in NORMALISES:
    for server_tx in SERVER_TXS:
      for alpha in ALPHAS:
        rs = [
          r
          for r in cell("aladdin", c, normalise=normalise, server_tx=server_tx, alpha=alpha)
          if r["spec"]["seed"] in preset.choice_seeds
        ]
        if rs:
          choice_rows.append((normalise, server_tx, alpha, rs))
  if choice_rows:
    lines += [
      f"## normalise x server_tx x alpha ({c}, seeds {list(preset.choice_seeds)})",
      "",
      "| normalise | server_tx | alpha | final test acc | final test loss | best acc |",
      "|---|---|---|---|---|---|",
    ]
    choice_rows.sort(
      key=lambda row: -statistics.mean(r["evals"][-1]["test_accuracy"] for r in row[3])
    )
    for normalise, server_tx, alpha, rs in choice_rows:
      lines.append(
        f"| {normalise} | {server_tx} | {alpha} | "
        f"{_mean_std([r['evals'][-1]['test_accuracy'] for r in rs])} | "
        f"{_mean_std([r['evals'][-1]['test_loss'] for r in rs])} | "
        f"{_mean_std([max(p['test_accuracy'] for p in r['evals']) for r in rs])} |"
      )
    lines.append("")

  overhead = out / "overhead.json"
  if overhead.exists():
    o = json.loads(overhead.read_text())
    lines += [
      "## Simulator overhead",
      "",
      f"One {o['name']} run with every JAX call timed (blocked on): wall {o['wall_time']:.2f} s, "
      f"inside JAX {o['jax_time']:.2f} s, outside (the simulator's Python: heap, bookkeeping, "
      f"batch slicing) {o['wall_time'] - o['jax_time']:.2f} s = "
      f"**{o['overhead_fraction']:.1%} of wall time**; {o['num_events']} events.",
      "",
    ]
  text = "\n".join(lines)
  summary = {
    "preset": dataclasses.asdict(preset),
    "target": target,
    "plots": plots,
    "num_runs": len(runs),
    "table3": t3,
  }
  return text, json.dumps(summary, indent=1)


def _plot_curves(out: Path, preset: Preset, cells: dict[str, dict[str, list[dict]]]) -> str:
  """Mean test accuracy against simulated time and against cluster iterations, per cluster."""
  plt = analysis.pyplot()
  clusters = list(cells)
  fig, axes = plt.subplots(2, len(clusters), figsize=(5 * len(clusters), 7), squeeze=False)
  for j, cluster in enumerate(clusters):
    for alg, rs in cells[cluster].items():
      if not rs:
        continue
      n = min(len(r["evals"]) for r in rs)
      t = [rs[0]["evals"][k]["time"] for k in range(n)]
      it = [rs[0]["evals"][k]["iterations"] for k in range(n)]
      acc = np.mean([[r["evals"][k]["test_accuracy"] for k in range(n)] for r in rs], axis=0)
      axes[0, j].plot(t, acc, marker=".", label=LABELS[alg])
      axes[1, j].plot(it, acc, marker=".", label=LABELS[alg])
    axes[0, j].set_title(f"{cluster}: test accuracy vs simulated time")
    axes[0, j].set_xlabel("simulated time (worker iterations, log scale above 10)")
    # AR-SGD and SGP take 10-100x longer on HE1/HE2: a log axis keeps the others readable.
    axes[0, j].set_xscale("symlog", linthresh=10)
    axes[1, j].set_title(f"{cluster}: test accuracy vs samples / (n B)")
    axes[1, j].set_xlabel("cluster iterations")
    for ax in axes[:, j]:
      ax.set_ylim(0, 1)
      ax.grid(alpha=0.3)
  axes[0, 0].legend()
  analysis.save_figure(fig, out / "accuracy_vs_time.png", dpi=110)
  return "accuracy_vs_time.png"


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------


def validation_tables(runs: dict[str, dict], scale: Scale) -> str:
  """The validation re-choice's tables (``tables.md``)."""
  grid = validation_grid(scale)
  seeds = ", ".join(map(str, scale.tune_seeds))
  parts = [
    f"# The reproduction's choices on validation: {sum(c.name in runs for c in grid)} of "
    f"{len(grid)} cells\n",
    f"## AR-SGD's rate (validation accuracy, {scale.ar_cluster}, seeds {seeds})\n",
  ]
  rows = []
  for lr in scale.ar_rates:
    accs = accuracies(runs, ar_specs(scale, lr))
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
  parts += protocol.not_run_note(grid, runs)
  return "\n".join(parts)


def plot(runs: dict[str, dict], path: Path, scale: Scale) -> bool:
  """Mean validation accuracy of every option, grouped by normalise and server_tx."""
  plt = analysis.pyplot()
  ranking = dict(option_ranking(runs, scale))
  if not ranking:
    return False
  fig, ax = plt.subplots(figsize=(8, 3.5))
  groups = [(n, s) for n in NORMALISES for s in SERVER_TXS]
  width = 0.8 / len(ALPHAS)
  for i, alpha in enumerate(ALPHAS):
    ys = [fsum_mean(ranking[(n, s, alpha)]) if (n, s, alpha) in ranking else 0 for n, s in groups]
    ax.bar([g + i * width for g in range(len(groups))], ys, width, label=f"alpha {alpha}")
  ax.set_xticks([g + width for g in range(len(groups))])
  ax.set_xticklabels([f"{n}\n{s}" for n, s in groups], fontsize=7)
  ax.set_ylabel(f"validation accuracy ({scale.cluster}, mean)")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3, axis="y")
  analysis.save_figure(fig, path, dpi=110)
  return True


def reproduction_report(setup: Reproduction, out: Path) -> driver.Report:
  """``tables.md``, ``summary.json`` and the plots from ``runs.json``, ``table3.json`` and
  ``overhead.json``."""
  t3_path = out / "table3.json"
  t3 = json.loads(t3_path.read_text()) if t3_path.exists() else None
  preset = PRESETS[setup.preset]
  text, summary = tables(out, preset, harness.load_summaries(out), t3)
  return driver.Report(text, {"tables.md": text, "summary.json": summary})


def validation_report(scale: Scale, out: Path) -> driver.Report:
  """``tables.md`` and ``validation.png`` from ``out/runs.json``."""
  runs = harness.load_summaries(out)
  text = validation_tables(runs, scale)
  plot(runs, out / "validation.png", scale)
  return driver.Report(text, {"tables.md": text})
