"""The CNN study's tables (paper Tables 1-3 and Table 4), plots and ``summary.json``."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import driver, harness
from benchmarks.large_batch import (
  LOOSE_FRACTION,
  TARGET_FRACTION,
  RunResult,
  Summary,
  load_results,
  plot_curves,
  summary_record,
)
from benchmarks.large_batch_cnn.grid import (
  PAPER_METHODS,
  RULES,
  WARMUPS,
  Preset,
  Sizes,
  build_grid,
  label_of,
)
from examples import analysis, lena

CELLS = ("acc", "best", "epochs", "iterations", "wall", "n", "loose")


def cells(sm: Summary, runs: list[RunResult]) -> dict[str, str]:
  """acc@budget, best acc and epochs/iterations/wall to target as 'mean ± std' strings;
  ``loose`` is the iterations to the looser target."""
  if not runs:
    return dict.fromkeys(CELLS, "—")
  return {
    "acc": harness.mean_std([r.final for r in runs]),
    "best": harness.mean_std([r.best for r in runs]),
    "epochs": sm.to_target(runs, "epoch", ".1f"),
    "iterations": sm.to_target(runs, "iteration", ".0f"),
    "wall": sm.to_target(runs, "wall_time", ".0f"),
    "n": str(len(runs)),
    "loose": sm.to_target(runs, "iteration", ".0f", loose=True),
  }


def table1(sm: Summary, p: Preset, seeds: Sequence[int], scales: Sequence[int]) -> str:
  """Paper Table 1: accuracy at the budget and epochs/iterations/time to the target."""
  header = ["S", "global batch", "method", "seeds", "test acc @ budget", "best acc"]
  header += ["epochs to target", "iterations to target", "wall s to target"]
  header += [f"iterations to {LOOSE_FRACTION:.0%}"]
  keys = ("n", "acc", "best", "epochs", "iterations", "wall", "loose")
  base = cells(sm, sm.baselines(seeds))
  rows = [[1, p.per_worker_batch, "SGD 1 worker", *(base[k] for k in keys)]]
  for s in scales:
    for opt, warm in PAPER_METHODS:
      c = cells(sm, sm.runs(seeds, optimizer=opt, batch_scale=s, warmup=warm))
      rows.append([s, s * p.per_worker_batch, f"{label_of(opt)} ({warm})", *(c[k] for k in keys)])
  return harness.markdown_table(header, rows)


def table2(sm: Summary, p: Preset, seeds: Sequence[int]) -> str:
  """Paper Table 2: rule x warm-up at each ablation scale (acc; iterations to target)."""
  blocks = []
  for s in p.ablation_scales:
    rows = []
    for opt in RULES:
      row = [label_of(opt)]
      for w in WARMUPS:
        c = cells(sm, sm.runs(seeds, optimizer=opt, batch_scale=s, warmup=w))
        row.append(f"{c['acc']} [{c['iterations']} / {c['loose']}]")
      rows.append(row)
    blocks.append(
      f"S = {s} (batch {s * p.per_worker_batch}); cell: test acc @ budget "
      f"[iterations to target / to {LOOSE_FRACTION:.0%}]\n\n"
      + harness.markdown_table(["rule \\ warm-up", *WARMUPS], rows)
    )
  return "\n\n".join(blocks)


def table3(sm: Summary, p: Preset, seeds: Sequence[int]) -> str:
  """Paper Table 3: LENA's alpha; with the range of the per-layer warm-up end iterations."""
  header = [
    "alpha",
    "seeds",
    "test acc @ budget",
    f"iterations to target / to {LOOSE_FRACTION:.0%}",
  ]
  header += ["per-layer warm-up end (iteration, min-max, seed 0)", "total iterations"]
  rows = []
  for a in p.alphas:
    runs = sm.runs(
      seeds, optimizer="lena", batch_scale=p.alpha_scale, warmup="state_aware", alpha=a
    )
    c = cells(sm, runs)
    ends = list(runs[0].warmup_ends().values()) if runs else []
    span = (
      f"{min(ends)}-{max(ends)}" if ends and min(ends) >= 0 else ("not all ended" if ends else "—")
    )
    total = runs[0].total_steps if runs else "—"
    rows.append([f"{a:.0%}", c["n"], c["acc"], f"{c['iterations']} / {c['loose']}", span, total])
  return (
    f"S = {p.alpha_scale} (batch {p.alpha_scale * p.per_worker_batch}), LENA with "
    "state-aware warm-up\n\n" + harness.markdown_table(header, rows)
  )


def table4(sm: Summary, p: Preset, seeds: Sequence[int]) -> str:
  """What makes layer-wise scaling win or lose: grouping, warm-up, budget, inner update."""
  x, long = p.extra_scale, p.long_epochs
  variants: list[tuple[str, dict[str, Any]]] = [
    ("LENA per-leaf, state-aware (paper)", dict(optimizer="lena", warmup="state_aware")),
    (
      "LENA per-module, state-aware",
      dict(optimizer="lena", warmup="state_aware", grouping="module"),
    ),
    ("LENA per-leaf, no warm-up", dict(optimizer="lena", warmup="none")),
    ("LENA per-module, no warm-up", dict(optimizer="lena", warmup="none", grouping="module")),
    ("AdaScale (global ratio), no warm-up", dict(optimizer="adascale", warmup="none")),
    ("LSW, fixed warm-up", dict(optimizer="linear_scaling", warmup="fixed")),
  ]
  if long:
    variants += [
      (f"{label_of(o)} ({w}), {long} epochs", dict(optimizer=o, warmup=w, epochs=long))
      for o, w in PAPER_METHODS
    ]
  variants += [
    (f"Adam (lr {p.adam_lr:g}, no scaling)", dict(optimizer="adam", warmup="none")),
    (
      f"Adam + LENA ratios + state-aware warm-up (lr {p.adam_lr:g})",
      dict(optimizer="adam_lena", warmup="state_aware"),
    ),
    (f"LAMB (optax.lamb, lr {p.lamb_lr:g})", dict(optimizer="lamb", warmup="none")),
  ]
  keys = ("n", "acc", "best", "iterations", "epochs", "loose")
  rows = []
  if long:
    c = cells(sm, sm.baselines(seeds, epochs=long))
    rows.append([f"SGD 1 worker, {long} epochs", *(c[k] for k in keys)])
  for label, fields in variants:
    c = cells(sm, sm.runs(seeds, batch_scale=x, **fields))
    rows.append([label, *(c[k] for k in keys)])
  header = ["variant", "seeds", "test acc @ budget", "best acc", "iterations to target"]
  header += ["epochs to target", f"iterations to {LOOSE_FRACTION:.0%}"]
  return (
    f"S = {x} (batch {x * p.per_worker_batch}); default budget {p.num_epochs} epochs; "
    "target = 98% of the single-worker SGD accuracy at the same budget\n\n"
    + harness.markdown_table(header, rows)
  )


def plot_all(
  sm: Summary, p: Preset, seeds: Sequence[int], scales: Sequence[int], out: Path
) -> list[Path]:
  """Accuracy vs iterations per scale, accuracy at budget vs scale, LENA's warm-up ends."""
  paths = []
  base = sm.baselines(seeds)
  target = TARGET_FRACTION * statistics.mean(r.final for r in base) if base else None
  for s in scales:
    curves = {label_of("sgd"): base}
    for opt, warm in PAPER_METHODS:
      runs = sm.runs(seeds, optimizer=opt, batch_scale=s, warmup=warm)
      curves[f"{label_of(opt)} ({warm}, {len(runs)} seeds)"] = runs
    title = f"MNIST-1D, S={s} (batch {s * p.per_worker_batch}), {p.num_epochs} epochs"
    paths.append(plot_curves(curves, target, title, out / f"accuracy_vs_iterations_s{s}.png"))

  series = {
    label_of(opt): [
      (
        s * p.per_worker_batch,
        [r.final for r in sm.runs(seeds, optimizer=opt, batch_scale=s, warmup=warm)],
      )
      for s in scales
    ]
    for opt, warm in PAPER_METHODS
  }
  fig = analysis.plot_accuracy_vs_scale(
    series,
    (
      (statistics.mean(r.final for r in base), f"SGD 1 worker (batch {p.per_worker_batch})")
      if base
      else None
    ),
    num_epochs=p.num_epochs,
    title="Accuracy at the epoch budget vs batch size (mean ± std over seeds)",
  )
  paths.append(analysis.save_figure(fig, out / "accuracy_vs_scale.png", dpi=110))

  # LENA's per-layer warm-up end (paper Fig. 7), seed 0 of each Table-1 scale, as a fraction
  # of the run so that scales with different update counts share an axis.
  ends = {}
  for s in scales:
    runs = sm.runs(seeds[:1], optimizer="lena", batch_scale=s, warmup="state_aware")
    if runs:
      ends[f"S={s} ({runs[0].total_steps} iterations)"] = (
        runs[0].warmup_ends(),
        runs[0].total_steps,
      )
  if ends:
    fixed = lena.Config().warmup_fraction  # LSW's W as a fraction of the run
    fig = analysis.plot_warmup_ends(
      ends, fraction=True, fixed_end=fixed, fixed_label=f"LSW fixed warm-up end ({fixed:.1%})"
    )
    paths.append(analysis.save_figure(fig, out / "lena_warmup_end.png", dpi=110))
  return paths


def report(sizes: Sizes, out: Path) -> driver.Report:
  """``tables.md``, ``summary.json`` and the plots of the finished runs of ``sizes``' grid."""
  p, seeds, scales = sizes.resolved()
  grid = build_grid(p, seeds, scales)
  sm = Summary(load_results(grid, out / "runs"))
  header = (
    f"# MNIST-1D large-batch study ('{sizes.name}' preset)\n\n"
    f"{int(p.num_samples * 0.8)} training / {int(p.num_samples * 0.2)} test examples, "
    f"CNN1D, per-worker batch {p.per_worker_batch}, {p.num_epochs} epochs for every "
    f"run, eta0 = {p.learning_rate} (momentum 0.9, weight decay 5e-4, exponential decay "
    f"to 1%), seeds {list(seeds)}, Table 1 scales {list(scales)}."
  )
  text = (
    "\n\n".join(
      [
        header,
        f"Finished runs: {len(sm.results)} of {len(grid)} in the grid. Target = "
        f"{TARGET_FRACTION:.0%} of the same seed's single-worker SGD test accuracy (loose "
        f"target {LOOSE_FRACTION:.0%}); mean ± std over seeds; '(k/n)' = only k of n seeds "
        "reached it (the mean is over those). Wall times include compilation and were measured "
        "on a shared machine: compare iterations, not seconds.",
        "## Table 1: accuracy at the budget, time to target\n\n" + table1(sm, p, seeds, scales),
        "## Table 2: scaling rule x warm-up\n\n" + table2(sm, p, seeds),
        "## Table 3: LENA's warm-up threshold alpha\n\n" + table3(sm, p, seeds),
        "## Table 4: what makes layer-wise scaling win or lose\n\n" + table4(sm, p, seeds),
      ]
    )
    + "\n"
  )
  names = [x.name for x in plot_all(sm, p, seeds, scales, out)]
  extra = {"preset": dataclasses.asdict(p), "seeds": list(seeds), "scales": list(scales)}
  summary = summary_record(sm, extra | {"plots": names})
  return driver.Report(text, {"tables.md": text, "summary.json": harness.json_text(summary)})
