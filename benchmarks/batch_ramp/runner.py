"""Trains one run of the batch-ramp study with the trainer, in a temporary directory, and
returns its summary (the pilot: its record)."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from typing import Any

from benchmarks import driver, harness, trainer
from benchmarks.batch_ramp.grid import ARMS, PILOT_SEED, Pilot, Run, Setup, crossing, step_schedule


def base_config(setup: Setup, seed: int, cache_dir: str) -> Any:
  """The trainer configuration of every arm at ``seed`` (the ramp aside)."""
  from examples import lena

  config = lena.get_config(setup.config)
  changes: dict[str, Any] = {
    "num_epochs": setup.num_epochs,
    "num_steps": 0,
    "eval_every": 0,  # once per epoch: evaluations equally spaced in examples in every arm
    "num_validation": setup.num_validation,
    "eval_split": "validation",
    "mnist1d_num_samples": setup.mnist1d_samples,
    "cache_dir": cache_dir,
    "seed": seed,
    "rng_impl": setup.rng_impl,
    "progress_bar": False,
    "log_every": 0,
    "checkpoint_every": 0,
  }
  if setup.per_worker_batch:
    changes["per_worker_batch"] = setup.per_worker_batch
  if setup.width:
    changes["width"] = setup.width
  return dataclasses.replace(config, **changes)


def ramp_of(setup: Setup, arm: str, num_train: int, per_worker_batch: int) -> str:
  """The ``batch_ramp`` of an arm (the trainer's spelling)."""
  if arm == "small":
    return f"steps:0:{setup.small}"
  if arm == "large":
    return f"steps:0:{setup.large}"
  if arm == "steps":
    batches = setup.num_epochs * num_train / per_worker_batch
    return step_schedule(setup.small, setup.large, setup.step_fractions, batches)
  if arm == "noise":
    return f"noise:every={setup.noise_every},max={setup.large}"
  if arm == "seesaw":
    return f"seesaw:max={setup.large}"
  raise ValueError(f"Unknown arm {arm!r}; valid arms: {', '.join(ARMS)}.")


def train_run(setup: Setup, run: Run, cache_dir: str, test: bool = True) -> dict[str, Any]:
  """Trains one run in a temporary directory and returns its summary (``test=False``: without
  the test split, as for the pilot that fixes the target)."""
  from examples import input_pipeline, metrics

  config = base_config(setup, run.seed, cache_dir)
  num_train = input_pipeline.create_dataset(config, 1).num_train
  spec = ramp_of(setup, run.arm, num_train, config.per_worker_batch)
  config = dataclasses.replace(config, batch_ramp=spec, batch_scale=setup.small)
  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory() as workdir:
    state = trainer.train(config, workdir)
    evals = metrics.read_metrics(workdir)
  seconds = time.perf_counter() - t0
  last = evals[-1]
  curve = [
    [r["iteration"], r["samples_seen"], r["num_samples"], r["eval_accuracy"], r["wall_time"]]
    for r in evals
  ]
  reach = crossing([(c[0], c[3]) for c in curve], setup.target)
  return {
    "arm": run.arm,
    "seed": run.seed,
    "batch_ramp": spec,
    "first_num_samples": setup.large if run.arm == "large" else setup.small,
    "per_worker_batch": config.per_worker_batch,
    "num_train": num_train,
    # [update, examples seen, S of the last update, validation accuracy, wall seconds]
    "evals": curve,
    "updates": last["iteration"],
    "samples": last["samples_seen"],
    "final_validation_accuracy": last["eval_accuracy"],
    "updates_to_target": reach,
    "wall_time": last["wall_time"],
    "seconds_per_sample": last["wall_time"] / last["samples_seen"],
    "process_seconds": seconds,  # with the initialisation and the test evaluation
    **(
      {f"test_{k}": v for k, v in trainer.evaluate(config, state, "test").items()} if test else {}
    ),
  }


def run(cell: Run, setup: Setup, context: driver.Context) -> dict[str, Any]:
  """One run's summary."""
  return train_run(setup, cell, str(context.cache_dir))


def pilot(cell: Pilot, setup: Setup, context: driver.Context) -> dict[str, Any]:
  """Trains ``small`` on ``PILOT_SEED`` (validation only): the record of ``pilot.json``."""
  summary = train_run(setup, Run("small", PILOT_SEED), str(context.cache_dir), test=False)
  return {"setup": dataclasses.asdict(setup), "recorded": harness.recorded(), "run": summary}


def describe(summary: dict[str, Any]) -> str:
  """A run's progress text."""
  return (
    f"{summary['updates']} updates, test acc {summary['test_accuracy']:.4f}, "
    f"{1e6 * summary['seconds_per_sample']:.1f} µs/sample"
  )
