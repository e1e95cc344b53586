"""Runs one (cluster, algorithm) pair of the stragglers benchmark on a local Ray cluster."""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from benchmarks import driver
from benchmarks.aladdin.ray_stragglers.grid import CLUSTERS, Pair, Stragglers


@functools.cache
def _task(setup: Stragglers) -> tuple[Any, Any, Any]:
  """The program's options, task and accuracy function, built once (and Ray started once)."""
  from examples.aladdin.main import Options
  from examples.aladdin.task import TaskOptions, build_task
  from optax_lena.aladdin import distributed as ad

  base = Options(
    task=TaskOptions(workers=setup.workers),
    time_budget=setup.time_budget,
    server_momentum=setup.server_momentum,
    worker_nice=setup.worker_nice,
    progress=False,
  )
  task, accuracy = build_task(base.task)
  accuracy(task.init_params)
  ad.exit_on_stop_signals()
  ad.connect(num_cpus=setup.num_cpus)
  return base, task, accuracy


def run(pair: Pair, setup: Stragglers, context: driver.Context) -> dict[str, Any]:
  """The pair's run (``run_one`` of the ALADDIN program) and the load it ran under."""
  del context
  from examples.aladdin.main import run_one

  base, task, accuracy = _task(setup)
  options = dataclasses.replace(base, slowdown=CLUSTERS[pair.cluster])
  return {**run_one(pair.algorithm, options, task, accuracy), "load_average": os.getloadavg()}


def describe(row: dict[str, Any]) -> str:
  """A pair's progress text."""
  return (
    f"{row['throughput']:.0f} samples/s, acc {row['test_accuracy']:.3f}, iterations "
    f"{row['iterations']}, wait {[round(w, 3) for w in row['wait_fraction']]}"
  )
