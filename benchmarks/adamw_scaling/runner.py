"""Trains one run of the AdamW study with the example trainer and its registry.

Each arm of ``grid.METHODS`` is a registry entry (:data:`ENTRIES`, ``adamw_scaling.<method>``,
registered while the study trains) whose optimizer is the study's: the rate tuned at the reference
batch (``per_worker_batch_size=8, reference_batch_size=64``: scale k = S / 8), cosine decay on the
sample clock, the fixed and state-aware warm-ups 5% of the reference-batch iterations. The trainer
runs ``parallel='vmap'`` (the S per-worker gradients one vmap, as S workers), ``(train examples //
global batch) x epochs`` updates, evaluating the test split every ``total // NUM_EVALS`` updates and
at the last. The final state is then evaluated once on the validation draw (the test part of
MNIST-1D's generation seed ``VALIDATION_SEED``) and its critical batch read, both added to the run's
last evaluation record, and the run's study fields to its ``config.json``: the records of the
study's first loop, which the archived runs hold (``report.py`` reads both).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import optax

import optax_lena as ol
from benchmarks import driver, harness, trainer
from benchmarks.adamw_scaling.grid import (
  ADAM_EPS,
  B1,
  B2,
  METHODS,
  NUM_EVALS,
  PER_WORKER_BATCH,
  REFERENCE_BATCH,
  VALIDATION_SEED,
  WARMUP_FRACTION,
  WEIGHT_DECAY,
  Run,
  Setup,
)
from examples import lena, metrics, models, optimizers


def make_optimizer(method: str, hp: optimizers.Hyperparams) -> optax.GradientTransformation:
  """The arm ``method``'s optimizer: the schedule and warm-ups count reference-batch iterations
  (``hp.base_steps_total`` = updates x k)."""
  _, kind, power, state_aware = METHODS[method]
  total = hp.base_steps_total
  warmup = max(1, round(WARMUP_FRACTION * total))
  k = hp.scale
  # LSW multiplies the base rate by k: a base rate of lr / k is plain AdamW at lr, with the same
  # warm-up and sample-clock schedule as every rule (at S = 8 the very run of the baseline).
  base_rate = hp.learning_rate / k if kind == "adamw" else hp.learning_rate
  schedule = optax.cosine_decay_schedule(base_rate, total, alpha=0.01)
  if kind == "lamb":

    def lamb_schedule(count):  # on base steps, with the same linear warm-up as LSW
      base = (count + 1) * k
      return schedule(count * k) * jnp.minimum(base / warmup, 1.0)

    return optax.lamb(lamb_schedule, weight_decay=WEIGHT_DECAY, mask=models.decay_mask)
  common: dict[str, Any] = {
    "weight_decay": WEIGHT_DECAY,
    "weight_decay_mask": models.decay_mask,
    "power": power,
    "clock": "samples",
    **hp.batch_kwargs(),
  }
  if kind in ("linear_scaling", "adamw"):
    return ol.linear_scaling_adamw(schedule, warmup_steps=warmup, **common)
  if kind in ("malladi", "malladi_b2"):
    b1 = 1 - k * (1 - B1) if kind == "malladi" else B1
    if b1 <= 0:
      raise ValueError(f"Malladi et al.'s rule needs k (1 - b1) < 1, got k = {k}.")
    betas = {"b1": b1, "b2": 1 - k * (1 - B2), "adam_eps": ADAM_EPS / k**0.5}
    return ol.linear_scaling_adamw(schedule, warmup_steps=warmup, **betas, **common)
  theta: dict[str, Any] = {"warmup_threshold": float(warmup)} if state_aware else {}
  build = ol.lena_adamw if kind == "lena" else ol.adascale_adamw
  return build(schedule, **theta, **common)


def _warmup(method: str) -> str:
  """The warm-up the arm builds (its entry's only one)."""
  _, kind, _, state_aware = METHODS[method]
  if state_aware:
    return "state_aware"
  return "fixed" if kind in ("linear_scaling", "adamw", "malladi", "malladi_b2", "lamb") else "none"


def registry_name(method: str) -> str:
  """The registry name of the arm ``method``."""
  return f"adamw_scaling.{method}"


ENTRIES = tuple(
  optimizers.Optimizer(
    name=registry_name(method),
    build=functools.partial(make_optimizer, method),
    label=label,
    paper_warmup=_warmup(method),
    diagnostics=kind != "lamb",
    warmups=(_warmup(method),),
    takes_reference_batch=True,
  )
  for method, (label, kind, _, _) in METHODS.items()
)


def trainer_config(run: Run, cache_dir: str) -> lena.Config:
  """The trainer configuration of ``run``: the attention model on its MNIST-1D draw, S
  per-worker batches of 8 in one vmap, whole updates per epoch, about ``NUM_EVALS`` evaluations."""
  total = run.epochs * (int(0.8 * run.num_samples) // run.global_batch)
  return dataclasses.replace(
    lena.get_config("mnist1d_attention"),
    cache_dir=cache_dir,
    mnist1d_num_samples=run.num_samples,
    per_worker_batch=PER_WORKER_BATCH,
    batch_scale=run.num_workers,
    num_devices=1,
    micro_batches=0,
    parallel="vmap",
    optimizer=registry_name(run.method),
    warmup="default",
    learning_rate=run.learning_rate,
    reference_batch_size=REFERENCE_BATCH,
    momentum=B1,
    weight_decay=WEIGHT_DECAY,
    num_epochs=run.epochs,
    num_steps=total,
    eval_every=max(1, total // NUM_EVALS),
    seed=run.seed,
    checkpoint_every=0,
    log_every=0,
    progress_bar=False,
  )


def total_base_steps(run: Run, num_train: int) -> int:
  """Reference-batch iterations of the run (the unit of the schedule and the warm-ups)."""
  return run.epochs * (num_train // run.global_batch) * run.scale


def study_fields(run: Run) -> dict[str, Any]:
  """The run's fields the report reads from ``config.json`` (``total_steps``: the harness's
  finished rule)."""
  num_train = int(0.8 * run.num_samples)
  return {
    **dataclasses.asdict(run),
    "label": METHODS[run.method][0],
    "global_batch": run.global_batch,
    "per_worker_batch": PER_WORKER_BATCH,
    "reference_batch": REFERENCE_BATCH,
    "total_steps": run.epochs * (num_train // run.global_batch),
    "total_base_steps": total_base_steps(run, num_train),
  }


def settings(run: Run, setup: Setup, context: driver.Context) -> dict[str, Any]:
  """What the run's ``config.json`` holds: the trainer's configuration and the study's fields."""
  del setup
  config = trainer_config(run, str(context.cache_dir))
  return {**dataclasses.asdict(config), **study_fields(run)}


def run(cell: Run, setup: Setup, context: driver.Context) -> None:
  """Trains ``cell`` into ``context.out/runs/<name>``; then evaluates the final state on the
  validation draw and reads its critical batch, into the last evaluation record."""
  workdir = context.out / "runs" / cell.name
  config = trainer_config(cell, str(context.cache_dir))
  state = trainer.train(config, workdir, ENTRIES)
  held_out = trainer.evaluate(dataclasses.replace(config, data_seed=VALIDATION_SEED), state, "test")
  final: dict[str, float | None] = {
    "val_loss": held_out["loss"],
    "val_accuracy": held_out["accuracy"],
  }
  if METHODS[cell.method][1] != "lamb":
    flat = ol.flat_diagnostics(state.opt_state, candidate_scales=[2 * cell.num_workers])
    final["critical_batch_size"] = flat.get("critical_batch_size")
    final["expected_speedup_2x"] = flat.get(f"expected_speedup/{2 * cell.num_workers}")
  _extend_last_evaluation(workdir, final)
  stored = json.loads((workdir / "config.json").read_text())
  harness.write_json(workdir / "config.json", {**stored, **study_fields(cell)})


def _extend_last_evaluation(workdir: Path, fields: dict[str, Any]) -> None:
  """Adds ``fields`` to the last record of ``metrics.jsonl`` (the final evaluation)."""
  records = metrics.read_metrics(workdir, None)
  records[-1] = {**records[-1], **fields}
  harness.write_text(workdir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records))
