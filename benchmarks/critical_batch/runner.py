"""The critical batch measured with branched runs, beside the estimate in the optimizer state.

A main run (S_main per-worker gradients of ``per_worker_batch`` examples) stops at a few
checkpoints (early, middle, late): of the MNIST-1D CNN with momentum SGD (``ol.adascale`` or
``ol.lena``), or of the attention model of ``benchmarks/adamw_scaling`` with AdamW
(``ol.adascale_adamw`` or ``ol.lena_adamw``, rate times the ratio to the power ``power``). From
each, short runs branch at several S (the state carried over: parameters, momentum or Adam's
moments, and the rule's moving averages; the rule's own rate at each S), and each measures the
updates needed to lower
the training loss (on a fixed subset) by a fixed fraction, interpolated between evaluations and
the median over seeds. Then:

* McCandlish et al. (2018): ``(S / S_min - 1)(E / E_min - 1) = 1`` with E = S B the
  examples (here per-worker batches), i.e. ``updates(B) = S_min + E_min / B``: a least-squares
  line of the updates against 1 / B gives S_min (intercept) and E_min (slope), and
  ``B_crit = E_min / S_min``;
* Zhang et al. (ICLR 2025): the batch at which the updates exceed ideal linear scaling from the
  smallest batch by 20% (``updates(B) B / (updates(B_1) B_1) = 1.2``, interpolated in log B);
* the estimate: ``ol.diagnostics(state)["critical_batch_size"]`` at the checkpoint (B_simple of
  the moving averages), and, from the same statistics without the averages' lag, B_simple of
  ``fresh`` per-worker gradients drawn at the checkpoint's parameters.

All batch sizes are in per-worker batches (multiply by ``per_worker_batch`` for examples).

  python -m benchmarks.critical_batch.measure --out benchmarks/critical_batch/results
  python -m benchmarks.critical_batch.measure --model attention --optimizer lena_adamw
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from benchmarks import harness

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Setup:
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
  cache_dir: str = "data_cache"


OPTIMIZERS = {"cnn": ("adascale", "lena"), "attention": ("adascale_adamw", "lena_adamw")}


def attention(optimizer: str = "lena_adamw") -> Setup:
  """The attention model's measurement (RESULTS.md gives its duration).

  As in ``benchmarks/adamw_scaling``: per-worker batch 8, weight decay 1e-4 on kernels, main run
  at S = 8. The rate is that study's tuned 1e-2 at batch 64 brought to one per-worker batch of 8
  by the square-root rule, so that branches down to S = 1 need no reference batch above theirs.
  """
  return Setup(
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


def quick(cache_dir: str = "data_cache", model: str = "cnn") -> Setup:
  """A seconds-long setup for the smoke test (of the CNN or of the attention model)."""
  base = Setup() if model == "cnn" else attention()
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
    cache_dir=cache_dir,
  )


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


def build(setup: Setup) -> tuple[dict[str, np.ndarray], Any, Any]:
  """The data, the model (Flax) and the optimizer of ``setup``.

  The base rate is constant: the branches isolate the batch, not the schedule.
  """
  import optax_lena as ol

  if setup.optimizer not in OPTIMIZERS[setup.model]:
    raise ValueError(f"--optimizer for {setup.model}: one of {OPTIMIZERS[setup.model]}")
  if setup.model == "cnn":
    from examples import input_pipeline, models

    data = input_pipeline.load_mnist1d(setup.cache_dir, num_samples=setup.mnist1d_samples)
    sgd = {"adascale": ol.adascale, "lena": ol.lena}[setup.optimizer]
    cnn = models.create_model("cnn1d", 10, features=setup.features)
    return data, cnn, sgd(setup.learning_rate, momentum=setup.momentum)
  from benchmarks.adamw_scaling import model as attention_model
  from benchmarks.adamw_scaling import train as adamw_train

  data = adamw_train.load_data(setup.mnist1d_samples, setup.cache_dir)
  adamw = {"adascale_adamw": ol.adascale_adamw, "lena_adamw": ol.lena_adamw}[setup.optimizer]
  tx = adamw(
    setup.learning_rate,
    weight_decay=adamw_train.WEIGHT_DECAY,
    weight_decay_mask=attention_model.decay_mask,
    power=setup.power,
  )
  return data, attention_model.PatchTransformer(), tx


class Trainer:
  """The model, its data, its optimizer and the compiled step (one program per S)."""

  def __init__(self, setup: Setup):
    import jax
    import jax.numpy as jnp

    import optax_lena as ol
    from examples import losses

    self.setup = setup
    data, self.model, self.tx = build(setup)
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


def measure(setup: Setup) -> dict[str, Any]:
  """The main run, its checkpoints' branches, the fits and the estimates (a JSON-able dict)."""
  trainer = Trainer(setup)
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


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


def _fmt(x: float) -> str:
  return "n/a" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:.3g}")


def within_2x(estimate: float, measured: float) -> str:
  if not (math.isfinite(estimate) and math.isfinite(measured) and measured > 0 and estimate > 0):
    return "n/a"
  return "yes" if 0.5 <= estimate / measured <= 2.0 else "no"


def table(result: dict[str, Any]) -> str:
  """The Markdown table of a :func:`measure` result."""
  scales = result["setup"]["scales"]
  header = [
    "update",
    "loss",
    *[f"updates S={s}" for s in scales],
    "S_min",
    "E_min",
    "B_crit (fit)",
    "B_crit (Zhang 20%)",
    "estimate (state)",
    "B_simple fresh",
    "state within 2x: fit / Zhang",
    "fresh within 2x: fit / Zhang",
  ]
  rows = [
    [
      r["checkpoint"],
      f"{r['train_loss']:.3f}",
      *[_fmt(u) for u in r["updates"]],
      _fmt(r["s_min"]),
      _fmt(r["e_min"]),
      _fmt(r["b_crit"]),
      _fmt(r["zhang"]),
      _fmt(r["estimate"]),
      _fmt(r["estimate_fresh"]),
      f"{within_2x(r['estimate'], r['b_crit'])} / {within_2x(r['estimate'], r['zhang'])}",
      f"{within_2x(r['estimate_fresh'], r['b_crit'])} / "
      f"{within_2x(r['estimate_fresh'], r['zhang'])}",
    ]
    for r in result["rows"]
  ]
  return harness.markdown_table(header, rows)


def plot(result: dict[str, Any], path: Path) -> Path:
  """Updates against S per checkpoint, the fitted curves and the estimates (PNG)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  scales = np.asarray(result["setup"]["scales"], np.float64)
  fig, ax = plt.subplots(figsize=(7, 4.5))
  grid = np.geomspace(scales[0], scales[-1], 100)
  for i, r in enumerate(result["rows"]):
    color = f"C{i}"
    ax.loglog(scales, r["updates"], "o", color=color, label=f"update {r['checkpoint']}")
    if math.isfinite(r["s_min"]):
      ax.loglog(grid, r["s_min"] + r["e_min"] / grid, "-", color=color, alpha=0.6)
    for key, style in (("b_crit", "-"), ("estimate", "--"), ("estimate_fresh", ":")):
      if math.isfinite(r[key]) and scales[0] / 4 < r[key] < scales[-1] * 4:
        ax.axvline(r[key], color=color, linestyle=style, alpha=0.5)
  ax.set_xlabel("S (per-worker batches per update)")
  ax.set_ylabel(f"updates to a {result['setup']['decrease']:.0%} lower training loss")
  ax.set_title("Critical batch: fit (solid), state estimate (dashed), fresh B_simple (dotted)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="benchmarks/critical_batch/results")
  parser.add_argument("--model", default="cnn", choices=tuple(OPTIMIZERS))
  parser.add_argument(
    "--optimizer",
    help="cnn: adascale (default), lena; attention: lena_adamw (default), adascale_adamw",
  )
  parser.add_argument("--quick", action="store_true", help="the smoke test's sizes")
  parser.add_argument(
    "--report_only", action="store_true", help="rebuild every table and plot from --out's JSON"
  )
  args = parser.parse_args(argv)
  out = Path(args.out)
  if args.report_only:
    for path in sorted(out.glob("critical_batch_*.json")):
      result = json.loads(path.read_text())
      name = path.stem.removeprefix("critical_batch_")
      harness.write_text(out / f"table_{name}.md", table(result) + "\n")
      plot(result, path.with_suffix(".png"))
    return
  setup = quick(model=args.model) if args.quick else Setup() if args.model == "cnn" else attention()
  if args.optimizer is not None:
    setup = dataclasses.replace(setup, optimizer=args.optimizer)
  result = measure(setup)
  result["machine"] = harness.machine_info()
  # The CNN's files keep their names: critical_batch_adascale.json, table_lena.md, ...
  name = setup.optimizer if setup.model == "cnn" else f"{setup.model}_{setup.optimizer}"
  harness.write_json(out / f"critical_batch_{name}.json", result)
  harness.write_text(out / f"table_{name}.md", table(result) + "\n")
  plot(result, out / f"critical_batch_{name}.png")
  print(table(result))


if __name__ == "__main__":
  main()
