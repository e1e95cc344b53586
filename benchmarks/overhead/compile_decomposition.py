"""Which part of LENA's whole step costs the compile time: SGD-momentum plus one piece at a time.

Run from the repository root::

  python -m benchmarks.overhead.compile_decomposition [--models resnet18,mlp50] [--repeats 2]

The step of ``whole_step_compile`` (forward and backward of S = 4 per-worker batches, then the
update) is compiled with SGD-momentum's update and, added one at a time, the pieces LENA's step
has on top of it: the squared norm of the mean gradient per leaf, the per-worker squared norms
per leaf, both (``ol.stacked_grad_stats``), the statistics feeding ``ol.skip_nonfinite_steps``
around SGD-momentum, and the full LSW, AdaScale and LENA updates. A piece's statistics are
outputs of the step, so XLA cannot drop them.

The measure is the **CPU seconds of the compile** (``time.process_time`` around
``lowered.compile()``, every XLA thread included), best of ``--repeats`` fresh compiles,
interleaved in one process, as a ratio to SGD-momentum's. On a shared machine CPU seconds move
far less with the load than wall seconds (which are recorded as context). Writes
``compile_decomposition.md/.json/.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

import optax_lena as ol
from benchmarks import harness
from benchmarks.overhead.common import optimizers, slices_mean
from benchmarks.overhead.whole_step_compile import (
  NUM_SAMPLES,
  PER_WORKER_BATCH,
  make_step,
  model_for,
)

VARIANTS = {
  "sgd_momentum": "SGD-m",
  "mean_sq": "+ sq. norm of the mean",
  "per_worker_sq": "+ workers' sq. norms",
  "stats": "+ both (stacked_grad_stats)",
  "guard": "+ both + non-finite guard",
  "linear_scaling": "LSW",
  "adascale": "AdaScale",
  "lena": "LENA",
}
# The workers' squared norms written other ways (``--reformulations``): as contractions, and as
# one segment sum over all leaves concatenated; and both statistics as the separate reductions
# ``ol.stacked_grad_stats`` used before it computed them as two-output reductions; and both with
# the leaves of one shape stacked, so that each shape's statistics are one reduction (the mean
# sliced back into leaves, the squared norms back into per-leaf scalars, as GradStats holds them).
REFORMULATIONS = {
  "per_worker_dot": "workers' sq. norms as dot_general",
  "per_worker_concat": "workers' sq. norms, one concatenated segment sum",
  "stats_separate": "both as separate reductions (stacked_grad_stats before 2026-12-05)",
  "stats_grouped": "both, leaves of one shape stacked (one reduction per shape)",
}


def _piece_step(apply: Callable, piece: str) -> tuple[Callable, optax.GradientTransformation]:
  """SGD-momentum's step with one of LENA's pieces added; the piece's scalars are outputs."""
  sgd, _ = optimizers(NUM_SAMPLES)["sgd_momentum"]
  tx = ol.skip_nonfinite_steps(sgd) if piece == "guard" else sgd

  def loss(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(apply(params, x), y).mean()

  def pieces(g):
    mean = slices_mean(g)
    rest = tuple(range(1, g.ndim))
    if piece == "per_worker_dot":
      per_worker = jax.lax.dot_general(g, g, ((rest, rest), ((0,), (0,))))
    else:
      per_worker = jnp.sum(jnp.square(g), axis=rest)
    return mean, jnp.mean(per_worker), jnp.sum(jnp.square(mean))

  def concatenated_norms(leaves):
    flat = jnp.concatenate([jnp.square(g).reshape(g.shape[0], -1) for g in leaves], axis=1)
    ids = jnp.concatenate([jnp.full((g[0].size,), i) for i, g in enumerate(leaves)])
    sums = jax.ops.segment_sum(flat.T, ids, num_segments=len(leaves))  # (leaves, S)
    return list(jnp.mean(sums, axis=1))

  def grouped(stacked):
    leaves = jax.tree.leaves(stacked)
    by_shape: dict[tuple, list[int]] = {}
    for i, g in enumerate(leaves):
      by_shape.setdefault((g.shape, g.dtype), []).append(i)
    means, top, bot = [None] * len(leaves), [None] * len(leaves), [None] * len(leaves)
    for members in by_shape.values():
      group = jnp.stack([leaves[i] for i in members])  # (k, S, ...)
      rest = tuple(range(1, group.ndim - 1))
      mean = jnp.mean(group, axis=1)
      group_top = jnp.mean(jnp.sum(jnp.square(group), axis=tuple(a + 1 for a in rest)), axis=1)
      group_bot = jnp.sum(jnp.square(mean), axis=rest)
      for j, i in enumerate(members):
        means[i], top[i], bot[i] = mean[j], group_top[j], group_bot[j]
    return jax.tree.unflatten(jax.tree.structure(stacked), means), [top, bot]

  def step(params, opt_state, x, y):
    stacked = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, x, y)
    if piece == "stats_grouped":
      mean, scalars = grouped(stacked)
    elif piece in ("stats", "guard"):
      mean, stats = ol.stacked_grad_stats(stacked)
      scalars = [stats.sq_norm_mean, stats.mean_grad_sq_norm]
    else:
      triples = [pieces(g) for g in jax.tree.leaves(stacked)]
      mean = jax.tree.unflatten(jax.tree.structure(stacked), [t[0] for t in triples])
      scalars = [[t[2] if piece == "mean_sq" else t[1] for t in triples]]
      if piece == "stats_separate":
        scalars = [[t[1] for t in triples], [t[2] for t in triples]]
      if piece == "per_worker_concat":
        scalars = [concatenated_norms(jax.tree.leaves(stacked))]
    extra = {"grad_stats": stats} if piece == "guard" else {}
    updates, opt_state = tx.update(mean, opt_state, params, **extra)
    return optax.apply_updates(params, updates), opt_state, scalars

  return step, tx


def compile_cpu_seconds(model: str, variant: str) -> tuple[float, float]:
  """(CPU seconds, wall seconds) of one fresh compile of ``model``'s step with ``variant``."""
  apply, params, in_shape = model_for(model)
  if variant in ("sgd_momentum", "linear_scaling", "adascale", "lena"):
    tx, uses_stats = optimizers(NUM_SAMPLES)[variant]
    step = make_step(apply, tx, uses_stats)
  else:
    step, tx = _piece_step(apply, variant)
  state = jax.eval_shape(tx.init, params)
  x = jax.ShapeDtypeStruct((NUM_SAMPLES, PER_WORKER_BATCH, *in_shape), jnp.float32)
  y = jax.ShapeDtypeStruct((NUM_SAMPLES, PER_WORKER_BATCH), jnp.int32)
  lowered = jax.jit(step).lower(params, state, x, y)
  cpu, wall = time.process_time(), time.perf_counter()
  lowered.compile()
  return time.process_time() - cpu, time.perf_counter() - wall


def bench(
  models: Sequence[str], repeats: int, reformulated: Sequence[str] = ()
) -> list[dict[str, Any]]:
  """One row per model; the models in ``reformulated`` also get the REFORMULATIONS."""
  rows = []
  for model in models:
    names = [*VARIANTS, *(REFORMULATIONS if model in reformulated else ())]
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for i in range(repeats):
      for name in names if i % 2 == 0 else names[::-1]:
        runs[name].append(compile_cpu_seconds(model, name))
        print(f"  {model} {name}: {runs[name][-1][0]:.2f} CPU s", flush=True)
    base = min(c for c, _ in runs["sgd_momentum"])
    row: dict[str, Any] = {"model": model, "leaves": len(jax.tree.leaves(model_for(model)[1]))}
    for name in names:
      best = min(c for c, _ in runs[name])
      row[name] = {
        "cpu_s": [c for c, _ in runs[name]],
        "wall_s": [w for _, w in runs[name]],
        "ratio_vs_sgd_momentum": best / base,
      }
    rows.append(row)
  return rows


def table(rows: list[dict[str, Any]]) -> str:
  head = "| model | leaves | " + " | ".join(VARIANTS[n] for n in VARIANTS) + " | SGD-m (CPU s) |"
  lines = [head, "|" + "---|" * (len(VARIANTS) + 3)]
  for r in rows:
    ratios = " | ".join(f"{r[n]['ratio_vs_sgd_momentum']:.2f}x" for n in VARIANTS)
    lines.append(
      f"| {r['model']} | {r['leaves']} | {ratios} | {min(r['sgd_momentum']['cpu_s']):.2f} |"
    )
  reformulated = [r for r in rows if all(n in r for n in REFORMULATIONS)]
  if reformulated:
    columns = {
      "per_worker_sq": "workers' sq. norms as reductions",
      "per_worker_dot": REFORMULATIONS["per_worker_dot"],
      "per_worker_concat": REFORMULATIONS["per_worker_concat"],
      "stats": "both as two-output reductions (stacked_grad_stats)",
      "stats_separate": REFORMULATIONS["stats_separate"],
      "stats_grouped": REFORMULATIONS["stats_grouped"],
    }
    names, labels = list(columns), list(columns.values())
    lines += ["", "| model | " + " | ".join(labels) + " |", "|" + "---|" * len(labels) + "---|"]
    for r in reformulated:
      cells = " | ".join(f"{r[n]['ratio_vs_sgd_momentum']:.2f}x" for n in names)
      lines.append(f"| {r['model']} | {cells} |")
  return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(8, 4))
  width = 0.8 / len(rows)
  for j, r in enumerate(rows):
    ax.bar(
      [i + j * width for i in range(len(VARIANTS))],
      [r[n]["ratio_vs_sgd_momentum"] for n in VARIANTS],
      width,
      label=f"{r['model']} ({r['leaves']} leaves)",
    )
  ax.axhline(1.0, color="k", lw=0.8)
  ax.set_xticks(
    [i + 0.4 - width / 2 for i in range(len(VARIANTS))],
    list(VARIANTS.values()),
    rotation=25,
    ha="right",
    fontsize=8,
  )
  ax.set_ylabel("compile CPU seconds / SGD-momentum's")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
  parser.add_argument("--models", default="resnet18,mlp50")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--reformulations", default="resnet18", help="models that also run them")
  parser.add_argument("--out", type=Path, default=Path("benchmarks/overhead/results"))
  parser.add_argument("--report_only", action="store_true", help="table and plot from the JSON")
  args = parser.parse_args(argv)
  if args.report_only:
    record = json.loads((args.out / "compile_decomposition.json").read_text())
    write_report(record, args.out)
    return
  command = "python -m benchmarks.overhead.compile_decomposition " + " ".join(
    sys.argv[1:] if argv is None else argv
  )
  machine = harness.machine_info()
  load_before = [round(x, 2) for x in os.getloadavg()]
  rows = bench(args.models.split(","), args.repeats, args.reformulations.split(","))
  load_after = [round(x, 2) for x in os.getloadavg()]
  args.out.mkdir(parents=True, exist_ok=True)
  record = {"command": command.strip(), "machine": machine, "num_samples": NUM_SAMPLES}
  record |= {"load_average_before": load_before, "load_average_after": load_after, "rows": rows}
  record["repeats"] = args.repeats
  harness.write_json(args.out / "compile_decomposition.json", record)
  write_report(record, args.out)


def write_report(record: dict[str, Any], out: Path) -> None:
  machine = record["machine"]
  markdown = (
    f"Command: `{record['command']}`. Machine: {machine['cpu']}, {machine['cpu_cores']} cores, "
    f"jax {machine['jax']}; load average {record['load_average_before']} before, "
    f"{record['load_average_after']} after. CPU seconds of `lowered.compile()`, "
    f"S = {record['num_samples']}, best of {record.get('repeats', 2)} interleaved fresh "
    "compiles, over SGD-momentum's.\n\n" + table(record["rows"])
  )
  (out / "compile_decomposition.md").write_text(markdown)
  plot(record["rows"], out / "compile_decomposition.png")
  print(markdown)


if __name__ == "__main__":
  main()
