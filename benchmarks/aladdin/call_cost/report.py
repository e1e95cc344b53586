"""The call-cost benchmark's table and plot, from ``call_cost.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import driver, harness
from benchmarks.aladdin.call_cost.grid import CallCost
from examples import analysis


def table(rows: list[dict[str, Any]]) -> str:
  """Per fold size, the medians of both paths and of their ratios per pair."""
  header = [
    "fold (KiB)",
    "caller CPU ms: inline / ring",
    "callee CPU ms: inline / ring",
    "inline / ring, per pair (caller, callee)",
    "wall ms per call: inline / ring",
  ]
  body = [
    [
      f"{r['fold']} ({r['kib']:.0f})",
      f"{r['inline_caller_cpu_ms']:.2f} / {r['ring_caller_cpu_ms']:.2f}",
      f"{r['inline_callee_cpu_ms']:.2f} / {r['ring_callee_cpu_ms']:.2f}",
      f"{r['caller_cpu_ms_ratio']:.1f}x, {r['callee_cpu_ms_ratio']:.1f}x",
      f"{r['inline_wall_ms']:.2f} / {r['ring_wall_ms']:.2f}",
    ]
    for r in rows
  ]
  return harness.markdown_table(header, body)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
  """CPU ms per call of caller and callee, inline and in the ring, per fold size."""
  fig, ax = analysis.pyplot().subplots(figsize=(6.5, 3.5))
  x = np.arange(len(rows))
  bars = [
    ("inline_caller_cpu_ms", "caller, inline"),
    ("ring_caller_cpu_ms", "caller, ring"),
    ("inline_callee_cpu_ms", "callee, inline"),
    ("ring_callee_cpu_ms", "callee, ring"),
  ]
  for k, (key, label) in enumerate(bars):
    ax.bar(x + (k - 1.5) * 0.2, [r[key] for r in rows], 0.2, label=label)
  ax.set_xticks(x, [f"{r['fold']} messages\n({r['kib']:.0f} KiB)" for r in rows])
  ax.set_ylabel("CPU ms per call (median)")
  ax.set_title("A call to a PS shard: messages inline or in the shared-memory ring", fontsize=9)
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3, axis="y")
  analysis.save_figure(fig, path)


def report(setup: CallCost, out: Path) -> driver.Report:
  """The table (RESULTS.md carries it) and ``call_cost.png``."""
  del setup
  rows = json.loads((out / "call_cost.json").read_text())["rows"]
  plot(rows, out / "call_cost.png")
  return driver.Report(table(rows), {})
