"""The ResNet1D study's plots: accuracy curves and against the batch, per-layer ratios (paper
Figs. 3-4) and per-layer warm-up ends (Fig. 7), all through ``examples.analysis``."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from benchmarks.large_batch import TARGET_FRACTION, Summary, plot_curves
from benchmarks.large_batch_resnet.grid import TABLE1, VARIANTS, Preset, label, tuned_rate
from examples import analysis, lena


def depth_order(names: Sequence[str]) -> list[str]:
  """Layer names from the input to the output (the stem, blocks 0, 1, ..., the classifier);
  ``jax.tree.leaves`` orders Flax's module names alphabetically instead."""

  def key(name: str) -> tuple[int, str]:
    top = name.split("/")[0]
    if top.startswith("stem"):
      return (-1, name)
    if top.startswith("BasicBlock1D_"):
      return (int(top.rsplit("_", 1)[1]), name)
    return (1_000, name)

  return sorted(names, key=key)


def plot_all(sm: Summary, p: Preset, out: Path) -> list[Path]:
  seeds, paths = p.seeds, []
  base = sm.baselines(seeds)
  target = TARGET_FRACTION * statistics.mean(r.final for r in base) if base else None
  for s in p.scales:
    curves = {"SGD 1 worker": base}
    rows = [(o, w, 0.0) for o, w in TABLE1]
    rows += [(o, "fixed", lr) for o in ("lars", "lamb") if (lr := tuned_rate(sm, p, o, s, 0))]
    for o, w, lr in rows:
      runs = sm.runs(seeds, optimizer=o, batch_scale=s, warmup=w, learning_rate=lr)
      curves[f"{label(o)} ({w}, {len(runs)} seeds)"] = runs
    title = f"MNIST-1D ResNet1D, S={s} (batch {s * p.per_worker_batch}), {p.num_epochs} epochs"
    paths.append(plot_curves(curves, target, title, out / f"accuracy_vs_iterations_s{s}.png"))

  series = {
    f"{label(o)} ({w})": [
      (
        s * p.per_worker_batch,
        [r.final for r in sm.runs(seeds, optimizer=o, batch_scale=s, warmup=w)],
      )
      for s in p.scales
    ]
    for o, w in TABLE1
  }
  fig = analysis.plot_accuracy_vs_scale(
    series,
    (statistics.mean(r.final for r in base), "SGD 1 worker") if base else None,
    num_epochs=p.num_epochs,
    title="Accuracy at the budget vs batch (mean ± std over seeds)",
    legend_size=7,
  )
  paths.append(analysis.save_figure(fig, out / "accuracy_vs_scale.png", dpi=110))
  for s in p.ablation_scales:
    if path := plot_layer_ratios(sm, s, out):
      paths.append(path)
    if path := plot_warmup_end(sm, s, out):
      paths.append(path)
  return paths


def plot_layer_ratios(sm: Summary, s: int, out: Path) -> Path | None:
  """Figs. 3-4: per-layer gain ratios over the run (LENA without warm-up, seed 0)."""
  runs = sm.runs([0], optimizer="lena", batch_scale=s, warmup="none")
  if not runs or not runs[0].layer_records:
    return None
  records = runs[0].layer_records
  series = analysis.layer_series(records, "gain_ratio")
  order = depth_order(list(series))
  plt = analysis.pyplot()
  fig, ax = plt.subplots(figsize=(8, 5))
  cmap = plt.get_cmap("viridis")
  for j, layer in enumerate(order):
    ax.plot(*series[layer], color=cmap(j / len(order)), lw=0.8, alpha=0.8)
  its = [r["iteration"] for r in records]
  ax.plot(its, [r["global_ratio"] for r in records], "r--", lw=2, label="AdaScale R (global)")
  for layer in (order[0], order[-1]):
    xs, ys = series[layer]
    ax.annotate(layer, (xs[-1], ys[-1]), fontsize=6)
  ax.set(
    yscale="log",
    xlabel="iteration",
    ylabel="gain ratio r_k",
    title=f"Per-layer gain ratios, LENA no warm-up, S={s} (colour: input -> output layer)",
  )
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  return analysis.save_figure(fig, out / f"layer_ratios_s{s}.png", dpi=110)


def plot_warmup_end(sm: Summary, s: int, out: Path) -> Path | None:
  """Fig. 7: per-layer warm-up end, the paper's progress rule against the variants (seed 0),
  layers from the input (top) to the output."""
  runs = {}
  for opt, rule in (("lena", "ratio (paper)"), *VARIANTS.items()):
    found = sm.runs([0], optimizer=opt, batch_scale=s, warmup="state_aware")
    if found:
      r = found[0]
      ends = r.warmup_ends()
      ordered = {layer: ends[layer] for layer in depth_order(list(ends))}
      runs[f"{rule}: acc {r.final:.3f}"] = (ordered, r.total_steps)
  if not runs:
    return None
  fixed = lena.Config().warmup_fraction
  fig = analysis.plot_warmup_ends(
    runs, fraction=True, fixed_end=fixed, fixed_label=f"LSW fixed warm-up ({fixed:.1%})"
  )
  fig.set_size_inches(8, 0.16 * len(ordered) + 2)  # 62 layers: analysis's default is very tall
  for tick in fig.axes[0].get_yticklabels():
    tick.set_fontsize(5)
  return analysis.save_figure(fig, out / f"warmup_end_s{s}.png", dpi=110)
