"""Multi-host step time: the trainer on 2 processes x 4 devices against 1 process x 8 devices.

The same run (MNIST-1D CNN, LENA, S = 16 per-worker batches = 8 devices x 2 micro-batches) is
started with ``python -m examples.main`` as

* ``1x8``: one process with 8 simulated CPU devices;
* ``2x4``: two local processes with 4 devices each, joined by ``jax.distributed`` (gloo);
* ``1x4``: one process with 4 devices and half the global batch: one process's share of the
  ``2x4`` work, with no other process (``2x4`` minus ``1x4`` is what joining costs).

The configurations alternate (``--rounds`` times each, side by side on the same machine), so a
change of load hits them alike. The step time of a run is the median wall time between
consecutive ``metrics.jsonl`` records (one per update) from update ``--skip`` to ``--steps``
(the median update: robust to bursts of load): compilation and the first updates are
excluded. Writes ``results/summary.json`` and ``results/table.md`` (quoted by ``RESULTS.md``).

Usage::

  python -m benchmarks.multihost.bench                 # RESULTS.md's numbers
  python -m benchmarks.multihost.bench --rounds 1 --steps 12 --skip 4 --out /tmp/mh  # smoke
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import harness
from examples import metrics

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
LAYOUTS = {"1x8": (1, 8, 16), "2x4": (2, 4, 16), "1x4": (1, 4, 8)}  # processes, devices, S


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


def report(results: dict[str, list[float]], args: argparse.Namespace) -> str:
  base = statistics.median(results["1x8"])
  rows = [
    (
      name,
      f"{LAYOUTS[name][0]} x {LAYOUTS[name][1]}",
      LAYOUTS[name][2],
      harness.mean_std([1e3 * t for t in results[name]], ".1f"),
      f"{1e3 * statistics.median(results[name]):.1f}",
      f"{statistics.median(results[name]) / base:.2f}",
    )
    for name in LAYOUTS
  ]
  ratios = [m / s for m, s in zip(results["2x4"], results["1x8"], strict=True)]
  table = harness.markdown_table(
    ("layout", "processes x devices", "S", "ms / update (mean ± std)", "median", "/ 1x8"), rows
  )
  return (
    f"{table}\n\n2x4 / 1x8 per round (side by side): "
    + ", ".join(f"{r:.2f}" for r in ratios)
    + f"; median {statistics.median(ratios):.2f}.\n\nCommand: "
    f"`python -m benchmarks.multihost.bench --rounds {args.rounds} --steps {args.steps} "
    f"--skip {args.skip} --per_worker_batch {args.per_worker_batch}`."
  )


def main(argv: Sequence[str] | None = None) -> dict[str, list[float]]:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.multihost.bench", description=__doc__)
  parser.add_argument("--rounds", type=int, default=3, help="runs of each layout, alternating")
  parser.add_argument("--steps", type=int, default=30, help="updates per run")
  parser.add_argument("--skip", type=int, default=10, help="updates before the timed window")
  parser.add_argument("--out", default="benchmarks/multihost/results", help="summary directory")
  parser.add_argument("--cache_dir", default="data_cache", help="MNIST-1D cache")
  parser.add_argument(
    "--per_worker_batch", type=int, default=32, help="examples per worker (compute per update)"
  )
  args = parser.parse_args(argv)
  if not 0 < args.skip < args.steps:
    parser.error("--skip must be between 0 and --steps.")
  results: dict[str, list[float]] = {name: [] for name in LAYOUTS}
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.rounds):
      for name in LAYOUTS:
        workdir = Path(tmp) / f"{name}_{r}"
        wall = run_once(name, workdir, args.steps, args.cache_dir, args.per_worker_batch)
        results[name].append(step_time(workdir, args.skip, args.steps))
        print(
          f"[round {r + 1}/{args.rounds}] {name}: {1e3 * results[name][-1]:.1f} ms / update "
          f"({wall:.0f} s with start-up and compilation)",
          flush=True,
        )
  text = report(results, args)
  print("\n" + text)
  out = Path(args.out)
  harness.write_json(
    out / "summary.json",
    {"step_seconds": results, "args": vars(args), "machine": harness.machine_info()},
  )
  (out / "table.md").write_text(text + "\n")
  return results


if __name__ == "__main__":
  main()
