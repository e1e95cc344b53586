"""The simulator's event engine, its per-worker record and the base of every algorithm's process:
timing only (what is computed is the compute object's, :mod:`.compute`).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from optax_lena._src.aladdin.sim.cluster import Cluster


class Engine:
  """The heap of events and the busy-until times of every link and PS shard."""

  def __init__(self, cluster: Cluster, record: bool):
    self.cluster = cluster
    self.heap: list[tuple[float, int, Callable[..., None], tuple]] = []
    self.seq = 0
    self.now = 0.0
    self.up_free = [0.0] * cluster.num_nics
    self.down_free = [0.0] * cluster.num_nics
    self.ps_free = [0.0] * cluster.num_shards
    self.record = record
    self.events: list[tuple[float, str, int]] = []
    self.num_events = 0
    self.stopped = False

  def at(self, when: float, handler: Callable[..., None], *args: Any) -> None:
    # The sequence number breaks ties: same-time events run in scheduling order, and the
    # handler is never compared.
    heapq.heappush(self.heap, (when, self.seq, handler, args))
    self.seq += 1

  def log(self, kind: str, worker: int) -> None:
    if self.record:
      self.events.append((self.now, kind, worker))

  def run(self, until: float) -> None:
    while self.heap and not self.stopped:
      when, _, handler, args = heapq.heappop(self.heap)
      if when > until:
        self.now = until
        self.stopped = True
        return
      self.now = when
      self.num_events += 1
      handler(*args)

  def send(
    self, src: int, dst: int, nbytes: float, on_arrival: Callable[..., None], *args: Any
  ) -> float:
    """A message from NIC ``src`` to NIC ``dst`` (uplink FIFO, wire latency, downlink in arrival
    order; the same NIC: through memory, now); ``on_arrival(*args)`` at the end. Returns when
    it has left the sender's uplink."""
    if src == dst:
      self.at(self.now, on_arrival, *args)
      return self.now
    wire, down = self.cluster.wire_time(nbytes, src), self.cluster.wire_time(nbytes, dst)
    start = max(self.now, self.up_free[src])
    self.up_free[src] = start + wire
    self.at(start + wire + self.cluster.latency, self._reach, dst, down, on_arrival, args)
    return start + wire

  def _reach(self, dst: int, wire: float, on_arrival: Callable[..., None], args: tuple) -> None:
    arrival = max(self.now, self.down_free[dst] + wire)
    self.down_free[dst] = arrival
    self.at(arrival, on_arrival, *args)

  def ps_process(
    self, shard: int, nbytes: float, update: bool, on_done: Callable[..., None], *args: Any
  ) -> None:
    """PS shard ``shard`` processes one message (FIFO, one at a time), then ``on_done(*args)``."""
    start = max(self.now, self.ps_free[shard])
    self.ps_free[shard] = start + self.cluster.ps_time(nbytes, update=update)
    self.at(self.ps_free[shard], on_done, *args)


@dataclasses.dataclass(eq=False)
class SimWorker:
  """Everything the simulator knows about one worker (a process may add fields): ``jitter``,
  its compute-time generator, seeded by (seed, i, 1); ``wait``, simulated seconds it spent idle;
  ``batches`` and ``state``, its batch stream and its program's state, owned by the compute
  object (None in the timing-only mode)."""

  index: int
  jitter: np.random.Generator
  iterations: int = 0
  wait: float = 0.0
  messages: int = 0
  idle_since: float = 0.0
  batches: Any = None
  state: Any = None


class Process:
  """Base of one algorithm's message pattern in the simulator: who waits for what, and when.

  A subclass per pattern, attached to an algorithm with ``@sim.simulates``, sets
  ``worker_type`` (its :class:`SimWorker` record), implements :meth:`computed` and the handlers
  it schedules on ``self.engine``, and calls the compute object (``self.compute.step``,
  ``receive``, ``apply``) for every computation, which the timing-only mode skips.
  """

  worker_type: ClassVar[type[SimWorker]] = SimWorker
  # The handlers of a process that talks to PS shards (see :meth:`to_shards`).
  ps_arrive: Callable[..., None]
  reply_arrive: Callable[..., None]

  def __init__(
    self,
    spec: Any,
    cluster: Cluster,
    compute: Any,
    *,
    batch_size: int,
    nbytes: float,
    num_samples: int | None,
    num_evals: int,
    seed: int,
    record_events: bool,
  ):
    self.spec, self.cluster, self.compute = spec, cluster, compute
    self.n = cluster.num_workers
    self.batch_size = batch_size
    self.nbytes = float(nbytes)
    self.budget = num_samples
    self.engine = Engine(cluster, record_events)
    self.samples = 0
    # Compute-time jitter: one generator per worker, apart from the batch streams' (seed, i).
    self.workers: list[Any] = [
      self.worker_type(i, np.random.default_rng([seed, i, 1])) for i in range(self.n)
    ]
    self.eval_every = (num_samples / num_evals) if num_samples and num_evals > 0 else math.inf
    self.next_eval = self.eval_every

  def start(self) -> None:
    """Schedules the first events (default: every worker starts computing)."""
    for worker in self.workers:
      self.begin(worker)

  def computed(self, worker: Any) -> None:
    """``worker`` (a ``worker_type`` record) has finished computing an iteration."""
    raise NotImplementedError

  def compute_time(self, worker: SimWorker) -> float:
    base = self.cluster.compute_time[worker.index]
    if not self.cluster.jitter:
      return base
    return base * (1.0 + self.cluster.jitter * (2.0 * worker.jitter.random() - 1.0))

  def computed_step(self, worker: SimWorker, step: bool = True) -> Any:
    """Books the end of ``worker``'s computation (idle from now on) and, if ``step``, returns
    the message of its local step."""
    self.engine.log("compute", worker.index)
    worker.iterations += 1
    worker.idle_since = self.engine.now
    return self.compute.step(worker) if step else None

  def begin(self, worker: SimWorker) -> None:
    """``worker`` starts an iteration now (its idle time since ``idle_since`` counts as wait)."""
    e = self.engine
    worker.wait += e.now - worker.idle_since
    e.at(e.now + self.compute_time(worker), self.computed, worker)

  def to_shards(self, worker: SimWorker, message: Any) -> float:
    """Sends each PS shard its slice of ``message`` (``self.ps_arrive(shard, worker, nbytes,
    message)`` on arrival); returns when the last slice has left the worker's uplink."""
    src, left = self.cluster.worker_nic(worker.index), self.engine.now
    nbytes = self.nbytes / self.cluster.num_shards  # memory-wise: equal slices
    for s in range(self.cluster.num_shards):
      ps = self.cluster.ps_nic(s)
      left = self.engine.send(src, ps, nbytes, self.ps_arrive, s, worker, nbytes, message)
    return left

  def to_worker(self, shard: int, worker: SimWorker, nbytes: float, reply: Any) -> None:
    """Sends a PS shard's reply to ``worker`` (``self.reply_arrive(worker, reply)``)."""
    dst = self.cluster.worker_nic(worker.index)
    self.engine.send(self.cluster.ps_nic(shard), dst, nbytes, self.reply_arrive, worker, reply)

  def evaluate(self) -> None:
    self.compute.evaluate(self.engine.now, self.samples, self.samples / (self.n * self.batch_size))

  def count_samples(self, count: int) -> None:
    """Adds processed samples; evaluates on the schedule and stops at the budget."""
    self.samples += count
    while self.samples >= self.next_eval - 1e-9 and (
      self.budget is None or self.next_eval < self.budget - 1e-9
    ):
      self.evaluate()
      self.next_eval += self.eval_every
    if self.budget is not None and self.samples >= self.budget:
      self.engine.stopped = True
