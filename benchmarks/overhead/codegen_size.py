"""Where the scanned step's compile goes: the code XLA:CPU generates for it.

Run from the repository root::

  python -m benchmarks.overhead.codegen_size [--models mlp12_scan,mlp48_scan,mlp192_scan]
                                             [--out DIR] [--report_only]

The step is ``depth``'s (forward and backward of S = 4 per-worker batches, then the update).
It is compiled once per variant: SGD-momentum; SGD-momentum with LENA's pieces added one at a
time (the per-slice statistics of ``ol.stacked_grad_stats``, then ``ol.skip_nonfinite_steps``
reading them); AdaScale and LENA per slice; and LENA per stack. Each compile is asked for XLA's
dump of the optimized LLVM IR of every kernel (``compiler_options={"xla_dump_to": ...}``). The
counts are the kernels XLA:CPU compiles (each distinct fused computation once), the lines of
their optimized LLVM IR, and the bytes of their object code.

CPU seconds of a compile move with the machine's load (``depth`` needs medians of interleaved
repeats). These counts do not: on one CPU and one jax/XLA version every run gives the same
numbers, so one compile per variant is enough. Writing the dump slows the compile, so its time
is not recorded (``depth`` has the times). The table gives, per model, each variant's counts as
ratios to SGD-momentum's, then the kernels of LENA per slice whose code grows most from the
smallest model to a larger one (matched by XLA's kernel names, which depend only on the graph's
shape), with their stores of one float32 element and of a vector. Writes
``codegen_size.md``, ``.json`` and ``.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

import optax_lena as ol
from benchmarks import harness
from benchmarks.overhead import depth
from benchmarks.overhead.common import optimizers
from benchmarks.overhead.whole_step_compile import NUM_SAMPLES, PER_WORKER_BATCH, make_step

VARIANTS = {
  "sgd_momentum": "SGD-m",
  "statistics": "+ statistics per slice",
  "guard": "+ statistics + non-finite guard",
  "adascale": "AdaScale per slice",
  "lena": "LENA per slice",
  "lena_per_stack": "LENA per stack",
}
MEASURES = {"kernels": "kernels", "ir_lines": "LLVM IR lines", "object_bytes": "object bytes"}
# The optimized IR of a kernel: XLA names it "<module>.<kernel>.ir-with-opt.ll".
IR_SUFFIX, OBJECT_MARK = ".ir-with-opt.ll", ".obj-file."
SCALAR_STORE, VECTOR_STORE = "store float ", "store <"
TOP_GROWING = 6


def statistics_step(model: depth.Model) -> tuple[Callable, optax.GradientTransformation]:
  """SGD-momentum's step with the per-slice statistics computed and returned as outputs, so
  that XLA keeps them."""
  sgd, _ = optimizers(NUM_SAMPLES)["sgd_momentum"]

  def loss(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(params, x), y).mean()

  def step(params, opt_state, x, y):
    stacked = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, x, y)
    mean, stats = ol.stacked_grad_stats(stacked, layer_axes=model.layer_axes)
    updates, opt_state = sgd.update(mean, opt_state, params)
    kept = (stats.sq_norm_mean, stats.mean_grad_sq_norm)
    return optax.apply_updates(params, updates), opt_state, kept

  return step, sgd


def variant_step(model: depth.Model, name: str) -> tuple[Callable, optax.GradientTransformation]:
  """The step and transformation of variant ``name`` on ``model``. The guard's step is
  ``whole_step_compile``'s with ``ol.skip_nonfinite_steps`` around SGD-momentum, fed the
  per-slice statistics."""
  if name == "statistics":
    return statistics_step(model)
  if name == "guard":
    sgd, _ = optimizers(NUM_SAMPLES)["sgd_momentum"]
    tx = ol.skip_nonfinite_steps(sgd, layer_axes=model.layer_axes)
    return make_step(model.apply, tx, True, model.layer_axes), tx
  tx, uses_stats, layer_axes = depth.transformation(model, name)
  return make_step(model.apply, tx, uses_stats, layer_axes), tx


def kernel_sizes(dump_dir: Path) -> dict[str, dict[str, int]]:
  """kernel name -> {"ir_lines", "object_bytes", "scalar_stores", "vector_stores"} of the jitted
  step in an XLA dump directory (float32 stores of one element, and of a vector)."""
  sizes: dict[str, dict[str, int]] = {}
  for path in dump_dir.glob(f"*jit_step.*{IR_SUFFIX}"):
    name = path.name.split(".jit_step.", 1)[1].removesuffix(IR_SUFFIX)
    lines = path.read_text().splitlines()
    sizes[name] = {
      "ir_lines": len(lines),
      "object_bytes": 0,
      # A store of one float per element: straight-line code, element by element; "store <": a
      # vector store (vectorised code).
      "scalar_stores": sum(1 for line in lines if SCALAR_STORE in line),
      "vector_stores": sum(1 for line in lines if VECTOR_STORE in line),
    }
  for path in dump_dir.glob(f"*jit_step{OBJECT_MARK}*.o"):
    name = path.name.split(OBJECT_MARK, 1)[1].removesuffix(".o")
    if name in sizes:
      sizes[name]["object_bytes"] = path.stat().st_size
  return sizes


def measure(model: depth.Model, name: str) -> dict[str, Any]:
  """Compiles ``name``'s step of ``model`` once with the IR dump: its counts, and the sizes of
  each kernel."""
  step, tx = variant_step(model, name)
  state = jax.eval_shape(tx.init, model.params)
  x = jax.ShapeDtypeStruct((NUM_SAMPLES, PER_WORKER_BATCH, *model.in_shape), jnp.float32)
  y = jax.ShapeDtypeStruct((NUM_SAMPLES, PER_WORKER_BATCH), jnp.int32)
  lowered = jax.jit(step, donate_argnums=(0, 1)).lower(model.params, state, x, y)
  with tempfile.TemporaryDirectory(prefix="codegen_size_") as tmp:
    lowered.compile(compiler_options={"xla_dump_to": tmp})
    sizes = kernel_sizes(Path(tmp))
  if not sizes:
    raise RuntimeError(
      f"XLA wrote no optimized LLVM IR for {model.name} / {name}: this measure needs XLA:CPU "
      "(run with JAX_PLATFORMS=cpu)."
    )
  return {
    "kernels": len(sizes),
    "ir_lines": sum(s["ir_lines"] for s in sizes.values()),
    "object_bytes": sum(s["object_bytes"] for s in sizes.values()),
    "per_kernel": sizes,
  }


def bench(models: Sequence[str], names: Sequence[str]) -> list[dict[str, Any]]:
  rows = []
  for model_name in models:
    model = depth.Model(model_name)
    if not model.scanned:
      raise SystemExit(f"{model_name}: codegen_size compares per-slice variants: scanned models")
    row: dict[str, Any] = {"model": model_name, "depth": model.depth, "leaves": model.leaves}
    for name in names:
      row[name] = r = measure(model, name)
      if name != "lena":  # the growth table reads LENA's kernels only
        del r["per_kernel"]
      print(
        f"  {model_name} {name}: {r['kernels']} kernels, {r['ir_lines']} IR lines, "
        f"{r['object_bytes']} object bytes",
        flush=True,
      )
    rows.append(row)
  return rows


def growing_kernels(rows: list[dict[str, Any]], name: str = "lena") -> list[dict[str, Any]]:
  """The kernels of ``name`` whose IR lines grow most from the first row to any later one, with
  their sizes and stores in every row."""

  def size(row: dict[str, Any], kernel: str) -> dict[str, int]:
    empty = {"ir_lines": 0, "scalar_stores": 0, "vector_stores": 0}
    return row[name]["per_kernel"].get(kernel, empty)

  kernels = {k for r in rows for k in r[name]["per_kernel"]}
  growth = {
    k: max(size(r, k)["ir_lines"] for r in rows) - size(rows[0], k)["ir_lines"] for k in kernels
  }
  top = sorted(kernels, key=lambda k: (-growth[k], k))[:TOP_GROWING]
  return [{"kernel": k, "sizes": [size(r, k) for r in rows]} for k in top]


def table(rows: list[dict[str, Any]], names: Sequence[str]) -> str:
  head = "| model | leaves | measure | " + " | ".join(VARIANTS[n] for n in names) + " |"
  lines = [head, "|" + "---|" * (len(names) + 3)]
  for r in rows:
    for key, label in MEASURES.items():
      base = r["sgd_momentum"][key]
      cells = [f"{base}"] + [f"{r[n][key] / base:.2f}x" for n in names[1:]]
      lines.append(f"| {r['model']} | {r['leaves']} | {label} | " + " | ".join(cells) + " |")
  if len(rows) > 1:
    models = " | ".join(r["model"] for r in rows)
    lines += ["", f"LENA per slice: the {TOP_GROWING} kernels whose LLVM IR grows most, in"]
    lines += [
      "IR lines (stores of one float32 / of a vector)",
      "",
      f"| kernel | {models} |",
      "|---|" + "---|" * len(rows),
    ]
    for k in growing_kernels(rows):
      cells = [f"{z['ir_lines']} ({z['scalar_stores']} / {z['vector_stores']})" for z in k["sizes"]]
      lines.append(f"| `{k['kernel']}` | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], names: Sequence[str], path: Path, title: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4))
  depths = [r["depth"] for r in rows]
  for name in names:
    ax.plot(depths, [r[name]["ir_lines"] for r in rows], marker="o", label=VARIANTS[name])
  ax.set_xscale("log")
  ax.set_xticks(depths, [str(d) for d in depths])
  ax.set_xlabel("depth (blocks under nn.scan)")
  ax.set_ylabel("optimized LLVM IR lines, all kernels")
  ax.set_title(title, fontsize=8)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_report(record: dict[str, Any], out: Path) -> str:
  machine = record["machine"]
  markdown = (
    f"Command: `{record['command']}` ({record['seconds']:.0f} s). Machine: {machine['cpu']}, "
    f"{machine['cpu_cores']} cores, jax {machine['jax']}. Whole step, S = "
    f"{record['num_samples']}, one compile per variant with XLA's LLVM IR dump: the kernels "
    "XLA:CPU compiles, the lines of their optimized LLVM IR and their object bytes (SGD-m's "
    "count, the others as ratios to it). These counts do not depend on the load.\n\n"
    + table(record["rows"], record["variants"])
  )
  harness.write_text(out / "codegen_size.md", markdown)
  plot(record["rows"], record["variants"], out / "codegen_size.png", record["command"])
  return markdown


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
  parser.add_argument("--models", default="mlp12_scan,mlp48_scan,mlp192_scan")
  parser.add_argument("--out", type=Path, default=Path("benchmarks/overhead/results"))
  parser.add_argument("--report_only", action="store_true", help="table and plot from the JSON")
  args = parser.parse_args(argv)
  if args.report_only:
    print(write_report(json.loads((args.out / "codegen_size.json").read_text()), args.out))
    return
  command = "python -m benchmarks.overhead.codegen_size " + " ".join(
    sys.argv[1:] if argv is None else argv
  )
  names = list(VARIANTS)
  start = time.perf_counter()
  rows = bench(args.models.split(","), names)
  record = {
    "command": command.strip(),
    "machine": harness.machine_info(),
    "load_average": [round(x, 2) for x in os.getloadavg()],
    "num_samples": NUM_SAMPLES,
    "seconds": time.perf_counter() - start,
    "variants": names,
    "rows": rows,
  }
  args.out.mkdir(parents=True, exist_ok=True)
  harness.write_json(args.out / "codegen_size.json", record)
  print(write_report(record, args.out), flush=True)


if __name__ == "__main__":
  main()
