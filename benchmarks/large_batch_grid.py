"""What both large-batch studies (``large_batch_cnn``, ``large_batch_resnet``) do alike to build
and train their grids: run names, table labels, the trainer configuration every run shares,
and the resumable training loop with the study's own optimizers registered.

A run specification is a frozen dataclass with ``optimizer``, ``batch_scale``, ``warmup``,
``seed`` and ``epochs`` (0 = the preset's budget), as ``benchmarks.large_batch_runs`` reads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from benchmarks import harness
from examples import lena, optimizers

S = TypeVar("S")


def run_name(spec: Any, *options: str) -> str:
  """``<optimizer>_s<S>_<warmup>[_<option>...][_ep<epochs>]_seed<seed>``: ``options`` are the
  study's own settings that differ from their defaults."""
  parts = [spec.optimizer, f"s{spec.batch_scale}", spec.warmup, *options]
  if spec.epochs:
    parts.append(f"ep{spec.epochs}")
  return "_".join(parts) + f"_seed{spec.seed}"


def label_of(name: str, study_optimizers: Iterable[optimizers.Optimizer]) -> str:
  """The table label of an optimizer: the study's own, or the registry's."""
  own = {e.name: e.label for e in study_optimizers}
  return own[name] if name in own else optimizers.get(name).label


def baselines(spec_type: Callable[..., S], seeds: Sequence[int]) -> list[S]:
  """The single-worker SGD run of every seed (every grid starts with them: the targets)."""
  return [spec_type("sgd", 1, "none", s) for s in seeds]


def unique(grid: Sequence[S]) -> list[S]:
  """The grid without repeated runs (a cell of one table reappears in another), in order."""
  return list(dict.fromkeys(grid))


def trainer_config(
  base: str, spec: Any, *, num_samples: int, per_worker_batch: int, cache_dir: str, **options: Any
) -> lena.Config:
  """The trainer configuration ``base`` for one run of a study: its MNIST-1D draw, S per-worker
  batches on one device (the same numbers as S workers, tested in the repository; simulated
  devices would only add overhead on a 2-core host), no checkpoints, no progress bar, and the
  study's own ``options`` (width, rates, evaluation cadence, ...)."""
  return dataclasses.replace(
    lena.get_config(base),
    cache_dir=cache_dir,
    mnist1d_num_samples=num_samples,
    per_worker_batch=per_worker_batch,
    batch_scale=spec.batch_scale,
    num_devices=1,
    micro_batches=0,
    optimizer=spec.optimizer,
    warmup=spec.warmup,
    seed=spec.seed,
    checkpoint_every=0,
    progress_bar=False,
    **options,
  )


def train_grid(
  grid: Sequence[Any],
  config_of: Callable[[Any], lena.Config],
  out: Path,
  study_optimizers: Sequence[optimizers.Optimizer],
  shard: tuple[int, int] = (0, 1),
) -> tuple[int, int]:
  """Trains this shard's unfinished runs into ``out/runs/`` with the trainer
  (:func:`benchmarks.harness.run_grid`); refuses to resume a run written with other settings.

  Returns:
    ``(trained, skipped)``.
  """

  def train(spec: Any, workdir: Path) -> None:
    with optimizers.registered(*study_optimizers):
      lena.train_and_evaluate(config_of(spec), workdir)

  return harness.run_grid(
    grid,
    train,
    out / "runs",
    shard=shard,
    config_of=lambda spec: dataclasses.asdict(config_of(spec)),
    ignore=("progress_bar", "cache_dir"),  # do not change the numbers
  )
