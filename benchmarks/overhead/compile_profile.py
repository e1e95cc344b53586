"""Why the update compiles slower than SGD-momentum with thousands of leaves: a profile.

Run from the repository root::

  python -m benchmarks.overhead.compile_profile [--leaves 1000] [--out DIR]

Times ``jax.jit(f).lower(...).compile()`` of four versions of one per-leaf multiply
``u_k * c_k`` over ``--leaves`` leaves of shape (16,), and counts the kernels XLA builds and how
many of them are distinct. The four differ only in where the scalar ``c_k`` comes from:

* ``slice``: ``c[k]`` of one float32 vector (what a per-leaf state vector gives);
* ``same_slice``: ``c[3]`` for every leaf (slicing, but one kernel shape);
* ``scalar_inputs``: ``c_k`` is its own input buffer (what SGD-momentum's kernels look like);
* ``index_inputs``: ``dynamic_index(c, i_k)`` with every index its own int32 input buffer.

XLA:CPU compiles each distinct fused computation once and reuses it for identical ones, so the
distinct-kernel count, not the leaf count, is what costs: see benchmarks/overhead/RESULTS.md.
With ``--out`` the numbers and the machine go to ``DIR/compile_profile.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp

from benchmarks import harness
from benchmarks.overhead.state_and_compile import kernel_counts

VARIANTS = ("slice", "same_slice", "scalar_inputs", "index_inputs")


def per_leaf_multiply(variant: str, num_leaves: int):
  def f(leaves, vector, scalars, indices):
    if variant == "slice":
      return [u * vector[k] for k, u in enumerate(leaves)]
    if variant == "same_slice":
      return [u * vector[3] for u in leaves]
    if variant == "scalar_inputs":
      return [u * c for u, c in zip(leaves, scalars, strict=True)]
    return [
      u * jax.lax.dynamic_index_in_dim(vector, i, keepdims=False)
      for u, i in zip(leaves, indices, strict=True)
    ]

  args = (
    [jax.ShapeDtypeStruct((16,), jnp.float32)] * num_leaves,
    jax.ShapeDtypeStruct((num_leaves,), jnp.float32),
    [jax.ShapeDtypeStruct((), jnp.float32)] * num_leaves,
    [jax.ShapeDtypeStruct((), jnp.int32)] * num_leaves,
  )
  return f, args


def profile(num_leaves: int, variants: Sequence[str] = VARIANTS) -> dict[str, dict[str, float]]:
  out = {}
  for variant in variants:
    f, args = per_leaf_multiply(variant, num_leaves)
    start = time.perf_counter()
    compiled = jax.jit(f).lower(*args).compile()
    seconds = time.perf_counter() - start
    kernels, distinct = kernel_counts(compiled.as_text() or "")
    out[variant] = {"seconds": seconds, "kernels": kernels, "distinct_kernels": distinct}
    print(f"{variant:>14}: {seconds:6.2f} s, {kernels} kernels, {distinct} distinct", flush=True)
  return out


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--leaves", type=int, default=1000)
  parser.add_argument("--out", type=Path, help="directory for compile_profile.json")
  args = parser.parse_args(argv)
  print(
    f"compile time of {args.leaves} per-leaf multiplies u_k * c_k (jax {jax.__version__}, "
    f"{jax.devices()[0].platform})",
    flush=True,
  )
  result = profile(args.leaves)
  if args.out is not None:
    command = "python -m benchmarks.overhead.compile_profile " + " ".join(
      sys.argv[1:] if argv is None else argv
    )
    harness.write_json(
      args.out / "compile_profile.json",
      {
        "command": command.strip(),
        "leaves": args.leaves,
        "machine": harness.machine_info(),
        "variants": result,
      },
    )


if __name__ == "__main__":
  main()
