"""Reproduction study of LENA (Ko et al., WWW 2022) on MNIST-1D: Tables 1-3 and ablations.

The grid (every cell x seeds; the single-worker SGD baseline once per seed):

* **Table 1**: batch scale S x {LSW (fixed warm-up), AdaScale (none), LENA (state-aware)}.
* **Table 2**: the 3x3 ablation {linear scaling, AdaScale, LENA} x warm-up {none, fixed,
  state-aware} at the ``ablation_scales`` (the largest by default: that is where the paper's
  table is).
* **Table 3**: LENA's warm-up threshold alpha in {1, 3, 5, 7, 9}% at ``alpha_scale``.
* **Table 4** ("what makes layer-wise scaling win or lose", at ``extra_scale``): per-module
  instead of per-leaf grouping, a longer epoch budget, and layer-wise ratios around an Adam
  inner update (``optax.scale_by_adam`` -> ``ol.scale_by_lena`` -> ``ol.layerwise_warmup`` ->
  ``ol.scale_by_learning_rate``) next to plain Adam and ``optax.lamb``. The two Adam variants
  are this study's own entries of the optimizer registry (:data:`STUDY_OPTIMIZERS`), registered
  while the study trains.

Every run is one in-process call of the trainer (``examples.lena.train_and_evaluate``) into
``<out>/runs/<name>`` (metrics.jsonl + config.json, no checkpoints), through
``benchmarks.harness.run_grid``: finished runs are skipped, ``--shard I/N`` lets N processes
share one grid. The raw runs are kept as ``<out>/runs.tar.xz`` (unpacked into ``runs/`` when
missing, repacked after training); every invocation ends by writing the tables (``tables.md``,
``summary.json``) and plots of whatever has finished.

Usage::

  python -m benchmarks.large_batch_cnn.study --smoke --out /tmp/smoke     # seconds, CI
  python -m benchmarks.large_batch_cnn.study --quick                      # the ~40-minute preset
  python -m benchmarks.large_batch_cnn.study                              # the full grid (hours)
  python -m benchmarks.large_batch_cnn.study --quick --shard 0/2 &        # two processes
  python -m benchmarks.large_batch_cnn.study --quick --shard 1/2
  python -m benchmarks.large_batch_cnn.study --quick --seeds 0 1 2 --scales 8 16 32 64 128 \
      --ablation_seeds 0 1 --report_only                                  # RESULTS.md's tables
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
from collections.abc import Sequence
from pathlib import Path

import optax

import optax_lena as ol
from benchmarks import harness
from benchmarks import large_batch_grid as grid_lib
from benchmarks import large_batch_runs as runs_lib
from examples import lena, optimizers

RULES = ("linear_scaling", "adascale", "lena")
# Table 1's methods, each with the paper's warm-up (the registry's paper_warmup).
PAPER_METHODS = tuple((o, optimizers.get(o).paper_warmup) for o in RULES)
WARMUPS = optimizers.WARMUPS
DEFAULT_OUT = "benchmarks/large_batch_cnn/results"


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


# The table label of an optimizer (this study's, or the registry's).
label_of = functools.partial(grid_lib.label_of, study_optimizers=STUDY_OPTIMIZERS)


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
  # Plumbing only (CI): a small draw, a narrow CNN, two epochs. No Table-2 ablation: its six
  # rule x warm-up runs beyond Table 1's go through the same grid and trainer calls as the
  # others and would only add their compilations (Table 2's cells are rebuilt from the
  # committed archives by the committed-tables test).
  "smoke": Preset(
    num_samples=1000,
    per_worker_batch=8,
    num_epochs=2,
    learning_rate=0.05,
    scales=(8,),
    seeds=(0,),
    ablation_scales=(),
    ablation_seeds=(0,),
    alpha_scale=8,
    alphas=(0.05,),  # the default: Table 3's row is Table 1's LENA run (one run less to train)
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

  optimizer: str  # a registry name: sgd, linear_scaling, adascale, lena, lamb; adam, adam_lena
  batch_scale: int
  warmup: str
  seed: int
  alpha: float = 0.05
  grouping: str = "leaf"
  epochs: int = 0  # 0 = the preset's budget

  @property
  def name(self) -> str:
    options = [f"a{round(self.alpha * 100)}"] if self.alpha != 0.05 else []
    options += [self.grouping] if self.grouping != "leaf" else []
    return grid_lib.run_name(self, *options)


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
  grid = grid_lib.baselines(RunSpec, seeds)
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
  return grid_lib.unique(grid)


def run_config(p: Preset, spec: RunSpec, cache_dir: str) -> lena.Config:
  """The trainer configuration of one run."""
  epochs = spec.epochs or p.num_epochs
  large = spec.batch_scale > 1
  updates_per_epoch = (p.num_samples * 0.8) / (p.per_worker_batch * spec.batch_scale)
  lr = {"lamb": p.lamb_lr, "adam": p.adam_lr, "adam_lena": p.adam_lr}.get(
    spec.optimizer, p.learning_rate
  )
  return grid_lib.trainer_config(
    "default",
    spec,
    num_samples=p.num_samples,
    per_worker_batch=p.per_worker_batch,
    cache_dir=cache_dir,
    width=p.width,
    learning_rate=lr,
    warmup_alpha=spec.alpha,
    grouping=spec.grouping,
    num_epochs=epochs,
    # Large batches make few updates per epoch: evaluate several times an epoch so that
    # "iterations to target" is precise; the baseline once an epoch.
    eval_every=max(1, round(updates_per_epoch / p.evals_per_epoch)) if large else 0,
    log_every=0,
    rng_impl=p.rng_impl,
  )


def train_grid(
  p: Preset, grid: list[RunSpec], out: Path, cache_dir: str, shard: tuple[int, int] = (0, 1)
) -> tuple[int, int]:
  """Trains the grid's unfinished runs (this shard's share); returns ``(trained, skipped)``."""
  config_of = functools.partial(run_config, p, cache_dir=cache_dir)
  return grid_lib.train_grid(grid, config_of, out, STUDY_OPTIMIZERS, shard)


def main(argv: Sequence[str] | None = None) -> str:
  """Command-line entry point; returns the tables' text."""
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.large_batch_cnn.study",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  size = parser.add_mutually_exclusive_group()
  size.add_argument("--quick", action="store_true", help="the ~40-CPU-minute preset")
  size.add_argument("--smoke", action="store_true", help="a few-second plumbing check (CI)")
  parser.add_argument("--out", default=DEFAULT_OUT)
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
  parser.add_argument(
    "--only", nargs="+", help="train only the runs whose name starts with one of these prefixes"
  )
  args = parser.parse_args(argv)
  shard = harness.parse_shard(args.shard)
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
  harness.unpack_runs(out)
  print(
    f"Study '{preset_name}': {len(grid)} runs ({math.ceil(len(grid) / shard[1])} in shard "
    f"{shard[0]}/{shard[1]}) into {out}/runs",
    flush=True,
  )
  if not args.report_only:
    selected = [sp for sp in grid if not args.only or sp.name.startswith(tuple(args.only))]
    trained, _ = train_grid(p, selected, out, args.cache_dir, shard)
    if trained:
      harness.pack_runs(out)
  header = (
    f"# MNIST-1D large-batch study ('{preset_name}' preset)\n\n"
    f"{int(p.num_samples * 0.8)} training / {int(p.num_samples * 0.2)} test examples, "
    f"CNN1D, per-worker batch {p.per_worker_batch}, {p.num_epochs} epochs for every "
    f"run, eta0 = {p.learning_rate} (momentum 0.9, weight decay 5e-4, exponential decay "
    f"to 1%), seeds {list(seeds)}, Table 1 scales {list(scales)}."
  )
  from benchmarks.large_batch_cnn import report  # it reads this module's grid

  sm = runs_lib.Summary(runs_lib.load_results(grid, out / "runs"))
  text = report.write(sm, p, len(grid), out, seeds, scales, header)
  print("\n" + text, flush=True)
  return text


if __name__ == "__main__":
  main()
