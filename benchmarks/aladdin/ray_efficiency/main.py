"""How close ALADDIN on Ray comes to the machine's limit (``docs/ALADDIN-ray.md``, efficiency).

Two measurements, each side by side in one run and repeated (the machine is shared: ratios, not
absolute times):

* ``single``: the limit of one worker is its local step alone (the same model, batch, optimizer
  and data iterator in a loop in one process, no Ray, no server), each step's message read
  after the next step is dispatched (a JAX loop's Python overlaps XLA), measured four times:
  in this process (XLA's default thread pool), and in a child process whose pool has the one
  thread the runtime gives its actors where they are at least as many as the cores, free to
  move between cores, then pinned as the runtime pins a worker (XLA's threads on one core, the
  Python thread on the others), then with every thread on one core and each step waited for
  (the limit of earlier runs); the limit is the fastest of the four. Efficiency = samples/s of
  ALADDIN on Ray with that one worker / samples/s of the limit, alternating the loops and the
  Ray run ``--repeats`` times per batch size. Also the CPU seconds the worker and the shard
  processes spent per iteration against the limit loop's (what the shard costs on a machine
  without spare cores).
* ``cluster``: 4 ALADDIN workers and the PS on this machine with the program's default settings
  (``python -m examples.aladdin``: batch 128, the runtime's default priority), against the same
  with the workers at the shards' priority (``worker_nice=0``): each worker's wait and compute
  fractions and the throughput.

Usage::

  python -m benchmarks.aladdin.ray_efficiency.main --repeats 5 --seconds 4 --cluster_seconds 10 \\
      --cluster_repeats 1     # results/efficiency.json and .png, the table of RESULTS.md
  python -m benchmarks.aladdin.ray_efficiency.main --report_only   # table and plot from the JSON
  python -m benchmarks.aladdin.ray_efficiency.main --smoke --out /tmp/efficiency.json   # CI

The JSON's ``recorded`` field holds the commit, date, load and command of the measurement.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import harness


def cpu_seconds(pid: int) -> float:
  """The CPU seconds (user + system) process ``pid`` has spent."""
  import psutil

  times = psutil.Process(pid).cpu_times()
  return times.user + times.system


def local_loop(task: Any, spec: Any, seconds: float, wait: bool = False) -> dict[str, float]:
  """The limit: the worker's step (``spec.worker_step``) in a plain loop, with its data. Each
  step's message is read after the next step is dispatched, as a JAX training loop overlaps
  its Python with XLA (and as the worker does); ``wait``: each step is waited for instead."""
  import jax

  step = jax.jit(spec.worker_step(task.loss_fn))
  batches = task.batches(0, 0)
  params, opt_state = task.init_params, spec.worker_tx.init(task.init_params)
  jax.block_until_ready(step(params, opt_state, next(batches)))
  cpu0, n, t0 = time.process_time(), 0, time.perf_counter()
  unread = None
  while time.perf_counter() - t0 < seconds:
    params, opt_state, message, _ = step(params, opt_state, next(batches))
    if wait:
      jax.block_until_ready(message)
    elif unread is not None:
      jax.block_until_ready(unread)
    unread = message
    n += 1
  jax.block_until_ready((params, unread))
  wall = time.perf_counter() - t0
  return {
    "throughput": n * task.batch_size / wall,
    "cpu_per_iteration": (time.process_time() - cpu0) / n,
  }


# The loops of a one-thread child (``_loop_child``): where its threads run, whether it waits.
CHILD_LOOPS = {
  "loop_one_thread": ("free", False),  # the OS places every thread
  "loop_pinned": ("pinned", False),  # XLA's threads on one core, the rest on the others
  "loop_one_core_waiting": ("one core", True),  # every thread on one core, each step waited for
}


def _loop_child(conn: Any, batch_size: int) -> None:
  """A loop process whose XLA pool has one thread: answers ``(seconds, placement, wait)`` with a
  loop's result, its threads placed as in :data:`CHILD_LOOPS` (``"pinned"`` as the runtime
  pins a worker: ``ad.cores.place_step``)."""
  from optax_lena.aladdin.distributed import cores

  limit_intra_op_threads, place_step = cores.limit_intra_op_threads, cores.place_step
  set_affinity, thread_ids = cores.set_affinity, cores.thread_ids

  limit_intra_op_threads(1)
  cpus = sorted(os.sched_getaffinity(0))
  from examples.aladdin.main import Options, algorithm_spec
  from examples.aladdin.task import TaskOptions, build_task

  options = Options(task=TaskOptions(workers=1, batch_size=batch_size))
  task, _ = build_task(options.task)
  spec = algorithm_spec("aladdin", options)
  while (request := conn.recv()) is not None:
    seconds, placement, wait = request
    if placement == "free":
      set_affinity(thread_ids(), cpus)
    elif placement == "one core":
      set_affinity(thread_ids(), cpus[:1])
    else:
      place_step(cpus[:1], cpus[1:])
    conn.send(local_loop(task, spec, seconds, wait))


def single(batch_size: int, seconds: float, repeats: int) -> dict[str, Any]:
  """The loops and one Ray worker, alternately, ``repeats`` times; the ratios of each pair."""
  from examples.aladdin.main import Options, algorithm_spec, runtime_config
  from examples.aladdin.task import TaskOptions, build_task
  from optax_lena.aladdin import distributed as ad

  options = Options(task=TaskOptions(workers=1, batch_size=batch_size))
  task, _ = build_task(options.task)
  spec = algorithm_spec("aladdin", options)
  pairs = []
  context = multiprocessing.get_context("spawn")
  conn, child_conn = context.Pipe()
  child = context.Process(target=_loop_child, args=(child_conn, batch_size), daemon=True)
  child.start()
  with ad.Runtime(task, runtime_config("aladdin", options)) as runtime:
    info = runtime.worker_infos()[0]
    pids = [info.pid, runtime.shard_stats()[0].pid]
    for _ in range(repeats):
      loops = {"loop_default_pool": local_loop(task, spec, seconds)}
      for key, (placement, wait) in CHILD_LOOPS.items():
        conn.send((seconds, placement, wait))
        loops[key] = conn.recv()
      fastest = max(loops.values(), key=lambda r: r["throughput"])
      cpu0 = [cpu_seconds(p) for p in pids]
      result = runtime.run(seconds, progress=False)
      cpu = [cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)]
      its = result.iterations[0]
      pairs.append(
        {
          **{key: loop["throughput"] for key, loop in loops.items()},
          "loop": fastest["throughput"],
          "ray": result.throughput,
          "efficiency": result.throughput / fastest["throughput"],
          "compute_fraction": result.compute_fraction[0],
          "worker_cores": info.cores,
          "wait_fraction": result.wait_fraction[0],
          "loop_cpu_per_iteration": fastest["cpu_per_iteration"],
          "worker_cpu_per_iteration": cpu[0] / its,
          "shard_cpu_per_iteration": cpu[1] / its,
          "messages_per_call": result.shards[0].received / max(result.shards[0].calls, 1),
          "load_average": os.getloadavg()[0],
        }
      )
      print(f"  batch {batch_size}: " + _line(pairs[-1]), flush=True)
  conn.send(None)
  child.join(timeout=30)
  return {"batch_size": batch_size, "seconds": seconds, "fold": info.fold, "pairs": pairs}


def cluster(seconds: float, repeats: int, workers: int = 4, compare: bool = True) -> dict[str, Any]:
  """The program's defaults with 4 workers, against the workers at the shards' priority."""
  import dataclasses

  from examples.aladdin.main import Options, runtime_config
  from examples.aladdin.task import TaskOptions, build_task
  from optax_lena.aladdin import distributed as ad

  options = Options(task=TaskOptions(workers=workers))
  task, _ = build_task(options.task)
  runs: dict[str, list[dict[str, Any]]] = {"default": []}
  if compare:
    runs["worker_nice=0"] = []
  for _ in range(repeats):
    for label in runs:
      config = runtime_config("aladdin", options)
      if label != "default":
        config = dataclasses.replace(config, worker_nice=0)
      with ad.Runtime(task, config) as runtime:
        result = runtime.run(seconds, progress=False)
      runs[label].append(
        {
          "throughput": result.throughput,
          "wait_fraction": result.wait_fraction,
          "compute_fraction": result.compute_fraction,
          "iterations": result.iterations,
          "nice": [w.nice for w in result.workers],
          "messages_per_call": result.shards[0].received / max(result.shards[0].calls, 1),
          "load_average": os.getloadavg()[0],
        }
      )
      r = runs[label][-1]
      print(
        f"  {label:<14} {r['throughput']:8.0f} samples/s  wait % "
        f"{[round(100 * w, 1) for w in r['wait_fraction']]}  nice {r['nice']}",
        flush=True,
      )
  return {"workers": workers, "seconds": seconds, "runs": runs}


def _vs_waiting(pair: dict[str, Any]) -> float:
  """The efficiency against a loop on one core that waits for each step (the limit of earlier
  runs, before the loops overlapped their Python with XLA)."""
  return pair["ray"] / pair["loop_one_core_waiting"]


def _line(pair: dict[str, Any]) -> str:
  return (
    f"loop {pair['loop_default_pool']:7.0f} / {pair['loop_one_thread']:7.0f} (1 thread) / "
    f"{pair['loop_pinned']:7.0f} (pinned) / {pair['loop_one_core_waiting']:7.0f} (waiting)  "
    f"ray {pair['ray']:7.0f} samples/s  efficiency "
    f"{pair['efficiency']:.2f}  compute {pair['compute_fraction']:.2f}  wait "
    f"{pair['wait_fraction']:.3f}  cpu/it loop {1e3 * pair['loop_cpu_per_iteration']:.2f} ms, "
    f"worker {1e3 * pair['worker_cpu_per_iteration']:.2f}, shard "
    f"{1e3 * pair['shard_cpu_per_iteration']:.2f}  ({pair['messages_per_call']:.1f} msg/call, "
    f"load {pair['load_average']:.1f})"
  )


def table(results: dict[str, Any]) -> str:
  """Markdown: the median and range of every ratio."""

  def stat(values: list[float], fmt: str = ".2f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

  rows = []
  for s in results["single"]:
    p = s["pairs"]
    loop_cpu = [x["loop_cpu_per_iteration"] for x in p]
    rows.append([
      s["batch_size"],
      stat([x["efficiency"] for x in p]),
      stat([x["ray"] / x["loop_default_pool"] for x in p]),
      stat([_vs_waiting(x) for x in p]),
      stat([x["compute_fraction"] for x in p]),
      stat([x["worker_cpu_per_iteration"] / c for x, c in zip(p, loop_cpu, strict=True)]),
      stat([x["shard_cpu_per_iteration"] / c for x, c in zip(p, loop_cpu, strict=True)]),
      stat([x["messages_per_call"] for x in p], ".1f"),
      stat([x["load_average"] for x in p], ".1f"),
    ])  # fmt: skip
  header = ["batch", "efficiency", "vs default-pool loop", "vs a loop waiting for each step"]
  header += ["compute fraction"]
  header += ["worker CPU / loop CPU"]
  header += ["shard CPU / loop CPU", "messages per call", "load average"]
  text = harness.markdown_table(header, rows)
  if "cluster" in results:
    cluster_rows = [
      [
        f"{label} (nice {r['nice'][0]})",
        f"{r['throughput']:.0f}",
        f"{100 * max(r['wait_fraction']):.1f}",
        " ".join(f"{100 * c:.0f}" for c in r["compute_fraction"]),
      ]
      for label, runs in results["cluster"]["runs"].items()
      for r in runs
    ]
    header = ["4 workers", "samples/s", "max wait % of a worker", "compute % per worker"]
    text += "\n\n" + harness.markdown_table(header, cluster_rows)
  return text


RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = {128: 0.8, 32: 0.6}  # ALADDIN.md, "Runtime efficiency"


def plot(results: dict[str, Any], path: Path) -> None:
  """Every pair's efficiency against the limit and against a loop waiting for each step."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(5.5, 3.6))
  for k, s in enumerate(results["single"]):
    p = s["pairs"]
    waiting = [_vs_waiting(x) for x in p]
    strict = [x["efficiency"] for x in p]
    for offset, values, label, marker in (
      (-0.1, strict, "vs the limit (fastest of 4 loops)", "o"),
      (0.1, waiting, "vs a loop waiting for each step", "^"),
    ):
      ax.scatter(
        [k + offset] * len(values),
        values,
        marker=marker,
        label=label if k == 0 else None,
        color="C0" if marker == "o" else "C1",
      )
    target = TARGETS.get(s["batch_size"])
    if target is not None:
      ax.hlines(
        target, k - 0.3, k + 0.3, colors="k", linestyles="--", label="target" if k == 0 else None
      )
  ax.set_xticks(
    range(len(results["single"])), [f"batch {s['batch_size']}" for s in results["single"]]
  )
  ax.set(ylabel="efficiency (one worker on Ray / loop)", ylim=(0, 1.1))
  ax.grid(alpha=0.3, axis="y")
  ax.legend(fontsize=8, loc="lower right")
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)


def main(argv: list[str] | None = None) -> str:
  """Measures (or with ``--report_only`` reads) the results; returns and prints the table."""
  parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
  parser.add_argument("--batch_sizes", type=int, nargs="+", default=[128, 32])
  parser.add_argument("--seconds", type=float, default=5.0, help="per loop and per Ray run")
  parser.add_argument("--repeats", type=int, default=4)
  parser.add_argument("--cluster_seconds", type=float, default=20.0)
  parser.add_argument("--cluster_repeats", type=int, default=2)
  parser.add_argument("--workers", type=int, default=4, help="of the cluster measurement")
  parser.add_argument("--smoke", action="store_true", help="seconds-long runs (CI)")
  parser.add_argument("--num_cpus", type=int, default=None, help="CPUs of the local Ray node")
  parser.add_argument("--out", type=Path, default=RESULTS / "efficiency.json")
  parser.add_argument("--report_only", action="store_true", help="table and plot from --out")
  args = parser.parse_args(argv)
  if args.report_only:
    results = json.loads(args.out.read_text())
    plot(results, args.out.with_suffix(".png"))
    print(table(results))
    return table(results)
  if args.smoke:
    args.batch_sizes, args.seconds, args.repeats = [32], 1.0, 1
    args.cluster_seconds, args.cluster_repeats, args.workers = 2.0, 1, 2

  from optax_lena.aladdin import distributed as ad

  ad.exit_on_stop_signals()
  ad.connect(num_cpus=args.num_cpus)
  results: dict[str, Any] = {
    "recorded": harness.recorded(),
    "machine": harness.machine_info(),
    "single": [single(b, args.seconds, args.repeats) for b in args.batch_sizes],
  }
  results["cluster"] = cluster(
    args.cluster_seconds, args.cluster_repeats, args.workers, compare=not args.smoke
  )
  harness.write_json(args.out, results)
  plot(results, args.out.with_suffix(".png"))
  print(table(results))
  return table(results)


if __name__ == "__main__":
  main()
