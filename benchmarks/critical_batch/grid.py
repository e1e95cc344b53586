"""The critical-batch measurements' declared sizes: the CNN with AdaScale and LENA, the attention
model with AdaScale-AdamW and LENA-AdamW (each one cell, one JSON)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Measurement:
  """One measurement's sizes (``quick()``: the smoke test's)."""

  model: str = "cnn"  # 'cnn' (momentum SGD rules) or 'attention' (AdamW rules)
  optimizer: str = "adascale"  # a key of OPTIMIZERS[model]
  learning_rate: float = 0.02  # eta0 of one per-worker batch; the rule scales it by its ratio
  momentum: float = 0.9  # the CNN's; AdamW keeps the library's b1, b2
  power: float = 0.5  # the AdamW rules' exponent of the ratio (the library's default)
  per_worker_batch: int = 16
  features: int = 32
  num_samples_main: int = 4  # S of the main run
  checkpoints: tuple[int, ...] = (20, 100, 400, 1500)  # updates of the main run
  scales: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)  # S of the branches
  seeds: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7)
  decrease: float = 0.1  # target: the checkpoint's loss times (1 - decrease)
  max_updates: int = 600  # per branch; not reached: left out of the fit
  eval_examples: int = 4096  # the fixed training subset whose loss is measured
  fresh_workers: int = 256  # per-worker gradients of the fresh B_simple
  mnist1d_samples: int = 10_000

  @property
  def name(self) -> str:
    """The measurement's file name (the CNN's keep their names: critical_batch_lena.json)."""
    kind = self.optimizer if self.model == "cnn" else f"{self.model}_{self.optimizer}"
    return f"critical_batch_{kind}"


OPTIMIZERS = {"cnn": ("adascale", "lena"), "attention": ("adascale_adamw", "lena_adamw")}


def attention(optimizer: str = "lena_adamw") -> Measurement:
  """The attention model's measurement (RESULTS.md gives its duration).

  As in ``benchmarks/adamw_scaling``: per-worker batch 8, weight decay 1e-4 on kernels, main run
  at S = 8. The rate is that study's tuned 1e-2 at batch 64 brought to one per-worker batch of 8
  by the square-root rule, so that branches down to S = 1 need no reference batch above theirs.
  """
  return Measurement(
    model="attention",
    optimizer=optimizer,
    learning_rate=1e-2 / math.sqrt(8),
    per_worker_batch=8,
    num_samples_main=8,
    checkpoints=(20, 100, 300, 1000),
    scales=(1, 2, 4, 8, 16, 32, 64),
    seeds=(0, 1, 2, 3, 4, 5, 6, 7),
    decrease=0.1,
    max_updates=1000,  # the small S need many updates late in training (Adam at a low rate)
    eval_examples=2048,
  )


def quick(model: str = "cnn") -> Measurement:
  """A seconds-long setup for the smoke test (of the CNN or of the attention model)."""
  base = Measurement() if model == "cnn" else attention()
  return dataclasses.replace(
    base,
    features=8,
    per_worker_batch=8,
    checkpoints=(5, 15, 30),
    scales=(1, 2, 4),
    seeds=(0,),
    decrease=0.01,
    max_updates=40,
    eval_examples=256,
    fresh_workers=16,
    mnist1d_samples=1000,
  )


@dataclasses.dataclass(frozen=True)
class Measurements:
  """The measurements of a setup, in the order they run."""

  measurements: tuple[Measurement, ...]


DEFAULT = Measurements(
  (
    Measurement(),
    Measurement(optimizer="lena"),
    attention("lena_adamw"),
    attention("adascale_adamw"),
  )
)
SMOKE = Measurements((quick(),))


def cells(setup: Measurements, out: Path) -> list[Measurement]:
  """Every measurement of the setup (the grid does not depend on results)."""
  del out
  return list(setup.measurements)
