"""What one call of a worker to a PS shard costs, its messages inline or in the shared-memory ring.

A caller (this process, as a worker's sender thread) and a callee (a Ray actor that reads its
slice of a fold as ``ServerShard.receive`` does, copies it as XLA copies its argument, and
replies every period with a global slice) on one node, with up to ``max_inflight`` calls
unanswered as the outbox keeps them. Per fold size, the CPU seconds per call of the caller and
of the callee, and the wall time per call, for messages in the call (inline: Ray copies them
through gRPC) and in the worker's ring (``ad.channel``); the two
paths alternate ``--repeats`` times. The messages are the example CNN's (12,106 float32).

Usage::

  python -m benchmarks.aladdin.call_cost.main                # results/call_cost.json and .png
  python -m benchmarks.aladdin.call_cost.main --report_only  # table and plot from the JSON
  python -m benchmarks.aladdin.call_cost.main --smoke --out /tmp/call_cost.json   # CI

The JSON's ``recorded`` field holds the commit, date, load and command of the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.aladdin.ray_efficiency.main import cpu_seconds

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


def table(rows: list[dict[str, Any]]) -> str:
  header = [
    "fold (KiB)",
    "caller CPU ms: inline / ring",
    "callee CPU ms: inline / ring",
    "inline / ring, per pair (caller, callee)",
    "wall ms per call: inline / ring",
  ]
  body = [
    [
      f"{r['fold']} ({r['kib']:.0f})",
      f"{r['inline_caller_cpu_ms']:.2f} / {r['ring_caller_cpu_ms']:.2f}",
      f"{r['inline_callee_cpu_ms']:.2f} / {r['ring_callee_cpu_ms']:.2f}",
      f"{r['caller_cpu_ms_ratio']:.1f}x, {r['callee_cpu_ms_ratio']:.1f}x",
      f"{r['inline_wall_ms']:.2f} / {r['ring_wall_ms']:.2f}",
    ]
    for r in rows
  ]
  return harness.markdown_table(header, body)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6.5, 3.5))
  x = np.arange(len(rows))
  bars = [
    ("inline_caller_cpu_ms", "caller, inline"),
    ("ring_caller_cpu_ms", "caller, ring"),
    ("inline_callee_cpu_ms", "callee, inline"),
    ("ring_callee_cpu_ms", "callee, ring"),
  ]
  for k, (key, label) in enumerate(bars):
    ax.bar(x + (k - 1.5) * 0.2, [r[key] for r in rows], 0.2, label=label)
  ax.set_xticks(x, [f"{r['fold']} messages\n({r['kib']:.0f} KiB)" for r in rows])
  ax.set_ylabel("CPU ms per call (median)")
  ax.set_title("A call to a PS shard: messages inline or in the shared-memory ring", fontsize=9)
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3, axis="y")
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)


def main(argv: list[str] | None = None) -> str:
  """Measures (or with ``--report_only`` reads) the rows; returns and prints the table."""
  parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
  parser.add_argument("--folds", type=int, nargs="+", default=[1, 4, 16, 32])
  parser.add_argument("--calls", type=int, default=300, help="per run")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--smoke", action="store_true", help="a few calls (CI)")
  parser.add_argument(
    "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "call_cost.json"
  )
  parser.add_argument("--report_only", action="store_true", help="table and plot from --out")
  args = parser.parse_args(argv)
  if args.report_only:
    rows = json.loads(args.out.read_text())["rows"]
    plot(rows, args.out.with_suffix(".png"))
    print(table(rows))
    return table(rows)
  if args.smoke:
    args.folds, args.calls, args.repeats = [4], 50, 1

  from optax_lena.aladdin import distributed as ad

  ad.exit_on_stop_signals()
  ad.connect()
  rows = measure(args.folds, args.calls, args.repeats)
  results = {
    "recorded": harness.recorded(),
    "machine": harness.machine_info(),
    "calls": args.calls,
    "rows": rows,
  }
  harness.write_json(args.out, results)
  plot(rows, args.out.with_suffix(".png"))
  print(table(rows))
  return table(rows)


if __name__ == "__main__":
  main()
