"""Trains one run of the ResNet1D study with the trainer (the equal-tuning runs then evaluated on
the validation draw)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from benchmarks import driver, harness, large_batch, trainer
from benchmarks.large_batch_resnet.grid import (
  PRESETS,
  STUDY_OPTIMIZERS,
  VALIDATION_DATA_SEED,
  EqualTuning,
  Preset,
  RunSpec,
  Sizes,
)
from examples import lena, optimizers


def run_config(p: Preset, spec: RunSpec, cache_dir: str) -> lena.Config:
  """The trainer configuration of one run."""
  s, epochs = spec.batch_scale, spec.epochs or p.num_epochs
  per_epoch = int(p.num_samples * 0.8) // (s * p.per_worker_batch)  # whole updates per epoch
  total = per_epoch * epochs
  return large_batch.trainer_config(
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


def settings(spec: RunSpec, sizes: Sizes, context: driver.Context) -> dict[str, Any]:
  """What the run's ``config.json`` holds (a run of other settings is not resumed)."""
  return dataclasses.asdict(run_config(PRESETS[sizes.name], spec, str(context.cache_dir)))


def run(spec: RunSpec, sizes: Sizes, context: driver.Context) -> None:
  """Trains ``spec`` into ``context.out/runs/<name>``."""
  config = run_config(PRESETS[sizes.name], spec, str(context.cache_dir))
  trainer.train(config, context.out / "runs" / spec.name, STUDY_OPTIMIZERS)


def equal_config(setup: EqualTuning, spec: RunSpec, cache_dir: str) -> lena.Config:
  """The main study's trainer configuration, one evaluation per epoch, sequential workers."""
  p = PRESETS[setup.preset]
  config = run_config(p, spec, cache_dir)
  per_epoch = int(p.num_samples * 0.8) // (spec.batch_scale * p.per_worker_batch)
  return dataclasses.replace(config, parallel="shard_map", eval_every=per_epoch)


def equal_settings(spec: RunSpec, setup: EqualTuning, context: driver.Context) -> dict[str, Any]:
  """What an equal-tuning run's ``config.json`` holds."""
  return dataclasses.asdict(equal_config(setup, spec, str(context.cache_dir)))


def equal_run(spec: RunSpec, setup: EqualTuning, context: driver.Context) -> None:
  """Trains an equal-tuning run, then evaluates it once on the validation draw
  (``validation.json``): the selection reads that, the report the test split."""
  workdir = context.out / "runs" / spec.name
  config = equal_config(setup, spec, str(context.cache_dir))
  state = trainer.train(config, workdir, STUDY_OPTIMIZERS)
  held_out = dataclasses.replace(config, data_seed=VALIDATION_DATA_SEED)
  result = trainer.evaluate(held_out, state, "test")
  harness.write_json(workdir / "validation.json", {**result, "data_seed": VALIDATION_DATA_SEED})


def described(workdir: Path) -> str:
  """The progress text of a run: its validation accuracy (the test split is for the report)."""
  from examples import metrics

  val = json.loads((workdir / "validation.json").read_text())["accuracy"]
  updates = metrics.read_metrics(workdir, "eval")[-1]["iteration"]
  return f"validation acc {val:.4f} after {updates} updates"
