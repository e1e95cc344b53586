"""The overhead benchmark's reports: overhead.md, .json and .png, and PASS/FAIL lines."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.overhead.common import TARGETS, Row, log
from examples import analysis

# ----------------------------------------------------------------------------------------------
# Report.


def summary_targets(rows: list[Row], memory: list[dict], compile_rows: list[dict]):
  """(target id, what, limit, list of (label, value, passed))."""
  out = []
  for tid, (what, limit) in TARGETS.items():
    checks = [(f"{r.section} / {r.tree}", r.ratio, r.passed) for r in rows if r.target == tid]
    if tid == "memory":
      checks = [
        (f"{m['tree']} / {m['optimizer']}", m["extra_bytes_per_leaf"], m["passed"])
        for m in memory
        if "passed" in m
      ]
    if tid == "compile":
      checks = [
        (f"{c['leaves']} leaves", c["ratio"], c["passed"]) for c in compile_rows if "passed" in c
      ]
    out.append((tid, what, limit, checks))
  return out


def load_line(meta: dict) -> str:
  """The machine's load average around the run (older records have none)."""
  if "load_average_before" not in meta:
    return "Load average: not recorded"
  return (
    f"Load average (1, 5, 15 min): {meta['load_average_before']} before, "
    f"{meta['load_average_after']} after"
  )


def write_markdown(
  path: str, meta: dict, rows: list[Row], memory: list[dict], compile_rows: list[dict]
) -> None:
  lines = [
    "# LENA overhead benchmark",
    "",
    f"Command: `{meta['command']}`  ",
    f"Machine: {meta['machine']['cpu']}, "
    f"{meta['machine']['cpu_cores']} cores; {meta['machine']['devices']}; jax "
    f"{meta['machine']['jax']}, optax {meta['machine']['optax']}  ",
    f"Repeats: {meta['repeats']}, interleaved (ratios of medians); total {meta['seconds']:.0f} s  ",
    load_line(meta),
    "",
    "## Targets",
    "",
    "| target | limit | measured | verdict |",
    "|---|---|---|---|",
  ]
  for _, what, limit, checks in summary_targets(rows, memory, compile_rows):
    for label, value, passed in checks:
      unit = " B/leaf" if "B per leaf" in what else "x"
      lines.append(
        f"| {what} ({label}) | {limit:g}{unit} | {value:.3f}{unit} | "
        f"{'PASS' if passed else 'FAIL'} |"
      )
  lines += [
    "",
    "## Time ratios",
    "",
    "| section | tree / model | candidate | baseline | candidate ms | baseline ms | ratio |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r.section} | {r.tree} | {r.candidate} | {r.baseline} | "
      f"{r.candidate_ms:.2f} | {r.baseline_ms:.2f} | **{r.ratio:.3f}** |"
    )
  lines += [
    "",
    "## Optimizer-state memory",
    "",
    "| tree | leaves | params | optimizer | state MiB | SGD-momentum MiB | extra bytes | "
    "extra B/leaf |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for m in memory:
    lines.append(
      f"| {m['tree']} | {m['leaves']} | {m['params']:,} | {m['optimizer']} | "
      f"{m['bytes'] / 2**20:.2f} | {m['sgd_momentum_bytes'] / 2**20:.2f} | "
      f"{m['extra_bytes']:,} | {m['extra_bytes_per_leaf']:.1f} |"
    )
  lines += [
    "",
    "## Compile time of the update step",
    "",
    "| leaves | params | lena s | SGD-momentum s | ratio | lena kernels (distinct) | "
    "SGD-momentum kernels (distinct) |",
    "|---|---|---|---|---|---|---|",
  ]
  for c in compile_rows:
    lines.append(
      f"| {c['leaves']} | {c['params']:,} | {c['lena_s']:.2f} | "
      f"{c['sgd_momentum_s']:.2f} | **{c['ratio']:.2f}** | "
      f"{c['lena_kernels']} ({c['lena_distinct_kernels']}) | "
      f"{c['sgd_momentum_kernels']} ({c['sgd_momentum_distinct_kernels']}) |"
    )
  harness.write_text(path, "\n".join(lines) + "\n")


def write_plot(path: str, rows: list[Row], compile_rows: list[dict]) -> None:
  plt = analysis.pyplot()
  fig, (ax1, ax2) = plt.subplots(
    1, 2, figsize=(15, 0.32 * max(len(rows), 8) + 1.5), gridspec_kw={"width_ratios": [2.2, 1]}
  )
  labels = [f"{r.section} | {r.tree} | {r.candidate} / {r.baseline}" for r in rows]
  colors = [
    "tab:gray" if r.passed is None else ("tab:green" if r.passed else "tab:red") for r in rows
  ]
  ypos = np.arange(len(rows))
  ax1.barh(ypos, [r.ratio for r in rows], color=colors)
  for y, r in zip(ypos, rows, strict=True):
    if r.target is not None:
      ax1.plot([TARGETS[r.target][1]] * 2, [y - 0.4, y + 0.4], color="black", lw=2)
  ax1.axvline(1.0, color="black", lw=0.5)
  ax1.set_yticks(ypos, labels, fontsize=7)
  ax1.invert_yaxis()
  ax1.set_xlabel("time ratio candidate / baseline (black tick: target)")
  ax1.set_title("Runtime overhead (green: meets target, red: misses)")
  if compile_rows:
    leaves = [c["leaves"] for c in compile_rows]
    ax2.plot(leaves, [c["lena_s"] for c in compile_rows], "o-", label="lena")
    ax2.plot(leaves, [c["sgd_momentum_s"] for c in compile_rows], "s-", label="SGD-momentum")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("parameter leaves")
    ax2.set_ylabel("compile seconds")
    ax2.legend()
    ax2.set_title("Compile time of the update step")
  analysis.save_figure(fig, Path(path), dpi=110)


def write_reports(
  out_dir: str, meta: dict[str, Any], rows: list[Row], memory: list[dict], compile_rows: list[dict]
) -> dict[str, Any]:
  """Writes overhead.md, overhead.json and overhead.png and prints PASS/FAIL per target."""
  os.makedirs(out_dir, exist_ok=True)
  write_markdown(os.path.join(out_dir, "overhead.md"), meta, rows, memory, compile_rows)
  targets = summary_targets(rows, memory, compile_rows)
  result = {
    **meta,
    "rows": [dataclasses.asdict(r) | {"passed": r.passed} for r in rows],
    "memory": memory,
    "compile": compile_rows,
    "targets": [
      {
        "id": tid,
        "what": what,
        "limit": limit,
        "checks": [{"label": lb, "value": v, "passed": p} for lb, v, p in checks],
      }
      for tid, what, limit, checks in targets
    ],
  }
  harness.write_json(os.path.join(out_dir, "overhead.json"), result)
  write_plot(os.path.join(out_dir, "overhead.png"), rows, compile_rows)
  log("\nTargets:")
  for _, what, limit, checks in targets:
    for label, value, passed in checks:
      log(f"  {'PASS' if passed else 'FAIL'}  {what} [{label}]: {value:.3f} (limit {limit:g})")
  log(f"\nWrote {out_dir}/overhead.md, overhead.json, overhead.png ({meta['seconds']:.0f} s)")
  return result
