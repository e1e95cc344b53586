"""The CI-time tables, summary and plot, from ``per_test.json.xz``."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from benchmarks import driver, harness
from benchmarks.ci_time.grid import CiTime, match, origin
from examples import analysis


def _totals(records: Iterable[Mapping[str, float]]) -> dict[str, float]:
  records = list(records)
  return {
    "tests": len(records),
    "cpu_s": round(sum(r["cpu"] for r in records), 1),
    "wall_s": round(sum(r["wall"] for r in records), 1),
  }


def summarise(data: Mapping[str, Any]) -> dict[str, Any]:
  baseline, current = data["tests"]["baseline"], data["tests"]["current"]
  matched = match(baseline, current)
  used = set(matched.values())
  new = [n for n in current if n not in matched]
  groups: dict[str, list[Mapping[str, float]]] = collections.defaultdict(list)
  for nodeid in new:
    groups[origin(nodeid)].append(current[nodeid])
  by_file: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
  for nodeid, old in matched.items():
    row = by_file[nodeid.split("::", 1)[0]]
    row["tests"] += 1
    row["cpu_baseline_s"] += baseline[old]["cpu"]
    row["cpu_current_s"] += current[nodeid]["cpu"]
  return {
    "baseline": data["baseline"],
    "current": data["current"],
    "runs": data["runs"],
    "machine": data.get("machine", {}),
    "suites": {"baseline": _totals(baseline.values()), "current": _totals(current.values())},
    "matched": {
      "baseline": _totals(baseline[o] for o in matched.values()),
      "current": _totals(current[n] for n in matched),
    },
    "baseline_unmatched": _totals(baseline[n] for n in baseline if n not in used),
    "new_by_origin": {k: _totals(v) for k, v in sorted(groups.items())},
    "matched_by_file": {
      f: {k: round(v, 1) for k, v in row.items()} for f, row in sorted(by_file.items())
    },
  }


def tables(summary: Mapping[str, Any]) -> str:
  def row(label: str, t: Mapping[str, float]) -> list[object]:
    return [label, int(t["tests"]), f"{t['cpu_s']:.0f}", f"{t['wall_s']:.0f}"]

  header = ["tests", "count", "CPU s", "wall s (summed per test)"]
  rows = [
    row(f"baseline suite ({summary['baseline']}), all", summary["suites"]["baseline"]),
    row("  of which matched today", summary["matched"]["baseline"]),
    row("  of which not matched", summary["baseline_unmatched"]),
    row(f"today's suite ({summary['current']}), all", summary["suites"]["current"]),
    row("  matched: the baseline's tests today", summary["matched"]["current"]),
  ]
  rows += [row(f"  new: {k}", v) for k, v in summary["new_by_origin"].items()]
  text = harness.markdown_table(header, rows) + "\n\n"
  files = sorted(
    summary["matched_by_file"].items(),
    key=lambda kv: -abs(kv[1]["cpu_current_s"] - kv[1]["cpu_baseline_s"]),
  )
  file_rows = [
    [f, int(r["tests"]), f"{r['cpu_baseline_s']:.1f}", f"{r['cpu_current_s']:.1f}"]
    for f, r in files[:15]
  ]
  header = ["file today (matched tests)", "tests", "CPU s baseline", "CPU s today"]
  text += harness.markdown_table(header, file_rows) + "\n"
  return text


def plot(summary: Mapping[str, Any], path: Path) -> None:
  fig, ax = analysis.pyplot().subplots(figsize=(7, 3.6))
  bottom = 0.0
  ax.bar(0, summary["matched"]["baseline"]["cpu_s"], color="tab:gray", label="matched tests")
  ax.bar(
    0,
    summary["baseline_unmatched"]["cpu_s"],
    bottom=summary["matched"]["baseline"]["cpu_s"],
    color="lightgray",
    label="baseline tests not matched",
  )
  ax.bar(1, summary["matched"]["current"]["cpu_s"], color="tab:gray")
  bottom = summary["matched"]["current"]["cpu_s"]
  for i, (name, t) in enumerate(summary["new_by_origin"].items()):
    ax.bar(1, t["cpu_s"], bottom=bottom, color=f"C{i}", label=f"new: {name}")
    bottom += t["cpu_s"]
  ax.set_xticks([0, 1], [f"baseline {summary['baseline']}", f"today {summary['current']}"])
  ax.set_ylabel("CPU seconds (non-Ray tests)")
  ax.legend(fontsize=7, loc="upper left")
  analysis.save_figure(fig, path, dpi=110)


def report(setup: CiTime, out: Path) -> driver.Report:
  """``summary.json``, ``tables.md`` and ``ci_time.png`` from the measured records."""
  del setup
  data = driver.Files(".json.xz").load(out, "per_test")
  summary = summarise(data)
  plot(summary, out / "ci_time.png")
  text = tables(summary)
  return driver.Report(text, {"summary.json": harness.json_text(summary), "tables.md": text})
