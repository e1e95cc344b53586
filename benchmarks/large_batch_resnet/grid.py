"""The ResNet1D study's grids: the main study's presets and groups of runs, and the equal-tuning
sweep and final seeds (``EqualTuning``), with the study's own LENA warm-up variants."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optax

import optax_lena as ol
from benchmarks import harness, large_batch
from examples import optimizers

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
label = functools.partial(large_batch.label_of, study_optimizers=STUDY_OPTIMIZERS)


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
    return large_batch.run_name(
      self, *([f"lr{self.learning_rate:g}"] if self.learning_rate else [])
    )


def tuned_rate(sm: large_batch.Summary, p: Preset, opt: str, s: int, seed: int) -> float:
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
  grid = large_batch.baselines(RunSpec, seeds)
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
    swept = large_batch.Summary(large_batch.load_results(grid, out / "runs"))
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
  return large_batch.unique(grid)


@dataclasses.dataclass(frozen=True)
class Sizes:
  """A preset by name, the groups to run, and the seeds and scales (empty: the preset's). The
  report covers the preset's whole grid whatever was run."""

  name: str
  groups: tuple[str, ...] = GROUPS
  seeds: tuple[int, ...] = ()
  scales: tuple[int, ...] = ()


def cells(sizes: Sizes, out: Path) -> list[RunSpec]:
  """The grid of ``sizes``; the tuned LARS/LAMB runs join once their sweep has finished."""
  p = PRESETS[sizes.name]
  return build_grid(p, out, sizes.groups, sizes.seeds or p.seeds, sizes.scales or p.scales)


# ------------------------------------------------------------------------------------------------
# Equal tuning: LENA, AdaScale, LARS and LAMB under one rate sweep and one selection rule
# ------------------------------------------------------------------------------------------------

SELECTION_SEED = 100
FINAL_SEEDS = (0, 1, 2, 3, 4)
VALIDATION_DATA_SEED = 1  # the training/test data are generation seed 0
FILES = (*harness.RUN_FILES, "validation.json")  # an equal-tuning run's files


@dataclasses.dataclass(frozen=True)
class Method:
  """One arm: a registry optimizer, its warm-up and its five swept rates."""

  key: str
  label: str
  optimizer: str
  warmup: str
  rates: tuple[float, ...]


# eta0 x {0.1, 0.3, 1, 3, 10} of the single worker's eta0 = 0.05 (the preset's).
ETA0_RATES = (0.005, 0.015, 0.05, 0.15, 0.5)
METHODS = (
  # LENA and AdaScale with the paper's state-aware warm-up (LENA's documented configuration):
  # the same warm-up for both, so LENA - AdaScale compares the layer-wise with the global rule.
  Method("lena", "LENA (SA)", "lena", "state_aware", ETA0_RATES),
  Method("adascale", "AdaScale (SA)", "adascale", "state_aware", ETA0_RATES),
  Method("lars", "LARS (fixed)", "lars", "fixed", (1.0, 3.0, 10.0, 30.0, 100.0)),
  Method("lamb", "LAMB (fixed)", "lamb", "fixed", (0.003, 0.01, 0.03, 0.1, 0.3)),
)
# The questions (A - B), paired by seed on the test accuracy.
PAIRS = (("lena", "lars"), ("lena", "lamb"), ("adascale", "lars"), ("lena", "adascale"))


@dataclasses.dataclass(frozen=True)
class EqualTuning:
  """The equal-tuning sizes: a main-study preset, the scale, the seeds and each method's rates."""

  preset: str
  scale: int
  selection_seed: int
  final_seeds: tuple[int, ...]
  methods: tuple[Method, ...]


EQUAL_TUNING = {
  "default": EqualTuning("default", 256, SELECTION_SEED, FINAL_SEEDS, METHODS),
  "smoke": EqualTuning(
    "smoke",
    4,
    SELECTION_SEED,
    (0,),
    # Two rates for LENA (a choice to make), one for LARS (its pairing with LENA): five runs.
    tuple(
      dataclasses.replace(m, rates=m.rates[1:3] if m.key == "lena" else m.rates[1:2])
      for m in METHODS
      if m.key in ("lena", "lars")
    ),
  ),
}


def spec_of(m: Method, setup: EqualTuning, rate: float, seed: int) -> RunSpec:
  """The run of ``m`` at ``rate`` and ``seed`` (the rate always in its name)."""
  return RunSpec(m.optimizer, setup.scale, m.warmup, seed, learning_rate=rate)


def read_validation(out: Path, spec: RunSpec) -> float | None:
  """The validation accuracy of a finished run (None: not finished)."""
  path = out / "runs" / spec.name / "validation.json"
  return json.loads(path.read_text())["accuracy"] if path.exists() else None


def read_test(out: Path, spec: RunSpec) -> list[dict[str, Any]] | None:
  """The evaluation records (test split) of a finished run (None: not finished)."""
  workdir = out / "runs" / spec.name
  if not (workdir / "validation.json").exists() or not harness.is_finished(workdir):
    return None
  from examples import metrics  # imports jax

  return metrics.read_metrics(workdir, "eval")


def choose(rates: Sequence[float], accs: Sequence[float | None]) -> float | None:
  """The rate of the best validation accuracy (ties: the smaller rate); None until every rate
  has finished."""
  if any(a is None for a in accs):
    return None
  pairs = sorted(zip(rates, accs, strict=True))
  best = max(a for _, a in pairs if a is not None)
  return next(r for r, a in pairs if a == best)


def chosen_rates(setup: EqualTuning, out: Path) -> dict[str, float | None]:
  """Each method's selected rate (None while its sweep is unfinished)."""
  return {
    m.key: choose(
      m.rates, [read_validation(out, spec_of(m, setup, r, setup.selection_seed)) for r in m.rates]
    )
    for m in setup.methods
  }


def equal_grid(setup: EqualTuning, out: Path) -> list[RunSpec]:
  """The sweep (rates interleaved across methods), then, once every sweep has finished, the
  final seeds of every method, seed by seed (the grid then no longer changes, so the shards of
  concurrent processes stay disjoint)."""
  n = max(len(m.rates) for m in setup.methods)
  middle_out = sorted(range(n), key=lambda i: (abs(i - n // 2), i))  # 5 rates: 2, 1, 3, 0, 4
  grid = [
    spec_of(m, setup, m.rates[i], setup.selection_seed)
    for i in middle_out
    for m in setup.methods
    if i < len(m.rates)
  ]
  chosen = {k: r for k, r in chosen_rates(setup, out).items() if r is not None}
  if len(chosen) < len(setup.methods):
    return grid
  grid += [spec_of(m, setup, chosen[m.key], sd) for sd in setup.final_seeds for m in setup.methods]
  return grid


def equal_tuning_cells(setup: EqualTuning, out: Path) -> list[RunSpec]:
  """:func:`equal_grid` (it grows once every sweep has finished)."""
  return equal_grid(setup, out)
