"""The scanned-layers study's tables, findings, per-run summary and plots, from the finished runs
under ``results/runs`` and the grid alone.

Deterministic in the runs: ``--report_only`` rebuilds ``tables.md``, ``summary.json`` and the
plots from the committed ``runs.tar.xz``. A run is read from its summary (``grid.RESULT``, the
runner's) and, for the logging reruns, from the diagnostics records of its ``metrics.jsonl``
(``comparisons.py``). The findings are sentences computed from the paired intervals, each
saying what its interval says and no more.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks import driver, harness
from benchmarks.scanned_layers import grid, plots
from benchmarks.scanned_layers.comparisons import (
  ENDPOINTS,
  Comparison,
  Endpoint,
  Runs,
  SliceRow,
  comparisons,
  finals,
  load,
  log_records,
  slice_rows,
)
from benchmarks.scanned_layers.grid import METHODS, Cell, Setup

SUMMARY_KEYS = (
  "group",
  "method",
  "scale",
  "rate",
  "seed",
  "updates",
  "validation_accuracy",
  "validation_loss",
  "test_accuracy",
  "test_loss",
  "cpu_seconds",
  "wall_seconds",
  "load_average",
)
# ----------------------------------------------------------------------------------------------


def _signed(value: float, e: Endpoint) -> str:
  return f"{value * e.scale:+.{e.digits}f}"


def finding(c: Comparison) -> str:
  """One comparison in words: its mean and interval, and only what the interval says."""
  e = ENDPOINTS[c.key]
  role = "Primary" if c.primary else "Secondary"
  head = f"{role}, S = {c.scale}, {c.label}, {e.name}"
  p = c.paired
  if p is None:
    return f"{head}: no seed has run both sides yet."
  unit = f" {e.unit}" if e.unit else ""
  if p.n < 2:
    return f"{head}: {_signed(p.mean, e)}{unit} on one seed, no interval."
  amount = f"{_signed(p.mean, e)}{unit}, 95% interval [{_signed(p.low, e)}, {_signed(p.high, e)}]"
  text = f"{head}: {amount} over {p.n} seeds ({p.wins} of them with A > B)"
  if not p.distinguishable:
    return f"{text}; the interval includes 0: no difference detected at n = {p.n}."
  a, b = METHODS[c.a].label, METHODS[c.b].label
  better, worse = (a, b) if (p.mean > 0) == e.higher_is_better else (b, a)
  bound = sorted(abs(v) * e.scale for v in (p.low, p.high))
  verb = "scores higher than" if e.higher_is_better else "has a lower loss than"
  return (
    f"{text}; the interval excludes 0: {better} {verb} {worse} at n = {p.n}, by "
    f"{bound[0]:.{e.digits}f} to {bound[1]:.{e.digits}f}{unit}."
  )


def selection_finding(setup: Setup, out: Path) -> str:
  """Which selections had their best rate at an edge of the grid (and ran one beyond it)."""
  choices = grid.chosen_rates(setup, out)
  edges = [
    f"{METHODS[m].label} at S = {s} ({rates[-1]:g})"
    for (m, s), (rates, _) in choices.items()
    if len(rates) > len(setup.rates)
  ]
  if not edges:
    return f"No selection of the {len(choices)} had its best rate at an edge of the grid."
  return (
    f"{len(edges)} of the {len(choices)} selections had their best rate at an edge of the grid "
    f"and ran one rate beyond it: {', '.join(edges)}."
  )


def spread_finding(setup: Setup, rows: list[SliceRow]) -> str:
  """How far the blocks' gain ratios of a stacked leaf spread (descriptive, one run)."""
  spreads = sorted(max(r.ratios) / min(r.ratios) for r in rows)
  return (
    f"Descriptive (one run, S = {setup.log_scale}, seed {setup.log_seed}): the {len(rows)} "
    f"stacked leaves' per-slice gain ratios, each averaged over the run's records, differ "
    f"across the {setup.depth} blocks by a factor (max / min) of {spreads[0]:.2f} to "
    f"{spreads[-1]:.2f}, median {statistics.median(spreads):.2f}."
  )


# ----------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------


def _rate(rate: float | None) -> str:
  return "—" if rate is None else f"{rate:g}"


def selection_table(setup: Setup, runs: Runs, out: Path) -> str:
  """Final validation accuracy of the selection seed at every rate run, the chosen rate."""
  rates = sorted({c.rate for c in runs if c.group == "select"} | set(setup.rates))
  choices = grid.chosen_rates(setup, out)
  rows = []
  for s in setup.scales:
    for method in setup.methods:
      score = grid.validation_score(out, setup, method, s)
      ran, chosen = choices[(method, s)]
      cells = []
      for rate in rates:
        value = score(rate) if rate in ran else None
        text = "—" if value is None else f"{value:.4f}"
        cells.append(f"**{text}**" if rate == chosen else text)
      extended = "yes" if len(ran) > len(setup.rates) else "no"
      rows.append([s, METHODS[method].label, *cells, _rate(chosen), extended])
  header = ["S", "method", *(f"{r:g}" for r in rates), "chosen rate", "beyond the grid"]
  return harness.markdown_table(header, rows)


def results_table(setup: Setup, runs: Runs) -> str:
  """Per method at each S: its rate, the reported seeds' test and validation numbers."""
  rows = []
  for s in setup.scales:
    for method in setup.methods:
      mine = finals(runs, method, s)
      if not mine:
        continue

      def values(key: str, mine: dict[int, dict[str, Any]] = mine) -> list[float]:
        return [mine[seed][key] for seed in sorted(mine)]

      rows.append(
        [
          s,
          METHODS[method].label,
          _rate(next(iter(mine.values()))["rate"]),
          len(mine),
          harness.mean_std(values("test_accuracy")),
          harness.mean_std(values("test_loss")),
          harness.mean_std(values("validation_accuracy")),
          statistics.mean(values("updates")),
        ]
      )
  header = ["S", "method", "rate", "seeds", "test accuracy", "test loss"]
  header += ["final validation accuracy", "updates"]
  return harness.markdown_table(header, rows)


def paired_table(comparisons_: list[Comparison]) -> str:
  """The primary and secondary comparisons, each with its Student-t 95% interval."""
  rows = []
  for c in comparisons_:
    e, p = ENDPOINTS[c.key], c.paired
    role = "primary" if c.primary else "secondary"
    if p is None:
      rows.append([c.scale, role, c.label, e.column, 0, "—", "—", "—", "no seed"])
      continue
    verdict = p.verdict("A ahead", "B ahead")
    if not e.higher_is_better and p.distinguishable:
      verdict = "A lower" if p.mean < 0 else "B lower"
    rows.append([c.scale, role, c.label, e.column, *p.row(c.label, e.digits, e.scale)[1:], verdict])
  header = ["S", "role", "A - B", "endpoint", "seeds", "mean", "95% interval", "A > B", "verdict"]
  return harness.markdown_table(header, rows)


def slice_table(setup: Setup, rows: list[SliceRow]) -> str:
  """Descriptive: per stacked leaf, its slices' gain ratios and warm-up ends by block beside
  the stack's."""

  def end(step: int) -> str:
    return "not ended" if step < 0 else str(step)

  table = [
    [
      f"`{r.leaf}`",
      " / ".join(f"{v:.2f}" for v in r.ratios),
      f"{max(r.ratios) / min(r.ratios):.2f}",
      f"{r.stack_ratio:.2f}",
      " / ".join(end(step) for step in r.ends),
      end(r.stack_end),
    ]
    for r in rows
  ]
  header = [
    "stacked leaf",
    f"gain ratio per slice, blocks 0-{setup.depth - 1}",
    "max / min",
    "gain ratio per stack",
    "warm-up end per slice (update)",
    "per stack",
  ]
  return harness.markdown_table(header, table)


def rerun_check(runs: Runs, out: Path) -> list[str]:
  """Per logging rerun: whether its evaluations (validation accuracy and loss, and the
  optimizer's per-layer diagnostics then) equal its reported run's, number for number. The
  train loss of an evaluation record is left out: it averages the updates since the previous
  record, which the logging records interleave."""
  from examples import metrics

  def evaluations(cell: Cell) -> list[dict[str, Any]]:
    keys = ("iteration", "eval_accuracy", "eval_loss", *metrics.DIAGNOSTICS)
    records = metrics.read_metrics(out / "runs" / cell.name, "eval")
    return [{k: r.get(k) for k in keys} for r in records]

  lines = []
  for cell in runs:
    if cell.group != "log":
      continue
    twin = Cell("final", cell.method, cell.scale, cell.rate, cell.seed)
    mine = evaluations(cell)
    same = twin in runs and evaluations(twin) == mine
    lines.append(
      f"{METHODS[cell.method].label}, S = {cell.scale}, seed {cell.seed}: its {len(mine)} "
      "evaluations (validation accuracy and loss, and every layer's gain ratio, rate multiplier "
      f"and warm-up end then) are {'identical to' if same else 'NOT identical to'} the "
      "reported run's."
    )
  return lines


def cost_table(setup: Setup, runs: Runs) -> str:
  """Runs and CPU time by kind of run."""
  kinds = {
    "selection grid": lambda c: c.group == "select" and c.rate in setup.rates,
    "beyond the grid": lambda c: c.group == "select" and c.rate not in setup.rates,
    "reported seeds": lambda c: c.group == "final",
    "logging reruns": lambda c: c.group == "log",
    "all": lambda c: True,
  }
  rows = []
  for kind, member in kinds.items():
    mine = [r for c, r in runs.items() if member(c)]
    cpu = [r["cpu_seconds"] for r in mine]
    wall = sum(r["wall_seconds"] for r in mine)
    mean = f"{statistics.mean(cpu):.1f}" if cpu else "—"
    rows.append([kind, len(mine), f"{sum(cpu) / 3600:.2f}", f"{wall / 3600:.2f}", mean])
  header = ["runs", "count", "CPU hours", "wall hours (summed)", "CPU s per run"]
  return harness.markdown_table(header, rows)


# ----------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------


def summary(runs: Runs) -> dict[str, Any]:
  """The per-run summary git keeps: cell name -> its numbers (the curves stay in the archive)."""
  return {c.name: {k: r[k] for k in SUMMARY_KEYS if k in r} for c, r in runs.items()}


def findings(
  setup: Setup,
  runs: Runs,
  out: Path,
  comparisons_: list[Comparison],
  records: dict[str, list[dict[str, Any]]] | None,
) -> str:
  """The study's findings as a Markdown list, every sentence computed from the runs."""
  lines = [finding(c) for c in comparisons_]
  if any(c.group == "select" for c in runs):
    lines.append(selection_finding(setup, out))
  if records is not None:
    lines.append(spread_finding(setup, slice_rows(setup, records)))
  return "\n".join(f"- {line}" for line in lines)


def report(setup: Setup, out: Path) -> driver.Report:
  """The tables and findings (``tables.md``), the per-run summary (``summary.json``) and the
  plots."""
  runs = load(setup, out)
  comparisons_ = comparisons(setup, runs)
  records = log_records(setup, runs, out)
  sections = [
    "## Findings (computed from the paired intervals)",
    findings(setup, runs, out, comparisons_, records),
    "## Selection: final validation accuracy of seed "
    f"{setup.selection_seed} (bold: the chosen rate)",
    selection_table(setup, runs, out),
    "## The reported seeds at the chosen rates (mean ± std over seeds)",
    results_table(setup, runs),
    "## Paired differences (A - B seed by seed, Student-t 95% interval)",
    paired_table(comparisons_),
  ]
  if records is not None:
    sections += [
      f"## Gain ratios and warm-up ends by block (logging reruns, S = {setup.log_scale}, "
      f"seed {setup.log_seed})",
      slice_table(setup, slice_rows(setup, records)),
      "\n".join(rerun_check(runs, out)),
    ]
  sections += ["## Runs and CPU time", cost_table(setup, runs)]
  text = "\n\n".join(sections)
  if runs:
    plots.test_accuracy(setup, runs, comparisons_, out / "test_accuracy.png")
    plots.curves(setup, runs, out / "validation_curves.png")
  if records is not None:
    plots.gain_ratios(setup, records, out / "gain_ratios.png")
  return driver.Report(
    text,
    {"tables.md": text + "\n", "summary.json": harness.json_text(summary(runs), sort_keys=True)},
  )
