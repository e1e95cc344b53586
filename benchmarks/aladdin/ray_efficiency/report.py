"""The efficiency benchmark's table and plot, from ``efficiency.json``."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks import driver, harness
from benchmarks.aladdin.ray_efficiency.grid import Efficiency
from examples import analysis

TARGETS = {128: 0.8, 32: 0.6}  # ALADDIN.md, "Runtime efficiency"


def _vs_waiting(pair: dict[str, Any]) -> float:
  """The efficiency against a loop on one core that waits for each step (the limit of earlier
  runs, before the loops overlapped their Python with XLA)."""
  return pair["ray"] / pair["loop_one_core_waiting"]


def table(results: dict[str, Any]) -> str:
  """Markdown: the median and range of every ratio."""

  def stat(values: list[float], fmt: str = ".2f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

  rows = []
  for s in results["single"]:
    p = s["pairs"]
    loop_cpu = [x["loop_cpu_per_iteration"] for x in p]
    rows.append([
      s["batch_size"],
      stat([x["efficiency"] for x in p]),
      stat([x["ray"] / x["loop_default_pool"] for x in p]),
      stat([_vs_waiting(x) for x in p]),
      stat([x["compute_fraction"] for x in p]),
      stat([x["worker_cpu_per_iteration"] / c for x, c in zip(p, loop_cpu, strict=True)]),
      stat([x["shard_cpu_per_iteration"] / c for x, c in zip(p, loop_cpu, strict=True)]),
      stat([x["messages_per_call"] for x in p], ".1f"),
      stat([x["load_average"] for x in p], ".1f"),
    ])  # fmt: skip
  header = ["batch", "efficiency", "vs default-pool loop", "vs a loop waiting for each step"]
  header += ["compute fraction"]
  header += ["worker CPU / loop CPU"]
  header += ["shard CPU / loop CPU", "messages per call", "load average"]
  text = harness.markdown_table(header, rows)
  if "cluster" in results:
    cluster_rows = [
      [
        f"{label} (nice {r['nice'][0]})",
        f"{r['throughput']:.0f}",
        f"{100 * max(r['wait_fraction']):.1f}",
        " ".join(f"{100 * c:.0f}" for c in r["compute_fraction"]),
      ]
      for label, runs in results["cluster"]["runs"].items()
      for r in runs
    ]
    header = ["4 workers", "samples/s", "max wait % of a worker", "compute % per worker"]
    text += "\n\n" + harness.markdown_table(header, cluster_rows)
  return text


def plot(results: dict[str, Any], path: Path) -> None:
  """Every pair's efficiency against the limit and against a loop waiting for each step."""
  fig, ax = analysis.pyplot().subplots(figsize=(5.5, 3.6))
  for k, s in enumerate(results["single"]):
    p = s["pairs"]
    waiting = [_vs_waiting(x) for x in p]
    strict = [x["efficiency"] for x in p]
    for offset, values, label, marker in (
      (-0.1, strict, "vs the limit (fastest of 4 loops)", "o"),
      (0.1, waiting, "vs a loop waiting for each step", "^"),
    ):
      ax.scatter(
        [k + offset] * len(values),
        values,
        marker=marker,
        label=label if k == 0 else None,
        color="C0" if marker == "o" else "C1",
      )
    target = TARGETS.get(s["batch_size"])
    if target is not None:
      ax.hlines(
        target, k - 0.3, k + 0.3, colors="k", linestyles="--", label="target" if k == 0 else None
      )
  ax.set_xticks(
    range(len(results["single"])), [f"batch {s['batch_size']}" for s in results["single"]]
  )
  ax.set(ylabel="efficiency (one worker on Ray / loop)", ylim=(0, 1.1))
  ax.grid(alpha=0.3, axis="y")
  ax.legend(fontsize=8, loc="lower right")
  analysis.save_figure(fig, path)


def report(setup: Efficiency, out: Path) -> driver.Report:
  """The table (RESULTS.md carries it) and ``efficiency.png``."""
  del setup
  results = json.loads((out / "efficiency.json").read_text())
  plot(results, out / "efficiency.png")
  return driver.Report(table(results), {})
