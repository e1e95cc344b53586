"""The CNN study's grid: its presets, its own optimizer entries and every run of Tables 1-4."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from pathlib import Path

import optax

import optax_lena as ol
from benchmarks import large_batch
from examples import optimizers

RULES = ("linear_scaling", "adascale", "lena")
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


# The table label of an optimizer (this study's, or the registry's).
label_of = functools.partial(large_batch.label_of, study_optimizers=STUDY_OPTIMIZERS)


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
class Sizes:
  """A preset by name, with Table 1's seeds and scales, the seeds of Tables 2-4 (a subset of
  ``seeds``) and the epoch budget changed where given (empty, 0: the preset's)."""

  name: str
  seeds: tuple[int, ...] = ()
  scales: tuple[int, ...] = ()
  ablation_seeds: tuple[int, ...] = ()
  epochs: int = 0

  def resolved(self) -> tuple[Preset, tuple[int, ...], tuple[int, ...]]:
    """The preset (its ablation seeds and budget changed), Table 1's seeds and scales."""
    p = PRESETS[self.name]
    if self.epochs:
      p = dataclasses.replace(p, num_epochs=self.epochs)
    if self.ablation_seeds:
      p = dataclasses.replace(
        p, ablation_seeds=self.ablation_seeds, extra_seeds=self.ablation_seeds
      )
    return p, self.seeds or p.seeds, self.scales or p.scales


SETUPS = {
  # The committed study (RESULTS.md): the quick sizes, three seeds, Table 1 at five scales,
  # Tables 2-4 on two seeds.
  "default": Sizes("quick", (0, 1, 2), (8, 16, 32, 64, 128), (0, 1)),
  "quick": Sizes("quick"),
  "full": Sizes("full"),
  "smoke": Sizes("smoke"),
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
    return large_batch.run_name(self, *options)


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
  grid = large_batch.baselines(RunSpec, seeds)
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
  return large_batch.unique(grid)


def cells(sizes: Sizes, out: Path) -> list[RunSpec]:
  """The grid of ``sizes`` (it does not depend on results)."""
  del out
  return build_grid(*sizes.resolved())
