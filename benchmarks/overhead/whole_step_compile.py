"""Compile time of a whole training step, per optimizer, against SGD-momentum.

Run from the repository root::

  python -m benchmarks.overhead.whole_step_compile [--models resnet18,mlp50,mlp250] [--out DIR]

The step is what a user jits: forward and backward of S = 4 per-worker batches
(``jax.vmap(jax.grad(loss))``), then ``ol.stacked_grad_stats`` and the update for the optimizers
that take statistics (LENA, AdaScale, LSW), or the mean gradient (the sum of the S slices over
S, ``common.slices_mean``) and the update for the others (SGD-momentum, ``optax.lars``,
``optax.lamb``), then ``optax.apply_updates``. Each optimizer's
step is built afresh and timed as ``jax.jit(step).lower(...).compile()`` on abstract inputs;
every optimizer is compiled ``--repeats`` times (default 2), interleaved in alternating order
in one process, and the best time counts. The time of record is the **CPU seconds** of
``lowered.compile()`` (``time.process_time``, every XLA thread included): on a shared machine
they move far less with the load than wall seconds, which are kept as context. Models:
ResNet-18 at CIFAR shapes (``examples.models.ResNet18``, 62 leaves, BatchNorm in inference
mode) and MLPs with LayerNorm of depth D (``mlpD``: 4 D + 2 leaves, width 32).

Writes ``whole_step_compile.md`` (the table), ``whole_step_compile.json`` and
``whole_step_compile.png`` to ``--out`` (with ``--tag``, ``whole_step_compile_TAG.*``). The
ratios are the figures of record; the seconds are context (they depend on the machine and its
load, which the files record: the load average before and after the run).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

import optax_lena as ol
from benchmarks import harness
from benchmarks.overhead.common import optimizers, slices_mean
from benchmarks.overhead.state_and_compile import kernel_counts

PyTree = Any
NUM_SAMPLES = 4
PER_WORKER_BATCH = 8
ORDER = ("sgd_momentum", "lars", "lamb", "adascale", "linear_scaling", "lena")
LABELS = {
  "sgd_momentum": "SGD-m",
  "lars": "optax.lars",
  "lamb": "optax.lamb",
  "adascale": "AdaScale",
  "linear_scaling": "LSW",
  "lena": "LENA",
}


def layernorm_mlp(depth: int, width: int = 32, num_classes: int = 10):
  """A flax MLP of ``depth`` Dense + LayerNorm + ReLU layers and a Dense head (4 D + 2 leaves)."""
  import flax.linen as nn

  class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      for _ in range(depth):
        x = nn.relu(nn.LayerNorm()(nn.Dense(width)(x)))
      return nn.Dense(num_classes)(x)

  return MLP(), (width,)


def model_for(name: str):
  """(apply(params, x) -> logits, params shapes, one example's input shape) of a model name."""
  if name == "resnet18":
    from examples.models import ResNet18

    model, in_shape = ResNet18(num_classes=10), (32, 32, 3)
    variables = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, *in_shape)), train=False)
    )
    extra = {k: v for k, v in variables.items() if k != "params"}

    def apply(params, x):
      # BatchNorm in inference mode: the statistics are constants of the step (their update
      # would be the same for every optimizer).
      consts = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), extra)
      return model.apply({"params": params, **consts}, x, train=False)

    return apply, variables["params"], in_shape
  if name.startswith("mlp"):
    model, in_shape = layernorm_mlp(int(name[3:]))
    variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, *in_shape))))
    return (lambda p, x: model.apply({"params": p}, x)), variables["params"], in_shape
  raise ValueError(f"unknown model {name!r}: resnet18 or mlpD (D layers)")


def make_step(apply, tx: optax.GradientTransformation, uses_stats: bool, layer_axes: Any = None):
  """The whole training step of ``apply``'s model with ``tx`` (``layer_axes``: the statistics'
  and the optimizer's, for a model with stacked layers)."""

  def loss(params, x, y):
    logits = apply(params, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  def step(params, opt_state, x, y):
    stacked = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, x, y)
    if uses_stats:
      mean, stats = ol.stacked_grad_stats(stacked, layer_axes=layer_axes)
      updates, opt_state = tx.update(mean, opt_state, params, grad_stats=stats)
    else:
      mean = slices_mean(stacked)
      updates, opt_state = tx.update(mean, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  return step


def compile_once(model: str, name: str) -> dict[str, float]:
  """Builds ``model``'s step for optimizer ``name`` from scratch and compiles it once."""
  apply, params, in_shape = model_for(model)
  return compile_step(apply, params, in_shape, *optimizers(NUM_SAMPLES)[name])


def compile_step(
  apply, params: PyTree, in_shape: Sequence[int], tx, uses_stats: bool, layer_axes: Any = None
) -> dict[str, float]:
  """Compiles the whole step of ``apply``'s model with ``tx`` once, on abstract inputs: its
  seconds (wall: lower + compile, compile; CPU: compile) and (distinct) kernels."""
  state = jax.eval_shape(tx.init, params)
  x = jax.ShapeDtypeStruct((NUM_SAMPLES, PER_WORKER_BATCH, *in_shape), jnp.float32)
  y = jax.ShapeDtypeStruct((NUM_SAMPLES, PER_WORKER_BATCH), jnp.int32)
  start = time.perf_counter()
  step = make_step(apply, tx, uses_stats, layer_axes)
  lowered = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, x, y)
  mid, cpu = time.perf_counter(), time.process_time()
  compiled = lowered.compile()
  end, cpu = time.perf_counter(), time.process_time() - cpu
  kernels, distinct = kernel_counts(compiled.as_text() or "")
  return {
    "seconds": end - start,
    "compile_seconds": end - mid,
    "compile_cpu_seconds": cpu,
    "kernels": kernels,
    "distinct_kernels": distinct,
  }


def optimizer_entry(
  runs: list[dict[str, float]], summary: tuple[str, float], base_cpu_s: float
) -> dict[str, Any]:
  """One optimizer's entry in a model's row: ``summary`` (its key and the CPU seconds that stand
  for the runs), every run's CPU and wall seconds, the ratio of the summary to SGD-momentum's
  ``base_cpu_s``, and the last run's kernel counts."""
  key, cpu_s = summary
  return {
    key: cpu_s,
    "all_cpu_s": [r["compile_cpu_seconds"] for r in runs],
    "all_wall_s": [r["seconds"] for r in runs],
    "ratio_vs_sgd_momentum": cpu_s / base_cpu_s,
    "kernels": runs[-1]["kernels"],
    "distinct_kernels": runs[-1]["distinct_kernels"],
  }


def bench(
  models: Sequence[str], names: Sequence[str] = ORDER, repeats: int = 2
) -> list[dict[str, Any]]:
  rows = []
  for model in models:
    leaves = len(jax.tree.leaves(model_for(model)[1]))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for i in range(repeats):
      for name in names if i % 2 == 0 else names[::-1]:
        runs[name].append(compile_once(model, name))
        last = runs[name][-1]
        print(
          f"  {model} ({leaves} leaves) {name}: {last['compile_cpu_seconds']:.2f} CPU s", flush=True
        )
    best = {name: min(r["compile_cpu_seconds"] for r in runs[name]) for name in names}
    row: dict[str, Any] = {"model": model, "leaves": leaves}
    for name in names:
      row[name] = optimizer_entry(runs[name], ("best_cpu_s", best[name]), best["sgd_momentum"])
    rows.append(row)
    print_ratios(f"{model} ({leaves} leaves)", row, names)
  return rows


def print_ratios(label: str, row: dict[str, Any], names: Sequence[str]) -> None:
  """One line per model: each optimizer's compile over SGD-momentum's."""
  ratios = ", ".join(f"{n} {row[n]['ratio_vs_sgd_momentum']:.2f}x" for n in names)
  print(f"{label}: {ratios}", flush=True)


def table(rows: list[dict[str, Any]], names: Sequence[str]) -> str:
  """The markdown table: per model, each optimizer's best compile time / SGD-momentum's."""
  head = "| model | leaves | " + " | ".join(f"{LABELS.get(n, n)} / SGD-m" for n in names[1:])
  head += (
    " | SGD-m (CPU s) | distinct kernels: " + ", ".join(LABELS.get(n, n) for n in names) + " |"
  )
  lines = [head, "|" + "---|" * (len(names) + 3)]
  for r in rows:
    ratios = " | ".join(f"{r[n]['ratio_vs_sgd_momentum']:.2f}x" for n in names[1:])
    kernels = ", ".join(str(r[n]["distinct_kernels"]) for n in names)
    base = r["sgd_momentum"]["best_cpu_s"]
    lines.append(f"| {r['model']} | {r['leaves']} | {ratios} | {base:.2f} | {kernels} |")
  return "\n".join(lines) + "\n"


def check_rows(rows: list[dict[str, Any]], names: Sequence[str]) -> None:
  """Every optimizer has a positive finite ratio in every row (a failed compile would not)."""
  for r in rows:
    for n in names:
      ratio = r[n]["ratio_vs_sgd_momentum"]
      if not (math.isfinite(ratio) and ratio > 0):
        raise RuntimeError(f"{r['model']} {n}: ratio {ratio}")


def plot(rows: list[dict[str, Any]], names: Sequence[str], path: Path, title: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4))
  labels = [f"{r['model']}\n({r['leaves']} leaves)" for r in rows]
  width = 0.8 / len(names)
  for j, name in enumerate(names):
    ax.bar(
      [i + j * width for i in range(len(rows))],
      [r[name]["ratio_vs_sgd_momentum"] for r in rows],
      width,
      label=LABELS.get(name, name),
    )
  ax.axhline(1.0, color="k", lw=0.8)
  ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], labels)
  ax.set_ylabel("whole-step compile time / SGD-momentum")
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--models", default="resnet18,mlp50,mlp250")
  parser.add_argument("--optimizers", default=",".join(ORDER))
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--tag", default="")
  parser.add_argument("--out", type=Path, default=Path("benchmarks/overhead/results"))
  args = parser.parse_args(argv)
  names = args.optimizers.split(",")
  if names[0] != "sgd_momentum":
    raise SystemExit("--optimizers must start with sgd_momentum (the baseline)")
  command = "python -m benchmarks.overhead.whole_step_compile " + " ".join(
    sys.argv[1:] if argv is None else argv
  )
  command = command.strip()
  machine = harness.machine_info()
  print(f"{command} on {machine}", flush=True)
  load_before = [round(x, 2) for x in os.getloadavg()]
  start = time.perf_counter()
  rows = bench(args.models.split(","), names, args.repeats)
  seconds = time.perf_counter() - start
  load_after = [round(x, 2) for x in os.getloadavg()]
  check_rows(rows, names)
  stem = "whole_step_compile" + (f"_{args.tag}" if args.tag else "")
  args.out.mkdir(parents=True, exist_ok=True)
  harness.write_json(
    args.out / f"{stem}.json",
    {
      "command": command,
      "machine": machine,
      "load_average_before": load_before,
      "load_average_after": load_after,
      "num_samples": NUM_SAMPLES,
      "repeats": args.repeats,
      "seconds": seconds,
      "rows": rows,
    },
  )
  markdown = (
    f"Command: `{command}` ({seconds:.0f} s). Machine: {machine['cpu']}, "
    f"{machine['cpu_cores']} cores, jax {machine['jax']}, optax {machine['optax']}; load "
    f"average (1, 5, 15 min) {load_before} before, {load_after} after. Whole-step "
    f"`jax.jit(step).lower(...).compile()`, S = {NUM_SAMPLES}, CPU seconds of the compile, best "
    f"of {args.repeats} fresh compiles per optimizer, interleaved in one process; ratios are of "
    "record, seconds are context.\n\n" + table(rows, names)
  )
  (args.out / f"{stem}.md").write_text(markdown)
  print(markdown, flush=True)
  plot(rows, names, args.out / f"{stem}.png", f"{command}\n(best of {args.repeats})")


if __name__ == "__main__":
  main()
