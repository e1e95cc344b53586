"""Measures the trainer's step time on 2 processes x 4 devices against 1 x 8 (and 1 x 4), each
run started with ``python -m examples.main`` (see the package's docstring)."""

from __future__ import annotations

import dataclasses
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import driver, harness
from benchmarks.multihost.grid import LAYOUTS, Bench
from examples import metrics

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]


def free_port() -> int:
  """A TCP port on the loopback that is free now (for a local coordinator)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_once(
  layout: str, workdir: Path, steps: int, cache_dir: str, per_worker_batch: int
) -> float:
  """Trains one run of ``layout``; returns its wall time in seconds (compilation included)."""
  processes, devices, batch_scale = LAYOUTS[layout]
  env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
  env.update(
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=f"{harness.HOST_DEVICES_FLAG}={devices}",
    PYTHONPATH=str(REPO_ROOT),
  )
  args = [
    *(sys.executable, "-m", "examples.main", "--config", "default", "--workdir", str(workdir)),
    *("--set", "optimizer=lena", "--set", f"batch_scale={batch_scale}", "--set", "micro_batches=2"),
    *("--set", f"num_steps={steps}", "--set", f"eval_every={steps}", "--set", "log_every=1"),
    *("--set", f"cache_dir={cache_dir}", "--set", "progress_bar=false"),
    *("--set", f"per_worker_batch={per_worker_batch}"),
  ]
  if processes > 1:
    args += [f"--coordinator_address=127.0.0.1:{free_port()}", f"--num_processes={processes}"]
  start = time.perf_counter()
  procs = [
    subprocess.Popen(
      args + ([f"--process_id={i}"] if processes > 1 else []),
      cwd=REPO_ROOT,
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(processes)
  ]
  errors = [p.communicate()[1] for p in procs]
  for p, err in zip(procs, errors, strict=True):
    if p.returncode:
      raise RuntimeError(f"{layout} failed ({p.returncode}):\n{err[-3000:]}")
  return time.perf_counter() - start


def step_time(workdir: Path, skip: int, steps: int) -> float:
  """The median seconds of the updates ``skip + 1 .. steps`` (one record per update): a burst
  of load from other programs lengthens a few updates, not the median."""
  wall = {r["iteration"]: r["wall_time"] for r in metrics.read_metrics(workdir, None)}
  return statistics.median(wall[t] - wall[t - 1] for t in range(skip + 1, steps + 1))


def run(cell: driver.Measurement, setup: Bench, context: driver.Context) -> dict[str, Any]:
  """The layouts alternating ``setup.rounds`` times: each run's median step seconds."""
  del cell
  results: dict[str, list[float]] = {name: [] for name in LAYOUTS}
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(setup.rounds):
      for name in LAYOUTS:
        workdir = Path(tmp) / f"{name}_{r}"
        cache = str(context.cache_dir)
        wall = run_once(name, workdir, setup.steps, cache, setup.per_worker_batch)
        results[name].append(step_time(workdir, setup.skip, setup.steps))
        print(
          f"[round {r + 1}/{setup.rounds}] {name}: {1e3 * results[name][-1]:.1f} ms / update "
          f"({wall:.0f} s with start-up and compilation)",
          flush=True,
        )
  return {
    "step_seconds": results,
    "args": dataclasses.asdict(setup),
    "recorded": harness.recorded(),
    "machine": harness.machine_info(),
  }
