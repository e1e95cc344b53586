"""Times ``ol.all_reduce_grad_stats`` on the default CNN's gradients, per leaf and packed, on one
process and across two (see the package's docstring); ``python -m benchmarks.multihost.allreduce
--worker ...`` is one launched process of a measurement.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import driver, harness
from benchmarks.multihost.grid import Allreduce
from benchmarks.multihost.runner import free_port

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
# The default CNN1D's gradient leaves (examples.models, MNIST-1D).
SHAPES = [(160, 10), (10,), (5, 32, 32), (32,), (5, 32, 32), (32,), (5, 1, 32), (32,)]


def _time_layouts(repeats: int) -> dict[str, float]:
  """In a launched process: milliseconds per all-reduce, per layout of the message."""
  import jax
  import numpy as np
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  import optax_lena as ol

  mesh = Mesh(np.array(jax.devices()), ("batch",))
  sizes = [int(np.prod(s)) for s in SHAPES]

  def leaves(x: jax.Array) -> list[jax.Array]:
    offsets = np.cumsum([0, *sizes])
    return [x[0, a:b].reshape(s) for a, b, s in zip(offsets, offsets[1:], SHAPES, strict=False)]

  def reduce(x: jax.Array, packed: bool) -> jax.Array:
    mean, stats = ol.all_reduce_grad_stats(leaves(x), "batch", packed=packed)
    outputs = jax.tree.leaves((mean, stats.sq_norm_mean, stats.mean_grad_sq_norm))
    return sum(t.sum() for t in outputs)[None, None] + 0 * x[:, :1]

  bodies = {
    "per_leaf": lambda x: reduce(x, False),
    "packed": lambda x: reduce(x, True),
  }
  n = len(jax.devices())
  x = jax.make_array_from_callback(
    (n, sum(sizes)), NamedSharding(mesh, P("batch")), lambda i: np.ones((n, sum(sizes)), "f")[i]
  )
  out = {}
  for name, body in bodies.items():
    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("batch"), out_specs=P("batch")))
    for _ in range(5):
      step(x).block_until_ready()
    start = time.perf_counter()
    for _ in range(repeats):
      step(x).block_until_ready()  # one at a time: the collectives of two calls never overlap
    out[name] = 1e3 * (time.perf_counter() - start) / repeats
  return out


def _launch(processes: int, devices: int, repeats: int) -> dict[str, float]:
  port = free_port()
  env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO_ROOT))
  env["XLA_FLAGS"] = f"{harness.HOST_DEVICES_FLAG}={devices}"
  cmd = [sys.executable, "-m", "benchmarks.multihost.allreduce", "--worker", str(repeats)]
  procs = [
    subprocess.Popen(
      [*cmd, f"127.0.0.1:{port}", str(processes), str(i)],
      env=env,
      cwd=REPO_ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(processes)
  ]
  outputs = [p.communicate(timeout=600) for p in procs]
  for p, (_, err) in zip(procs, outputs, strict=True):
    if p.returncode:
      raise RuntimeError(f"{processes}x{devices} failed ({p.returncode}):\n{err[-3000:]}")
  return json.loads(outputs[0][0].strip().splitlines()[-1])


def _worker(argv: Sequence[str]) -> None:
  repeats, address, processes, process_id = int(argv[0]), argv[1], int(argv[2]), int(argv[3])
  import jax

  if processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(address, processes, process_id)
  print(json.dumps(_time_layouts(repeats)), flush=True)


def measure(cell: driver.Measurement, setup: Allreduce, context: driver.Context) -> dict[str, Any]:
  """Both layouts alternating ``setup.rounds`` times: milliseconds per all-reduce of each
  message layout."""
  del cell, context
  layouts = {"1x8": (1, 8), "2x4": (2, 4)}
  results: dict[str, dict[str, list[float]]] = {k: {"per_leaf": [], "packed": []} for k in layouts}
  for r in range(setup.rounds):
    for name, (processes, devices) in layouts.items():
      for message, ms in _launch(processes, devices, setup.repeats).items():
        results[name][message].append(ms)
      print(f"[round {r + 1}/{setup.rounds}] {name}: {results[name]}", flush=True)
  return {
    "ms": results,
    "args": dataclasses.asdict(setup),
    "recorded": harness.recorded(),
    "machine": harness.machine_info(),
  }


if __name__ == "__main__":
  _worker(sys.argv[2:])  # the child of a measurement: --worker REPEATS ADDRESS PROCESSES ID
