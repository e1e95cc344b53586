"""One run of the AdamW large-batch study: the methods, the data and the training loop.

Every update averages S per-worker gradients of batch ``PER_WORKER_BATCH`` (computed with
``jax.vmap`` over a leading worker axis, then ``ol.stacked_grad_stats``). The learning rate is
tuned at ``REFERENCE_BATCH`` (S = 8), so the optax_lena optimizers get
``per_worker_batch_size=8, reference_batch_size=64`` and their scale is ``k = S / 8``. Every
run sees the same number of epochs; the schedule (cosine decay) runs on the sample clock, so it
is the same function of samples seen at every S. Records follow the trainer's
``metrics.jsonl`` schema (``examples.metrics``), so ``benchmarks.harness`` and
``examples.analysis`` read them.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optax_lena as ol
from benchmarks.adamw_scaling.model import PatchTransformer, decay_mask
from examples import input_pipeline, losses, metrics

PER_WORKER_BATCH = 8
REFERENCE_SCALE = 8  # the rate is tuned at S = 8 workers ...
REFERENCE_BATCH = REFERENCE_SCALE * PER_WORKER_BATCH  # ... i.e. at global batch 64
WEIGHT_DECAY = 1e-4
B1, B2, ADAM_EPS = 0.9, 0.999, 1e-8  # Adam's defaults at the reference batch
# The validation set is the test part of an independent MNIST-1D draw (another generation
# seed): held out from the seed-0 training and test sets by construction, so the archived runs'
# data stay exactly as they were.
VALIDATION_SEED = 1
WARMUP_FRACTION = 0.05  # LSW's fixed warm-up and the state-aware theta: 5% of the base steps
NUM_EVALS = 10

# name: (label, kind, power, state-aware warm-up). kind "linear_scaling" gets LSW's fixed
# warm-up, "lamb" the same linear warm-up on its schedule.
METHODS: dict[str, tuple[str, str, float, bool]] = {
  "adam_lsw": ("Adam + LSW (linear)", "linear_scaling", 1.0, False),
  "adam_sqrt_lsw": ("Adam + sqrt LSW", "linear_scaling", 0.5, False),
  "lamb": ("LAMB (rate swept)", "lamb", 1.0, False),
  "adascale": ("AdaScale-AdamW p=1", "adascale", 1.0, False),
  "adascale_sqrt": ("AdaScale-AdamW p=1/2", "adascale", 0.5, False),
  "lena": ("LENA-AdamW p=1", "lena", 1.0, False),
  "lena_sqrt": ("LENA-AdamW p=1/2", "lena", 0.5, False),
  "adascale_sa": ("AdaScale-AdamW p=1 + SA warm-up", "adascale", 1.0, True),
  "adascale_sqrt_sa": ("AdaScale-AdamW p=1/2 + SA warm-up", "adascale", 0.5, True),
  "lena_sa": ("LENA-AdamW p=1 + SA warm-up", "lena", 1.0, True),
  "lena_sqrt_sa": ("LENA-AdamW p=1/2 + SA warm-up", "lena", 0.5, True),
  # Plain AdamW at its own rate (swept at every S on the validation set): the reference.
  "adamw": ("AdamW (rate tuned on validation)", "adamw", 1.0, False),
  # Malladi et al.'s square-root SDE rule for Adam: rate x sqrt(k), 1 - b1 and 1 - b2 times k,
  # eps / sqrt(k). Defined only where k (1 - b1) < 1.
  "malladi": ("Adam + Malladi SDE rule", "malladi", 0.5, False),
  # Where it is not (k >= 10): the same rule with b1 kept (a variant, not the paper's rule).
  "malladi_b2": ("Adam + Malladi rule, b1 kept (variant)", "malladi_b2", 0.5, False),
}
# The rules of the original grid (``study.grid_runs``); the others run in their own phases.
GRID_METHODS = tuple(m for m in METHODS if METHODS[m][1] not in ("adamw", "malladi", "malladi_b2"))


@dataclasses.dataclass(frozen=True)
class Run:
  """One cell of the grid; ``name`` is its directory under ``runs/``."""

  method: str
  num_workers: int
  seed: int
  learning_rate: float
  epochs: int
  num_samples: int  # MNIST-1D examples before the 80/20 split
  sweep: bool = False  # a learning-rate sweep run (its rate is in the name)

  @property
  def name(self) -> str:
    rate = f"_lr{self.learning_rate:g}" if self.sweep else ""
    return f"{self.method}{rate}_S{self.num_workers}_seed{self.seed}"

  @property
  def global_batch(self) -> int:
    return self.num_workers * PER_WORKER_BATCH

  @property
  def scale(self) -> int:
    """k, reference batches per update."""
    return self.global_batch // REFERENCE_BATCH


def load_data(num_samples: int, cache_dir: str = "data_cache") -> dict[str, np.ndarray]:
  """MNIST-1D (generated offline, seed 0) and the validation set (the test part of the
  ``VALIDATION_SEED`` draw), inputs standardised with the training statistics."""
  data = input_pipeline.load_mnist1d(cache_dir, seed=0, num_samples=num_samples)
  held_out = input_pipeline.load_mnist1d(cache_dir, seed=VALIDATION_SEED, num_samples=num_samples)
  data["x_val"], data["y_val"] = held_out["x_test"], held_out["y_test"]
  mean, std = data["x_train"].mean(), data["x_train"].std()
  return {k: (v - mean) / std if k.startswith("x") else v for k, v in data.items()}


def total_base_steps(run: Run, num_train: int) -> int:
  """Reference-batch iterations of the run (the unit of the schedule and the warm-ups)."""
  return run.epochs * (num_train // run.global_batch) * run.scale


def make_optimizer(run: Run, num_train: int) -> optax.GradientTransformation:
  """The run's optimizer: the schedule and warm-ups count reference-batch iterations."""
  _, kind, power, state_aware = METHODS[run.method]
  total = total_base_steps(run, num_train)
  warmup = max(1, round(WARMUP_FRACTION * total))
  k = run.scale
  # LSW multiplies the base rate by k: a base rate of lr / k is plain AdamW at lr, with the same
  # warm-up and sample-clock schedule as every rule (at S = 8 the very run of the baseline).
  base_rate = run.learning_rate / k if kind == "adamw" else run.learning_rate
  schedule = optax.cosine_decay_schedule(base_rate, total, alpha=0.01)
  if kind == "lamb":

    def lamb_schedule(count):  # on base steps, with the same linear warm-up as LSW
      base = (count + 1) * k
      return schedule(count * k) * jnp.minimum(base / warmup, 1.0)

    return optax.lamb(lamb_schedule, weight_decay=WEIGHT_DECAY, mask=decay_mask)
  common: dict[str, Any] = {
    "weight_decay": WEIGHT_DECAY,
    "weight_decay_mask": decay_mask,
    "power": power,
    "clock": "samples",
    "per_worker_batch_size": PER_WORKER_BATCH,
    "reference_batch_size": REFERENCE_BATCH,
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


def config_of(run: Run) -> dict[str, Any]:
  """What ``config.json`` holds (``total_steps`` is the harness's finished rule)."""
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


def train(run: Run, workdir: Path, data: dict[str, np.ndarray] | None = None) -> None:
  """Trains ``run`` into ``workdir`` (``config.json``, ``metrics.jsonl``), from scratch."""
  data = load_data(run.num_samples) if data is None else data
  config = config_of(run)
  workdir.mkdir(parents=True, exist_ok=True)
  metrics.write_config(workdir, config, resuming=False)
  writer = metrics.MetricsWriter(workdir, resume_step=0)
  model = PatchTransformer()
  x_train, y_train = data["x_train"], data["y_train"]
  params = model.init(jax.random.key(run.seed), x_train[:1])["params"]
  tx = make_optimizer(run, len(x_train))
  opt_state = tx.init(params)
  uses_stats = METHODS[run.method][1] != "lamb"

  def logits_of(p, x) -> jax.Array:
    return model.apply({"params": p}, x)  # type: ignore[return-value]  # no mutable state

  def loss_fn(p, x, y):
    return losses.cross_entropy(logits_of(p, x), y)

  @jax.jit
  def step(params, opt_state, x, y):
    worker_loss, stacked = jax.vmap(jax.value_and_grad(loss_fn), in_axes=(None, 0, 0))(params, x, y)
    grads, stats = ol.stacked_grad_stats(stacked)
    extra = {"grad_stats": stats} if uses_stats else {}
    updates, opt_state = tx.update(grads, opt_state, params, **extra)
    return optax.apply_updates(params, updates), opt_state, jnp.mean(worker_loss)

  @jax.jit
  def evaluate(params, x, y):
    logits = logits_of(params, x)
    return losses.cross_entropy(logits, y), losses.accuracy(logits, y)

  total = config["total_steps"]
  per_epoch = total // run.epochs
  eval_at = {max(1, round(total * (i + 1) / NUM_EVALS)) for i in range(NUM_EVALS)}
  rng = np.random.default_rng(run.seed)
  start, iteration, train_losses = time.perf_counter(), 0, []
  for epoch in range(run.epochs):
    for x, y in input_pipeline.numpy_batches(x_train, y_train, run.global_batch, rng=rng):
      shape = (run.num_workers, PER_WORKER_BATCH)
      params, opt_state, loss = step(params, opt_state, x.reshape(*shape, -1), y.reshape(shape))
      iteration += 1
      train_losses.append(loss)
      if iteration in eval_at:
        eval_loss, eval_acc = evaluate(params, data["x_test"], data["y_test"])
        val_loss, val_acc = evaluate(params, data["x_val"], data["y_val"])
        record = {
          "type": "eval",
          "iteration": iteration,
          "epoch": iteration / per_epoch,
          "base_steps": iteration * run.scale,
          "wall_time": time.perf_counter() - start,
          "train_loss": float(np.mean(jax.device_get(train_losses))),
          "eval_loss": float(eval_loss),
          "eval_accuracy": float(eval_acc),
          "val_loss": float(val_loss),
          "val_accuracy": float(val_acc),
        }
        train_losses = []
        if uses_stats:
          record |= metrics.diagnostics_record(opt_state, params)
          flat = ol.flat_diagnostics(opt_state, candidate_scales=[2 * run.num_workers])
          record["critical_batch_size"] = flat.get("critical_batch_size")
          record["expected_speedup_2x"] = flat.get(f"expected_speedup/{2 * run.num_workers}")
        writer.write(record)
    del epoch
