"""Trains one cell of the scanned-layers study through ``benchmarks.trainer``: the attention
model with its blocks scanned, every evaluation during training on the validation split; the
test split once, after training, for the reported seeds only. The run directory holds the
trainer's ``config.json`` and ``metrics.jsonl`` and, written last, the cell's summary
(``grid.RESULT``), which the selection and the report read."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from benchmarks import driver, harness, trainer
from benchmarks.scanned_layers.grid import METHODS, RESULT, Cell, Setup


def trainer_config(cell: Cell, setup: Setup, cache_dir: str) -> Any:
  """The trainer configuration of ``cell``: ``mnist1d_attention`` with the study's fields (the
  AdamW settings, the decay and the warm-up fractions stay the configuration's)."""
  from examples import lena

  method = METHODS[cell.method]
  return dataclasses.replace(
    lena.get_config("mnist1d_attention"),
    cache_dir=cache_dir,
    mnist1d_num_samples=setup.num_samples,
    data_seed=0,
    num_validation=setup.num_validation,
    eval_split="validation",
    width=setup.width,
    depth=setup.depth,
    scan_layers=True,
    layer_axes=method.layer_axes,
    optimizer=method.optimizer,
    warmup=method.warmup,
    learning_rate=cell.rate,
    reference_batch_size=setup.reference_batch if method.reference_batch else 0,
    per_worker_batch=setup.per_worker_batch,
    batch_scale=cell.scale,
    num_devices=1,  # S micro-batches accumulated on one device, whatever devices jax has
    micro_batches=0,
    parallel="shard_map",
    num_epochs=setup.num_epochs,
    num_steps=0,
    eval_every=0,  # about once an epoch
    log_every=setup.log_every if cell.group == "log" else 0,
    checkpoint_every=0,
    seed=cell.seed,
    rng_impl=setup.rng_impl,
    progress_bar=False,
  )


def settings(cell: Cell, setup: Setup, context: driver.Context) -> dict[str, Any]:
  """What a run directory's ``config.json`` must hold to be resumed."""
  return dataclasses.asdict(trainer_config(cell, setup, str(context.cache_dir)))


def run(cell: Cell, setup: Setup, context: driver.Context) -> None:
  """Trains ``cell`` into ``context.out/runs/<name>`` and writes its summary there: the
  validation curve, the CPU seconds and, for a reported seed, the test split's numbers."""
  from examples import metrics

  workdir = context.out / "runs" / cell.name
  config = trainer_config(cell, setup, str(context.cache_dir))
  cpu, wall = time.process_time(), time.perf_counter()
  state = trainer.train(config, workdir)
  cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
  evals = metrics.read_metrics(workdir, "eval")
  last = evals[-1]
  result: dict[str, Any] = {
    **dataclasses.asdict(cell),
    "updates": last["iteration"],
    "validation_accuracy": last["eval_accuracy"],
    "validation_loss": last["eval_loss"],
    # [update, epoch, validation accuracy, validation loss, train loss] at every evaluation
    "curve": [
      [r["iteration"], r["epoch"], r["eval_accuracy"], r["eval_loss"], r["train_loss"]]
      for r in evals
    ],
    "cpu_seconds": cpu,  # the process's, training and its evaluations (not the test's)
    "wall_seconds": wall,
    "load_average": round(os.getloadavg()[0], 1),
  }
  if cell.group == "final":  # the test split, once, after training
    test = trainer.evaluate(config, state, "test")
    result |= {"test_accuracy": test["accuracy"], "test_loss": test["loss"]}
  harness.write_json(workdir / RESULT, result)


def describe(workdir: Any) -> str:
  """A finished run's progress text."""
  import json

  result = json.loads((workdir / RESULT).read_text())
  text = f"validation acc {result['validation_accuracy']:.4f} after {result['updates']} updates"
  if "test_accuracy" in result:
    text += f", test acc {result['test_accuracy']:.4f}"
  return f"{text}, {result['cpu_seconds']:.0f} CPU s"
