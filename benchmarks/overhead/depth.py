"""Compile time against depth: models whose repeated blocks are scanned, and the same unrolled.

Run from the repository root::

  python -m benchmarks.overhead.depth [--depths 12,48,192] [--attention_depths 12]
                                      [--models NAMES] [--repeats 3] [--out DIR] [--report_only]

The step is ``whole_step_compile``'s (forward and backward of S = 4 per-worker batches, the
statistics for the optax_lena optimizers or the mean as a sum of slices for the others, the
update), for a LayerNorm MLP of depth D (``mlpD``, width 32) and the example trainer's attention
model (``attentionD``: ``examples.models.PatchTransformer`` with D blocks), each unrolled (one
parameter leaf per layer and kind) and scanned (``...D_scan``: the blocks under ``nn.scan``,
their parameters stacked on a leading layer axis). On the scanned models ``ol.adascale`` and
``ol.lena`` are per slice (``layer_axes=`` axis 0 of the stacked leaves, the statistics too);
``lena_per_stack`` is LENA without ``layer_axes`` (one layer per stacked leaf, for context).
``optax.lars`` and ``optax.lamb`` have one trust ratio per leaf either way.

The measure is the **CPU seconds** of ``lowered.compile()`` (every XLA thread), the median of
``--repeats`` fresh compiles per optimizer, interleaved in alternating order in one process;
ratios to SGD-momentum's compile of the same model are the figures of record, seconds are
context. Writes ``depth_compile.md`` (table and goals), ``depth_compile.json`` and
``depth_compile.png`` to ``--out``; ``--report_only`` rebuilds the table and plot from the JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import harness
from benchmarks.overhead.common import optimizers
from benchmarks.overhead.whole_step_compile import LABELS as STEP_LABELS
from benchmarks.overhead.whole_step_compile import (
  NUM_SAMPLES,
  compile_step,
  layernorm_mlp,
  optimizer_entry,
  print_ratios,
)

PyTree = Any
ORDER = ("sgd_momentum", "lars", "lamb", "adascale", "lena", "lena_per_stack")
LABELS = {**STEP_LABELS, "lena": "LENA per slice", "lena_per_stack": "LENA per stack"}
# The optax_lena optimizers that take layer_axes on a scanned model.
PER_SLICE = ("adascale", "lena")
# Goals of issue 49 on the scanned models: LENA per slice's compile over SGD-momentum's, and
# its compile at the largest depth over its compile at the smallest.
RATIO_GOAL, DEPTH_GOAL = 1.25, 1.2
MLP_WIDTH = 32


class Model:
  """A model of the sweep: what ``compile_step`` needs, and the scanned model's layer axes."""

  def __init__(self, name: str):
    family, scanned = name.removesuffix("_scan"), name.endswith("_scan")
    self.name, self.scanned = name, scanned
    self.family = family.rstrip("0123456789")
    self.depth = int(family[len(self.family) :])
    if self.family == "mlp":
      build = scanned_mlp if scanned else _unrolled_mlp
    elif self.family == "attention":
      build = _attention
    else:
      raise ValueError(f"unknown model {name!r}: mlpD, attentionD, with _scan for scanned")
    self.apply, self.params, self.in_shape, self.layer_axes = build(self.depth, scanned)

  @property
  def leaves(self) -> int:
    return len(jax.tree.leaves(self.params))


def scanned_mlp(depth: int, scanned: bool = True, width: int = MLP_WIDTH):
  """``whole_step_compile.layernorm_mlp`` with its ``depth`` blocks under ``nn.scan``: the
  blocks' parameters stacked on axis 0 under ``blocks`` (4 stacked leaves), a Dense ``head``."""
  import flax.linen as nn

  del scanned

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, _):
      return nn.relu(nn.LayerNorm()(nn.Dense(width)(x))), None

  class ScannedMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
      stack = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=depth)
      x, _ = stack(name="blocks")(x, None)
      return nn.Dense(10, name="head")(x)

  return _flax_model(ScannedMLP(), (width,), lambda path, leaf: 0 if path[0] == "blocks" else None)


def _unrolled_mlp(depth: int, scanned: bool):
  return _flax_model(*layernorm_mlp(depth, MLP_WIDTH), None)


def _attention(depth: int, scanned: bool):
  """The trainer's attention model with ``depth`` blocks; scanned: its ``scan_layers`` stack,
  whose layer axes Flax records (``optax_lena.flax.layer_axes``)."""
  from examples.models import PatchTransformer

  model = PatchTransformer(depth=depth, scan_layers=scanned)
  if not scanned:
    return _flax_model(model, (40,), None)
  import flax
  import flax.linen as nn

  import optax_lena.flax as olf

  boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 40))))["params"]
  axes = flax.core.freeze(olf.layer_axes(boxed))
  apply, params, in_shape, _ = _flax_model(model, (40,), None)
  return apply, nn.meta.unbox(params), in_shape, axes


def _flax_model(model, in_shape: Sequence[int], layer_axes: Any):
  """(apply(params, x), parameter shapes, one example's shape, layer axes) of a linen model."""
  import flax.linen as nn

  x = jnp.zeros((1, *in_shape))
  params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x))["params"]
  return (lambda p, x: model.apply({"params": p}, x)), nn.meta.unbox(params), in_shape, layer_axes


def names_for(model: Model, names: Sequence[str]) -> list[str]:
  """The optimizers compiled for ``model``: LENA per stack only where it differs from LENA (a
  scanned model)."""
  return [n for n in names if model.scanned or n != "lena_per_stack"]


def transformation(model: Model, name: str) -> tuple[Any, bool, Any]:
  """(transformation, takes statistics, layer axes of the statistics) of ``name`` for ``model``."""
  layer_axes = model.layer_axes if name in PER_SLICE else None
  tx, uses_stats = optimizers(NUM_SAMPLES, layer_axes=layer_axes)[name.removesuffix("_per_stack")]
  return tx, uses_stats, layer_axes


def bench(models: Sequence[str], names: Sequence[str], repeats: int) -> list[dict[str, Any]]:
  rows = []
  for model_name in models:
    model = Model(model_name)
    run_names = names_for(model, names)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in run_names}
    for i in range(repeats):
      for name in run_names if i % 2 == 0 else run_names[::-1]:
        tx, uses_stats, layer_axes = transformation(model, name)
        result = compile_step(model.apply, model.params, model.in_shape, tx, uses_stats, layer_axes)
        runs[name].append(result)
        print(f"  {model_name} {name}: {result['compile_cpu_seconds']:.2f} CPU s", flush=True)
    base = statistics.median(r["compile_cpu_seconds"] for r in runs["sgd_momentum"])
    row: dict[str, Any] = {
      "model": model_name,
      "family": model.family,
      "depth": model.depth,
      "scanned": model.scanned,
      "leaves": model.leaves,
      "params": int(sum(math.prod(x.shape) for x in jax.tree.leaves(model.params))),
      "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    for name in run_names:
      median = statistics.median(r["compile_cpu_seconds"] for r in runs[name])
      row[name] = optimizer_entry(runs[name], ("median_cpu_s", median), base)
    rows.append(row)
    print_ratios(f"{model_name} ({model.leaves} leaves)", row, run_names)
  return rows


# ----------------------------------------------------------------------------------------------
# Report.


def goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Issue 49's goals on the scanned models: LENA per slice <= RATIO_GOAL x SGD-momentum's
  compile (and below optax.lars) per scanned model; per family, LENA's compile at the largest
  scanned depth <= DEPTH_GOAL x its compile at the smallest."""
  out = []
  for r in rows:
    if r["scanned"] and "lena" in r:
      ratio = r["lena"]["ratio_vs_sgd_momentum"]
      lars = r.get("lars", {}).get("ratio_vs_sgd_momentum")
      out.append(
        {
          "goal": f"{r['model']}: LENA per slice / SGD-m (optax.lars: "
          + ("-" if lars is None else f"{lars:.2f}x")
          + ")",
          "limit": RATIO_GOAL,
          "value": ratio,
          "passed": ratio <= RATIO_GOAL and (lars is None or ratio < lars),
        }
      )
  for family in sorted({r["family"] for r in rows}):
    scanned = [r for r in rows if r["family"] == family and r["scanned"] and "lena" in r]
    scanned.sort(key=lambda r: r["depth"])
    if len(scanned) >= 2:
      low, high = scanned[0], scanned[-1]
      value = high["lena"]["median_cpu_s"] / low["lena"]["median_cpu_s"]
      out.append(
        {
          "goal": f"{family}: LENA per slice's compile, depth {high['depth']} / depth "
          f"{low['depth']} (scanned; SGD-m: "
          f"{high['sgd_momentum']['median_cpu_s'] / low['sgd_momentum']['median_cpu_s']:.2f}x)",
          "limit": DEPTH_GOAL,
          "value": value,
          "passed": value <= DEPTH_GOAL,
        }
      )
  return out


def table(rows: list[dict[str, Any]], names: Sequence[str]) -> str:
  cells = [LABELS.get(n, n) + " / SGD-m" for n in names[1:]]
  lines = [
    "| model | depth | blocks | leaves | SGD-m (CPU s) | " + " | ".join(cells) + " | distinct "
    "kernels SGD-m, LENA |",
    "|" + "---|" * (len(cells) + 6),
  ]
  for r in rows:
    ratios = [
      f"{r[n]['ratio_vs_sgd_momentum']:.2f}x" if n in r else "(= LENA per slice)" for n in names[1:]
    ]
    kernels = ", ".join(str(r[n]["distinct_kernels"]) for n in ("sgd_momentum", "lena") if n in r)
    lines.append(
      f"| {r['family']} | {r['depth']} | {'scanned' if r['scanned'] else 'unrolled'} | "
      f"{r['leaves']} | {r['sgd_momentum']['median_cpu_s']:.2f} | {' | '.join(ratios)} | "
      f"{kernels} |"
    )
  return "\n".join(lines) + "\n"


def goals_table(rows: list[dict[str, Any]]) -> str:
  lines = ["| goal | limit | measured | verdict |", "|---|---|---|---|"]
  for g in goals(rows):
    verdict = "PASS" if g["passed"] else "FAIL"
    lines.append(f"| {g['goal']} | {g['limit']:g}x | {g['value']:.2f}x | {verdict} |")
  return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], names: Sequence[str], path: Path, title: str) -> None:
  from examples import analysis

  plt = analysis.pyplot()
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 1.4]})
  mlp = [r for r in rows if r["family"] == "mlp"]
  for name, marker in (("sgd_momentum", "s"), ("lena", "o")):
    for scanned, style in ((True, "-"), (False, "--")):
      points = sorted((r["depth"], r[name]["median_cpu_s"]) for r in mlp if r["scanned"] == scanned)
      if points:
        ax1.plot(
          *zip(*points, strict=True),
          style,
          marker=marker,
          label=f"{LABELS[name]}, {'scanned' if scanned else 'unrolled'}",
        )
  ax1.set_xscale("log")
  ax1.set_yscale("log")
  depths = sorted({r["depth"] for r in mlp})
  ax1.set_xticks(depths, [str(d) for d in depths])
  ax1.xaxis.set_minor_locator(plt.NullLocator())
  ax1.set_xlabel("MLP depth")
  ax1.set_ylabel("whole-step compile, CPU s")
  ax1.legend(fontsize=7)
  ax1.set_title("LayerNorm MLP (width 32)", fontsize=9)
  width = 0.8 / (len(names) - 1)
  for j, name in enumerate(names[1:]):
    ax2.bar(
      [i + j * width for i in range(len(rows))],
      [r[name]["ratio_vs_sgd_momentum"] if name in r else 0.0 for r in rows],
      width,
      label=LABELS.get(name, name),
    )
  ax2.axhline(1.0, color="k", lw=0.8)
  ax2.axhline(RATIO_GOAL, color="tab:red", lw=0.8, ls=":", label=f"goal {RATIO_GOAL}x (scanned)")
  labels = [f"{r['family']} {r['depth']}\n{'scan' if r['scanned'] else 'unrolled'}" for r in rows]
  ax2.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], labels, fontsize=7)
  ax2.set_ylabel("compile / SGD-momentum's")
  ax2.legend(fontsize=7, ncol=2)
  fig.suptitle(title, fontsize=8)
  analysis.save_figure(fig, path, dpi=110)


def write_report(record: dict[str, Any], out: Path, stem: str) -> str:
  names = record["optimizers"]
  machine = record["machine"]
  markdown = (
    f"Command: `{record['command']}` ({record['seconds']:.0f} s). Machine: {machine['cpu']}, "
    f"{machine['cpu_cores']} cores, jax {machine['jax']}; load average (1, 5, 15 min) "
    f"{record['load_average_before']} before, {record['load_average_after']} after. Whole-step "
    f"`jax.jit(step).lower(...).compile()`, S = {record['num_samples']}, CPU seconds of the "
    f"compile, median of {record['repeats']} fresh compiles per optimizer, interleaved in one "
    "process; ratios are of record, seconds are context.\n\n"
    + table(record["rows"], names)
    + "\nGoals (issue 49) on the scanned models:\n\n"
    + goals_table(record["rows"])
  )
  harness.write_text(out / f"{stem}.md", markdown)
  title = f"{record['command']} (median of {record['repeats']})"
  plot(record["rows"], names, out / f"{stem}.png", title)
  return markdown


def default_models(depths: Sequence[int], attention_depths: Sequence[int]) -> list[str]:
  return [f"mlp{d}{s}" for d in depths for s in ("_scan", "")] + [
    f"attention{d}{s}" for d in attention_depths for s in ("_scan", "")
  ]


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
  parser.add_argument("--depths", default="12,48,192", help="MLP depths")
  parser.add_argument("--attention_depths", default="12", help="attention model depths ('' none)")
  parser.add_argument("--models", default="", help="these models instead (e.g. mlp12_scan,mlp12)")
  parser.add_argument("--optimizers", default=",".join(ORDER))
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--tag", default="")
  parser.add_argument("--out", type=Path, default=Path("benchmarks/overhead/results"))
  parser.add_argument("--report_only", action="store_true", help="table and plot from the JSON")
  args = parser.parse_args(argv)
  stem = "depth_compile" + (f"_{args.tag}" if args.tag else "")
  if args.report_only:
    print(write_report(json.loads((args.out / f"{stem}.json").read_text()), args.out, stem))
    return
  names = args.optimizers.split(",")
  if names[0] != "sgd_momentum":
    raise SystemExit("--optimizers must start with sgd_momentum (the baseline)")
  depths = lambda text: [int(d) for d in text.split(",") if d]
  models = (
    args.models.split(",")
    if args.models
    else default_models(depths(args.depths), depths(args.attention_depths))
  )
  command = "python -m benchmarks.overhead.depth " + " ".join(
    sys.argv[1:] if argv is None else argv
  )
  load_before = [round(x, 2) for x in os.getloadavg()]
  start = time.perf_counter()
  rows = bench(models, names, args.repeats)
  record = {
    "command": command.strip(),
    "machine": harness.machine_info(),
    "load_average_before": load_before,
    "load_average_after": [round(x, 2) for x in os.getloadavg()],
    "num_samples": NUM_SAMPLES,
    "repeats": args.repeats,
    "seconds": time.perf_counter() - start,
    "optimizers": names,
    "rows": rows,
    "goals": goals(rows),
  }
  args.out.mkdir(parents=True, exist_ok=True)
  harness.write_json(args.out / f"{stem}.json", record)
  print(write_report(record, args.out, stem), flush=True)


if __name__ == "__main__":
  main()
