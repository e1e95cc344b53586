"""How LENA's per-leaf factors reach the leaves, and how the statistics reduce: step and compile.

Run from the repository root::

  python -m benchmarks.overhead.factor_split [--repeats 40] [--out benchmarks/overhead/results]

At ResNet-18 (62 leaves, width 64) it compares, side by side in one process:

* the per-leaf ratio and warm-up factor read as slices of their vectors at constant offsets
  (``slice``, the code before 2026-12-05 below 128 leaves), split into scalars by two levels of
  variadic reduces (``split2``, the library's ``tree_utils.unstack_scalars``) or by one
  (``split1``): the update-only
  step time (statistics given) and the CPU seconds of the whole training step's compile, both
  over SGD-momentum's;
* the statistics of S = 8 stacked gradients as separate reductions (``separate``, the code
  before 2026-12-05) and as two-output reductions (``two_output``, the library's): the time of
  the step statistics + LENA's update, over the mean + SGD-momentum step.

Each variant is traced with the library's code patched for that trace only; the arithmetic is
the same in all, so their updates are bitwise equal. Writes ``factor_split.md/.json/.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import optax_lena as ol
from benchmarks import harness
from benchmarks.overhead.common import (
  NUM_WORKERS,
  apply_update,
  optimizers,
  time_interleaved,
  update_stepper,
)
from benchmarks.overhead.trees import grad_stats_for, materialize, resnet18_shapes
from benchmarks.overhead.whole_step_compile import (
  NUM_SAMPLES,
  PER_WORKER_BATCH,
  make_step,
  model_for,
)
from optax_lena._src import tree_utils

SPLITS = ("slice", "split2", "split1")


@contextlib.contextmanager
def factors_as(split: str) -> Iterator[None]:
  """Traces inside this context read the per-leaf factors the ``split`` way."""
  saved = tree_utils.unstack_scalars
  if split == "slice":
    tree_utils.unstack_scalars = tree_utils.unpack_scalars
  elif split == "split1":
    tree_utils.unstack_scalars = one_level_split
  try:
    yield
  finally:
    tree_utils.unstack_scalars = saved


def one_level_split(vector: jax.Array) -> list[jax.Array]:
  """The split as one variadic reduce over the whole vector (n outputs, n^2 comparisons)."""
  if vector.shape[0] <= 1:
    return tree_utils.unpack_scalars(vector)
  return list(tree_utils._select_each(vector, 0))


def separate_stats(stacked: Any) -> tuple[Any, ol.GradStats]:
  """``ol.stacked_grad_stats`` as it was: the mean, the workers' norms and the mean's norm as
  three reductions per leaf."""

  def per_leaf(g):
    mean = jnp.mean(g, axis=0)
    per_worker = jnp.sum(jnp.square(g), axis=tuple(range(1, g.ndim)))
    return mean, jnp.mean(per_worker), jnp.sum(jnp.square(mean))

  leaves, treedef = jax.tree.flatten(stacked)
  triples = [per_leaf(g) for g in leaves]
  part = lambda i: jax.tree.unflatten(treedef, [t[i] for t in triples])
  return part(0), ol.GradStats(part(1), leaves[0].shape[0], part(2))


def step_ratios(repeats: int) -> dict[str, float]:
  """Median step time of every variant over its SGD-momentum baseline's."""
  shapes = resnet18_shapes()
  opts = optimizers(NUM_WORKERS)
  sgd, lena = opts["sgd_momentum"][0], opts["lena"][0]
  grads = materialize(shapes, seed=1)
  stats = grad_stats_for(grads)
  stacked = materialize(shapes, seed=1, lead=(NUM_WORKERS,))
  runners = {}

  def add(name: str, fn: Callable, tx: Any, consts: tuple, split: str = "split2") -> None:
    with factors_as(split):
      runner = update_stepper(fn, tx, materialize(shapes, seed=0), consts)
      runner()  # traced and compiled here, inside the context
    runners[name] = runner

  add("update_sgd", lambda p, s, g, st: apply_update(sgd, False, g, s, p), sgd, (grads, stats))
  for split in SPLITS:
    fn = lambda p, s, g, st: apply_update(lena, True, g, s, p, st)
    add(f"update_{split}", fn, lena, (grads, stats), split)

  def mean_sgd(p, s, x):
    return apply_update(sgd, False, jax.tree.map(lambda g: jnp.mean(g, axis=0), x), s, p)

  def stats_lena(stats_fn):
    def step(p, s, x):
      mean, st = stats_fn(x)
      return apply_update(lena, True, mean, s, p, st)

    return step

  add("stacked_sgd", mean_sgd, sgd, (stacked,))
  add("stacked_separate", stats_lena(separate_stats), lena, (stacked,))
  add("stacked_two_output", stats_lena(ol.stacked_grad_stats), lena, (stacked,))
  times = time_interleaved(runners, repeats, warmup=1)
  median = {name: float(np.median(t)) for name, t in times.items()}
  out = {f"{n}_ms": 1e3 * m for n, m in median.items()}
  for name, m in median.items():
    out[name] = m / median["update_sgd" if name.startswith("update") else "stacked_sgd"]
  return out


def compile_ratios(repeats: int) -> dict[str, float]:
  """CPU seconds of the whole step's compile (best of ``repeats``) over SGD-momentum's."""
  opts = optimizers(NUM_SAMPLES)
  apply, params, in_shape = model_for("resnet18")
  x = jax.ShapeDtypeStruct((NUM_SAMPLES, PER_WORKER_BATCH, *in_shape), jnp.float32)
  y = jax.ShapeDtypeStruct((NUM_SAMPLES, PER_WORKER_BATCH), jnp.int32)

  def cpu_seconds(name: str, split: str) -> float:
    tx, uses_stats = opts[name]
    with factors_as(split):
      lowered = jax.jit(make_step(apply, tx, uses_stats)).lower(
        params, jax.eval_shape(tx.init, params), x, y
      )
    start = time.process_time()
    lowered.compile()
    return time.process_time() - start

  names = ["sgd_momentum", *SPLITS]
  runs: dict[str, list[float]] = {n: [] for n in names}
  for i in range(repeats):
    for n in names if i % 2 == 0 else names[::-1]:
      runs[n].append(
        cpu_seconds("sgd_momentum", "slice") if n == names[0] else cpu_seconds("lena", n)
      )
  out = {f"compile_{n}_cpu_s": min(v) for n, v in runs.items()}
  out |= {f"compile_{n}": min(runs[n]) / min(runs["sgd_momentum"]) for n in SPLITS}
  return out


def report(record: dict[str, Any], out: Path) -> None:
  r = record["ratios"]
  lines = [
    f"Command: `{record['command']}`. Machine: {record['machine']['cpu']}, "
    f"{record['machine']['cpu_cores']} cores, jax {record['machine']['jax']}; load average "
    f"{record['load_average_before']} before, {record['load_average_after']} after. "
    "Ratios to SGD-momentum in the same process (medians of interleaved steps; compile: CPU "
    "seconds, best of the repeats).",
    "",
    "| ResNet-18, 62 leaves | sliced at constant offsets | split, two levels | split, one level |",
    "|---|---|---|---|",
    "| update only (statistics given) | "
    + " | ".join(f"{r[f'update_{s}']:.3f}x" for s in SPLITS)
    + " |",
    "| whole-step compile, CPU s | "
    + " | ".join(f"{r[f'compile_{s}']:.2f}x" for s in SPLITS)
    + " |",
    "",
    "| ResNet-18, S = 8 stacked | statistics as separate reductions | two-output reductions |",
    "|---|---|---|",
    f"| statistics + LENA / mean + SGD-m | {r['stacked_separate']:.3f}x | "
    f"{r['stacked_two_output']:.3f}x |",
    f"| step, ms (mean + SGD-m: {r['stacked_sgd_ms']:.0f}) | {r['stacked_separate_ms']:.0f} | "
    f"{r['stacked_two_output_ms']:.0f} |",
  ]
  markdown = "\n".join(lines) + "\n"
  (out / "factor_split.md").write_text(markdown)
  print(markdown)

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
  axes[0].bar(SPLITS, [r[f"update_{s}"] for s in SPLITS], color="C0")
  axes[0].set_title("update only / SGD-m", fontsize=9)
  axes[1].bar(SPLITS, [r[f"compile_{s}"] for s in SPLITS], color="C1")
  axes[1].set_title("whole-step compile CPU s / SGD-m", fontsize=9)
  for ax in axes:
    ax.axhline(1.0, color="k", lw=0.8)
  fig.suptitle("ResNet-18: LENA's per-leaf factors sliced or split", fontsize=10)
  fig.tight_layout()
  fig.savefig(out / "factor_split.png", dpi=120)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
  parser.add_argument("--repeats", type=int, default=40, help="interleaved steps per variant")
  parser.add_argument("--compile_repeats", type=int, default=2)
  parser.add_argument("--out", type=Path, default=Path("benchmarks/overhead/results"))
  parser.add_argument("--report_only", action="store_true", help="table and plot from the JSON")
  args = parser.parse_args(argv)
  if args.report_only:
    report(json.loads((args.out / "factor_split.json").read_text()), args.out)
    return
  load_before = [round(x, 2) for x in os.getloadavg()]
  ratios = step_ratios(args.repeats) | compile_ratios(args.compile_repeats)
  record = {
    "command": "python -m benchmarks.overhead.factor_split "
    + " ".join(f"--repeats {args.repeats} --compile_repeats {args.compile_repeats}".split()),
    "machine": harness.machine_info(),
    "load_average_before": load_before,
    "load_average_after": [round(x, 2) for x in os.getloadavg()],
    "ratios": ratios,
  }
  args.out.mkdir(parents=True, exist_ok=True)
  harness.write_json(args.out / "factor_split.json", record)
  report(record, args.out)


if __name__ == "__main__":
  main()
