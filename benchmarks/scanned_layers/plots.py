"""The scanned-layers study's plots: final test accuracy by method at each S with the paired
differences and their intervals, the validation curves, and the logging reruns' gain ratios by
block against the stack's."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks.paired_intervals import paired
from benchmarks.scanned_layers.comparisons import Comparison, Runs, endpoint, finals, slice_rows
from benchmarks.scanned_layers.grid import LOG_METHODS, METHODS, Setup
from examples import analysis

COLORS = dict(zip(METHODS, ("C0", "C1", "C2", "C3", "C4"), strict=True))

# ----------------------------------------------------------------------------------------------


def test_accuracy(setup: Setup, runs: Runs, comparisons_: list[Comparison], path: Path) -> None:
  """Top: final test accuracy by method at each S, the seeds' points, their mean and its 95%
  interval. Bottom: per slice minus each other arm, paired by seed, with the 95% intervals."""
  plt = analysis.pyplot()
  n = len(setup.scales)
  fig, axes = plt.subplots(2, n, figsize=(6.5 * n, 8.5), squeeze=False)
  for col, s in enumerate(setup.scales):
    top, bottom = axes[0][col], axes[1][col]
    for i, method in enumerate(setup.methods):
      values = list(endpoint(runs, method, s, "test_accuracy").values())
      if not values:
        continue
      color = COLORS[method]
      top.scatter([i] * len(values), values, color=color, alpha=0.5, s=16)
      mean = paired(values, [0.0] * len(values))  # the mean's interval, the paired helper's
      half = 0.0 if mean.n < 2 else mean.high - mean.mean
      top.errorbar([i + 0.15], [mean.mean], yerr=[[half], [half]], fmt="s", color=color, capsize=4)
    top.set_xticks(range(len(setup.methods)))
    top.set_xticklabels([METHODS[m].label for m in setup.methods], rotation=25, ha="right")
    top.set(
      ylabel="final test accuracy", title=f"S = {s}: the seeds, their mean and its 95% interval"
    )
    top.grid(alpha=0.3, axis="y")
    mine = [
      (c.b, c.paired)
      for c in comparisons_
      if c.scale == s and c.key == "test_accuracy" and c.paired is not None
    ]
    for i, (b, p) in enumerate(mine):
      half = 0.0 if p.n < 2 else p.high - p.mean
      xerr = [[100 * half], [100 * half]]
      bottom.errorbar([100 * p.mean], [i], xerr=xerr, fmt="o", capsize=4, color=COLORS[b])
    bottom.axvline(0.0, color="k", lw=1)
    bottom.set_yticks(range(len(mine)))
    bottom.set_yticklabels([f"- {METHODS[b].label}" for b, _ in mine])
    bottom.invert_yaxis()
    seeds = max((p.n for _, p in mine), default=0)
    bottom.set(
      xlabel="test accuracy difference (points)",
      title=f"S = {s}: per slice minus each, by seed ({seeds} seeds)",
    )
    bottom.grid(alpha=0.3, axis="x")
  analysis.save_figure(fig, path)


def curves(setup: Setup, runs: Runs, path: Path) -> None:
  """Validation accuracy per evaluation (about once an epoch): the reported seeds' mean and
  range, per method at each S."""
  plt = analysis.pyplot()
  n = len(setup.scales)
  fig, axes = plt.subplots(1, n, figsize=(6 * n, 4.5), squeeze=False)
  for ax, s in zip(axes[0], setup.scales, strict=True):
    for method in setup.methods:
      curves = [r["curve"] for r in finals(runs, method, s).values()]
      if not curves:
        continue
      epochs = [point[1] for point in curves[0]]
      accs = list(zip(*([point[2] for point in c] for c in curves), strict=True))
      color = COLORS[method]
      ax.plot(epochs, [statistics.mean(a) for a in accs], color=color, label=METHODS[method].label)
      ax.fill_between(
        epochs, [min(a) for a in accs], [max(a) for a in accs], color=color, alpha=0.2
      )
    ax.set(xlabel="epoch", ylabel="validation accuracy", title=f"S = {s}: mean and range of seeds")
    ax.grid(alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=8)
  analysis.save_figure(fig, path)


def gain_ratios(setup: Setup, records: dict[str, list[dict[str, Any]]], path: Path) -> None:
  """The logging reruns: each stacked leaf's per-slice gain ratios against the update, beside
  the stack's one ratio."""
  per_slice, per_stack = (records[m] for m in LOG_METHODS)
  leaves = [r.leaf for r in slice_rows(setup, records)]
  cols = 4
  rows = -(-len(leaves) // cols)
  plt = analysis.pyplot()
  fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.6 * rows), squeeze=False)
  for ax, leaf in zip(axes.flat, leaves, strict=False):
    steps = [r["iteration"] for r in per_slice]
    for b in range(setup.depth):
      ax.plot(steps, [r["gain_ratio"][f"{leaf}/{b}"] for r in per_slice], lw=1, label=f"block {b}")
    stack_steps = [r["iteration"] for r in per_stack]
    ax.plot(stack_steps, [r["gain_ratio"][leaf] for r in per_stack], "k--", lw=1.2, label="stack")
    ax.set_title(leaf.removeprefix("blocks/").replace("MultiHeadDotProductAttention_0", "attn"))
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(leaves) :]:
    ax.axis("off")
  axes[0][0].legend(fontsize=6)
  fig.suptitle(f"gain ratio against the update, S = {setup.log_scale}, seed {setup.log_seed}")
  analysis.save_figure(fig, path, dpi=80)  # 16 panels: a smaller file


# ----------------------------------------------------------------------------------------------
# The report
