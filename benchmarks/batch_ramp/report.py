"""The report of the batch-ramp study: per-arm tables, paired comparisons with ``small``, the
goal's verdicts and the plots, all from a ``summary.json`` (and the pilot's record)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks import driver, harness
from benchmarks.batch_ramp.grid import ARMS, Setup
from benchmarks.paired_intervals import Paired, paired_by_seed
from examples import analysis


def steady_seconds_per_sample(run: dict[str, Any]) -> float:
  """The median over epochs (but the first) of the wall time per example: without the
  compilations, which fall in the first epoch and in the epochs where a ramp meets a new S."""
  c = run["evals"]
  return statistics.median(
    (c[i][4] - c[i - 1][4]) / (c[i][1] - c[i - 1][1]) for i in range(1, len(c))
  )


def by_seed(result: dict[str, Any], arm: str, key: str) -> dict[int, float]:
  """seed -> ``key`` of the arm's runs (those where it is not None); the key
  ``steady_seconds_per_sample`` is :func:`steady_seconds_per_sample`."""
  get = lambda r: steady_seconds_per_sample(r) if key == "steady_seconds_per_sample" else r[key]
  return {
    r["seed"]: get(r) for r in result["runs"].values() if r["arm"] == arm and get(r) is not None
  }


def reduction(result: dict[str, Any], arm: str, key: str) -> dict[int, float]:
  """seed -> ``1 - arm / small`` of ``key`` (the fraction of the small batch's saved)."""
  a, b = by_seed(result, arm, key), by_seed(result, "small", key)
  return {s: 1.0 - a[s] / b[s] for s in sorted(set(a) & set(b))}


def comparisons(result: dict[str, Any]) -> dict[str, dict[str, Paired | None]]:
  """Per arm but ``small``, paired by seed: the test accuracy minus small's (and large's), the
  fraction of small's updates saved (in all, and to the target, over the seeds where both
  reached it) and the time per sample minus small's. None where no seed has both sides."""

  def pair(a: dict[int, float], b: dict[int, float] | None = None) -> Paired | None:
    b = {s: 0.0 for s in a} if b is None else b  # a fraction saved is already a difference
    return paired_by_seed(a, b) if set(a) & set(b) else None

  acc = lambda arm: by_seed(result, arm, "test_accuracy")
  per_sample = lambda arm, key="seconds_per_sample": by_seed(result, arm, key)
  steady = "steady_seconds_per_sample"
  return {
    arm: {
      "test_accuracy": pair(acc(arm), acc("small")),
      "vs_large": None if arm == "large" else pair(acc(arm), acc("large")),
      "updates_saved": pair(reduction(result, arm, "updates")),
      "target_updates_saved": pair(reduction(result, arm, "updates_to_target")),
      "seconds_per_sample": pair(per_sample(arm), per_sample("small")),
      steady: pair(per_sample(arm, steady), per_sample("small", steady)),
    }
    for arm in ARMS[1:]
  }


def _cell(p: Paired | None, digits: int, scale: float) -> str:
  return "—" if p is None else p.format(digits, scale)


def _goal(p: Paired | None, bound: float, scale: float) -> str:
  """Whether the interval (``yes``), only the mean (``mean only``) or neither is >= bound."""
  if p is None:
    return "no seed reached the target"
  if p.n > 1 and p.low >= bound:
    return "yes"
  return "mean only" if p.mean >= bound else f"no (mean {p.mean * scale:+.1f})"


def tables(result: dict[str, Any]) -> str:
  """The Markdown tables of a result: per arm, paired against small, and the goal."""
  setup, runs = result["setup"], list(result["runs"].values())
  seeds = sorted({r["seed"] for r in runs})
  header = [
    "arm",
    "batch_ramp",
    "S range",
    "updates",
    "final validation acc",
    "test acc",
    f"updates to {setup['target']:.2f} (validation)",
    "µs per sample",
    "µs per sample, median epoch",
  ]
  rows = []
  for arm in ARMS:
    mine = [r for r in runs if r["arm"] == arm]
    if not mine:
      continue
    sizes = [r["first_num_samples"] for r in mine] + [c[2] for r in mine for c in r["evals"]]
    hits = [r["updates_to_target"] for r in mine if r["updates_to_target"] is not None]
    rows.append(
      [
        arm,
        f"`{mine[0]['batch_ramp']}`",
        f"{min(sizes)}-{max(sizes)}" if min(sizes) != max(sizes) else str(sizes[0]),
        harness.mean_std([r["updates"] for r in mine], ".0f"),
        harness.mean_std([r["final_validation_accuracy"] for r in mine]),
        harness.mean_std([r["test_accuracy"] for r in mine]),
        harness.mean_std_reached(hits, len(mine)),
        harness.mean_std([1e6 * r["seconds_per_sample"] for r in mine], ".1f"),
        harness.mean_std([1e6 * steady_seconds_per_sample(r) for r in mine], ".1f"),
      ]
    )
  per_arm = harness.markdown_table(header, rows)
  comp = comparisons(result)
  paired_rows = [
    [
      arm,
      _cell(c["test_accuracy"], 2, 100),
      _cell(c["vs_large"], 2, 100),
      _cell(c["updates_saved"], 1, 100),
      _cell(c["target_updates_saved"], 1, 100),
      _cell(c["seconds_per_sample"], 2, 1e6),
      _cell(c["steady_seconds_per_sample"], 2, 1e6),
    ]
    for arm, c in comp.items()
  ]
  paired_table = harness.markdown_table(
    [
      "arm",
      "test acc - small (points)",
      "test acc - large (points)",
      "updates saved vs small (%)",
      "updates to target saved vs small (%)",
      "µs per sample - small",
      "µs per sample, median epoch - small",
    ],
    paired_rows,
  )
  goal_rows = [
    [
      arm,
      _goal(c["test_accuracy"], -0.01, 100),
      _goal(c["target_updates_saved"], 0.40, 100),
      _goal(c["updates_saved"], 0.40, 100),
      "—" if c["vs_large"] is None else c["vs_large"].verdict("yes", "no: behind large"),
    ]
    for arm, c in comp.items()
    if arm not in ("small", "large")
  ]
  goal_table = harness.markdown_table(
    [
      "ramp",
      "test acc >= small - 1 point",
      ">= 40% fewer updates to target",
      ">= 40% fewer updates in all",
      "test acc > large",
    ],
    goal_rows,
  )
  note = (
    f"Seeds {seeds}; differences paired by seed, mean [95% Student-t interval, n - 1 degrees of "
    "freedom]; 'yes' = the interval clears the bound, 'mean only' = the mean does."
  )
  return "\n\n".join([per_arm, paired_table, goal_table, note])


def mean_curves(result: dict[str, Any], arm: str) -> tuple[list[float], list[float], list[float]]:
  """Per evaluation (one per epoch, so the same examples in every seed): the mean update,
  epoch and validation accuracy over the arm's seeds."""
  mine = [r for r in result["runs"].values() if r["arm"] == arm]
  n = min(len(r["evals"]) for r in mine)
  mean = lambda i, k: sum(r["evals"][i][k] for r in mine) / len(mine)
  epochs = [mean(i, 1) / mine[0]["num_train"] for i in range(n)]
  return [mean(i, 0) for i in range(n)], epochs, [mean(i, 3) for i in range(n)]


def plots(result: dict[str, Any], out: Path) -> list[Path]:
  """Accuracy against updates, S against examples, and the paired differences (PNG)."""
  plt = analysis.pyplot()
  present = [a for a in ARMS if any(r["arm"] == a for r in result["runs"].values())]
  target = result["setup"]["target"]
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for arm in present:
    updates, _, acc = mean_curves(result, arm)
    ax.plot(updates, acc, marker=".", label=arm, color=f"C{ARMS.index(arm)}")
  ax.axhline(target, color="gray", ls=":", lw=1, label=f"target {target:.2f}")
  ax.set(xscale="log", xlabel="updates", ylabel="validation accuracy (mean over seeds)")
  ax.set(title="Equal examples: accuracy against updates")
  ax.set_ylim(max(0.0, target - 0.3), None)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  out.mkdir(parents=True, exist_ok=True)
  paths = [analysis.save_figure(fig, out / "accuracy_vs_updates.png", dpi=110)]

  fig, ax = plt.subplots(figsize=(7, 4.5))
  for arm in present:
    i = ARMS.index(arm)
    for j, r in enumerate(r for r in result["runs"].values() if r["arm"] == arm):
      epochs = [0.0] + [c[1] / r["num_train"] for c in r["evals"]]
      sizes = [r["first_num_samples"]] + [c[2] for c in r["evals"]]
      ax.step(epochs, sizes, where="pre", color=f"C{i}", alpha=0.6, label=arm if j == 0 else None)
  ax.set(yscale="log", xlabel="epoch", ylabel="S (per-worker batches per update)")
  ax.set(title="S at each evaluation (every seed)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  paths.append(analysis.save_figure(fig, out / "batch_vs_examples.png", dpi=110))

  comp = comparisons(result)
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
  for ax, key, scale, label in (
    (axes[0], "test_accuracy", 100, "test acc - small (points)"),
    (axes[1], "target_updates_saved", 100, "updates to target saved vs small (%)"),
  ):
    for k, arm in enumerate(comp):
      p = comp[arm][key]
      if p is None or p.n < 2:
        continue
      ax.errorbar(
        [p.mean * scale],
        [k],
        xerr=[[(p.mean - p.low) * scale], [(p.high - p.mean) * scale]],
        fmt="o",
        capsize=3,
        color=f"C{ARMS.index(arm)}",  # the arm's colour in the other plots
      )
    ax.axvline(-1.0 if key == "test_accuracy" else 40.0, color="gray", ls=":", lw=1)
    ax.axvline(0.0, color="k", lw=0.5)
    ax.set(yticks=range(len(comp)), yticklabels=list(comp), xlabel=label)
    ax.grid(alpha=0.3)
  fig.suptitle("Paired by seed against small: mean and 95% interval (dotted: the goal)")
  paths.append(analysis.save_figure(fig, out / "paired.png", dpi=110))
  return paths


def report(setup: Setup, out: Path) -> driver.Report:
  """``table.md`` and the plots from ``out/summary.json``."""
  del setup  # the summary holds the setup it ran
  result = json.loads((out / "summary.json").read_text())
  text = tables(result)
  plots(result, out)
  return driver.Report(text, {"table.md": text + "\n"})


def pilot_report(setup: Setup, out: Path) -> driver.Report:
  """The pilot's final validation accuracy and its curve (what fixed the target)."""
  del setup
  run = json.loads((out / "pilot.json").read_text())["run"]
  curve = [(c[0], c[3]) for c in run["evals"]]
  return driver.Report(json.dumps({"final_validation_accuracy": curve[-1][1], "curve": curve}), {})
