"""What the Ray runtime counts and reports, as typed records: an iteration's :class:`Stats`
(summed into a worker's chunk and its totals), a shard's :class:`ShardCounts`, and the
records a run reports (:class:`ShardStats`, :class:`WorkerInfo`, :class:`RunResult`)."""

from __future__ import annotations

import dataclasses
from typing import Any

PyTree = Any


@dataclasses.dataclass
class Stats:
  """What some iterations of a worker took; records add up (``a + b``).

  Attributes:
    iterations: iterations completed (an iteration that ended before it could step, e.g. SGP
      waiting for a gossip message past the deadline, returns 0 with its wait).
    compute_s: seconds in the local step.
    sleep_s: seconds asleep as an emulated straggler (``Config.slowdown``).
    wait_s: seconds blocked on other processes (back-pressure, replies, a barrier, a peer).
    busy_s: seconds of the worker's calls (set per chunk by the worker, not per iteration).
    merges: replies merged, models adopted or gossip messages mixed (set per chunk).
  """

  iterations: int = 0
  compute_s: float = 0.0
  sleep_s: float = 0.0
  wait_s: float = 0.0
  busy_s: float = 0.0
  merges: int = 0

  @classmethod
  def iteration(cls, compute_s: float, sleep_s: float = 0.0, wait_s: float = 0.0) -> Stats:
    """The record of one completed iteration.

    Examples:
      >>> from optax_lena.aladdin import distributed as ad
      >>> ad.Stats.iteration(0.02, wait_s=0.01) + ad.Stats.iteration(0.03)
      Stats(iterations=2, compute_s=0.05, sleep_s=0.0, wait_s=0.01, busy_s=0.0, merges=0)
    """
    return cls(iterations=1, compute_s=compute_s, sleep_s=sleep_s, wait_s=wait_s)

  def __iadd__(self, other: Stats) -> Stats:
    # Field by field, written out: a worker adds one record per iteration.
    self.iterations += other.iterations
    self.compute_s += other.compute_s
    self.sleep_s += other.sleep_s
    self.wait_s += other.wait_s
    self.busy_s += other.busy_s
    self.merges += other.merges
    return self

  def __add__(self, other: Stats) -> Stats:
    total = dataclasses.replace(self)
    total += other
    return total


@dataclasses.dataclass
class ShardCounts:
  """A PS shard's message counters (see :class:`ShardStats`)."""

  received: int = 0
  calls: int = 0
  rejected_malformed: int = 0
  global_updates: int = 0


@dataclasses.dataclass(frozen=True)
class ShardStats:
  """A PS shard's counters (``Runtime.shard_stats()``, ``RunResult.shards``).

  Attributes:
    shard, pid, nice, threads_limited, node_id: its index, process, priority, whether XLA's
      intra-op pool is limited, its Ray node.
    received: messages received (each folded one counted): the accepted ones plus both
      rejection counts; calls: Ray calls.
    rejected_malformed, rejected_by_server: calls refused as malformed (shape, dtype, sender,
      ring record; one each, whatever they claim to hold) and messages refused by the server
      state (non-finite).
    global_updates, checkpoints, restored_updates, restored_generation: updates so far
      (counted from the restored checkpoint), checkpoints saved, the updates and the generation
      of the checkpoint restored at start (-1: none).
    restarted: Ray restarted this actor.
  """

  shard: int
  pid: int
  nice: int
  threads_limited: bool
  received: int
  calls: int
  rejected_malformed: int
  global_updates: int
  rejected_by_server: int
  checkpoints: int
  restored_updates: int
  restored_generation: int
  restarted: bool
  node_id: str


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
  """A worker's identity, totals, transport and placement.

  As ``Runtime.worker_infos()`` and ``RunResult.workers`` report it.

  Attributes:
    worker, pid, incarnation, start_updates, loss: its index, process, restarts by Ray, the
      global updates of the model it (re)started from, its last loss.
    iterations, compute_s, sleep_s, wait_s, busy_s: totals over its calls (:class:`Stats`).
    merges: replies merged, models adopted or gossip messages mixed (0 for AR-SGD).
    sent, calls, shared_memory, fold: messages sent per shard, Ray calls per shard, whether
      they travel through a shared-memory ring, messages it queues before a call.
    node_id, devices, accelerator_ids, cuda_visible_devices, nice, threads_limited, cores: its
      Ray node, JAX's devices, the accelerators Ray assigned, the visible CUDA devices, its
      priority, whether XLA's intra-op pool is limited, the cores its step is pinned to.
  """

  worker: int
  pid: int
  incarnation: int
  start_updates: int
  loss: float
  iterations: int
  compute_s: float
  sleep_s: float
  wait_s: float
  busy_s: float
  merges: int
  sent: list[int]
  calls: int
  shared_memory: bool
  fold: int
  node_id: str
  devices: list[str]
  accelerator_ids: dict[str, list[str]]
  cuda_visible_devices: str | None
  nice: int
  threads_limited: bool
  cores: list[int]


@dataclasses.dataclass
class RunResult:
  """What a run measured, in wall-clock seconds.

  It follows ``al.Result``, which describes ``algorithm``, ``samples``, ``throughput``,
  ``iterations``, ``curve`` and ``final_params``.

  Attributes:
    wall_s: seconds from the first scheduled chunk to the last result.
    wait_fraction: per worker, time blocked on other processes / time in its iterations.
    compute_fraction: per worker, time in its local step / time in its iterations.
    merges: per worker, its :class:`WorkerInfo` ``merges``.
    curve_iterations: the iterations of all workers together at each evaluation.
    shards: each shard's counters at the end (:class:`ShardStats`).
    workers: each worker's identity and totals at the end (:class:`WorkerInfo`).
  """

  algorithm: str
  wall_s: float
  samples: int
  throughput: float
  iterations: list[int]
  wait_fraction: list[float]
  compute_fraction: list[float]
  merges: list[int]
  curve: list[tuple[float, float]]
  curve_iterations: list[int]
  shards: list[ShardStats]
  workers: list[WorkerInfo]
  final_params: PyTree

  def summary(self) -> dict[str, Any]:
    """A JSON-friendly dict of everything but ``final_params`` (the records as dicts)."""
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    out.pop("final_params")
    out["shards"] = [dataclasses.asdict(s) for s in self.shards]
    out["workers"] = [dataclasses.asdict(w) for w in self.workers]
    return out
