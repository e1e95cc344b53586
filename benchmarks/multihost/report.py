"""The multi-host tables (``table.md``, ``allreduce.md``) from their JSON."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks import driver, harness
from benchmarks.multihost.grid import LAYOUTS, Allreduce, Bench


def _command(data: dict[str, Any], legacy: str) -> str:
  """The command that measured ``data``: its ``recorded`` one, or for the measurements made
  before it was recorded, ``legacy`` (theirs, by its options)."""
  return data.get("recorded", {}).get("command") or legacy


def bench_table(data: dict[str, Any]) -> str:
  """Per layout, the step time and its ratio to 1x8; the side-by-side ratios per round."""
  results, args = data["step_seconds"], data["args"]
  legacy = (
    f"python -m benchmarks.multihost.bench --rounds {args['rounds']} --steps {args['steps']} "
    f"--skip {args['skip']} --per_worker_batch {args['per_worker_batch']}"
  )
  base = statistics.median(results["1x8"])
  rows = [
    (
      name,
      f"{LAYOUTS[name][0]} x {LAYOUTS[name][1]}",
      LAYOUTS[name][2],
      harness.mean_std([1e3 * t for t in results[name]], ".1f"),
      f"{1e3 * statistics.median(results[name]):.1f}",
      f"{statistics.median(results[name]) / base:.2f}",
    )
    for name in LAYOUTS
  ]
  ratios = [m / s for m, s in zip(results["2x4"], results["1x8"], strict=True)]
  table = harness.markdown_table(
    ("layout", "processes x devices", "S", "ms / update (mean ± std)", "median", "/ 1x8"), rows
  )
  return (
    f"{table}\n\n2x4 / 1x8 per round (side by side): "
    + ", ".join(f"{r:.2f}" for r in ratios)
    + f"; median {statistics.median(ratios):.2f}.\n\nCommand: `{_command(data, legacy)}`."
  )


def bench_report(setup: Bench, out: Path) -> driver.Report:
  """``table.md`` from ``summary.json``."""
  del setup
  text = bench_table(json.loads((out / "summary.json").read_text()))
  return driver.Report(text, {"table.md": text + "\n"})


def allreduce_table(data: dict[str, Any]) -> str:
  """Per layout, the milliseconds per all-reduce of each message layout and their ratio."""
  results, args = data["ms"], data["args"]
  legacy = (
    f"python -m benchmarks.multihost.allreduce --rounds {args['rounds']} "
    f"--repeats {args['repeats']}"
  )
  median = {k: {m: statistics.median(v) for m, v in r.items()} for k, r in results.items()}
  rows = [
    (
      name,
      *(harness.mean_std(results[name][m], ".2f") for m in ("per_leaf", "packed")),
      f"{median[name]['per_leaf'] / median[name]['packed']:.1f}",
    )
    for name in results
  ]
  return (
    harness.markdown_table(("layout", "per leaf (ms)", "packed (ms)", "per leaf / packed"), rows)
    + f"\n\nCommand: `{_command(data, legacy)}`.\n"
  )


def allreduce_report(setup: Allreduce, out: Path) -> driver.Report:
  """``allreduce.md`` from ``allreduce.json``."""
  del setup
  text = allreduce_table(json.loads((out / "allreduce.json").read_text()))
  return driver.Report(text, {"allreduce.md": text})
