"""Trains one run of the CNN study with the trainer."""

from __future__ import annotations

import dataclasses
from typing import Any

from benchmarks import driver, large_batch, trainer
from benchmarks.large_batch_cnn.grid import STUDY_OPTIMIZERS, Preset, RunSpec, Sizes
from examples import lena


def run_config(p: Preset, spec: RunSpec, cache_dir: str) -> lena.Config:
  """The trainer configuration of one run."""
  epochs = spec.epochs or p.num_epochs
  large = spec.batch_scale > 1
  updates_per_epoch = (p.num_samples * 0.8) / (p.per_worker_batch * spec.batch_scale)
  lr = {"lamb": p.lamb_lr, "adam": p.adam_lr, "adam_lena": p.adam_lr}.get(
    spec.optimizer, p.learning_rate
  )
  return large_batch.trainer_config(
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


def settings(spec: RunSpec, sizes: Sizes, context: driver.Context) -> dict[str, Any]:
  """What the run's ``config.json`` holds (a run of other settings is not resumed)."""
  return dataclasses.asdict(run_config(sizes.resolved()[0], spec, str(context.cache_dir)))


def run(spec: RunSpec, sizes: Sizes, context: driver.Context) -> None:
  """Trains ``spec`` into ``context.out/runs/<name>``."""
  config = run_config(sizes.resolved()[0], spec, str(context.cache_dir))
  trainer.train(config, context.out / "runs" / spec.name, STUDY_OPTIMIZERS)
