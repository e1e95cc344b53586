"""The cost model of the ALADDIN cluster simulator (plain arithmetic on seconds and bytes, no
JAX); ``docs/ALADDIN.md`` (section 5, "Cost model") states and discusses its assumptions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

#: The paper's clusters (Table 3): worker 0 slower than the others by this factor.
PAPER_SLOWDOWNS: dict[str, float] = {"HO": 1.0, "HE0": 2.0, "HE1": 10.0, "HE2": 100.0}

#: Bytes per second of 1 Gb/s.
GIGABIT = 1e9 / 8


@dataclasses.dataclass(frozen=True)
class Cluster:
  """A simulated cluster: per-worker speeds, network and parameter-server costs.

  The cost model: a worker's iteration takes its ``compute_time``; a message of b bytes takes
  ``b / bandwidth`` on the sender's uplink (first come, first served), ``latency`` on the wire
  and ``b / bandwidth`` on the receiver's downlink (messages received one after another);
  messages between a worker and a PS shard on the same machine cost nothing; a PS shard
  processes its messages one at a time at ``ps_cost_per_byte``, twice that for a global update;
  the ring all-reduce of b bytes over n workers takes ``2 (n - 1) / n * b / bandwidth +
  2 (n - 1) * latency``. Build one with :func:`make_cluster` or :func:`paper_cluster`; a value
  out of range raises a ValueError at construction.

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
    **kwargs: the other :class:`Cluster` fields (``bandwidth``, ``latency``, ``num_shards``,
      ``jitter``, ...).

  Returns:
    The :class:`Cluster`.

  Raises:
    ValueError: a slowed-down worker outside ``[0, n)`` or a factor not above 0, or a field
      out of range.

  Examples:
    >>> from optax_lena.aladdin import simulator as sim
    >>> cluster = sim.make_cluster(8, 0.5, slowdown=10.0)
    >>> cluster.num_workers, cluster.compute_time[:3]
    (8, (5.0, 0.5, 0.5))
    >>> sim.make_cluster(4, 0.5, slowdown={2: 3.0}, num_shards=2).compute_time
    (0.5, 0.5, 1.5, 0.5)
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


#: The paper's models, with one RTX 2080 Ti's published training throughputs (Lambda's
#: TensorFlow benchmark, FP32); docs/ALADDIN.md, section 5, "The paper's cluster", gives the
#: source and why they bound the compute time above.
PAPER_MODELS: dict[str, ModelSize] = {
  "ResNet-50": ModelSize("ResNet-50", 23_500_000, 128, 294.0),
  "VGG-16": ModelSize("VGG-16", 138_000_000, 96, 186.0),
}


def calibrated_compute_time(model: ModelSize, paper_speedup: float, cluster: Cluster) -> float:
  """The compute time at which the ring all-reduce model gives the paper's AR-SGD speed-up.

  AR-SGD on a homogeneous cluster of n workers computes for ``c`` seconds and all-reduces for
  ``t_ar`` per iteration, so its speed-up is ``n c / (c + t_ar)``; setting it to the paper's
  ``s`` gives ``c = s t_ar / (n - s)``. With that compute time, the simulator's other cells of
  Table 3 are predictions.

  Args:
    model: the model, whose bytes set ``t_ar``.
    paper_speedup: s, the paper's AR-SGD speed-up on the homogeneous cluster (below n).
    cluster: the cluster (n and its network).

  Returns:
    Seconds per iteration of one worker.

  References:
    Ko, Choi, Jei, Lee and Kim, "ALADDIN: Asymmetric Centralized Training for Distributed Deep
    Learning", CIKM 2021, Table 3 (AR-SGD on HO: 5.40 for ResNet-50, 2.03 for VGG-16).

  Examples:
    >>> from optax_lena.aladdin import simulator as sim
    >>> resnet = sim.PAPER_MODELS["ResNet-50"]
    >>> round(sim.calibrated_compute_time(resnet, 5.40, sim.paper_cluster(1.0)), 3)
    0.275
  """
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

  8 workers, two per machine sharing its NIC (1.25e9 bytes/s per direction), 50 us latency, 4
  PS shards (one per machine, co-located), 0.5 ns of PS processing per byte and a send buffer
  of one message.

  Args:
    compute_time: seconds per iteration of a normal worker.
    slowdown: worker 0's slowdown factor (``PAPER_SLOWDOWNS``: 1, 2, 10, 100).
    num_workers: n.
    num_shards: PS shards (one per machine).
    ps_cost_per_byte: seconds a shard spends per byte (0.5e-9: 2 GB/s of float32).
    send_buffer: messages an ALADDIN worker may have queued on its uplink.

  Returns:
    The :class:`Cluster`.

  Raises:
    ValueError: ``compute_time`` is not a positive finite number or ``slowdown`` is not above
      0, or a count is below 1.

  References:
    Ko, Choi, Jei, Lee and Kim, "ALADDIN: Asymmetric Centralized Training for Distributed Deep
    Learning", CIKM 2021: the cluster of its experiments (Section 5) and Table 3's HO, HE0,
    HE1 and HE2.

  Examples:
    >>> from optax_lena.aladdin import simulator as sim
    >>> cluster = sim.paper_cluster(0.435, slowdown=sim.PAPER_SLOWDOWNS["HE1"])
    >>> cluster.num_workers, cluster.num_machines, cluster.num_shards, cluster.compute_time[:2]
    (8, 4, 4, (4.35, 0.435))
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
