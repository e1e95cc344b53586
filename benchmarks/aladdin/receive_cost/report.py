"""The receive-cost benchmark's tables and plot, from ``receive_cost.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import driver, harness
from benchmarks.aladdin.receive_cost.grid import ReceiveCost
from examples import analysis


def table(trees: list[dict[str, Any]]) -> str:
  """One markdown table per tree: ratios to the ``optax.sgd`` step, best and median."""
  parts = []
  for tree in trees:
    header = [
      f"{tree['tree']} ({tree['params'] / 1e6:.1f} M params, {tree['leaves']} leaves)",
      "best",
      "median",
      "best ms",
    ]
    body = [
      [r["what"].strip(), f"{r['best']:.2f}x", f"{r['median']:.2f}x", f"{r['best_s'] * 1e3:.3f}"]
      for r in tree["rows"]
    ]
    parts.append(harness.markdown_table(header, body))
  return "\n\n".join(parts)


def plot(trees: list[dict[str, Any]], path: Path) -> None:
  """Each candidate's time per message over the sgd step's, best and median, per tree."""
  fig, axes = analysis.pyplot().subplots(1, len(trees), figsize=(6 * len(trees), 4.5), sharey=True)
  for ax, tree in zip(np.atleast_1d(axes), trees, strict=True):
    names = [r["what"].strip() for r in tree["rows"]]
    y = np.arange(len(names))
    ax.barh(y - 0.2, [r["best"] for r in tree["rows"]], 0.4, label="best")
    ax.barh(y + 0.2, [r["median"] for r in tree["rows"]], 0.4, label="median")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(y, names, fontsize=7)
    ax.set_xlabel("time per message / one optax.sgd step")
    ax.set_title(tree["tree"], fontsize=9)
    ax.legend(fontsize=8)
  np.atleast_1d(axes)[0].invert_yaxis()  # the y axis is shared: once for both
  analysis.save_figure(fig, path)


def report(setup: ReceiveCost, out: Path) -> driver.Report:
  """The tables (RESULTS.md carries them) and ``receive_cost.png``."""
  del setup
  trees = json.loads((out / "receive_cost.json").read_text())["trees"]
  plot(trees, out / "receive_cost.png")
  return driver.Report(table(trees), {})
