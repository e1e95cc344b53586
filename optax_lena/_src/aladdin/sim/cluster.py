"""The cost model of the ALADDIN cluster simulator (plain arithmetic on seconds and bytes, no
JAX); ``docs/ALADDIN.md`` (section 5, "Cost model") states and discusses its assumptions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

# The paper's clusters (Table 3): one worker (index 0) slower by this factor.
PAPER_SLOWDOWNS: dict[str, float] = {"HO": 1.0, "HE0": 2.0, "HE1": 10.0, "HE2": 100.0}

GIGABIT = 1e9 / 8  # bytes per second of 1 Gb/s


@dataclasses.dataclass(frozen=True)
class Cluster:
  """A simulated cluster: per-worker speeds, network and parameter-server costs.

  Attributes:
    compute_time: seconds per iteration of each worker (its length is n).
    bandwidth: bytes per second of every NIC, in each direction (10 Gb/s = 1.25e9).
    latency: seconds a message spends on the wire, and per step of the ring all-reduce.
    ps_cost_per_byte: seconds a PS shard spends per byte (twice that for a global update).
    num_shards: PS shards, each serving its slice of every message serially.
    workers_per_machine: workers sharing one NIC (the paper: 2 GPUs per machine).
    ps_colocated: the PS shards run on the worker machines (shard s on machine s mod m).
    ps_bandwidth: bytes per second of the PS shards' own NICs (None: ``bandwidth``).
    jitter: each iteration takes ``compute_time[i] * (1 + jitter * u)``, u uniform in [-1, 1)
      from a generator seeded by (seed, worker) (0: exact times).
    send_buffer: messages an ALADDIN worker may have queued on its uplink before it waits for
      the oldest to leave (None: unbounded).
  """

  compute_time: tuple[float, ...]
  bandwidth: float = 10 * GIGABIT
  latency: float = 50e-6
  ps_cost_per_byte: float = 0.5e-9
  num_shards: int = 1
  workers_per_machine: int = 1
  ps_colocated: bool = False
  ps_bandwidth: float | None = None
  send_buffer: int | None = None
  jitter: float = 0.0

  def __post_init__(self) -> None:
    times = tuple(float(t) for t in self.compute_time)
    object.__setattr__(self, "compute_time", times)
    if not times or any(not (t > 0 and math.isfinite(t)) for t in times):
      raise ValueError(f"compute_time must be positive finite seconds per worker, got {times}.")
    if not self.bandwidth > 0:
      raise ValueError(f"bandwidth must be positive bytes/s, got {self.bandwidth}.")
    if self.latency < 0 or self.ps_cost_per_byte < 0:
      raise ValueError("latency and ps_cost_per_byte must be >= 0.")
    if not 0 <= self.jitter < 1:
      raise ValueError(f"jitter must be in [0, 1), got {self.jitter}.")
    if self.send_buffer is not None and self.send_buffer < 1:
      raise ValueError(f"send_buffer must be None or >= 1, got {self.send_buffer}.")
    if self.num_shards < 1 or self.workers_per_machine < 1:
      raise ValueError("num_shards and workers_per_machine must be >= 1.")

  @property
  def num_workers(self) -> int:
    """n, the number of workers."""
    return len(self.compute_time)

  @property
  def num_machines(self) -> int:
    """Machines holding the workers (``ceil(n / workers_per_machine)``)."""
    return -(-self.num_workers // self.workers_per_machine)

  def worker_nic(self, worker: int) -> int:
    """The NIC index worker ``worker`` sends and receives on."""
    return worker // self.workers_per_machine

  def ps_nic(self, shard: int) -> int:
    """The NIC index PS shard ``shard`` sends and receives on."""
    if self.ps_colocated:
      return shard % self.num_machines
    return self.num_machines + shard

  @property
  def num_nics(self) -> int:
    """NICs in the model (machines, plus the PS shards' own unless co-located)."""
    return self.num_machines + (0 if self.ps_colocated else self.num_shards)

  def wire_time(self, nbytes: float, nic: int | None = None) -> float:
    """Seconds ``nbytes`` occupy one direction of NIC ``nic`` (None: a worker's NIC)."""
    if nic is not None and nic >= self.num_machines and self.ps_bandwidth is not None:
      return nbytes / self.ps_bandwidth
    return nbytes / self.bandwidth

  def ps_time(self, nbytes: float, *, update: bool) -> float:
    """Seconds a PS shard spends on a message of ``nbytes`` (twice that with a global update)."""
    return nbytes * self.ps_cost_per_byte * (2.0 if update else 1.0)

  def allreduce_time(self, nbytes: float) -> float:
    """Ring all-reduce of ``nbytes`` over the n workers (0 for one worker)."""
    n = self.num_workers
    if n == 1:
      return 0.0
    return 2.0 * (n - 1) / n * nbytes / self.bandwidth + 2.0 * (n - 1) * self.latency


def make_cluster(
  num_workers: int,
  compute_time: float,
  *,
  slowdown: float | Mapping[int, float] = 1.0,
  **kwargs: Any,
) -> Cluster:
  """A cluster of ``num_workers`` equal workers, some slowed down.

  Args:
    num_workers: n.
    compute_time: seconds per iteration of a normal worker.
    slowdown: a float (worker 0 is that many times slower: the paper's HE clusters) or a
      mapping ``{worker: factor}``.
    **kwargs: the other :class:`Cluster` fields.
  """
  factors = {0: float(slowdown)} if isinstance(slowdown, int | float) else dict(slowdown)
  for worker, factor in factors.items():
    if not 0 <= worker < num_workers or not factor > 0:
      raise ValueError(f"slowdown {worker}: {factor} needs a worker in [0, n) and a factor > 0.")
  times = tuple(compute_time * factors.get(i, 1.0) for i in range(num_workers))
  return Cluster(times, **kwargs)


@dataclasses.dataclass(frozen=True)
class ModelSize:
  """A model for the timing-only mode: its size and one 2080 Ti's iteration time.

  Attributes:
    name: e.g. ``"ResNet-50"``.
    num_params: parameters (float32 on the wire: 4 bytes each).
    batch_size: per-worker batch of the paper.
    images_per_second: one RTX 2080 Ti's FP32 training throughput used for ``compute_time``.
  """

  name: str
  num_params: int
  batch_size: int
  images_per_second: float

  @property
  def nbytes(self) -> float:
    """Bytes of one gradient or parameter message (float32)."""
    return 4.0 * self.num_params

  @property
  def compute_time(self) -> float:
    """Seconds per iteration of one worker: batch / throughput."""
    return self.batch_size / self.images_per_second


# One RTX 2080 Ti's published throughputs (Lambda's TensorFlow benchmark, FP32); docs/ALADDIN.md,
# section 5, "The paper's cluster", gives the source and why they bound the compute time above.
PAPER_MODELS: dict[str, ModelSize] = {
  "ResNet-50": ModelSize("ResNet-50", 23_500_000, 128, 294.0),
  "VGG-16": ModelSize("VGG-16", 138_000_000, 96, 186.0),
}


def calibrated_compute_time(model: ModelSize, paper_speedup: float, cluster: Cluster) -> float:
  """The compute time for which the ring all-reduce model gives the paper's AR-SGD HO
  speed-up ``s`` (``paper_speedup``) on ``cluster``: ``n c / (c + t_ar) = s`` -> ``c = s t_ar /
  (n - s)``, ``t_ar`` the all-reduce time of ``model``'s bytes (seconds per iteration)."""
  n = cluster.num_workers
  return paper_speedup * cluster.allreduce_time(model.nbytes) / (n - paper_speedup)


def paper_cluster(
  compute_time: float,
  slowdown: float = 1.0,
  *,
  num_workers: int = 8,
  num_shards: int = 4,
  ps_cost_per_byte: float = 0.5e-9,
  send_buffer: int | None = 1,
) -> Cluster:
  """The paper's cluster: 4 machines x 2 GPUs, 10 Gb/s Ethernet, PS shards on the machines.

  Args:
    compute_time: seconds per iteration of a normal worker.
    slowdown: worker 0's slowdown factor (``PAPER_SLOWDOWNS``).
    num_workers, num_shards, ps_cost_per_byte, send_buffer: the :class:`Cluster` fields
      (n, one shard per machine, 2 GB/s of gradient per shard and 1 by default, the paper's).
  """
  return make_cluster(
    num_workers,
    compute_time,
    slowdown=slowdown,
    bandwidth=10 * GIGABIT,
    latency=50e-6,
    ps_cost_per_byte=ps_cost_per_byte,
    num_shards=num_shards,
    workers_per_machine=2,
    ps_colocated=True,
    send_buffer=send_buffer,
  )
