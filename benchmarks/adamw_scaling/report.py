"""Tables, summary and plots of the AdamW study, from the finished runs under ``results/runs``.

Deterministic in the runs: ``--report_only`` rebuilds ``tables.md``, ``summary.json`` and the
plots from the committed ``runs.tar.xz``. A run is read from its ``config.json`` (the study's
fields: ``method``, ``num_workers``, ``learning_rate``, ``seed``, ``sweep``, ``label``) and its
evaluation records (``eval_accuracy``; the last one's ``val_accuracy`` and
``critical_batch_size``), as both the archived runs and the trainer's (``runner.py``) hold them.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks import driver, harness, paired_intervals
from benchmarks.adamw_scaling import grid as study
from benchmarks.adamw_scaling.grid import METHODS, PER_WORKER_BATCH, Setup
from examples import analysis, metrics

BASELINE = "adam_lsw"  # at S = 8 (scale 1) every optax_lena rule is this plain AdamW
# Fractions of the baseline's final accuracy: with the same epochs the large-S runs have a few
# dozen updates, so the shared 98% / 90% targets are complemented by lower ones.
TARGET_FRACTIONS = (0.90, 0.75, 0.50)
# (A, B): A - B seed by seed (a seed fixes the initialisation and the data order, so pairing
# removes most of the seed-to-seed spread): the questions of the study.
PAIRS = (
  ("adam_sqrt_lsw", "adam_lsw"),
  ("lena", "lena_sqrt"),
  ("adascale", "adascale_sqrt"),
  ("lena_sa", "lena_sqrt_sa"),
  ("adascale_sa", "adascale_sqrt_sa"),
  ("lena", "adascale"),
  ("lena_sa", "lena"),
  ("adascale_sa", "adascale"),
  ("lena", "adam_sqrt_lsw"),
  ("lena", "lamb"),
)
# Every rule against AdamW with its rate tuned on validation at that S (the reference); Malladi's
# rule where it is defined (S = 32), its b1-kept variant where it is not (if it ran).
REFERENCE = study.TUNED_METHOD
REFERENCE_RULES = (
  "adam_sqrt_lsw",
  "adam_lsw",
  "adascale",
  "lena",
  "lamb",
  "lamb_val",
  "malladi",
  "malladi_b2",
  "adamw_check",
)
# Labels of the methods and of the cells that are not methods of their own (other rate choices).
LABELS = {m: label for m, (label, *_) in METHODS.items()} | {
  "lamb": "LAMB (rate swept, chosen on seed 0's test accuracy)",
  "lamb_val": "LAMB (rate chosen on validation)",
  "adamw_check": "AdamW (rate chosen on the check seeds)",
}


def load_runs(runs_dir: Path) -> list[dict[str, Any]]:
  """Config and evaluation records of every finished run."""
  out = []
  for workdir in sorted(p for p in runs_dir.glob("*") if p.is_dir()):
    if harness.is_finished(workdir):
      config = harness.read_config(workdir)
      assert config is not None
      out.append({"config": config, "evals": metrics.read_metrics(workdir, "eval")})
  return out


def select(runs: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
  """(method, S) -> runs over the reported seeds. LAMB keeps the rate that was best on seed 0
  (and, as ``lamb_val``, the one chosen on validation); AdamW the rate chosen on validation by
  the selection seeds (and, as ``adamw_check`` where it differs, by the check seeds)."""
  by_rate: dict[tuple[str, int, float], list[dict[str, Any]]] = defaultdict(list)
  for run in runs:
    c = run["config"]
    if c["method"] != REFERENCE and c["seed"] not in study.CHECK_SEEDS:
      by_rate[(c["method"], c["num_workers"], c["learning_rate"])].append(run)
  cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
  for (method, s, _), group in by_rate.items():
    current = cells.get((method, s))
    if current is None or _seed0_accuracy(group) > _seed0_accuracy(current):
      cells[(method, s)] = sorted(group, key=lambda r: r["config"]["seed"])
  base = cells.get((BASELINE, 8))
  chosen = {
    (REFERENCE, study.SELECTION_SEEDS): REFERENCE,
    ("lamb", study.SELECTION_SEEDS): "lamb_val",
    (REFERENCE, study.CHECK_SEEDS): "adamw_check",
  }
  for (method, seeds), key in chosen.items():
    for s, (_, rate) in tuned_rates(runs, method, seeds).items():
      finals = _finals(runs, method, s, rate)
      if method == REFERENCE and s == 8 and not finals and base and _rate(base) == rate:
        finals = list(base)  # the same configuration (scale 1), archived; its own cell
      if rate is None or not finals:
        continue
      if key == "adamw_check" and (REFERENCE, s) in cells and rate == _rate(cells[(REFERENCE, s)]):
        continue  # the check seeds chose the same rate
      cells[(key, s)] = finals
  return cells


def _rate(group: list[dict[str, Any]]) -> float:
  return group[0]["config"]["learning_rate"]


def _finals(runs: list[dict[str, Any]], method: str, s: int, rate: float | None) -> list[Any]:
  """``method``'s runs at S = ``s`` and ``rate`` on the reported seeds, by seed."""
  out = [
    r
    for r in runs
    if r["config"]["method"] == method
    and r["config"]["num_workers"] == s
    and r["config"]["learning_rate"] == rate
    and r["config"]["seed"] in study.FINAL_SEEDS
  ]
  return sorted(out, key=lambda r: r["config"]["seed"])


def tuned_rates(
  runs: list[dict[str, Any]],
  method: str = REFERENCE,
  seeds: tuple[int, ...] = study.SELECTION_SEEDS,
) -> dict[int, tuple[list[float], float | None]]:
  """S -> (``method``'s swept rates, the one chosen on validation over ``seeds`` or None), by
  ``study.selection``."""
  val: dict[tuple[int, float, int], float] = {}
  for run in runs:
    c = run["config"]
    if c["method"] == method and c["seed"] in seeds:
      val[(c["num_workers"], c["learning_rate"], c["seed"])] = run["evals"][-1]["val_accuracy"]
  scales = sorted({s for s, _, _ in val})
  return {
    s: study.selection(
      lambda s, lr, seed: val.get((s, lr, seed)), s, study.base_rates(method, s), seeds
    )
    for s in scales
  }


def _seed0_accuracy(group: list[dict[str, Any]]) -> float:
  accs = [r["evals"][-1]["eval_accuracy"] for r in group if r["config"]["seed"] == 0]
  return accs[0] if accs else float("-inf")


def final_accuracies(group: list[dict[str, Any]]) -> list[float]:
  return [r["evals"][-1]["eval_accuracy"] for r in group]


def report(setup: Setup, out: Path) -> driver.Report:
  """``tables.md``, ``summary.json`` and the plots of every finished run under ``out/runs``."""
  del setup  # the report covers whatever ran
  runs = load_runs(out / "runs")
  cells = select(runs)
  scales = sorted({s for _, s in cells})
  baseline = cells.get((BASELINE, 8), [])
  base_acc = statistics.mean(final_accuracies(baseline)) if baseline else None
  targets = analysis.targets(base_acc, TARGET_FRACTIONS) if base_acc is not None else []
  methods = [m for m in LABELS if any((m, s) in cells for s in scales)]
  header = ["method", *[f"S={s} (batch {s * PER_WORKER_BATCH})" for s in scales]]

  def cell_rows(fn):
    rows = []
    for m in methods:
      row = [LABELS[m]]
      for s in scales:
        at_scale_one = s == 8 and m not in ("lamb", "lamb_val")  # the baseline's run
        group = cells.get((m, s)) or (cells.get((BASELINE, 8)) if at_scale_one else None)
        row.append(fn(group, s) if group else "—")
      rows.append(row)
    return rows

  lamb_swept = _swept_rates(runs, "lamb")

  def acc_cell(group, s):
    accs = final_accuracies(group)
    rate = ""
    if any(group is cells.get((m, s)) for m in (REFERENCE, "lamb_val", "adamw_check")):
      rate = f" @ {_rate(group):g}"  # inside its validation sweep (an edge adds a rate)
    elif group[0]["config"]["method"] == "lamb":
      lr = group[0]["config"]["learning_rate"]
      edge = lr in (min(lamb_swept[s]), max(lamb_swept[s])) and len(lamb_swept[s]) > 1
      rate = f" @ {lr:g}" + (" (edge of the sweep)" if edge else "")
    return f"{harness.mean_std(accs)} ({len(accs)}){rate}"

  def target_cell(target):
    def fn(group, s):
      hits = [analysis.iterations_to_target(r["evals"], target) for r in group]
      return harness.mean_std_reached([h for h in hits if h is not None], len(hits))

    return fn

  def critical_cell(group, s):
    values = [r["evals"][-1].get("critical_batch_size") for r in group]
    finite = [v * PER_WORKER_BATCH for v in values if v is not None]
    return f"{statistics.median(finite):.0f}" if finite else "—"

  sections = [
    "# AdamW study: tables (generated by report.py)\n",
    f"Finished runs: {len(runs)}. Baseline: AdamW at S = 8 (global batch 64, the rate's "
    f"reference batch), final accuracy {base_acc if base_acc is None else round(base_acc, 4)}.",
    "\n## Final test accuracy (mean ± std over seeds (n); LAMB: its best rate on seed 0; AdamW: "
    "the rate chosen on the validation set)\n",
    harness.markdown_table(header, cell_rows(acc_cell)),
  ]
  for fraction, target in _with_fractions(targets):
    sections += [
      f"\n## Updates to {fraction:.0%} of the baseline's accuracy ({target:.4f})\n",
      harness.markdown_table(header, cell_rows(target_cell(target))),
    ]
  sections += [
    "\n## Paired differences of final accuracy (A - B on the same seed)\n",
    "Mean ± std over the seeds both ran, and on how many seeds A was ahead.\n",
    harness.markdown_table(
      ["A - B", *[f"S={s}" for s in scales if s > 8]], _pair_rows(cells, scales)
    ),
    "\n## Every rule against tuned AdamW (A - AdamW at its validation-chosen rate, by seed)\n",
    "Student-t 95% interval of the mean over the seeds both ran (n - 1 degrees of freedom).\n",
    harness.markdown_table(
      ["A - tuned AdamW", "S", "seeds", "mean", "95% interval", "seeds A > AdamW", "verdict"],
      [[*row[:1], s, *row[1:], p.verdict()] for s, row, p in _reference_rows(cells, scales)],
    ),
    "\n## Rates chosen on the validation set (mean final validation accuracy over the seeds)\n",
    f"Selection seeds {', '.join(map(str, study.SELECTION_SEEDS))} (pre-registered for AdamW), "
    f"check seeds {', '.join(map(str, study.CHECK_SEEDS))}; the highest mean wins, ties to the "
    "smaller rate; a best rate at an edge of the first sweep adds one rate beyond it.\n",
    harness.markdown_table(*_selection_table(runs)),
    "\n## Critical batch size at the end of training (examples; median over seeds)\n",
    "From `ol.diagnostics(...)['critical_batch_size']` (per-worker batches) times the "
    f"per-worker batch {PER_WORKER_BATCH}.\n",
    harness.markdown_table(header, cell_rows(critical_cell)),
    "\n## Rate sweeps (final accuracy)\n",
    harness.markdown_table(
      ["method", "S", "rate", "seed 0", "all seeds that ran it (n)"], _sweep_rows(runs)
    ),
  ]
  text = "\n".join(sections) + "\n"
  summary = {
    f"{m}/S{s}": {
      "final_accuracy": final_accuracies(g),
      "seeds": [r["config"]["seed"] for r in g],
      "iterations_to_target": {
        f"{f:.2f}": [analysis.iterations_to_target(r["evals"], t) for r in g]
        for f, t in _with_fractions(targets)
      },
      "learning_rate": g[0]["config"]["learning_rate"],
    }
    for (m, s), g in sorted(cells.items())
  }
  selected = {
    f"{method}/seeds {','.join(map(str, seeds))}/S{s}": {"rates": rates, "chosen": chosen}
    for method, seeds in SELECTIONS
    for s, (rates, chosen) in tuned_rates(runs, method, seeds).items()
  }
  record = {"baseline_accuracy": base_acc, "cells": summary, "selection": selected}
  _plots(out, cells, scales, methods, base_acc, targets)
  _reference_plot(out, _reference_rows(cells, scales))
  return driver.Report(text, {"tables.md": text, "summary.json": harness.json_text(record)})


def _reference_rows(cells, scales) -> list[tuple[int, list[Any], paired_intervals.Paired]]:
  """(S, ``Paired.row``, Paired) of every rule in ``REFERENCE_RULES`` minus tuned AdamW."""
  out = []
  for s in (s for s in scales if s > 8 and (REFERENCE, s) in cells):
    ref = {r["config"]["seed"]: r["evals"][-1]["eval_accuracy"] for r in cells[(REFERENCE, s)]}
    for m in REFERENCE_RULES:
      if (m, s) not in cells:
        continue
      acc = {r["config"]["seed"]: r["evals"][-1]["eval_accuracy"] for r in cells[(m, s)]}
      p = paired_intervals.paired_by_seed(acc, ref)
      out.append((s, p.row(LABELS[m], 4), p))
  return out


# (method, seeds) of every validation choice: the selection seeds', then the check seeds'.
SELECTIONS: tuple[tuple[str, tuple[int, ...]], ...] = tuple(
  (m, seeds) for seeds in (study.SELECTION_SEEDS, study.CHECK_SEEDS) for m in (REFERENCE, "lamb")
)


def _selection_table(runs: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
  """One row per (method, seeds, S): the mean final validation accuracy of each rate."""
  val: dict[tuple[str, int, float, int], float] = {}
  for run in runs:
    c = run["config"]
    if c["method"] in (REFERENCE, "lamb") and c["seed"] in study.CHECK_SEEDS:
      key = (c["method"], c["num_workers"], c["learning_rate"], c["seed"])
      val[key] = run["evals"][-1]["val_accuracy"]
  rates = sorted({lr for _, _, lr, _ in val})
  rows = []
  for method, seeds in SELECTIONS:
    for s, (_, chosen) in tuned_rates(runs, method, seeds).items():
      cells = []
      for lr in rates:
        got = [val[(method, s, lr, seed)] for seed in seeds if (method, s, lr, seed) in val]
        cells.append(f"{statistics.mean(got):.4f}" if len(got) == len(seeds) else "—")
      label = "AdamW" if method == REFERENCE else "LAMB"
      seed_text = ", ".join(map(str, seeds))
      rows.append([label, seed_text, s, *cells, "—" if chosen is None else f"{chosen:g}"])
  return ["method", "seeds", "S", *[f"{lr:g}" for lr in rates], "chosen"], rows


def _reference_plot(out: Path, rows) -> None:
  """The paired differences against tuned AdamW with their intervals, one panel per S."""
  if not rows:
    return
  plt = analysis.pyplot()
  scales = sorted({s for s, _, _ in rows})
  fig, axes = plt.subplots(1, len(scales), figsize=(4.5 * len(scales), 3.4), squeeze=False)
  for ax, s in zip(axes[0], scales, strict=True):
    mine = [(row[0], p) for t, row, p in rows if t == s]
    ys = range(len(mine))
    for y, (_, p) in zip(ys, mine, strict=True):
      ax.errorbar(p.mean, y, xerr=[[p.mean - p.low], [p.high - p.mean]], fmt="o", capsize=3)
    ax.axvline(0.0, color="gray", lw=0.8)
    ax.set_yticks(list(ys), [label for label, _ in mine], fontsize=6)
    ax.set_title(f"S = {s} (batch {s * PER_WORKER_BATCH})", fontsize=8)
    ax.set_xlabel("A - tuned AdamW, test accuracy (95% t)", fontsize=7)
  analysis.save_figure(fig, out / "paired_vs_tuned_adamw.png")


def _sweep_rows(runs: list[dict[str, Any]]) -> list[list[Any]]:
  """One row per swept (method, S, rate): seed 0's accuracy and, where other seeds ran that
  rate (LAMB: seed 0's best and its neighbours), the mean ± std over the seeds."""
  by_rate: dict[tuple[str, int, float], dict[int, float]] = defaultdict(dict)
  for run in runs:
    c = run["config"]
    # AdamW's and the check seeds' selection runs have their own table.
    if c.get("sweep") and c["method"] != REFERENCE and c["seed"] not in study.CHECK_SEEDS:
      key = (c["label"], c["num_workers"], c["learning_rate"])
      by_rate[key][c["seed"]] = run["evals"][-1]["eval_accuracy"]
  rows = []
  for (label, s, lr), accs in sorted(by_rate.items()):
    seed0 = f"{accs[0]:.4f}" if 0 in accs else "—"
    every = [accs[k] for k in sorted(accs)]
    rows.append([label, s, f"{lr:g}", seed0, f"{harness.mean_std(every)} ({len(every)})"])
  return rows


def _pair_rows(cells, scales) -> list[list[str]]:
  rows = []
  for a, b in PAIRS:
    row = [f"{LABELS[a]} - {LABELS[b]}"]
    for s in (s for s in scales if s > 8):
      by_seed = [
        {r["config"]["seed"]: r["evals"][-1]["eval_accuracy"] for r in cells.get((m, s), [])}
        for m in (a, b)
      ]
      seeds = sorted(set(by_seed[0]) & set(by_seed[1]))
      diffs = [by_seed[0][k] - by_seed[1][k] for k in seeds]
      ahead = sum(d > 0 for d in diffs)
      row.append(f"{_signed_mean_std(diffs)} ({ahead}/{len(diffs)})" if diffs else "—")
    rows.append(row)
  return rows


def _signed_mean_std(values: list[float]) -> str:
  if len(values) == 1:
    return f"{values[0]:+.3f}"
  return f"{statistics.mean(values):+.3f} ± {statistics.stdev(values):.3f}"


def _swept_rates(runs: list[dict[str, Any]], method: str) -> dict[int, set[float]]:
  """S -> the rates of ``method``'s finished seed-0 sweep runs."""
  rates: dict[int, set[float]] = defaultdict(set)
  for run in runs:
    c = run["config"]
    if c["method"] == method and c.get("sweep") and c["seed"] == 0:
      rates[c["num_workers"]].add(c["learning_rate"])
  return rates


def _with_fractions(targets: list[float]) -> list[tuple[float, float]]:
  """(fraction, target) pairs; none while no baseline run has finished."""
  return list(zip(TARGET_FRACTIONS, targets, strict=True)) if targets else []


def _plots(out, cells, scales, methods, base_acc, targets) -> None:
  series = {
    LABELS[m]: [
      (s * PER_WORKER_BATCH, final_accuracies(cells[(m, s)]))
      for s in scales
      if (m, s) in cells and s > 8
    ]
    for m in methods
    if any((m, s) in cells for s in scales if s > 8)  # not the baseline alone
  }
  baseline = (base_acc, "AdamW at S = 8") if base_acc is not None else None
  epochs = next(iter(cells.values()))[0]["config"]["epochs"] if cells else 0
  fig = analysis.plot_accuracy_vs_scale(
    series,
    baseline,
    num_epochs=epochs,
    title="AdamW rules on MNIST-1D (attention model)",
    legend_size=6,
  )
  analysis.save_figure(fig, out / "accuracy_vs_scale.png")
  largest = max(scales) if scales else None
  if largest is None:
    return
  curves = {
    LABELS[m]: (
      [e["iteration"] for e in cells[(m, largest)][0]["evals"]],
      [e["eval_accuracy"] for e in cells[(m, largest)][0]["evals"]],
    )
    for m in methods
    if (m, largest) in cells
  }
  hlines = [(t, f"{f:.0%} of baseline") for f, t in _with_fractions(targets)]
  fig = analysis.plot_accuracy(curves, hlines, title=f"S = {largest}, seed 0")
  analysis.save_figure(fig, out / f"accuracy_vs_iterations_s{largest}.png")
