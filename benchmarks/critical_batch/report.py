"""The critical-batch tables and plots, one per measurement, from its JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import driver, harness
from benchmarks.critical_batch.grid import Measurements
from examples import analysis


def _fmt(x: float) -> str:
  return "n/a" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:.3g}")


def within_2x(estimate: float, measured: float) -> str:
  if not (math.isfinite(estimate) and math.isfinite(measured) and measured > 0 and estimate > 0):
    return "n/a"
  return "yes" if 0.5 <= estimate / measured <= 2.0 else "no"


def table(result: dict[str, Any]) -> str:
  """The Markdown table of a :func:`measure` result."""
  scales = result["setup"]["scales"]
  header = [
    "update",
    "loss",
    *[f"updates S={s}" for s in scales],
    "S_min",
    "E_min",
    "B_crit (fit)",
    "B_crit (Zhang 20%)",
    "estimate (state)",
    "B_simple fresh",
    "state within 2x: fit / Zhang",
    "fresh within 2x: fit / Zhang",
  ]
  rows = [
    [
      r["checkpoint"],
      f"{r['train_loss']:.3f}",
      *[_fmt(u) for u in r["updates"]],
      _fmt(r["s_min"]),
      _fmt(r["e_min"]),
      _fmt(r["b_crit"]),
      _fmt(r["zhang"]),
      _fmt(r["estimate"]),
      _fmt(r["estimate_fresh"]),
      f"{within_2x(r['estimate'], r['b_crit'])} / {within_2x(r['estimate'], r['zhang'])}",
      f"{within_2x(r['estimate_fresh'], r['b_crit'])} / "
      f"{within_2x(r['estimate_fresh'], r['zhang'])}",
    ]
    for r in result["rows"]
  ]
  return harness.markdown_table(header, rows)


def plot(result: dict[str, Any], path: Path) -> Path:
  """Updates against S per checkpoint, the fitted curves and the estimates (PNG)."""
  scales = np.asarray(result["setup"]["scales"], np.float64)
  fig, ax = analysis.pyplot().subplots(figsize=(7, 4.5))
  grid = np.geomspace(scales[0], scales[-1], 100)
  for i, r in enumerate(result["rows"]):
    color = f"C{i}"
    ax.loglog(scales, r["updates"], "o", color=color, label=f"update {r['checkpoint']}")
    if math.isfinite(r["s_min"]):
      ax.loglog(grid, r["s_min"] + r["e_min"] / grid, "-", color=color, alpha=0.6)
    for key, style in (("b_crit", "-"), ("estimate", "--"), ("estimate_fresh", ":")):
      if math.isfinite(r[key]) and scales[0] / 4 < r[key] < scales[-1] * 4:
        ax.axvline(r[key], color=color, linestyle=style, alpha=0.5)
  ax.set_xlabel("S (per-worker batches per update)")
  ax.set_ylabel(f"updates to a {result['setup']['decrease']:.0%} lower training loss")
  ax.set_title("Critical batch: fit (solid), state estimate (dashed), fresh B_simple (dotted)")
  ax.legend(fontsize=8)
  path.parent.mkdir(parents=True, exist_ok=True)
  return analysis.save_figure(fig, path, dpi=110)


def report(setup: Measurements, out: Path) -> driver.Report:
  """``table_<name>.md`` and the plot of every measurement of the setup that has run."""
  files, texts = {}, []
  for m in setup.measurements:
    path = out / f"{m.name}.json"
    if path.exists():
      result = json.loads(path.read_text())
      name = m.name.removeprefix("critical_batch_")
      files[f"table_{name}.md"] = table(result) + "\n"
      texts.append(f"{name}:\n\n{table(result)}")
      plot(result, path.with_suffix(".png"))
  return driver.Report("\n\n".join(texts), files)
