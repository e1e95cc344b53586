"""Measures the cost of one call of a worker to a PS shard (see the package's docstring)."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np

from benchmarks import driver, harness
from benchmarks.aladdin.call_cost.grid import CallCost
from benchmarks.aladdin.ray_efficiency.runner import cpu_seconds

SIZE, PERIOD, MAX_INFLIGHT = 12_106, 4, 2


class _Callee:
  """Reads a fold as a shard does and replies every ``PERIOD`` messages (a Ray actor)."""

  def __init__(self, max_fold: int):
    from optax_lena.aladdin.distributed import channel

    self.rings = channel.Mapped(SIZE, np.float32, max_fold)
    self.global_slice = np.ones(SIZE, np.float32)

  def pid(self) -> int:
    return os.getpid()

  def receive(self, worker: int, messages: Any, finite: np.ndarray) -> Any:
    from optax_lena.aladdin.distributed import channel

    rows = messages if isinstance(messages, channel.Rows) else None
    block = np.array(self.rings.read(rows) if rows is not None else messages)
    n = len(block) // PERIOD
    if not n:
      return None
    replies = np.repeat(self.global_slice[None] + block[0, 0], n, axis=0)
    alphas = np.full(n, 0.5, np.float32)
    if rows is not None:
      self.rings.write_replies(rows, replies)
      return None, alphas
    return replies, alphas


def _calls(callee: Any, ring: Any, fold: int, calls: int) -> dict[str, float]:
  """``calls`` calls of ``fold`` messages (in ``ring``, or inline when None)."""
  import ray

  messages = np.random.default_rng(0).normal(size=(fold, SIZE)).astype(np.float32)
  finite = np.ones(fold, bool)
  pid = ray.get(callee.pid.remote())
  inflight: list[Any] = []
  callee0, caller0, t0 = cpu_seconds(pid), time.process_time(), time.perf_counter()
  for call in range(calls):
    if len(inflight) == MAX_INFLIGHT:
      reply = ray.get(inflight.pop(0))
      if ring is not None and reply is not None:
        ring.replies[(call - MAX_INFLIGHT) % MAX_INFLIGHT, : len(reply[1])].copy()
    if ring is None:
      part: Any = messages
    else:
      region = call % MAX_INFLIGHT
      ring.write(region, list(messages))
      part = ring.rows(region, fold, 0, SIZE)
    inflight.append(callee.receive.remote(0, part, finite))
  ray.get(inflight)
  wall = time.perf_counter() - t0
  return {
    "wall_ms": 1e3 * wall / calls,
    "caller_cpu_ms": 1e3 * (time.process_time() - caller0) / calls,
    "callee_cpu_ms": 1e3 * (cpu_seconds(pid) - callee0) / calls,
  }


def measure(folds: list[int], calls: int, repeats: int) -> list[dict[str, Any]]:
  import ray

  from optax_lena.aladdin.distributed import channel

  most = max(folds)
  callee = ray.remote(num_cpus=0)(_Callee).remote(most)
  run = channel.run_name()
  ring = channel.open_ring(run, 0, MAX_INFLIGHT, most, -(-most // PERIOD), SIZE, np.float32)
  assert ring is not None, "no room for the ring in shared memory"
  rows: list[dict[str, Any]] = []
  try:
    for fold in folds:
      for warm_up in (None, ring):
        _calls(callee, warm_up, fold, 20)
      runs: dict[str, list[dict[str, float]]] = {"inline": [], "ring": []}
      for _ in range(repeats):
        runs["inline"].append(_calls(callee, None, fold, calls))
        runs["ring"].append(_calls(callee, ring, fold, calls))
      row: dict[str, Any] = {"fold": fold, "kib": fold * SIZE * 4 / 1024, "runs": runs}
      for path, results in runs.items():
        for key in ("wall_ms", "caller_cpu_ms", "callee_cpu_ms"):
          row[f"{path}_{key}"] = statistics.median(r[key] for r in results)
      for key in ("caller_cpu_ms", "callee_cpu_ms"):
        pairs = zip(runs["inline"], runs["ring"], strict=True)
        ratios = [i[key] / r[key] if r[key] > 0 else float("nan") for i, r in pairs]
        row[f"{key}_ratio"] = statistics.median(ratios)
      rows.append(row)
      print(_line(row), flush=True)
  finally:
    ring.close()
  return rows


def _line(row: dict[str, Any]) -> str:
  inline = f"{row['inline_caller_cpu_ms']:.2f} / {row['inline_callee_cpu_ms']:.2f}"
  ring = f"{row['ring_caller_cpu_ms']:.2f} / {row['ring_callee_cpu_ms']:.2f}"
  return (
    f"  fold {row['fold']:2d} ({row['kib']:.0f} KiB), CPU ms per call (caller / callee): "
    f"inline {inline}, ring {ring}"
  )


def run(cell: driver.Measurement, setup: CallCost, context: driver.Context) -> dict[str, Any]:
  """The measurement on a local Ray node: every fold size, inline and in the ring."""
  del cell, context
  from optax_lena.aladdin import distributed as ad

  ad.exit_on_stop_signals()
  ad.connect()
  rows = measure(list(setup.folds), setup.calls, setup.repeats)
  return {
    "recorded": harness.recorded(),
    "machine": harness.machine_info(),
    "calls": setup.calls,
    "rows": rows,
  }
