"""Measures one critical batch: the main run, its checkpoints' branches, the fits and the
estimates (see the package's docstring)."""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from benchmarks import driver, harness
from benchmarks.critical_batch.grid import OPTIMIZERS, Measurement, Measurements

PyTree = Any
# The attention model's data and weight decay, as in benchmarks/adamw_scaling's first runs:
# the validation-free seed-0 draw, inputs standardised with the training statistics.
ATTENTION_WEIGHT_DECAY = 1e-4


# ----------------------------------------------------------------------------------------------
# Fits (NumPy float64)
# ----------------------------------------------------------------------------------------------


def fit_mccandlish(scales: Sequence[float], updates: Sequence[float]) -> dict[str, float]:
  """S_min, E_min and B_crit = E_min / S_min from ``updates(B) = S_min + E_min / B``.

  Least squares of the updates against 1 / B (McCandlish et al.'s Eq. 2.11 rearranged). NaN
  where fewer than 3 batches reached the target; B_crit is infinite when S_min <= 0 (no sign
  of diminishing returns within the batches measured).
  """
  b = np.asarray(scales, np.float64)
  s = np.asarray(updates, np.float64)
  ok = np.isfinite(s)
  if ok.sum() < 3:
    return {"s_min": math.nan, "e_min": math.nan, "b_crit": math.nan}
  design = np.stack([np.ones(ok.sum()), 1.0 / b[ok]], axis=1)
  (s_min, e_min), *_ = np.linalg.lstsq(design, s[ok], rcond=None)
  b_crit = e_min / s_min if s_min > 0 else math.inf
  return {"s_min": float(s_min), "e_min": float(e_min), "b_crit": float(b_crit)}


def zhang_critical_batch(
  scales: Sequence[float], updates: Sequence[float], overhead: float = 1.2
) -> float:
  """The batch where the updates exceed linear scaling from the smallest batch by 20%.

  ``updates(B) B / (updates(B_1) B_1)`` is interpolated linearly in log B between the measured
  batches; ``inf`` if it stays below ``overhead`` (beyond the largest batch), NaN without the
  smallest batch's measurement.
  """
  b = np.asarray(scales, np.float64)
  s = np.asarray(updates, np.float64)
  if not np.isfinite(s[0]):
    return math.nan
  ratio = s * b / (s[0] * b[0])
  for i in range(1, len(b)):
    if not np.isfinite(ratio[i]):
      return math.nan  # a larger batch did not reach the target: beyond the 20% mark anyway
    if ratio[i] >= overhead:
      lo, hi = math.log(b[i - 1]), math.log(b[i])
      frac = (overhead - ratio[i - 1]) / (ratio[i] - ratio[i - 1])
      return float(math.exp(lo + frac * (hi - lo)))
  return math.inf


def crossing(evals: Sequence[tuple[int, float]], target: float) -> float:
  """The (fractional) update at which the loss first reaches ``target``, linear between
  evaluations; NaN if it never does."""
  prev_u, prev_l = 0, math.inf
  for u, loss in evals:
    if loss <= target:
      if not math.isfinite(prev_l):
        return float(u)
      return float(prev_u + (prev_l - target) / (prev_l - loss) * (u - prev_u))
    prev_u, prev_l = u, loss
  return math.nan


# ----------------------------------------------------------------------------------------------
# Training (jax)
# ----------------------------------------------------------------------------------------------


def attention_data(num_samples: int, cache_dir: str | Path) -> dict[str, np.ndarray]:
  """MNIST-1D (seed 0), inputs standardised with the training set's mean and std."""
  from examples import input_pipeline

  data = input_pipeline.load_mnist1d(cache_dir, seed=0, num_samples=num_samples)
  mean, std = data["x_train"].mean(), data["x_train"].std()
  return {k: (v - mean) / std if k.startswith("x") else v for k, v in data.items()}


def build(setup: Measurement, cache_dir: str | Path) -> tuple[dict[str, np.ndarray], Any, Any]:
  """The data, the model (Flax) and the optimizer of ``setup``.

  The base rate is constant: the branches isolate the batch, not the schedule.
  """
  import optax_lena as ol

  if setup.optimizer not in OPTIMIZERS[setup.model]:
    raise ValueError(f"--optimizer for {setup.model}: one of {OPTIMIZERS[setup.model]}")
  if setup.model == "cnn":
    from examples import input_pipeline, models

    data = input_pipeline.load_mnist1d(cache_dir, num_samples=setup.mnist1d_samples)
    sgd = {"adascale": ol.adascale, "lena": ol.lena}[setup.optimizer]
    cnn = models.create_model("cnn1d", 10, features=setup.features)
    return data, cnn, sgd(setup.learning_rate, momentum=setup.momentum)
  from examples import models

  data = attention_data(setup.mnist1d_samples, cache_dir)
  adamw = {"adascale_adamw": ol.adascale_adamw, "lena_adamw": ol.lena_adamw}[setup.optimizer]
  tx = adamw(
    setup.learning_rate,
    weight_decay=ATTENTION_WEIGHT_DECAY,
    weight_decay_mask=models.decay_mask,
    power=setup.power,
  )
  return data, models.PatchTransformer(), tx


class Trainer:
  """The model, its data, its optimizer and the compiled step (one program per S)."""

  def __init__(self, setup: Measurement, cache_dir: str | Path):
    import jax
    import jax.numpy as jnp

    import optax_lena as ol
    from examples import losses

    self.setup = setup
    data, self.model, self.tx = build(setup, cache_dir)
    self.x, self.y = data["x_train"], data["y_train"]
    self.eval_x = jnp.asarray(self.x[: setup.eval_examples])
    self.eval_y = jnp.asarray(self.y[: setup.eval_examples])
    model, tx = self.model, self.tx

    def loss(params: PyTree, x: jax.Array, y: jax.Array) -> jax.Array:
      logits = cast(jax.Array, model.apply({"params": params}, x))
      return losses.cross_entropy(logits, y)

    def step(params: PyTree, opt_state: PyTree, xb: jax.Array, yb: jax.Array) -> Any:
      grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, xb, yb)
      mean, stats = ol.stacked_grad_stats(grads)
      updates, opt_state = tx.update(mean, opt_state, params, grad_stats=stats)
      return jax.tree.map(jnp.add, params, updates), opt_state

    def fresh_noise_scale(params: PyTree, xb: jax.Array, yb: jax.Array) -> jax.Array:
      grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, xb, yb)
      _, stats = ol.stacked_grad_stats(grads)
      top = jnp.sum(jnp.stack(jax.tree.leaves(stats.sq_norm_mean)))
      bot = jnp.sum(jnp.stack(jax.tree.leaves(stats.mean_grad_sq_norm)))
      return ol.noise_scale(top, bot, jnp.asarray(xb.shape[0]))

    def fresh_layer_noise_scales(params: PyTree, xb: jax.Array, yb: jax.Array) -> jax.Array:
      grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, xb, yb)
      _, stats = ol.stacked_grad_stats(grads)
      top, bot = jax.tree.leaves(stats.sq_norm_mean), jax.tree.leaves(stats.mean_grad_sq_norm)
      return ol.noise_scale(jnp.stack(top), jnp.stack(bot), jnp.asarray(xb.shape[0]))

    self.step = jax.jit(step)  # retraced (compiled) once per S, the shape of xb
    self.eval_loss = jax.jit(functools.partial(loss, x=self.eval_x, y=self.eval_y))
    self.fresh = jax.jit(fresh_noise_scale)
    # A program of its own, so that the global fresh estimate's program stays as it was.
    self.fresh_layers = jax.jit(fresh_layer_noise_scales)
    self.diagnostics = jax.jit(ol.diagnostics)
    params = self.model.init(jax.random.key(0), self.eval_x[:1])["params"]
    self.init_state = (params, tx.init(params))
    # In jax.tree.leaves order, that of the state's per-layer statistics.
    self.layer_names = [
      jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
    ]

  def batch(self, rng: np.random.Generator, s: int) -> tuple[Any, Any]:
    idx = rng.integers(0, len(self.y), size=(s, self.setup.per_worker_batch))
    return self.x[idx], self.y[idx]

  def loss_of(self, params: PyTree) -> float:
    return float(self.eval_loss(params))

  def branch(self, state: tuple[PyTree, PyTree], s: int, target: float, seed: int) -> float:
    """Updates at S to reach ``target`` from ``state`` (interpolated; NaN if not reached)."""
    rng = np.random.default_rng([seed, s, 7])
    params, opt_state = state
    evals = []
    for u in range(1, self.setup.max_updates + 1):
      params, opt_state = self.step(params, opt_state, *self.batch(rng, s))
      evals.append((u, self.loss_of(params)))
      if evals[-1][1] <= target:
        break
    return crossing(evals, target)


def measure(setup: Measurement, cache_dir: str | Path = "data_cache") -> dict[str, Any]:
  """The main run, its checkpoints' branches, the fits and the estimates (a JSON-able dict)."""
  trainer = Trainer(setup, cache_dir)
  rng = np.random.default_rng(12345)
  state = trainer.init_state
  done, rows = 0, []
  t0 = time.perf_counter()
  for checkpoint in setup.checkpoints:
    while done < checkpoint:
      state = trainer.step(*state, *trainer.batch(rng, setup.num_samples_main))
      done += 1
    diag = trainer.diagnostics(state[1])
    loss0 = trainer.loss_of(state[0])
    target = loss0 * (1.0 - setup.decrease)
    fresh_rng = np.random.default_rng([99, checkpoint])
    fresh_batch = trainer.batch(fresh_rng, setup.fresh_workers)
    fresh = float(trainer.fresh(state[0], *fresh_batch))
    layer_fresh = np.asarray(trainer.fresh_layers(state[0], *fresh_batch), np.float64)
    per_seed = [
      [trainer.branch(state, s, target, seed) for s in setup.scales] for seed in setup.seeds
    ]
    columns = zip(*per_seed, strict=True)
    # The median over seeds: one lucky dip of a small batch's noisy loss does not move it.
    updates = [float(np.median(c)) if all(np.isfinite(c)) else math.nan for c in columns]
    fit = fit_mccandlish(setup.scales, updates)
    rows.append(
      {
        "checkpoint": checkpoint,
        "train_loss": loss0,
        "target": target,
        "updates": updates,
        "updates_per_seed": per_seed,
        **fit,
        "zhang": zhang_critical_batch(setup.scales, updates),
        "estimate": float(diag["critical_batch_size"]),
        "estimate_fresh": fresh,
        "gain_ratio": float(diag["global_ratio"]),
        # Per layer (result["layer_names"]): B_simple of the state's averages and fresh.
        "layer_estimate": np.asarray(diag["noise_scale"], np.float64).tolist(),
        "layer_fresh": layer_fresh.tolist(),
      }
    )
    print(
      f"[{time.perf_counter() - t0:6.0f} s] update {checkpoint}: loss {loss0:.3f}, updates "
      f"{[round(u, 1) for u in updates]}, B_crit fit {fit['b_crit']:.2f}, Zhang "
      f"{rows[-1]['zhang']:.2f}, estimate {rows[-1]['estimate']:.2f}, fresh {fresh:.2f}",
      flush=True,
    )
  return {
    "setup": dataclasses.asdict(setup),
    "layer_names": trainer.layer_names,
    "rows": rows,
    "seconds": time.perf_counter() - t0,
  }


def run(cell: Measurement, setup: Measurements, context: driver.Context) -> dict[str, Any]:
  """One measurement, with the machine it ran on."""
  del setup
  return {**measure(cell, context.cache_dir), "machine": harness.machine_info()}
