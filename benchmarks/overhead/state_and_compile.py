"""Sections (e) and (f): optimizer-state memory, and compile time against the number of leaves."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optax_lena as ol
from benchmarks.overhead.common import NUM_WORKERS, TARGETS, apply_update, log, optimizers
from benchmarks.overhead.trees import leaves_tree, tree_info

PyTree = Any


# ----------------------------------------------------------------------------------------------
# (e) Optimizer-state memory.


def state_bytes(tx: optax.GradientTransformation, shapes: PyTree) -> int:
  state = jax.eval_shape(tx.init, shapes)
  return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(state)))


def memory_rows(trees: dict[str, PyTree]) -> list[dict[str, Any]]:
  log("  (e) optimizer-state memory")
  opts = optimizers()
  out = []
  for tree_name, shapes in trees.items():
    info = tree_info(shapes)
    base = state_bytes(opts["sgd_momentum"][0], shapes)
    for name in ("lena", "adascale", "linear_scaling", "lars", "lamb"):
      nbytes = state_bytes(opts[name][0], shapes)
      extra = nbytes - base
      row = {
        "tree": tree_name,
        **info,
        "optimizer": name,
        "bytes": nbytes,
        "sgd_momentum_bytes": base,
        "extra_bytes": extra,
        "extra_bytes_per_leaf": extra / info["leaves"],
      }
      if name in ("lena", "adascale", "linear_scaling"):
        row["passed"] = bool(extra <= TARGETS["memory"][1] * info["leaves"] + 64)
      out.append(row)
      log(
        f"    {tree_name:>24} {name:>15}: {nbytes / 2**20:9.2f} MiB, "
        f"+{extra} B (+{extra / info['leaves']:.1f} B/leaf)"
        + ("" if "passed" not in row else ("  PASS" if row["passed"] else "  FAIL"))
      )
  return out


# ----------------------------------------------------------------------------------------------
# (f) Compile time.


def kernel_counts(compiled_hlo: str) -> tuple[int, int]:
  """(kernels, distinct kernels) of a compiled module's text.

  XLA:CPU compiles a kernel once per distinct fused computation (names and metadata aside) and
  reuses it for identical ones, so the distinct count, not the leaf count, drives compile time.
  """
  bodies = re.findall(r"^%\S+ \(.*?\) -> .*? \{\n(.*?)\n\}", compiled_hlo, re.M | re.S)
  normalised = {re.sub(r"%[\w.\-]+", "%", re.sub(r", metadata=\{[^}]*\}", "", b)) for b in bodies}
  return len(bodies), len(normalised)


def compile_seconds(name: str, shapes: PyTree) -> tuple[float, int, int]:
  """Seconds to lower and compile the update step, and its (kernels, distinct kernels)."""
  tx, uses_stats = optimizers()[name]
  scalar = jax.ShapeDtypeStruct((), jnp.float32)
  stats = ol.GradStats(
    jax.tree.map(lambda _: scalar, shapes), NUM_WORKERS, jax.tree.map(lambda _: scalar, shapes)
  )
  state = jax.eval_shape(tx.init, shapes)

  def step(params, opt_state, grads, stats):
    return apply_update(tx, uses_stats, grads, opt_state, params, stats)

  start = time.perf_counter()
  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(shapes, state, shapes, stats).compile()
  seconds = time.perf_counter() - start
  return (seconds, *kernel_counts(compiled.as_text() or ""))


def bench_compile(
  leaf_counts: Sequence[int], repeats: int = 1, names: Sequence[str] = ("sgd_momentum", "lena")
) -> list[dict[str, Any]]:
  log("  (f) compile time of the update step (jit(...).lower(...).compile())")
  out = []
  for count in leaf_counts:
    shapes = leaves_tree(count)
    times: dict[str, list[float]] = {name: [] for name in names}
    kernels: dict[str, tuple[int, int]] = {}
    for i in range(repeats):
      for name in names if i % 2 == 0 else names[::-1]:
        seconds, count_all, count_distinct = compile_seconds(name, shapes)
        kernels[name] = (count_all, count_distinct)
        times[name].append(seconds)
    med = {name: float(np.median(t)) for name, t in times.items()}
    row: dict[str, Any] = {
      "leaves": count,
      "params": tree_info(shapes)["params"],
      **{f"{name}_s": med[name] for name in names},
      **{f"{name}_kernels": kernels[name][0] for name in names},
      **{f"{name}_distinct_kernels": kernels[name][1] for name in names},
      "ratio": med["lena"] / med["sgd_momentum"],
    }
    out.append(row)
    log(
      f"    {count:6d} leaves: lena {med['lena']:7.2f} s, sgd_momentum "
      f"{med['sgd_momentum']:7.2f} s, ratio {row['ratio']:.2f}x; distinct kernels "
      f"{kernels['lena'][1]} vs {kernels['sgd_momentum'][1]}"
    )
  if out:
    out[-1]["target"] = "compile"
    out[-1]["passed"] = bool(out[-1]["ratio"] <= TARGETS["compile"][1])
  return out
