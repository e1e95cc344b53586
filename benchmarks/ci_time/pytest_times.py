"""A pytest plugin that records every test's wall time and CPU time.

Loaded with ``-p benchmarks.ci_time.pytest_times`` (or from a directory on ``PYTHONPATH`` as
``-p pytest_times``, for a checkout of another commit). Each process (xdist worker) appends one
JSON line per test to ``$CI_TIME_OUT/<worker>.jsonl``: the node id, the wall seconds of its
set-up, call and tear-down, and the CPU seconds of this process (every thread, XLA's included)
and of the child processes it reaped meanwhile. CPU time depends far less on what else runs
than wall time does, which is what lets two suites measured at different moments be compared.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator
from typing import Any

import pytest


def _cpu_seconds() -> tuple[float, float]:
  own = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Generator[None, None, None]:
  wall0, (own0, children0) = time.perf_counter(), _cpu_seconds()
  yield
  wall1, (own1, children1) = time.perf_counter(), _cpu_seconds()
  out = os.environ.get("CI_TIME_OUT")
  if not out:
    return
  os.makedirs(out, exist_ok=True)
  record = {
    "nodeid": item.nodeid,
    "wall": round(wall1 - wall0, 4),
    "cpu": round(own1 - own0 + children1 - children0, 4),
  }
  worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
  with open(os.path.join(out, f"{worker}.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\n")
