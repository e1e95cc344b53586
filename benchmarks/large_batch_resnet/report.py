"""The ResNet1D study's reports: the main study's tables and ``summary.json`` (its plots:
``plots.py``), and the equal tuning's tables, summary and plot."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import driver, harness
from benchmarks.large_batch import (
  LOOSE_FRACTION,
  TARGET_FRACTION,
  RunResult,
  Summary,
  load_results,
  summary_record,
)
from benchmarks.large_batch_resnet import plots
from benchmarks.large_batch_resnet.grid import (
  GROUPS,
  LR_CELLS,
  LR_FACTORS,
  PAIRS,
  PRESETS,
  RULES,
  TABLE1,
  VALIDATION_DATA_SEED,
  VARIANTS,
  WARMUPS,
  EqualTuning,
  Preset,
  Sizes,
  build_grid,
  chosen_rates,
  label,
  read_test,
  read_validation,
  spec_of,
  tuned_rate,
)
from benchmarks.paired_intervals import Paired, paired
from examples import analysis

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


def report(sizes: Sizes, out: Path) -> driver.Report:
  """``tables.md``, ``summary.json`` and the plots of the preset's whole grid's finished runs."""
  p = PRESETS[sizes.name]
  seeds, scales = p.seeds, p.scales
  full_grid = build_grid(p, out, GROUPS, seeds, scales)
  sm = Summary(load_results(full_grid, out / "runs"))
  head = (
    f"# MNIST-1D large-batch study of ResNet1D ('{sizes.name}' preset)\n\n"
    f"{int(p.num_samples * 0.8)} training / {int(p.num_samples * 0.2)} test examples, "
    f"ResNet1D width {p.width} (62 parameter leaves, BatchNorm), per-worker batch "
    f"{p.per_worker_batch}, {p.num_epochs} epochs for every run unless stated, eta0 = "
    f"{p.learning_rate} (momentum 0.9, weight decay {p.weight_decay}, exponential decay to 1%)."
  )
  text = "\n\n".join(
    [
      head,
      f"Finished runs: {len(sm.results)} of {len(full_grid)} in the grid. Target = "
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
  paths = plots.plot_all(sm, p, out)
  extra = {"preset": dataclasses.asdict(p), "plots": [x.name for x in paths]}
  files = {"tables.md": text + "\n", "summary.json": harness.json_text(summary_record(sm, extra))}
  return driver.Report(text, files)


# ------------------------------------------------------------------------------------------------
# Equal tuning
# ------------------------------------------------------------------------------------------------


def summarise(setup: EqualTuning, out: Path) -> dict[str, Any]:
  """Everything the tables and the plot read: the sweep and the final runs."""
  chosen = chosen_rates(setup, out)
  methods: dict[str, Any] = {}
  for m in setup.methods:
    sweep = {
      f"{r:g}": read_validation(out, spec_of(m, setup, r, setup.selection_seed)) for r in m.rates
    }
    final: dict[str, Any] = {}
    rate = chosen[m.key]
    if rate is not None:
      for seed in setup.final_seeds:
        evals = read_test(out, spec_of(m, setup, rate, seed))
        if evals is not None:
          final[str(seed)] = {
            "test_accuracy": evals[-1]["eval_accuracy"],
            "validation_accuracy": read_validation(out, spec_of(m, setup, rate, seed)),
            "curve": [[e["iteration"], e["eval_accuracy"]] for e in evals],
          }
    edge = None if rate is None else ("low" if rate == m.rates[0] else "high")
    methods[m.key] = {
      "label": m.label,
      "optimizer": m.optimizer,
      "warmup": m.warmup,
      "rates": list(m.rates),
      "sweep_validation_accuracy": sweep,
      "chosen_rate": rate,
      "chosen_at_edge": edge if rate in (m.rates[0], m.rates[-1]) else None,
      "final": final,
    }
  return {
    "scale": setup.scale,
    "selection_seed": setup.selection_seed,
    "final_seeds": list(setup.final_seeds),
    "validation_data_seed": VALIDATION_DATA_SEED,
    "methods": methods,
    "pairs": [[a, b] for a, b in PAIRS if a in methods and b in methods],
  }


def pair(summary: dict[str, Any], a: str, b: str) -> Paired | None:
  """Test accuracy ``a - b`` over the final seeds both finished (None: none)."""
  fa, fb = (summary["methods"][k]["final"] for k in (a, b))
  seeds = sorted((set(fa) & set(fb)), key=int)
  if not seeds:
    return None
  va = [fa[s]["test_accuracy"] for s in seeds]
  return paired(va, [fb[s]["test_accuracy"] for s in seeds])


def equal_tables(summary: dict[str, Any]) -> str:
  """The sweep, the final runs and the paired intervals, as Markdown."""
  ms = summary["methods"]
  s, sel = summary["scale"], summary["selection_seed"]
  rows = []
  for m in ms.values():
    cells = [
      f"{r}: {'—' if v is None else f'{v:.4f}'}" for r, v in m["sweep_validation_accuracy"].items()
    ]
    rate = m["chosen_rate"]
    chosen = "sweep unfinished" if rate is None else f"{rate:g}"
    if m["chosen_at_edge"]:
      chosen += f" ({m['chosen_at_edge']} edge of the grid)"
    rows.append([m["label"], ", ".join(cells), chosen])
  sweep = harness.markdown_table(["method", f"rate: validation acc (seed {sel})", "chosen"], rows)
  final_rows = []
  for m in ms.values():
    accs = [f["test_accuracy"] for f in m["final"].values()]
    per_seed = ", ".join(f"{k}: {f['test_accuracy']:.4f}" for k, f in m["final"].items())
    rate = "—" if m["chosen_rate"] is None else f"{m['chosen_rate']:g}"
    mean = harness.mean_std(accs) if accs else "—"
    final_rows.append([m["label"], rate, len(accs), mean, per_seed or "—"])
  final = harness.markdown_table(
    ["method", "rate", "seeds", "test acc @ budget", "per seed"], final_rows
  )
  pair_rows = []
  for a, b in PAIRS:
    if a in ms and b in ms and (d := pair(summary, a, b)) is not None:
      label = f"{ms[a]['label']} - {ms[b]['label']}, S = {s}, equal tuning"
      pair_rows.append(
        [*d.row(label, 4), d.verdict(f"{ms[a]['label']} ahead", f"{ms[b]['label']} ahead")]
      )
  pairs = harness.markdown_table(
    [
      "claim (A - B), test acc",
      "seeds",
      "mean",
      "95% interval (t, n-1 dof)",
      "seeds A > B",
      "verdict",
    ],
    pair_rows,
  )
  return (
    f"### Equal tuning: rate sweep (S = {s}, selection seed {sel}, validation draw)\n\n{sweep}\n\n"
    f"### Equal tuning: final runs at the chosen rates (test accuracy)\n\n{final}\n\n"
    f"### Equal tuning: paired intervals\n\n{pairs}\n"
  )


def equal_plot(summary: dict[str, Any], path: Path) -> None:
  """Validation accuracy against the rate relative to the grid's middle (left); test accuracy
  of the final runs against updates, mean over seeds (right)."""
  fig, (left, right) = analysis.pyplot().subplots(1, 2, figsize=(11, 4.2))
  for m in summary["methods"].values():
    rates, mid = m["rates"], m["rates"][len(m["rates"]) // 2]
    pts = [
      (r / mid, v)
      for r, v in zip(rates, m["sweep_validation_accuracy"].values(), strict=True)
      if v is not None
    ]
    if pts:
      left.plot(*zip(*pts, strict=True), marker="o", label=f"{m['label']} (x {mid:g})")
    curves = [f["curve"] for f in m["final"].values()]
    if curves:
      n = min(len(c) for c in curves)
      its = [c[i][0] for c in curves[:1] for i in range(n)]
      acc = [statistics.fmean(c[i][1] for c in curves) for i in range(n)]
      right.plot(its, acc, label=f"{m['label']}, rate {m['chosen_rate']:g} ({len(curves)} seeds)")
  left.set(xscale="log", xlabel="rate / grid middle", ylabel="validation accuracy (end of run)")
  left.set_title(f"sweep, seed {summary['selection_seed']}")
  right.set(xlabel="update", ylabel="test accuracy", ylim=(0, 1))
  right.set_title(f"final runs, S = {summary['scale']}")
  for ax in (left, right):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  analysis.save_figure(fig, path, dpi=110)


def equal_report(setup: EqualTuning, out: Path) -> driver.Report:
  """``tables.md``, ``summary.json`` (in the tables' order: tables(json) == tables) and
  ``equal_tuning.png``."""
  summary = summarise(setup, out)
  text = equal_tables(summary)
  equal_plot(summary, out / "equal_tuning.png")
  return driver.Report(text, {"tables.md": text, "summary.json": harness.json_text(summary)})
