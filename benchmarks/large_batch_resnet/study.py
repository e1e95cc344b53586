"""Large-batch study of a deep BatchNorm network: tuned LARS/LAMB, LENA's warm-up variants.

MNIST-1D with :class:`examples.models.ResNet1D` (ResNet-18's 62 parameter leaves, BatchNorm)
instead of the CNN study's 8-leaf CNN. Every optimizer comes from the examples' registry
(``examples.optimizers``); the study registers LENA with the warm-up variants of
``ol.lena(warmup_progress=...)`` while it trains. The grid, in the order it runs (the most
informative cells first):

* ``core``: at ``ablation_scales`` (S = 256, 128), the paper's Table 2 in its shape, rules
  {LSW, AdaScale, LENA} x warm-ups {none, fixed, state-aware}, plus LENA with the two warm-up
  variants ``relative_to_max`` and ``relative_to_mean`` (the per-layer end times: Fig. 7).
* ``key``: the cells that decide the question (LSW fixed, AdaScale without / with the
  state-aware warm-up, LENA without / with the paper's warm-up / with each variant), run first
  with more seeds and at the second scale.
* ``table1``: Table 1's shape at every scale, {LSW (fixed), AdaScale (none), LENA
  (state-aware)} (the paper's), AdaScale (state-aware) and LENA (relative_to_max), 3 seeds.
* ``sweep``: ``optax.lars`` and ``optax.lamb`` with the fixed warm-up, the learning rate chosen
  by the same small sweep (seed 0) at each scale, then the best rate with every seed.
* ``long``: a 3x longer epoch budget at ``long_scale`` (the single worker included).
* ``lr``: sensitivity to eta0 at the first ablation scale.

Every run is one call of the trainer (``examples.lena.train_and_evaluate``) with
``parallel='vmap'``: the S per-worker gradients of an update are one ``vmap`` (each worker
normalises with its own BatchNorm batch, as data-parallel workers), so the statistics are exactly
those of S workers. A run makes ``(train examples // global batch) x epochs`` updates (each
epoch's remainder dropped) and logs the per-layer ratios and rate multipliers about
``ratio_records`` times. Runs go through ``benchmarks.harness.run_grid`` into
``<out>/runs/<name>`` (resumable, ``--shard I/N``), archived as ``<out>/runs.tar.xz``; every
invocation ends by writing ``tables.md``, ``summary.json`` and the plots of whatever finished.

Usage::

  python -m benchmarks.large_batch_resnet.study --smoke --out /tmp/smoke     # seconds (CI)
  python -m benchmarks.large_batch_resnet.study                              # the full grid
  python -m benchmarks.large_batch_resnet.study --groups core --scales 256 --seeds 0 1
  python -m benchmarks.large_batch_resnet.study --groups long --only lena_s256
  python -m benchmarks.large_batch_resnet.study --shard 0/2 &                # two processes
  python -m benchmarks.large_batch_resnet.study --report_only
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import optax

import optax_lena as ol
from benchmarks import harness
from benchmarks import large_batch_grid as grid_lib
from benchmarks import large_batch_runs as runs_lib
from examples import lena, optimizers

RULES = ("linear_scaling", "adascale", "lena")
WARMUPS = optimizers.WARMUPS
# LENA with the warm-up variants of ol.lena(warmup_progress=...): this study's registry names.
VARIANTS = {"lena_relmax": "relative_to_max", "lena_relmean": "relative_to_mean"}
TABLE1 = (
  ("linear_scaling", "fixed"),
  ("adascale", "none"),
  ("lena", "state_aware"),
  ("adascale", "state_aware"),
  ("lena_relmax", "state_aware"),
)
# The cells that answer "when does layer-wise scaling win" (the first to get more seeds/scales).
KEY = (
  ("linear_scaling", "fixed"),
  ("adascale", "none"),
  ("adascale", "state_aware"),
  ("lena", "none"),
  ("lena", "state_aware"),
  ("lena_relmax", "state_aware"),
  ("lena_relmean", "state_aware"),
)
LONG = (
  ("lena", "state_aware"),
  ("adascale", "state_aware"),
  ("lena_relmax", "state_aware"),
  ("adascale", "none"),
)
GROUPS = ("core", "key", "table1", "sweep", "long", "lr")
# eta0 sensitivity (group "lr"): LENA's ratios sit above AdaScale's R for most layers, so the
# same eta0 is a larger rate for LENA; these runs vary eta0 at the first ablation scale.
LR_CELLS = (
  ("lena", "state_aware"),
  ("adascale", "state_aware"),
  ("lena", "none"),
  ("lena_relmax", "state_aware"),
)
LR_FACTORS = (0.5, 0.25, 2.0, 0.125)
DEFAULT_OUT = "benchmarks/large_batch_resnet/results"


def lena_variant(progress: str) -> Callable[[optimizers.Hyperparams], optax.GradientTransformation]:
  """Builder of the registry's LENA (momentum SGD, coupled weight decay, the rate on the sample
  clock) whose state-aware warm-up advances by ``progress``."""

  def build(hp: optimizers.Hyperparams) -> optax.GradientTransformation:
    return ol.lena(
      hp.sample_schedule(),
      momentum=hp.momentum,
      weight_decay=hp.weight_decay,
      clock="samples",
      num_samples=hp.num_samples,
      warmup_progress=progress,
      **hp.warmup_kwargs(),
    )

  return build


STUDY_OPTIMIZERS = tuple(
  optimizers.Optimizer(
    name,
    lena_variant(progress),
    f"LENA, warm-up {progress}",
    paper_warmup="state_aware",
    diagnostics=True,
    warmups=("state_aware",),
  )
  for name, progress in VARIANTS.items()
)


# The table label of an optimizer (this study's, or the registry's).
label = functools.partial(grid_lib.label_of, study_optimizers=STUDY_OPTIMIZERS)


@dataclasses.dataclass(frozen=True)
class Preset:
  """Sizes of the study."""

  num_samples: int  # MNIST-1D examples before the 80/20 train/test split
  per_worker_batch: int
  width: int  # ResNet1D width
  num_epochs: int
  learning_rate: float  # eta0 of one worker (SGD, LSW, AdaScale, LENA)
  scales: tuple[int, ...]
  seeds: tuple[int, ...]
  ablation_scales: tuple[int, ...]
  ablation_seeds: tuple[int, ...]
  sweep_scales: tuple[int, ...]
  lars_lrs: tuple[float, ...]
  lamb_lrs: tuple[float, ...]
  long_scale: int
  long_epochs: int
  long_seeds: tuple[int, ...]
  weight_decay: float = 5e-4
  evals_per_epoch: int = 4
  ratio_records: int = 60  # per-layer diagnostics records per run (about)
  rng_impl: str = "default"  # the trainer's initialisation PRNG ('rbg' compiles faster)


PRESETS = {
  # 8k training examples and per-worker batch 8: S = 256 (batch 2048) makes 3 updates per
  # epoch (each epoch's remainder dropped), like the paper's 16.4k of 45k CIFAR images (2.7).
  "default": Preset(
    num_samples=10_000,
    per_worker_batch=8,
    width=8,
    num_epochs=20,
    learning_rate=0.05,
    scales=(8, 32, 128, 256),
    seeds=(0, 1, 2),
    ablation_scales=(256, 128),
    ablation_seeds=(0, 1, 2),
    sweep_scales=(256, 128, 32, 8),
    lars_lrs=(1.0, 3.0, 10.0, 30.0),
    lamb_lrs=(0.003, 0.01, 0.03, 0.1),
    long_scale=256,
    long_epochs=60,
    long_seeds=(0, 1),
  ),
  "smoke": Preset(
    num_samples=600,
    per_worker_batch=4,
    width=2,
    num_epochs=2,
    learning_rate=0.05,
    scales=(4,),
    seeds=(0,),
    ablation_scales=(4,),
    ablation_seeds=(0,),
    sweep_scales=(4,),
    lars_lrs=(1.0,),
    lamb_lrs=(0.01,),
    long_scale=4,
    long_epochs=3,
    long_seeds=(0,),
    evals_per_epoch=2,
    ratio_records=5,
    rng_impl="rbg",
  ),
}


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One training run; ``name`` encodes everything that differs between runs."""

  optimizer: str  # a registry name
  batch_scale: int
  warmup: str
  seed: int
  learning_rate: float = 0.0  # 0 = the preset's eta0
  epochs: int = 0  # 0 = the preset's budget

  @property
  def name(self) -> str:
    return grid_lib.run_name(self, *([f"lr{self.learning_rate:g}"] if self.learning_rate else []))


def tuned_rate(sm: runs_lib.Summary, p: Preset, opt: str, s: int, seed: int) -> float:
  """The swept rate of ``opt`` with the best final accuracy at S = ``s`` (seed ``seed``); 0.0
  until the whole sweep has finished."""
  accs = {}
  for lr in p.lars_lrs if opt == "lars" else p.lamb_lrs:
    r = sm.runs([seed], optimizer=opt, batch_scale=s, warmup="fixed", learning_rate=lr)
    if not r:
      return 0.0
    accs[lr] = r[0].final
  return max(accs, key=lambda lr: accs[lr])


def build_grid(
  p: Preset,
  out: Path,
  groups: Sequence[str] = GROUPS,
  seeds: Sequence[int] | None = None,
  scales: Sequence[int] | None = None,
) -> list[RunSpec]:
  """The runs of ``groups``, deduplicated, most informative first.

  The tuned LARS/LAMB runs (the best swept rate with every seed) join the grid once their
  sweep has finished in ``out``, so a second invocation runs them.
  """
  seeds = tuple(seeds or p.seeds)
  scales = tuple(scales or p.scales)
  first = seeds[0]
  grid = grid_lib.baselines(RunSpec, seeds)
  if "core" in groups:
    abl = [s for s in p.ablation_scales if s in scales] or list(p.ablation_scales)
    for sd in [s for s in p.ablation_seeds if s in seeds]:
      for sc in abl:
        grid += [RunSpec(o, sc, w, sd) for o in RULES for w in WARMUPS]
        grid += [RunSpec(v, sc, "state_aware", sd) for v in VARIANTS]
  if "key" in groups:
    grid += [RunSpec(o, sc, w, sd) for sd in seeds for sc in scales for o, w in KEY]
  if "table1" in groups:
    grid += [RunSpec(o, sc, w, sd) for sd in seeds for sc in scales for o, w in TABLE1]
  if "sweep" in groups:
    sweep = [s for s in p.sweep_scales if s in scales]
    for sc in sweep:
      grid += [RunSpec("lars", sc, "fixed", first, learning_rate=lr) for lr in p.lars_lrs]
      grid += [RunSpec("lamb", sc, "fixed", first, learning_rate=lr) for lr in p.lamb_lrs]
    swept = runs_lib.Summary(runs_lib.load_results(grid, out / "runs"))
    for sc in sweep:
      for opt in ("lars", "lamb"):
        if lr := tuned_rate(swept, p, opt, sc, first):
          grid += [RunSpec(opt, sc, "fixed", sd, learning_rate=lr) for sd in seeds]
  if "long" in groups:
    for sd in [s for s in p.long_seeds if s in seeds]:
      grid += [RunSpec(o, p.long_scale, w, sd, epochs=p.long_epochs) for o, w in LONG]
      grid.append(RunSpec("sgd", 1, "none", sd, epochs=p.long_epochs))
      grid.append(RunSpec("lena", p.long_scale, "none", sd, epochs=p.long_epochs))
  if "lr" in groups:
    sc = p.ablation_scales[0]
    grid += [
      RunSpec(o, sc, w, first, learning_rate=p.learning_rate * f)
      for f in LR_FACTORS
      for o, w in LR_CELLS
    ]
    # More seeds where LENA without warm-up does best (eta0 / 4), next to AdaScale there.
    grid += [
      RunSpec(o, sc, w, sd, learning_rate=p.learning_rate * 0.25)
      for sd in seeds[1:]
      for o, w in LR_CELLS
    ]
  return grid_lib.unique(grid)


def run_config(p: Preset, spec: RunSpec, cache_dir: str) -> lena.Config:
  """The trainer configuration of one run."""
  s, epochs = spec.batch_scale, spec.epochs or p.num_epochs
  per_epoch = int(p.num_samples * 0.8) // (s * p.per_worker_batch)  # whole updates per epoch
  total = per_epoch * epochs
  return grid_lib.trainer_config(
    "mnist1d_resnet1d",
    spec,
    num_samples=p.num_samples,
    per_worker_batch=p.per_worker_batch,
    cache_dir=cache_dir,
    width=p.width,
    parallel="vmap",
    learning_rate=spec.learning_rate or p.learning_rate,
    weight_decay=p.weight_decay,
    num_epochs=epochs,
    num_steps=total,
    eval_every=max(1, round(per_epoch / p.evals_per_epoch)) if s > 1 else per_epoch,
    log_every=max(1, total // p.ratio_records) if optimizers_with_diagnostics(spec) else 0,
    rng_impl=p.rng_impl,
  )


def optimizers_with_diagnostics(spec: RunSpec) -> bool:
  """Whether the run's optimizer reports per-layer diagnostics (logged over the run)."""
  with optimizers.registered(*STUDY_OPTIMIZERS):
    return optimizers.get(spec.optimizer).diagnostics


def train_grid(
  p: Preset, grid: list[RunSpec], out: Path, cache_dir: str, shard: tuple[int, int]
) -> int:
  """Trains this shard's unfinished runs; returns how many it trained."""

  config_of = functools.partial(run_config, p, cache_dir=cache_dir)
  trained, _ = grid_lib.train_grid(grid, config_of, out, STUDY_OPTIMIZERS, shard)
  return trained


def main(argv: Sequence[str] | None = None) -> str:
  """Command-line entry point; returns the tables' text."""
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.large_batch_resnet.study",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument("--smoke", action="store_true", help="a few-second plumbing check (CI)")
  parser.add_argument("--out", default=DEFAULT_OUT)
  parser.add_argument("--groups", nargs="+", choices=GROUPS, default=list(GROUPS))
  parser.add_argument("--seeds", type=int, nargs="+")
  parser.add_argument("--scales", type=int, nargs="+")
  parser.add_argument("--cache_dir", default="data_cache")
  parser.add_argument("--shard", default="0/1", help="I/N: every N-th run from the I-th")
  parser.add_argument("--report_only", action="store_true")
  parser.add_argument(
    "--only", nargs="+", help="train only the runs whose name starts with one of these prefixes"
  )
  args = parser.parse_args(argv)
  shard = harness.parse_shard(args.shard)
  name = "smoke" if args.smoke else "default"
  p = PRESETS[name]
  seeds, scales = tuple(args.seeds or p.seeds), tuple(args.scales or p.scales)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  harness.unpack_runs(out)

  def selected() -> list[RunSpec]:
    grid = build_grid(p, out, args.groups, seeds, scales)
    return [sp for sp in grid if not args.only or sp.name.startswith(tuple(args.only))]

  grid = selected()
  print(f"Study '{name}': {len(grid)} runs in the grid, shard {shard[0]}/{shard[1]}", flush=True)
  if not args.report_only:
    trained = train_grid(p, grid, out, args.cache_dir, shard)
    # The tuned LARS/LAMB runs join once their sweep is complete: run them now.
    if more := [sp for sp in selected() if sp not in grid]:
      trained += train_grid(p, more, out, args.cache_dir, shard)
    if trained:
      harness.pack_runs(out)
  from benchmarks.large_batch_resnet import report  # it reads this module's grid

  full_grid = build_grid(p, out, GROUPS, p.seeds, p.scales)
  sm = runs_lib.Summary(runs_lib.load_results(full_grid, out / "runs"))
  head = (
    f"# MNIST-1D large-batch study of ResNet1D ('{name}' preset)\n\n"
    f"{int(p.num_samples * 0.8)} training / {int(p.num_samples * 0.2)} test examples, "
    f"ResNet1D width {p.width} (62 parameter leaves, BatchNorm), per-worker batch "
    f"{p.per_worker_batch}, {p.num_epochs} epochs for every run unless stated, eta0 = "
    f"{p.learning_rate} (momentum 0.9, weight decay {p.weight_decay}, exponential decay to 1%)."
  )
  text = report.write(sm, p, len(full_grid), out, head)
  print("\n" + text, flush=True)
  return text


if __name__ == "__main__":
  main()
