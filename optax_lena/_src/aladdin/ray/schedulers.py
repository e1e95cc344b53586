"""How the driver hands out work, written once: asynchronous chunks (ALADDIN, ASP, EASGD, SGP),
rounds (AR-SGD's barrier), and the deterministic lockstep; :func:`drive` runs any of them. An
algorithm's iteration names its scheduler (``Iteration.scheduler``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from optax_lena._src.aladdin.ray.errors import ClusterLostError
from optax_lena._src.aladdin.ray.records import Stats

Submit = list[tuple[int, Any]]  # (worker, ObjectRef of its call)


class Schedule(Protocol):
  """What :func:`drive` runs: the calls to start, and the calls that follow a result."""

  workers: list[Any]

  def start(self) -> Submit: ...

  def finished(self, i: int, stats: Stats) -> Submit: ...


class AsyncChunks:
  """The scheduler of wait-free algorithms: each worker runs timed chunks until the deadline.

  Every worker runs chunks of about ``chunk`` seconds until the deadline; one chunk is queued
  behind the running one, so that a worker never idles between chunks.

  Args:
    workers: the worker actors.
    deadline: ``time.time()`` at which the run ends.
    chunk: seconds of one call.
  """

  # Workers may run different numbers of iterations (no barrier between them).
  barrier: ClassVar[bool] = False

  def __init__(self, workers: list[Any], deadline: float, chunk: float):
    self.workers, self.deadline, self.chunk = workers, deadline, chunk

  def _call(self, i: int) -> tuple[int, Any]:
    return i, self.workers[i].run.remote(self.deadline, max_seconds=self.chunk)

  def start(self) -> Submit:
    return [self._call(i) for _ in range(2) for i in range(len(self.workers))]

  def finished(self, i: int, stats: Stats) -> Submit:
    return [self._call(i)] if time.time() < self.deadline else []


class Rounds:
  """The scheduler of synchronous algorithms: every worker runs the same iterations per call.

  Every worker gets the same number of iterations per call (a barrier per iteration cannot
  end on a clock), adapted so that a round lasts about ``chunk`` seconds; two rounds in flight.

  Args:
    workers: the worker actors.
    deadline: ``time.time()`` after which no round starts.
    chunk: seconds a round should last.
  """

  barrier: ClassVar[bool] = True

  def __init__(self, workers: list[Any], deadline: float, chunk: float):
    self.workers, self.deadline, self.chunk = workers, deadline, chunk
    self.size = 1
    self.left: list[int] = []  # results still missing, per round in flight (oldest first)

  def _round(self) -> Submit:
    self.left.append(len(self.workers))
    return [(i, w.run.remote(None, max_iterations=self.size)) for i, w in enumerate(self.workers)]

  def start(self) -> Submit:
    return self._round() + self._round()

  def finished(self, i: int, stats: Stats) -> Submit:
    self.left[0] -= 1
    if self.left[0]:
      return []
    self.left.pop(0)
    per_iteration = stats.busy_s / max(stats.iterations, 1)
    self.size = max(1, min(1000, int(self.chunk / max(per_iteration, 1e-4))))
    return self._round() if time.time() < self.deadline else []


class Lockstep:
  """Deterministic: ``iterations`` rounds; in each, worker 0, 1, ..., n-1 run one iteration
  that waits for its replies, one after the other (``together``: all n at once, for a
  scheduler with a barrier)."""

  def __init__(self, workers: list[Any], iterations: int, together: bool):
    self.workers, self.together = workers, together
    self.calls = iterations * len(workers)  # call c is worker c % n's, in round c // n
    self.next = self.running = 0

  def start(self) -> Submit:
    """The next call, or the next round's n calls together."""
    n = len(self.workers)
    stop = min(self.calls, self.next + (n if self.together else 1))
    calls = [(c % n, self.workers[c % n]) for c in range(self.next, stop)]
    out = [(i, w.run.remote(None, max_iterations=1, sync=True)) for i, w in calls]
    self.next, self.running = stop, len(out)
    return out

  def finished(self, i: int, stats: Stats) -> Submit:
    self.running -= 1
    return self.start() if self.running == 0 else []


def drive(
  schedule: Schedule,
  *,
  check: Callable[[bool], None],
  on_result: Callable[[float, list[Stats]], None],
  tick: Callable[[float], None],
) -> list[Stats]:
  """Runs ``schedule`` until no call is left; returns each worker's summed chunk statistics.

  Args:
    schedule: :class:`AsyncChunks`, :class:`Rounds`, :class:`Lockstep` or another
      :class:`Schedule`.
    check: ``check(progressed)`` after every wait (signals; a lost cluster when no result came
      for too long).
    on_result: ``on_result(now, totals)`` after every result (progress).
    tick: ``tick(now)`` after every wait (evaluations).

  Raises:
    ClusterLostError: a worker died and Ray could not restart it.
  """
  import ray

  totals = [Stats() for _ in schedule.workers]
  inflight = dict((ref, i) for i, ref in schedule.start())
  while inflight:
    ready, _ = ray.wait(list(inflight), num_returns=1, timeout=1.0)
    check(bool(ready))
    tick(time.time())
    for ref in ready:
      i = inflight.pop(ref)
      try:
        stats = ray.get(ref)
      except ray.exceptions.RayActorError as err:
        raise ClusterLostError(f"Worker {i} died and could not be restarted: {err}") from err
      totals[i] = totals[i] + stats
      on_result(time.time(), totals)
      inflight.update((r, w) for w, r in schedule.finished(i, stats))
  return totals
