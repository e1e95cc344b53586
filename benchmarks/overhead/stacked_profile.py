"""Where the time of the stacked statistics + update goes: per-kernel times from the profiler.

Run from the repository root::

  python -m benchmarks.overhead.stacked_profile [--tree resnet18] [--steps 30] [--out DIR]

The steps of section (b) on S = 8 stacked gradients of the ResNet-18 tree (or the scanned
transformer-shaped tree, ``--tree scanned_transformer``), each jitted with its carry donated:

* ``slices_mean+sgd_momentum``: the baseline, the mean as the sum of the S slices over S;
* ``jnp.mean+sgd_momentum``: the same with ``jnp.mean(g, axis=0)`` (context: a scalar loop);
* ``stacked_grad_stats+lena``: ``ol.stacked_grad_stats`` and LENA's update;
* ``two_output_norms+lena``: the same with both squared norms of every leaf as one two-output
  reduction to a scalar (``ol.stacked_grad_stats`` before issue 49), for comparison;
* ``sgd_momentum (update only)`` and ``lena (update only)``: the updates from a given mean and
  given statistics;
* ``one read of the stack``: the sum of the squares of every element of the S slices, the cost
  of one pass over them.

Each step runs under ``jax.profiler`` for ``--steps`` steps after warm-up; per kernel (a fused
computation of the compiled module) the minimum over the steps is kept, the least disturbed
time on a shared machine, and the step's kernels are summed by kind. The wall time of the same
steps (median) is context: the steps are not interleaved here, section (b) of the main
benchmark times them side by side. Writes ``stacked_profile.md`` and ``.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness

if __name__ == "__main__":  # glibc told to keep freed memory, as the main benchmark
  harness.reexec_with_caching_malloc()

import jax
import jax.numpy as jnp
import numpy as np

import optax_lena as ol
from benchmarks.overhead.common import (
  NUM_WORKERS,
  apply_update,
  optimizers,
  slices_mean,
)
from benchmarks.overhead.trees import (
  grad_stats_for,
  materialize,
  resnet18_shapes,
  scanned_layer_axes,
  transformer_shapes,
  tree_info,
)

PyTree = Any


def _two_output_norms(stacked: PyTree) -> tuple[PyTree, ol.GradStats]:
  """The statistics with both squared norms of a leaf as one two-output reduction to a scalar
  (``ol.stacked_grad_stats`` of 2026-12-05): on XLA:CPU a scalar loop, not a library kernel."""
  zero = lambda dtype: jnp.zeros((), dtype)
  add_pairs = lambda a, b: (a[0] + b[0], a[1] + b[1])

  def per_leaf(g):
    z = zero(g.dtype)
    total, total_sq = jax.lax.reduce((g, jnp.square(g)), (z, z), add_pairs, (0,))
    mean = total / g.shape[0]
    axes = tuple(range(mean.ndim))
    sq_sum, mean_sq = jax.lax.reduce((total_sq, jnp.square(mean)), (z, z), add_pairs, axes)
    return mean, sq_sum / g.shape[0], mean_sq

  treedef = jax.tree.structure(stacked)
  triples = [per_leaf(g) for g in jax.tree.leaves(stacked)]
  unflatten = lambda i: jax.tree.unflatten(treedef, [t[i] for t in triples])
  return unflatten(0), ol.GradStats(unflatten(1), NUM_WORKERS, unflatten(2))


def steps(layer_axes: Any) -> dict[str, tuple[Callable[..., Any], str]]:
  """name -> (step(params, opt_state, stacked, mean, stats), the optimizer whose state it
  carries)."""
  opts = optimizers(NUM_WORKERS, layer_axes=layer_axes)
  sgd, lena = opts["sgd_momentum"][0], opts["lena"][0]

  def update_only(tx, uses_stats):
    return lambda p, s, stacked, mean, stats: apply_update(tx, uses_stats, mean, s, p, stats)

  def from_stack(statistics):
    def step(p, s, stacked, mean, stats):
      mean, stats = statistics(stacked)
      return apply_update(lena, True, mean, s, p, stats)

    return step

  def baseline(mean_of):
    return lambda p, s, stacked, mean, stats: apply_update(sgd, False, mean_of(stacked), s, p)

  def one_read(p, s, stacked, mean, stats):
    total = sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(stacked))
    return p, jax.tree.map(lambda x: x + 0 * total.astype(x.dtype), s)

  mean_over_axis = lambda t: jax.tree.map(lambda g: jnp.mean(g, axis=0), t)
  out = {
    "slices_mean+sgd_momentum": (baseline(slices_mean), "sgd_momentum"),
    "jnp.mean+sgd_momentum": (baseline(mean_over_axis), "sgd_momentum"),
    "stacked_grad_stats+lena": (
      from_stack(lambda t: ol.stacked_grad_stats(t, layer_axes=layer_axes)),
      "lena",
    ),
  }
  if layer_axes is None:  # the old statistics are per leaf: no per-slice LENA to feed
    out["two_output_norms+lena"] = (from_stack(_two_output_norms), "lena")
  return out | {
    "sgd_momentum (update only)": (update_only(sgd, False), "sgd_momentum"),
    "lena (update only)": (update_only(lena, True), "lena"),
    "one read of the stack": (one_read, "sgd_momentum"),
  }


def profile_step(fn, tx, params, stacked, mean, stats, num_steps: int) -> dict[str, Any]:
  """Per-kernel minimum times (ms) over ``num_steps`` profiled steps, and the wall times."""
  jitted = jax.jit(fn, donate_argnums=(0, 1))
  carry = (jax.tree.map(jnp.copy, params), jax.tree.map(jnp.copy, tx.init(params)))
  compiled = jitted.lower(*carry, stacked, mean, stats).compile()
  text = compiled.as_text() or ""
  kernels = set(re.findall(r"^\s+(?:ROOT )?%(\S+) = ", text.split("\nENTRY")[-1], re.M))
  for _ in range(3):
    carry = jax.block_until_ready(compiled(*carry, stacked, mean, stats))
  walls = []
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      for _ in range(num_steps):
        start = time.perf_counter()
        carry = jax.block_until_ready(compiled(*carry, stacked, mean, stats))
        walls.append(time.perf_counter() - start)
    (trace,) = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
    with gzip.open(trace) as f:
      events = json.load(f)["traceEvents"]
  times: dict[str, list[float]] = collections.defaultdict(list)
  for event in events:
    if event.get("ph") == "X" and event["name"] in kernels:
      times[event["name"]].append(event["dur"] / 1e3)
  minimum = {name: min(t) for name, t in times.items()}
  by_kind: collections.Counter[str] = collections.Counter()
  for name, t in minimum.items():
    by_kind[re.sub(r"\.\d+$", "", name)] += t
  return {
    "kernels": len(minimum),
    "sum_of_kernel_minima_ms": sum(minimum.values()),
    "by_kind_ms": dict(by_kind.most_common()),
    "wall_median_ms": 1e3 * float(np.median(walls)),
    "wall_min_ms": 1e3 * float(np.min(walls)),
  }


def table(rows: dict[str, dict[str, Any]], baseline: str) -> str:
  base = rows[baseline]["sum_of_kernel_minima_ms"]
  lines = [
    "| step | kernels | sum of per-kernel minima, ms | / baseline | largest kinds (ms) | wall "
    "median (min), ms |",
    "|---|---|---|---|---|---|",
  ]
  for name, r in rows.items():
    kinds = ", ".join(f"{k} {v:.1f}" for k, v in list(r["by_kind_ms"].items())[:3])
    lines.append(
      f"| {name} | {r['kernels']} | {r['sum_of_kernel_minima_ms']:.1f} | "
      f"{r['sum_of_kernel_minima_ms'] / base:.2f}x | {kinds} | {r['wall_median_ms']:.1f} "
      f"({r['wall_min_ms']:.1f}) |"
    )
  return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
  parser.add_argument("--tree", choices=("resnet18", "scanned_transformer"), default="resnet18")
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--out", type=Path, default=Path("benchmarks/overhead/results"))
  parser.add_argument("--report_only", action="store_true", help="the table from the JSON")
  args = parser.parse_args(argv)
  stem = f"stacked_profile_{args.tree}"
  if args.report_only:
    record = json.loads((args.out / f"{stem}.json").read_text())
  else:
    if args.tree == "resnet18":
      shapes, layer_axes = resnet18_shapes(64), None
    else:
      shapes, layer_axes = transformer_shapes(16, 192, scanned=True), scanned_layer_axes
    stacked = materialize(shapes, seed=1, lead=(NUM_WORKERS,))
    mean = materialize(shapes, seed=2)
    stats = grad_stats_for(mean, layer_axes=layer_axes)
    params = materialize(shapes, seed=0)
    opts = optimizers(NUM_WORKERS, layer_axes=layer_axes)
    load_before = [round(x, 2) for x in os.getloadavg()]
    rows = {}
    for name, (fn, opt) in steps(layer_axes).items():
      rows[name] = profile_step(fn, opts[opt][0], params, stacked, mean, stats, args.steps)
      print(f"  {name}: {rows[name]['sum_of_kernel_minima_ms']:.1f} ms", flush=True)
    command = "python -m benchmarks.overhead.stacked_profile " + " ".join(
      sys.argv[1:] if argv is None else argv
    )
    record = {
      "command": command.strip(),
      "machine": harness.machine_info(),
      "tree": {"name": args.tree, **tree_info(shapes)},
      "steps": args.steps,
      "load_average_before": load_before,
      "load_average_after": [round(x, 2) for x in os.getloadavg()],
      "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    harness.write_json(args.out / f"{stem}.json", record)
  tree = record["tree"]
  markdown = (
    f"Command: `{record['command']}`. Tree: {tree['name']} ({tree['leaves']} leaves, "
    f"{tree['params']:,} parameters), S = {NUM_WORKERS} stacked. Machine: "
    f"{record['machine']['cpu']}, {record['machine']['cpu_cores']} cores, jax "
    f"{record['machine']['jax']}; load average {record['load_average_before']} before, "
    f"{record['load_average_after']} after. Per kernel the minimum over {record['steps']} "
    "profiled steps (jax.profiler), summed per step; ratios to the baseline's sum.\n\n"
    + table(record["rows"], "slices_mean+sgd_momentum")
  )
  harness.write_text(args.out / f"{stem}.md", markdown)
  print(markdown)


if __name__ == "__main__":
  main()
