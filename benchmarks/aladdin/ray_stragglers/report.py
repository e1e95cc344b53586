"""The stragglers benchmark's table and plots, from ``results/<setup>.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import driver, harness
from benchmarks.aladdin.ray_stragglers.grid import CLUSTERS, Stragglers
from examples import analysis


def table(results: dict[str, Any]) -> str:
  """Markdown table: throughput relative to the algorithm's HO run, waits, accuracy."""
  runs = results["runs"]
  rows = []
  for key, r in runs.items():
    cluster, algorithm = key.split("/")
    ho = runs.get(f"HO/{algorithm}")
    rel = f"{r['throughput'] / ho['throughput']:.2f}" if ho else "-"
    waits = " ".join(f"{100 * w:.1f}" for w in r["wait_fraction"])
    its = " ".join(str(i) for i in r["iterations"])
    rows.append([cluster, algorithm, f"{r['throughput']:.0f}", rel, f"{r['test_accuracy']:.3f}"])
    rows[-1] += [its, waits]
  header = ["cluster", "algorithm", "samples/s", "relative to its HO", "test acc"]
  return harness.markdown_table([*header, "iterations per worker", "wait % per worker"], rows)


def plot(results: dict[str, Any], out: Path) -> None:
  """Accuracy vs wall time per cluster, and relative throughput bars, next to ``out``."""
  plt = analysis.pyplot()
  runs = results["runs"]
  clusters = sorted({k.split("/")[0] for k in runs}, key=list(CLUSTERS).index)
  algorithms = sorted({k.split("/")[1] for k in runs})
  fig, axes = plt.subplots(1, len(clusters), figsize=(4.5 * len(clusters), 3.6), sharey=True)
  for ax, cluster in zip(list(axes) if len(clusters) > 1 else [axes], clusters, strict=True):
    for algorithm in algorithms:
      r = runs.get(f"{cluster}/{algorithm}")
      if r:
        t, acc = zip(*r["curve"], strict=True)
        ax.plot(t, acc, marker=".", label=algorithm)
    ax.set(title=cluster, xlabel="wall time (s)")
    ax.grid(alpha=0.3)
  (axes[0] if len(clusters) > 1 else axes).set_ylabel("test accuracy")
  (axes[0] if len(clusters) > 1 else axes).legend()
  analysis.save_figure(fig, out.with_name(f"{out.stem}_accuracy.png"))

  fig, ax = plt.subplots(figsize=(6, 3.6))
  width = 0.8 / len(algorithms)
  for k, algorithm in enumerate(algorithms):
    ho = runs.get(f"HO/{algorithm}")
    rel = [
      runs[f"{c}/{algorithm}"]["throughput"] / ho["throughput"]
      if ho and f"{c}/{algorithm}" in runs
      else 0
      for c in clusters
    ]
    ax.bar([i + k * width for i in range(len(clusters))], rel, width=width, label=algorithm)
  ax.set_xticks([i + width * (len(algorithms) - 1) / 2 for i in range(len(clusters))], clusters)
  ax.set(ylabel="throughput / own HO throughput")
  ax.axhline(0.8, color="gray", ls="--", lw=0.8)
  ax.legend()
  analysis.save_figure(fig, out.with_name(f"{out.stem}_throughput.png"))


def report(name: str, setup: Stragglers, out: Path) -> driver.Report:
  """The table of ``out/<name>.json`` (RESULTS.md carries its rows) and its two plots."""
  del setup
  path = out / f"{name}.json"
  results = json.loads(path.read_text())
  plot(results, path)
  return driver.Report(table(results), {})
