"""The ResNet1D study's tables and ``summary.json`` (its plots: ``plots.py``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.large_batch_resnet import plots
from benchmarks.large_batch_resnet.study import (
  LR_CELLS,
  LR_FACTORS,
  RULES,
  TABLE1,
  VARIANTS,
  WARMUPS,
  Preset,
  label,
  tuned_rate,
)
from benchmarks.large_batch_runs import (
  LOOSE_FRACTION,
  TARGET_FRACTION,
  RunResult,
  Summary,
  summary_record,
)

ms = harness.mean_std


def cells(sm: Summary, runs: list[RunResult]) -> dict[str, str]:
  """Seeds, acc@budget, best acc, iterations to the target / loose target, run length."""
  return {
    "n": str(len(runs)),
    "acc": ms([r.final for r in runs]),
    "best": ms([r.best for r in runs]),
    "it": sm.to_target(runs),
    "loose": sm.to_target(runs, loose=True),
    "total": str(runs[0].total_steps) if runs else "—",
  }


def tuned_rows(sm: Summary, p: Preset, s: int, seeds: Sequence[int]) -> list[tuple]:
  """Table 1's rows at S = s: its methods, then LARS and LAMB at their tuned rates."""
  rows: list[tuple] = [(o, w, 0.0) for o, w in TABLE1]
  for o in ("lars", "lamb"):
    if lr := tuned_rate(sm, p, o, s, seeds[0]):
      rows.append((o, "fixed", lr))
  return rows


def table1(sm: Summary, p: Preset, seeds: Sequence[int], scales: Sequence[int]) -> str:
  keys = ("n", "acc", "best", "it", "loose", "total")
  c = cells(sm, sm.baselines(seeds))
  rows = [[1, p.per_worker_batch, "SGD 1 worker", *(c[k] for k in keys)]]
  for s in scales:
    for o, w, lr in tuned_rows(sm, p, s, seeds):
      c = cells(sm, sm.runs(seeds, optimizer=o, batch_scale=s, warmup=w, learning_rate=lr))
      name = f"{label(o)} ({w}{f', lr {lr:g}' if lr else ''})"
      rows.append([s, s * p.per_worker_batch, name, *(c[k] for k in keys)])
  header = ["S", "global batch", "method", "seeds", "test acc @ budget", "best acc"]
  header += ["iterations to target", f"iterations to {LOOSE_FRACTION:.0%}", "updates in the run"]
  return harness.markdown_table(header, rows)


def table2(sm: Summary, p: Preset, seeds: Sequence[int]) -> str:
  def cell(runs: list[RunResult]) -> str:
    c = cells(sm, runs)
    return f"{c['acc']} [{c['it']} / {c['loose']}] (n={c['n']})" if runs else "—"

  blocks = []
  for s in p.ablation_scales:
    rows = []
    for o in RULES:
      row = [label(o)]
      row += [cell(sm.runs(seeds, optimizer=o, batch_scale=s, warmup=w)) for w in WARMUPS]
      for v in VARIANTS:
        row.append(
          cell(sm.runs(seeds, optimizer=v, batch_scale=s, warmup="state_aware"))
          if o == "lena"
          else "= fixed (theta base steps)"
        )
      rows.append(row)
    blocks.append(
      f"S = {s} (batch {s * p.per_worker_batch}); cell: test acc @ budget [iterations to "
      f"target / to {LOOSE_FRACTION:.0%}]; state_aware = the paper's progress rule\n\n"
      + harness.markdown_table(["rule \\ warm-up", *WARMUPS, *VARIANTS.values()], rows)
    )
  return "\n\n".join(blocks)


def warmup_end_table(sm: Summary, p: Preset, seeds: Sequence[int]) -> str:
  """Fig. 7 in numbers: per warm-up rule, when the layers ended their warm-up."""
  rows = []
  for s in p.ablation_scales:
    for opt, rule in (("lena", "ratio (paper)"), *VARIANTS.items()):
      runs = sm.runs(seeds, optimizer=opt, batch_scale=s, warmup="state_aware")
      if not runs:
        continue
      firsts, meds, lasts, never = [], [], [], []
      for r in runs:
        ends = np.array(list(r.warmup_ends().values()), float)
        done = ends[ends > 0] / r.total_steps * 100
        never.append(int(np.sum(ends < 0)))
        fr = np.where(ends > 0, ends / r.total_steps * 100, 100.0)
        firsts.append(float(done.min()) if done.size else 100.0)
        meds.append(float(np.median(fr)))
        lasts.append(float(fr.max()))
      rows.append(
        [
          s,
          rule,
          len(runs),
          ms(firsts, ".0f"),
          ms(meds, ".0f"),
          ms(lasts, ".0f"),
          f"{ms(never, '.1f')} of {len(runs[0].warmup_ends())}",
          ms([r.final for r in runs]),
        ]
      )
  header = ["S", "warm-up progress rule", "seeds", "first layer ends (% of run)", "median layer"]
  header += ["last layer", "layers not ended", "test acc"]
  return harness.markdown_table(header, rows)


def ratio_spread_table(sm: Summary, p: Preset) -> str:
  """Do the per-layer ratios spread out over training (paper Figs. 3-4)? LENA without warm-up."""
  rows = []
  for s in p.ablation_scales:
    runs = sm.runs([0], optimizer="lena", batch_scale=s, warmup="none")
    if not runs:
      continue
    r = runs[0]
    for frac in (0.0, 0.1, 0.25, 0.5, 0.75, 1.0):
      rec = min(r.layer_records, key=lambda x: abs(x["iteration"] - max(1, frac * r.total_steps)))
      q = np.percentile(list(rec["gain_ratio"].values()), [0, 25, 50, 75, 100])
      rows.append(
        [
          s,
          r.spec.name,
          f"{rec['iteration'] / r.total_steps:.0%}",
          *(f"{v:.1f}" for v in q),
          f"{q[4] / q[0]:.1f}",
          f"{rec['global_ratio']:.1f}",
        ]
      )
  header = ["S", "run", "at % of run", "min ratio", "25%", "median", "75%", "max", "max/min"]
  return harness.markdown_table([*header, "AdaScale R"], rows)


def sweep_table(sm: Summary, p: Preset, seeds: Sequence[int], scales: Sequence[int]) -> str:
  rows = []
  for s in [x for x in p.sweep_scales if x in scales]:
    for o in ("lars", "lamb"):
      parts = []
      for lr in p.lars_lrs if o == "lars" else p.lamb_lrs:
        r = sm.runs(seeds[:1], optimizer=o, batch_scale=s, warmup="fixed", learning_rate=lr)
        parts.append(f"{lr:g}: {r[0].final:.3f}" if r else f"{lr:g}: —")
      lr = tuned_rate(sm, p, o, s, seeds[0])
      c = cells(sm, sm.runs(seeds, optimizer=o, batch_scale=s, warmup="fixed", learning_rate=lr))
      rows.append(
        [s, label(o), ", ".join(parts), lr or "sweep unfinished", f"{c['acc']} (n={c['n']})"]
      )
  header = ["S", "optimizer", "rate: acc (seed 0)", "chosen", "all seeds"]
  return harness.markdown_table(header, rows)


def long_table(sm: Summary, p: Preset, seeds: Sequence[int]) -> str:
  variants = [
    ("sgd", "none", 1),
    ("adascale", "none", p.long_scale),
    ("adascale", "state_aware", p.long_scale),
    ("lena", "state_aware", p.long_scale),
    ("lena_relmax", "state_aware", p.long_scale),
    ("lena", "none", p.long_scale),
  ]
  rows = []
  for ep in (0, p.long_epochs):
    for o, w, s in variants:
      runs = sm.runs(seeds, optimizer=o, batch_scale=s, warmup=w, epochs=ep)
      if runs:
        c = cells(sm, runs)
        rows.append(
          [
            f"{label(o)} ({w})",
            ep or p.num_epochs,
            c["n"],
            c["acc"],
            c["it"],
            c["loose"],
            c["total"],
          ]
        )
  header = ["method", "epochs", "seeds", "test acc @ budget", "iterations to target"]
  header += [f"iterations to {LOOSE_FRACTION:.0%}", "updates in the run"]
  return (
    f"S = {p.long_scale} (batch {p.long_scale * p.per_worker_batch}); budget {p.num_epochs} vs "
    f"{p.long_epochs} epochs; target = 98% of the single worker at the same budget\n\n"
    + harness.markdown_table(header, rows)
  )


def lr_table(sm: Summary, p: Preset, seeds: Sequence[int]) -> str:
  """Accuracy against eta0 (seed 0) for the cells of ``LR_CELLS``."""
  sc = p.ablation_scales[0]
  rates = sorted({p.learning_rate, *(p.learning_rate * f for f in LR_FACTORS)})
  rows = []
  for o, w in LR_CELLS:
    row = [f"{label(o)} ({w})"]
    for r in rates:
      lr = 0.0 if r == p.learning_rate else r
      runs = sm.runs(seeds[:1], optimizer=o, batch_scale=sc, warmup=w, learning_rate=lr)
      row.append(f"{runs[0].final:.4f}" if runs else "—")
    rows.append(row)
  low_rate = p.learning_rate * 0.25
  all_seeds = []
  for o, w in LR_CELLS:
    low = sm.runs(seeds, optimizer=o, batch_scale=sc, warmup=w, learning_rate=p.learning_rate / 4)
    base = sm.runs(seeds, optimizer=o, batch_scale=sc, warmup=w)
    all_seeds.append(
      [
        f"{label(o)} ({w})",
        len(low),
        ms([r.final for r in low]),
        len(base),
        ms([r.final for r in base]),
      ]
    )
  return "\n".join(
    [
      f"S = {sc} (batch {sc * p.per_worker_batch}), seed {seeds[0]}; eta0 = {p.learning_rate} "
      "is the single worker's rate used everywhere else",
      "",
      harness.markdown_table(["method", *(f"eta0 = {r:g}" for r in rates)], rows),
      "",
      f"All seeds at eta0 = {low_rate:g} and {p.learning_rate:g} (mean ± std):",
      "",
      harness.markdown_table(
        ["method", "seeds", f"eta0 = {low_rate:g}", "seeds", f"eta0 = {p.learning_rate:g}"],
        all_seeds,
      ),
    ]
  )


def write(sm: Summary, p: Preset, grid_size: int, out: Path, head: str) -> str:
  """Writes ``tables.md``, ``summary.json`` and the plots; returns the tables' text."""
  seeds, scales = p.seeds, p.scales
  text = "\n\n".join(
    [
      head,
      f"Finished runs: {len(sm.results)} of {grid_size} in the grid. Target = "
      f"{TARGET_FRACTION:.0%} of the same seed's single-worker SGD test accuracy (loose "
      f"{LOOSE_FRACTION:.0%}); mean ± std over seeds; '(k/n)': only k of n seeds reached it.",
      "## Table 1: accuracy at the budget, iterations to target\n\n" + table1(sm, p, seeds, scales),
      "## Table 2: scaling rule x warm-up (with the warm-up variants)\n\n" + table2(sm, p, seeds),
      "## Per-layer warm-up end (Fig. 7 in numbers)\n\n" + warmup_end_table(sm, p, seeds),
      "## Per-layer ratios over the run (Figs. 3-4 in numbers, LENA no warm-up, seed 0)\n\n"
      + ratio_spread_table(sm, p),
      "## LARS / LAMB learning-rate sweep (fixed warm-up)\n\n" + sweep_table(sm, p, seeds, scales),
      "## Longer budget\n\n" + long_table(sm, p, seeds),
      "## Sensitivity to eta0\n\n" + lr_table(sm, p, seeds),
    ]
  )
  harness.write_text(out / "tables.md", text + "\n")
  paths = plots.plot_all(sm, p, out)
  extra = {"preset": dataclasses.asdict(p), "plots": [x.name for x in paths]}
  harness.write_json(out / "summary.json", summary_record(sm, extra))
  return text
