"""Targets, iterations-to-target and the plots shared by the demo, the studies and the notebook.

Everything reads the trainer's evaluation records (``metrics.read_metrics``): dicts with
``iteration``, ``epoch``, ``wall_time`` and ``eval_accuracy``, plus per-layer dicts such as
``warmup_end_step`` for optimizers that report diagnostics. matplotlib is an ``examples`` extra
and is imported only by the plotting functions.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Record = dict[str, Any]

# Fractions of the single-worker run's final accuracy that count as "reached it": the first is
# the headline target, the second shows how fast the methods get close when none reaches it.
TARGET_FRACTIONS = (0.98, 0.90)


def targets(baseline_accuracy: float, fractions: Sequence[float] = TARGET_FRACTIONS) -> list[float]:
  """The accuracies ``fractions x baseline_accuracy``."""
  return [f * baseline_accuracy for f in fractions]


def first_reaching(records: Sequence[Record], target: float) -> Record | None:
  """The first evaluation record whose accuracy reaches ``target`` (None: never)."""
  for r in records:
    if r["eval_accuracy"] >= target:
      return r
  return None


def iterations_to_target(records: Sequence[Record], target: float) -> int | None:
  """The first evaluated iteration whose accuracy reaches ``target`` (None: never)."""
  r = first_reaching(records, target)
  return None if r is None else int(r["iteration"])


def layer_series(records: Sequence[Record], key: str) -> dict[str, tuple[list, list]]:
  """Per layer, ``(iterations, values)`` of a per-layer diagnostic such as ``lr_multiplier``."""
  series: dict[str, tuple[list, list]] = {}
  for r in records:
    for layer, value in r.get(key, {}).items():
      xs, ys = series.setdefault(layer, ([], []))
      xs.append(r["iteration"])
      ys.append(value)
  return series


# ----------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------


def pyplot() -> Any:
  """``matplotlib.pyplot``, on the file-only Agg backend unless one was chosen (notebooks)."""
  import matplotlib

  if "matplotlib.pyplot" not in sys.modules:
    matplotlib.use("Agg")  # scripts write files: no display needed
  import matplotlib.pyplot as plt

  return plt


def save_figure(fig: Any, path: Path, dpi: int = 120) -> Path:
  """Writes ``fig`` to ``path`` as PNG, closes it (figures pile up in long studies) and
  returns the path."""
  fig.tight_layout()
  fig.savefig(path, dpi=dpi)
  pyplot().close(fig)
  return path


def plot_accuracy(
  curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
  hlines: Sequence[tuple[float, str]] = (),
  *,
  title: str,
  xlabel: str = "iterations (updates)",
  ylabel: str = "test accuracy",
  colors: Mapping[str, str] | None = None,
) -> Any:
  """Accuracy against iterations (log scale) with target lines.

  Args:
    curves: label -> (iterations, accuracies).
    hlines: (accuracy, label) horizontal lines, e.g. the targets.
    title: the axes title.
    xlabel: x axis label.
    ylabel: y axis label.
    colors: optional fixed colours per label.

  Returns:
    The figure.
  """
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for label, (xs, ys) in curves.items():
    ax.plot(xs, ys, label=label, color=(colors or {}).get(label))
  for (value, label), ls in zip(hlines, (":", "-.", "--", ":"), strict=False):
    ax.axhline(value, color="gray", ls=ls, lw=1, label=label)
  ax.set(xscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  return fig


def plot_accuracy_vs_scale(
  series: Mapping[str, Sequence[tuple[int, Sequence[float]]]],
  baseline: tuple[float, str] | None,
  *,
  num_epochs: int,
  title: str,
  legend_size: int = 8,
) -> Any:
  """Final accuracy against the global batch, mean ± std over seeds, one line per method.

  Args:
    series: label -> ``[(global batch, [final accuracy of each seed]), ...]``; points without
      runs are skipped.
    baseline: ``(accuracy, label)`` of a dashed horizontal line (the single worker), or None.
    num_epochs: the epoch budget, for the y label.
    title: figure title.
    legend_size: legend font size.

  Returns:
    The figure (save it with :func:`save_figure`).
  """
  fig, ax = pyplot().subplots(figsize=(7, 4.5))
  for name, points in series.items():
    done = [(batch, accs) for batch, accs in points if accs]
    if done:
      ax.errorbar(
        [batch for batch, _ in done],
        [statistics.mean(accs) for _, accs in done],
        yerr=[statistics.stdev(accs) if len(accs) > 1 else 0.0 for _, accs in done],
        marker="o",
        capsize=3,
        label=name,
      )
  if baseline is not None:
    ax.axhline(baseline[0], color="k", ls="--", label=baseline[1])
  ax.set(
    xscale="log",
    xlabel="global batch",
    ylabel=f"test accuracy @ {num_epochs} epochs",
    title=title,
  )
  ax.grid(alpha=0.3)
  ax.legend(fontsize=legend_size)
  return fig


def plot_lr_multipliers(
  records: Sequence[Record],
  num_samples: int,
  global_ratio: tuple[Sequence[float], Sequence[float]] | None = None,
  *,
  title: str,
) -> Any:
  """LENA's per-layer rate multipliers over training, AdaScale's single one dashed.

  Args:
    records: records with ``lr_multiplier`` (per layer).
    num_samples: S, LSW's multiplier after its warm-up (a dotted line).
    global_ratio: AdaScale's (iterations, ratios), or None.
    title: the axes title.

  Returns:
    The figure.
  """
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for layer, (xs, ys) in sorted(layer_series(records, "lr_multiplier").items()):
    ax.plot(xs, ys, lw=1.2, label=layer)
  if global_ratio is not None:
    ax.plot(*global_ratio, "k--", lw=1, label="AdaScale (all layers)")
  ax.axhline(num_samples, color="gray", ls=":", lw=1, label=f"LSW after warm-up (S={num_samples})")
  ax.set(xlabel="iteration", ylabel="rate multiplier r_k x warm-up factor", title=title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  return fig


def plot_warmup_ends(
  runs: Mapping[str, tuple[Mapping[str, int], int]],
  *,
  fraction: bool,
  fixed_end: float | None = None,
  fixed_label: str = "LSW fixed warm-up end",
) -> Any:
  """Per layer, when LENA's state-aware warm-up ended (the paper's Figure 7).

  Args:
    runs: label -> (``warmup_end_step`` of the last record: layer -> iteration, -1 = never;
      the run's iterations). Several runs are drawn as grouped bars.
    fraction: plot the end as a fraction of the run (runs of different lengths share an
      axis); else in iterations.
    fixed_end: where a fixed warm-up would end (same unit), a dashed line; None: none.
    fixed_label: that line's label.

  Returns:
    The figure.
  """
  plt = pyplot()
  layers = list(next(iter(runs.values()))[0]) if runs else []
  fig, ax = plt.subplots(figsize=(7, 0.35 * len(layers) * max(1, len(runs)) ** 0.5 + 2))
  height = 0.8 / max(1, len(runs))
  for j, (label, (ends, total)) in enumerate(runs.items()):
    scale = total if fraction else 1
    values = [(ends[k] if ends[k] >= 0 else total) / scale for k in layers]
    # A single run: unfinished layers in gray; several: one colour per run.
    colors = (
      None if len(runs) > 1 else ["tab:blue" if ends[k] >= 0 else "lightgray" for k in layers]
    )
    ax.barh(
      [i + j * height for i in range(len(layers))], values, height=height, color=colors, label=label
    )
  if fixed_end is not None:
    ax.axvline(fixed_end, color="tab:red", ls="--", label=fixed_label)
  ax.set_yticks([i + 0.4 - height / 2 for i in range(len(layers))], layers, fontsize=7)
  ax.invert_yaxis()
  unit = "fraction of the run" if fraction else "iteration"
  ax.set(
    xlabel=f"{unit} at which the layer's warm-up ended ({'1' if fraction else 'gray'} = not ended)",
    title="LENA state-aware warm-up: per-layer end (cf. paper Fig. 7)",
  )
  ax.grid(alpha=0.3, axis="x")
  ax.legend(fontsize=8)
  return fig
