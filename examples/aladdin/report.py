"""What the ALADDIN program reports: the table, ``metrics.jsonl`` (``examples.metrics``
records), the plots (``examples.analysis``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def title(workers: int, slowdown: Mapping[int, float]) -> str:
  """``"4 workers, worker 0 x10"`` or ``"4 workers, homogeneous"``."""
  slow = ", ".join(f"worker {k} x{v:g}" for k, v in slowdown.items())
  return f"{workers} workers, " + (slow or "homogeneous")


def print_table(rows: Sequence[dict[str, Any]]) -> None:
  """The summary table, one row per algorithm."""
  head = (
    f"{'algorithm':<9} {'samples/s':>10} {'test acc':>8}  {'iterations per worker':<24} "
    f"{'wait % per worker':<24} {'compute % per worker':<24} {'merged':<18}"
  )
  print(head)
  print("-" * len(head))
  for r in rows:
    its = " ".join(str(i) for i in r["iterations"])
    waits = " ".join(f"{100 * w:.1f}" for w in r["wait_fraction"])
    computes = " ".join(f"{100 * c:.0f}" for c in r["compute_fraction"])
    merged = " ".join(str(m) for m in r["merges"])
    print(
      f"{r['algorithm']:<9} {r['throughput']:>10.0f} {r['test_accuracy']:>8.3f}  {its:<24} "
      f"{waits:<24} {computes:<24} {merged:<18}"
    )


def write_metrics(row: dict[str, Any], workdir: Path, batch_size: int) -> Path:
  """One ``"eval"`` record per evaluation of the global model, in ``workdir/metrics.jsonl``:
  ``iteration`` (all workers' iterations together), ``samples``, ``wall_time``,
  ``eval_accuracy``."""
  from examples import metrics

  workdir.mkdir(parents=True, exist_ok=True)
  writer = metrics.MetricsWriter(workdir, resume_step=0)
  for (seconds, accuracy), iterations in zip(row["curve"], row["curve_iterations"], strict=True):
    writer.write(
      {
        "type": "eval",
        "algorithm": row["algorithm"],
        "iteration": int(iterations),
        "samples": int(iterations) * batch_size,
        "wall_time": float(seconds),
        "eval_accuracy": float(accuracy),
      }
    )
  assert writer.path is not None  # a workdir was given
  return writer.path


def save_plots(rows: Sequence[dict[str, Any]], plot_dir: Path, plot_title: str) -> list[Path]:
  """Accuracy vs wall time per algorithm, and per-worker iterations; returns the PNG paths."""
  from examples import analysis

  plt = analysis.pyplot()
  plot_dir.mkdir(parents=True, exist_ok=True)
  fig, ax = plt.subplots(figsize=(6, 4))
  for r in rows:
    t, acc = zip(*r["curve"], strict=True)
    ax.plot(t, acc, marker=".", label=r["algorithm"])
  ax.set(xlabel="wall time (s)", ylabel="test accuracy", title=plot_title)
  ax.grid(alpha=0.3)
  ax.legend()
  paths = [analysis.save_figure(fig, plot_dir / "accuracy_vs_time.png")]

  fig, ax = plt.subplots(figsize=(6, 4))
  width = 0.8 / max(len(rows), 1)
  for k, r in enumerate(rows):
    x = np.arange(len(r["iterations"])) + k * width
    ax.bar(x, r["iterations"], width=width, label=r["algorithm"])
  ax.set(xlabel="worker", ylabel="iterations", title=plot_title)
  ax.legend()
  paths.append(analysis.save_figure(fig, plot_dir / "iterations.png"))
  return paths
