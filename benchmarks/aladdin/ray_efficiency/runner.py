"""Measures the efficiency benchmark: one worker on Ray against its local step, and four
workers' waits (see the package's docstring)."""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

from benchmarks import driver, harness
from benchmarks.aladdin.ray_efficiency.grid import Efficiency


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


def run(cell: driver.Measurement, setup: Efficiency, context: driver.Context) -> dict[str, Any]:
  """The measurement, on a local Ray node: ``single`` at each batch size, then ``cluster``."""
  del cell, context
  from optax_lena.aladdin import distributed as ad

  ad.exit_on_stop_signals()
  ad.connect(num_cpus=setup.num_cpus)
  single_runs = [single(b, setup.seconds, setup.repeats) for b in setup.batch_sizes]
  return {
    "recorded": harness.recorded(),
    "machine": harness.machine_info(),
    "single": single_runs,
    "cluster": cluster(setup.cluster_seconds, setup.cluster_repeats, setup.workers, setup.compare),
  }
