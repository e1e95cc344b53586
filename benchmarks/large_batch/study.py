"""Reproduction study of LENA (Ko et al., WWW 2022) on MNIST-1D: Tables 1-3 and ablations.

The grid (every cell x seeds; the single-worker SGD baseline once per seed):

* **Table 1**: batch scale S x {LSW (fixed warm-up), AdaScale (none), LENA (state-aware)}.
* **Table 2**: the 3x3 ablation {linear, AdaScale, LENA} x warm-up {none, fixed, state-aware}
  at the ``ablation_scales`` (the largest by default: that is where the paper's table is).
* **Table 3**: LENA's warm-up threshold alpha in {1, 3, 5, 7, 9}% at ``alpha_scale``.
* **Table 4** ("what makes layer-wise scaling win or lose", at ``extra_scale``): per-module
  instead of per-leaf grouping, a longer epoch budget, and layer-wise ratios around an Adam
  inner update (``optax.scale_by_adam`` -> ``ol.scale_by_lena`` -> ``ol.layerwise_warmup`` ->
  ``ol.scale_by_learning_rate``) next to plain Adam and ``optax.lamb``. The two Adam variants
  are this study's own entries of the optimizer registry (:data:`STUDY_OPTIMIZERS`), registered
  while the study trains.

Every run is one in-process call of ``examples.train.train_and_evaluate`` into
``<out>/runs/<name>`` (metrics.jsonl + config.json, no checkpoints). The study resumes: a run
whose metrics reach its last update is skipped, so the sweep can be stopped and restarted, and
``--shard I/N`` lets N processes share one grid. Every invocation ends by writing the tables
(``tables.md``, ``summary.json``) and plots of whatever has finished.

Usage::

  python -m benchmarks.large_batch.study --smoke --out /tmp/smoke     # < 60 s, CI
  python -m benchmarks.large_batch.study --quick                      # what RESULTS.md reports
  python -m benchmarks.large_batch.study                              # the full grid (hours)
  python -m benchmarks.large_batch.study --quick --shard 0/2 &        # two processes
  python -m benchmarks.large_batch.study --quick --shard 1/2
  python -m benchmarks.large_batch.study --quick --report_only        # tables from finished runs
  python -m benchmarks.large_batch.study --quick --seeds 0 1 2 --scales 8 16 32 64 128 \
      --ablation_seeds 0 1                                            # RESULTS.md's grid
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optax

import optax_lena as ol
from examples import analysis, metrics, optimizers, train
from examples import configs as configs_lib

# Target = the first fraction (98%) of the single-worker SGD accuracy of the same seed and
# budget; the looser second one (90%) shows which method gets close first when none reaches it.
TARGET_FRACTION, LOOSE_FRACTION = analysis.TARGET_FRACTIONS
RULES = ("lsw", "adascale", "lena")
# Table 1's methods, each with the paper's warm-up (the registry's paper_warmup).
PAPER_METHODS = tuple((o, optimizers.get(o).paper_warmup) for o in RULES)
WARMUPS = optimizers.WARMUPS


def _adam(hp: optimizers.Hyperparams) -> optax.GradientTransformation:
  """Adam at large batch without layer-wise scaling; rate on the sample clock (t*S)."""
  rate = ol.scale_by_learning_rate(
    hp.sample_schedule(), clock="samples", num_samples=hp.num_samples
  )
  return optax.chain(optax.scale_by_adam(), rate)


def _adam_lena(hp: optimizers.Hyperparams) -> optax.GradientTransformation:
  """Adam with LENA's layer ratios: each layer's Adam direction times its gain ratio r_k in
  [1, S], then the state-aware warm-up (theta = alpha * T1). The building blocks read the
  statistics of the raw gradients, so they can follow Adam. No weight decay (Adam's own)."""
  blocks = [optax.scale_by_adam(), ol.scale_by_lena(num_samples=hp.num_samples)]
  if hp.warmup == "state_aware":
    theta = hp.warmup_kwargs()["warmup_threshold"]
    blocks.append(ol.layerwise_warmup(theta, num_samples=hp.num_samples))
  rate = ol.scale_by_learning_rate(
    hp.sample_schedule(), clock="samples", num_samples=hp.num_samples
  )
  return optax.chain(*blocks, rate)


# This study's own optimizers, registered while it trains (optimizers.registered): adding a
# variant to the study is one entry here and its runs in build_grid.
STUDY_OPTIMIZERS = (
  optimizers.Optimizer("adam", _adam, "Adam", warmups=("none",)),
  optimizers.Optimizer(
    "adam_lena", _adam_lena, "Adam+LENA", "state_aware", True, ("none", "state_aware")
  ),
)


def label_of(name: str) -> str:
  """The table label of an optimizer (this study's, or the registry's)."""
  own = {e.name: e.label for e in STUDY_OPTIMIZERS}
  return own[name] if name in own else optimizers.get(name).label


@dataclasses.dataclass(frozen=True)
class Preset:
  """Sizes of the study. ``full`` is the complete grid, ``quick`` what fits ~40 CPU minutes."""

  num_samples: int  # MNIST-1D examples before the 80/20 train/test split
  per_worker_batch: int
  num_epochs: int  # the epoch budget of every run (Table 1's "acc@budget")
  learning_rate: float  # eta0 of one worker (SGD, LSW, AdaScale, LENA)
  scales: tuple[int, ...]
  seeds: tuple[int, ...]
  ablation_scales: tuple[int, ...]
  ablation_seeds: tuple[int, ...]
  alpha_scale: int
  alphas: tuple[float, ...]
  extra_scale: int
  extra_seeds: tuple[int, ...]
  long_epochs: int  # the longer budget of Table 4 (0 = skip)
  evals_per_epoch: int = 4  # large-batch evaluation cadence (iterations-to-target precision)
  adam_lr: float = 1e-3  # eta0 of the Adam inner update (one worker)
  lamb_lr: float = 1e-2
  width: int = 0  # CNN1D features; 0 = the model's default
  rng_impl: str = "default"


PRESETS = {
  # 16k training examples: at S=256 (batch 4096) an epoch still has ~4 updates, the paper's
  # ratio at 16.4k images of 45k (2.7 updates per epoch).
  "full": Preset(
    num_samples=20_000,
    per_worker_batch=16,
    num_epochs=30,
    learning_rate=0.05,
    scales=(8, 16, 32, 64, 128, 256),
    seeds=(0, 1, 2),
    ablation_scales=(128, 256),
    ablation_seeds=(0, 1, 2),
    alpha_scale=256,
    alphas=(0.01, 0.03, 0.05, 0.07, 0.09),
    extra_scale=256,
    extra_seeds=(0, 1, 2),
    long_epochs=60,
  ),
  # The default 8k training examples; S=128 (batch 2048) has ~4 updates per epoch.
  "quick": Preset(
    num_samples=10_000,
    per_worker_batch=16,
    num_epochs=20,
    learning_rate=0.05,
    scales=(32, 128),
    seeds=(0, 1),
    ablation_scales=(128,),
    ablation_seeds=(0,),
    alpha_scale=128,
    alphas=(0.01, 0.03, 0.05, 0.07, 0.09),
    extra_scale=128,
    extra_seeds=(0,),
    long_epochs=40,
  ),
  # Plumbing only (CI): a small draw, a narrow CNN, two epochs.
  "smoke": Preset(
    num_samples=1000,
    per_worker_batch=8,
    num_epochs=2,
    learning_rate=0.05,
    scales=(8,),
    seeds=(0,),
    ablation_scales=(8,),
    ablation_seeds=(0,),
    alpha_scale=8,
    alphas=(0.01, 0.05),
    extra_scale=8,
    extra_seeds=(0,),
    long_epochs=0,
    evals_per_epoch=2,
    width=8,
    rng_impl="rbg",
  ),
}


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One training run of the grid; ``name`` is derived from everything that differs."""

  optimizer: str  # a registry name: sgd, lsw, adascale, lena, lamb; adam, adam_lena (ours)
  batch_scale: int
  warmup: str
  seed: int
  alpha: float = 0.05
  grouping: str = "leaf"
  epochs: int = 0  # 0 = the preset's budget

  @property
  def name(self) -> str:
    parts = [self.optimizer, f"s{self.batch_scale}", self.warmup]
    if self.alpha != 0.05:
      parts.append(f"a{round(self.alpha * 100)}")
    if self.grouping != "leaf":
      parts.append(self.grouping)
    if self.epochs:
      parts.append(f"ep{self.epochs}")
    return "_".join(parts) + f"_seed{self.seed}"


def build_grid(
  p: Preset, seeds: Sequence[int] | None = None, scales: Sequence[int] | None = None
) -> list[RunSpec]:
  """All runs of the study, deduplicated, in the order they should run.

  Args:
    p: the preset.
    seeds: overrides ``p.seeds`` (Table 1 and the baselines).
    scales: overrides ``p.scales`` (Table 1).

  Returns:
    The run specifications: baselines, Table 1, Table 2, Table 3, Table 4.
  """
  seeds = tuple(seeds or p.seeds)
  scales = tuple(scales or p.scales)
  extra_seeds = tuple(s for s in p.extra_seeds if s in seeds) or seeds[:1]
  grid = [RunSpec("sgd", 1, "none", s) for s in seeds]
  grid += [RunSpec(o, sc, w, s) for sc in scales for o, w in PAPER_METHODS for s in seeds]
  grid += [
    RunSpec(o, sc, w, s)
    for sc in p.ablation_scales
    for o in RULES
    for w in WARMUPS
    for s in p.ablation_seeds
    if s in seeds
  ]
  grid += [
    RunSpec("lena", p.alpha_scale, "state_aware", s, alpha=a) for a in p.alphas for s in extra_seeds
  ]
  x = p.extra_scale
  for s in extra_seeds:
    grid += [
      RunSpec("lena", x, "state_aware", s, grouping="module"),
      RunSpec("lena", x, "none", s, grouping="module"),
      RunSpec("lena", x, "none", s),
      RunSpec("adascale", x, "none", s),
    ]
    if p.long_epochs:
      grid += [RunSpec(o, x, w, s, epochs=p.long_epochs) for o, w in PAPER_METHODS]
      grid += [RunSpec("sgd", 1, "none", s, epochs=p.long_epochs)]
    grid += [
      RunSpec("adam", x, "none", s),
      RunSpec("adam_lena", x, "state_aware", s),
      RunSpec("lamb", x, "none", s),
    ]
  return list(dict.fromkeys(grid))  # dedupe (Table 1 cells reappear in Table 2), keep order


# ----------------------------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------------------------


def run_config(p: Preset, spec: RunSpec, cache_dir: str) -> configs_lib.Config:
  """The trainer configuration of one run."""
  epochs = spec.epochs or p.num_epochs
  large = spec.batch_scale > 1
  updates_per_epoch = (p.num_samples * 0.8) / (p.per_worker_batch * spec.batch_scale)
  lr = {"lamb": p.lamb_lr, "adam": p.adam_lr, "adam_lena": p.adam_lr}.get(
    spec.optimizer, p.learning_rate
  )
  return dataclasses.replace(
    configs_lib.get_config("default"),
    cache_dir=cache_dir,
    mnist1d_num_samples=p.num_samples,
    width=p.width,
    optimizer=spec.optimizer,
    warmup=spec.warmup,
    learning_rate=lr,
    warmup_alpha=spec.alpha,
    grouping=spec.grouping,
    per_worker_batch=p.per_worker_batch,
    batch_scale=spec.batch_scale,
    # One device, S micro-batches: the same numbers as S workers (tested in the repo), and
    # on a 2-core host simulated devices would only add overhead.
    num_devices=1,
    micro_batches=0,
    num_epochs=epochs,
    seed=spec.seed,
    # Large batches make few updates per epoch: evaluate several times an epoch so that
    # "iterations to target" is precise; the baseline once an epoch.
    eval_every=max(1, round(updates_per_epoch / p.evals_per_epoch)) if large else 0,
    log_every=0,
    checkpoint_every=0,
    progress_bar=False,
    rng_impl=p.rng_impl,
  )


def is_finished(workdir: Path) -> bool:
  """Whether the run's metrics reach its last update (then the study skips it)."""
  try:
    total = json.loads((workdir / "config.json").read_text())["total_steps"]
    evals = metrics.read_metrics(workdir, "eval")
  except (FileNotFoundError, json.JSONDecodeError, KeyError):
    return False
  return bool(evals) and evals[-1]["iteration"] == total


def check_same_config(workdir: Path, config: configs_lib.Config) -> None:
  """Refuses to resume into a run directory written with another configuration.

  Run names do not encode the preset's sizes (data, epochs, rates), so e.g. ``--epochs 30``
  into a directory of 20-epoch runs would otherwise skip runs of the wrong budget.

  Raises:
    ValueError: naming the fields that differ.
  """
  try:
    stored = json.loads((workdir / "config.json").read_text())
  except (FileNotFoundError, json.JSONDecodeError):
    return
  ignore = {"progress_bar", "cache_dir"}  # do not change the numbers
  changed = sorted(
    k
    for k, v in dataclasses.asdict(config).items()
    if k not in ignore and k in stored and stored[k] != v
  )
  if changed:
    raise ValueError(
      f"{workdir} holds a run with other settings ({', '.join(changed)}); "
      "use another --out for this preset/options."
    )


def run_grid(
  p: Preset, grid: list[RunSpec], out: Path, cache_dir: str, shard: tuple[int, int] = (0, 1)
) -> tuple[int, int]:
  """Trains the grid's unfinished runs (this shard's share), printing progress.

  Returns:
    ``(trained, skipped)`` counts.
  """
  index, count = shard
  mine = [s for i, s in enumerate(grid) if i % count == index]
  trained = skipped = 0
  start = time.perf_counter()
  for i, spec in enumerate(mine, 1):
    workdir = out / "runs" / spec.name
    head = f"[{i}/{len(mine)}] {spec.name}"
    config = run_config(p, spec, cache_dir)
    check_same_config(workdir, config)
    if is_finished(workdir):
      skipped += 1
      print(f"{head}: finished earlier, skipped", flush=True)
      continue
    t0 = time.perf_counter()
    with optimizers.registered(*STUDY_OPTIMIZERS):
      train.train_and_evaluate(config, workdir)
    trained += 1
    final = metrics.read_metrics(workdir, "eval")[-1]
    print(
      f"{head}: acc {final['eval_accuracy']:.4f} after {final['iteration']} updates, "
      f"{time.perf_counter() - t0:.0f} s (study {time.perf_counter() - start:.0f} s)",
      flush=True,
    )
  return trained, skipped


# ----------------------------------------------------------------------------------------------
# Summaries
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class RunResult:
  """What the tables need from one finished run."""

  spec: RunSpec
  evals: list[dict[str, Any]]
  total_steps: int

  @property
  def final(self) -> float:
    return self.evals[-1]["eval_accuracy"]

  def reach(self, target: float) -> dict[str, float] | None:
    """Iteration, epoch and wall time of the first evaluation at >= target (None: never)."""
    r = analysis.first_reaching(self.evals, target)
    if r is None:
      return None
    return {"iterations": r["iteration"], "epochs": r["epoch"], "wall": r["wall_time"]}


def load_results(grid: list[RunSpec], out: Path) -> dict[RunSpec, RunResult]:
  """The finished runs of the grid."""
  results = {}
  for spec in grid:
    workdir = out / "runs" / spec.name
    if is_finished(workdir):
      total = json.loads((workdir / "config.json").read_text())["total_steps"]
      results[spec] = RunResult(spec, metrics.read_metrics(workdir, "eval"), total)
  return results


def _mean_std(values: Sequence[float], fmt: str = ".4f") -> str:
  if not values:
    return "—"
  if len(values) == 1:
    return format(values[0], fmt)
  return f"{statistics.mean(values):{fmt}} ± {statistics.stdev(values):{fmt}}"


class Summary:
  """Aggregates finished runs over seeds against per-seed targets."""

  def __init__(self, results: dict[RunSpec, RunResult]):
    self.results = results
    # Per (seed, epochs): 98% of that seed's single-worker accuracy at the same budget.
    self.targets = {
      (s.seed, s.epochs): TARGET_FRACTION * r.final
      for s, r in results.items()
      if s.optimizer == "sgd"
    }

  def runs(self, seeds: Sequence[int], **fields: Any) -> list[RunResult]:
    """Finished runs with these spec fields, one per seed."""
    out = []
    for seed in seeds:
      spec = RunSpec(seed=seed, **fields)
      if spec in self.results:
        out.append(self.results[spec])
    return out

  def target(self, r: RunResult, fraction: float = TARGET_FRACTION) -> float | None:
    """``fraction`` x the run's seed's SGD accuracy (same budget if run, else default)."""
    key = (r.spec.seed, r.spec.epochs)
    t = self.targets.get(key, self.targets.get((r.spec.seed, 0)))
    return None if t is None else t * fraction / TARGET_FRACTION

  def cells(self, runs: list[RunResult]) -> dict[str, str]:
    """acc@budget, best acc and epochs/iterations/wall to target as 'mean ± std' strings;
    ``loose`` is the iterations to the looser target."""
    if not runs:
      return dict.fromkeys(("acc", "best", "epochs", "iterations", "wall", "n", "loose"), "—")

    def to_target(key: str, fmt: str, fraction: float = TARGET_FRACTION) -> str:
      reached = [r.reach(t) for r in runs if (t := self.target(r, fraction)) is not None]
      hits = [h for h in reached if h is not None]
      if not reached:
        return "no baseline"
      if not hits:
        return "never"
      text = _mean_std([h[key] for h in hits], fmt)
      return text if len(hits) == len(reached) else f"{text} ({len(hits)}/{len(reached)})"

    return {
      "acc": _mean_std([r.final for r in runs]),
      "best": _mean_std([max(e["eval_accuracy"] for e in r.evals) for r in runs]),
      "epochs": to_target("epochs", ".1f"),
      "iterations": to_target("iterations", ".0f"),
      "wall": to_target("wall", ".0f"),
      "n": str(len(runs)),
      "loose": to_target("iterations", ".0f", LOOSE_FRACTION),
    }


def table1(sm: Summary, p: Preset, seeds: Sequence[int], scales: Sequence[int]) -> str:
  """Paper Table 1: accuracy at the budget and epochs/iterations/time to the target."""
  lines = [
    "| S | global batch | method | seeds | test acc @ budget | best acc | epochs to "
    "target | iterations to target | wall s to target | iterations to "
    f"{LOOSE_FRACTION:.0%} |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  base = sm.cells(sm.runs(seeds, optimizer="sgd", batch_scale=1, warmup="none"))
  lines.append(
    f"| 1 | {p.per_worker_batch} | SGD 1 worker | {base['n']} | {base['acc']} | "
    f"{base['best']} | {base['epochs']} | {base['iterations']} | {base['wall']} | "
    f"{base['loose']} |"
  )
  for s in scales:
    for opt, warm in PAPER_METHODS:
      c = sm.cells(sm.runs(seeds, optimizer=opt, batch_scale=s, warmup=warm))
      lines.append(
        f"| {s} | {s * p.per_worker_batch} | {label_of(opt)} ({warm}) | {c['n']} "
        f"| {c['acc']} | {c['best']} | {c['epochs']} | {c['iterations']} | "
        f"{c['wall']} | {c['loose']} |"
      )
  return "\n".join(lines)


def table2(sm: Summary, p: Preset, seeds: Sequence[int]) -> str:
  """Paper Table 2: rule x warm-up at each ablation scale (acc; iterations to target)."""
  blocks = []
  for s in p.ablation_scales:
    lines = [
      f"S = {s} (batch {s * p.per_worker_batch}); cell: test acc @ budget "
      f"[iterations to target / to {LOOSE_FRACTION:.0%}]",
      "",
      "| rule \\ warm-up | " + " | ".join(WARMUPS) + " |",
      "|---|---|---|---|",
    ]
    for opt in RULES:
      row = []
      for w in WARMUPS:
        c = sm.cells(sm.runs(seeds, optimizer=opt, batch_scale=s, warmup=w))
        row.append(f"{c['acc']} [{c['iterations']} / {c['loose']}]")
      lines.append(f"| {label_of(opt)} | " + " | ".join(row) + " |")
    blocks.append("\n".join(lines))
  return "\n\n".join(blocks)


def _warmup_ends(r: RunResult) -> list[int]:
  """Per-layer iteration at which LENA's warm-up ended (-1 = never) at the end of the run."""
  return list(r.evals[-1].get("warmup_end_step", {}).values())


def table3(sm: Summary, p: Preset, seeds: Sequence[int]) -> str:
  """Paper Table 3: LENA's alpha; with the range of the per-layer warm-up end iterations."""
  lines = [
    f"S = {p.alpha_scale} (batch {p.alpha_scale * p.per_worker_batch}), LENA with "
    "state-aware warm-up",
    "",
    f"| alpha | seeds | test acc @ budget | iterations to target / to "
    f"{LOOSE_FRACTION:.0%} | per-layer warm-up end (iteration, min-max, seed 0) | "
    "total iterations |",
    "|---|---|---|---|---|---|",
  ]
  for a in p.alphas:
    runs = sm.runs(
      seeds, optimizer="lena", batch_scale=p.alpha_scale, warmup="state_aware", alpha=a
    )
    c = sm.cells(runs)
    ends = _warmup_ends(runs[0]) if runs else []
    span = (
      f"{min(ends)}-{max(ends)}" if ends and min(ends) >= 0 else ("not all ended" if ends else "—")
    )
    total = runs[0].total_steps if runs else "—"
    lines.append(
      f"| {a:.0%} | {c['n']} | {c['acc']} | {c['iterations']} / {c['loose']} | {span} | {total} |"
    )
  return "\n".join(lines)


def table4(sm: Summary, p: Preset, seeds: Sequence[int]) -> str:
  """What makes layer-wise scaling win or lose: grouping, warm-up, budget, inner update."""
  x, long = p.extra_scale, p.long_epochs
  rows = [
    ("LENA per-leaf, state-aware (paper)", dict(optimizer="lena", warmup="state_aware")),
    (
      "LENA per-module, state-aware",
      dict(optimizer="lena", warmup="state_aware", grouping="module"),
    ),
    ("LENA per-leaf, no warm-up", dict(optimizer="lena", warmup="none")),
    ("LENA per-module, no warm-up", dict(optimizer="lena", warmup="none", grouping="module")),
    ("AdaScale (global ratio), no warm-up", dict(optimizer="adascale", warmup="none")),
    ("LSW, fixed warm-up", dict(optimizer="lsw", warmup="fixed")),
  ]
  if long:
    rows += [
      (f"{label_of(o)} ({w}), {long} epochs", dict(optimizer=o, warmup=w, epochs=long))
      for o, w in PAPER_METHODS
    ]
  rows += [
    (f"Adam (lr {p.adam_lr:g}, no scaling)", dict(optimizer="adam", warmup="none")),
    (
      f"Adam + LENA ratios + state-aware warm-up (lr {p.adam_lr:g})",
      dict(optimizer="adam_lena", warmup="state_aware"),
    ),
    (f"LAMB (optax.lamb, lr {p.lamb_lr:g})", dict(optimizer="lamb", warmup="none")),
  ]
  lines = [
    f"S = {x} (batch {x * p.per_worker_batch}); default budget {p.num_epochs} epochs; "
    "target = 98% of the single-worker SGD accuracy at the same budget",
    "",
    "| variant | seeds | test acc @ budget | best acc | iterations to target | "
    f"epochs to target | iterations to {LOOSE_FRACTION:.0%} |",
    "|---|---|---|---|---|---|---|",
  ]
  if long:
    c = sm.cells(sm.runs(seeds, optimizer="sgd", batch_scale=1, warmup="none", epochs=long))
    lines.append(
      f"| SGD 1 worker, {long} epochs | {c['n']} | {c['acc']} | {c['best']} | "
      f"{c['iterations']} | {c['epochs']} | {c['loose']} |"
    )
  for label, fields in rows:
    c = sm.cells(sm.runs(seeds, batch_scale=x, **fields))
    lines.append(
      f"| {label} | {c['n']} | {c['acc']} | {c['best']} | {c['iterations']} | "
      f"{c['epochs']} | {c['loose']} |"
    )
  return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------


def _mean_curve(runs: list[RunResult]) -> tuple[list[int], list[float]]:
  """Accuracy vs iteration averaged over seeds (the evaluation iterations coincide)."""
  n = min(len(r.evals) for r in runs)
  its = [runs[0].evals[i]["iteration"] for i in range(n)]
  return its, [statistics.mean(r.evals[i]["eval_accuracy"] for r in runs) for i in range(n)]


def plot_all(
  sm: Summary, p: Preset, seeds: Sequence[int], scales: Sequence[int], out: Path
) -> list[Path]:
  """Accuracy vs iterations per scale, accuracy at budget vs scale, LENA's warm-up ends."""
  paths = []
  base = sm.runs(seeds, optimizer="sgd", batch_scale=1, warmup="none")
  target = (TARGET_FRACTION * statistics.mean(r.final for r in base)) if base else None
  base_label = label_of("sgd")
  for s in scales:
    curves = {base_label: _mean_curve(base)} if base else {}
    for opt, warm in PAPER_METHODS:
      runs = sm.runs(seeds, optimizer=opt, batch_scale=s, warmup=warm)
      if runs:
        curves[f"{label_of(opt)} ({warm}, {len(runs)} seeds)"] = _mean_curve(runs)
    hlines = [] if target is None else [(target, f"target ({TARGET_FRACTION:.0%} of 1 worker)")]
    fig = analysis.plot_accuracy(
      curves,
      hlines,
      title=f"MNIST-1D, S={s} (batch {s * p.per_worker_batch}), {p.num_epochs} epochs",
      colors={base_label: "k"},
    )
    paths.append(analysis.save_figure(fig, out / f"accuracy_vs_iterations_s{s}.png", dpi=110))

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
  lena = {
    s: sm.runs(seeds[:1], optimizer="lena", batch_scale=s, warmup="state_aware") for s in scales
  }
  lena = {s: r[0] for s, r in lena.items() if r}
  if lena:
    fixed = configs_lib.Config().warmup_fraction  # LSW's W as a fraction of the run
    fig = analysis.plot_warmup_ends(
      {
        f"S={s} ({r.total_steps} iterations)": (
          r.evals[-1].get("warmup_end_step", {}),
          r.total_steps,
        )
        for s, r in lena.items()
      },
      fraction=True,
      fixed_end=fixed,
      fixed_label=f"LSW fixed warm-up end ({fixed:.1%})",
    )
    paths.append(analysis.save_figure(fig, out / "lena_warmup_end.png", dpi=110))
  return paths


def report(
  p: Preset,
  grid: list[RunSpec],
  out: Path,
  seeds: Sequence[int],
  scales: Sequence[int],
  header: str,
) -> str:
  """Writes ``tables.md``, ``summary.json`` and the plots from the finished runs."""
  results = load_results(grid, out)
  sm = Summary(results)
  text = (
    "\n\n".join(
      [
        header,
        f"Finished runs: {len(results)} of {len(grid)} in the grid. Target = "
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
  (out / "tables.md").write_text(text)
  plots = plot_all(sm, p, seeds, scales, out)
  summary = {
    "preset": dataclasses.asdict(p),
    "seeds": list(seeds),
    "scales": list(scales),
    "targets": {f"seed{s}_ep{e or p.num_epochs}": t for (s, e), t in sm.targets.items()},
    "runs": {
      spec.name: {
        "final_accuracy": r.final,
        "total_steps": r.total_steps,
        "wall_time": r.evals[-1]["wall_time"],
        "reach": r.reach(t) if (t := sm.target(r)) is not None else None,
      }
      for spec, r in results.items()
    },
    "plots": [p_.name for p_ in plots],
  }
  (out / "summary.json").write_text(json.dumps(summary, indent=2))
  return text


def main(argv: Sequence[str] | None = None) -> str:
  """Command-line entry point; returns the tables' text."""
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.large_batch.study",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  size = parser.add_mutually_exclusive_group()
  size.add_argument("--quick", action="store_true", help="the ~40-CPU-minute preset")
  size.add_argument("--smoke", action="store_true", help="a < 60 s plumbing check (CI)")
  parser.add_argument("--out", default="benchmarks/large_batch/results")
  parser.add_argument("--seeds", type=int, nargs="+", help="override the preset's seeds")
  parser.add_argument("--scales", type=int, nargs="+", help="override Table 1's scales")
  parser.add_argument(
    "--ablation_seeds",
    type=int,
    nargs="+",
    help="override the seeds of Tables 2-4 (a subset of --seeds)",
  )
  parser.add_argument("--epochs", type=int, help="override the epoch budget")
  parser.add_argument("--cache_dir", default="data_cache", help="MNIST-1D cache")
  parser.add_argument("--shard", default="0/1", help="I/N: run every N-th run from the I-th")
  parser.add_argument("--report_only", action="store_true", help="no training: tables only")
  args = parser.parse_args(argv)
  preset_name = "smoke" if args.smoke else "quick" if args.quick else "full"
  p = PRESETS[preset_name]
  if args.epochs:
    p = dataclasses.replace(p, num_epochs=args.epochs)
  if args.ablation_seeds:
    p = dataclasses.replace(
      p, ablation_seeds=tuple(args.ablation_seeds), extra_seeds=tuple(args.ablation_seeds)
    )
  seeds, scales = tuple(args.seeds or p.seeds), tuple(args.scales or p.scales)
  grid = build_grid(p, seeds, scales)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  index, count = (int(v) for v in args.shard.split("/"))
  start = time.perf_counter()
  print(
    f"Study '{preset_name}': {len(grid)} runs ({math.ceil(len(grid) / count)} in shard "
    f"{index}/{count}) into {out}/runs",
    flush=True,
  )
  if not args.report_only:
    trained, skipped = run_grid(p, grid, out, args.cache_dir, (index, count))
    print(
      f"Trained {trained}, skipped {skipped} in {time.perf_counter() - start:.0f} s.", flush=True
    )
  header = (
    f"# MNIST-1D large-batch study ('{preset_name}' preset)\n\n"
    f"{int(p.num_samples * 0.8)} training / {int(p.num_samples * 0.2)} test examples, "
    f"CNN1D, per-worker batch {p.per_worker_batch}, {p.num_epochs} epochs for every "
    f"run, eta0 = {p.learning_rate} (momentum 0.9, weight decay 5e-4, exponential decay "
    f"to 1%), seeds {list(seeds)}, Table 1 scales {list(scales)}."
  )
  text = report(p, grid, out, seeds, scales, header)
  print("\n" + text, flush=True)
  return text


if __name__ == "__main__":
  main()
