"""What the Ray runtime trains (:class:`Task`), how (:class:`Config`), what it measured
(:class:`RunResult`) and its errors; every knob is checked here, where the user sets it."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

PyTree = Any


class ClusterLostError(RuntimeError):
  """The driver lost its Ray cluster (GCS unreachable, or no actor answers)."""


class Interrupted(KeyboardInterrupt):
  """The run was stopped by SIGINT (Ctrl-C) or SIGTERM, ``signum``; everything has been shut
  down. A program exits with ``exit_code`` (130 or 143)."""

  def __init__(self, signum: int):
    super().__init__(f"stopped by signal {signum}")
    self.signum = signum

  @property
  def exit_code(self) -> int:
    return 128 + self.signum


@dataclasses.dataclass(frozen=True)
class Task:
  """What to train; shipped (cloudpickled) to every actor. The optimizers belong to the
  algorithm (``Config.algorithm``, e.g. ``al.algorithm("aladdin", worker_tx=tx)``).

  Attributes:
    loss_fn: ``loss_fn(params, batch) -> scalar loss``.
    init_params: the initial model (a pytree of floating-point arrays).
    batches: ``batches(worker, seed) -> iterator`` of that worker's mini-batches, endless.
    batch_size: samples per mini-batch (for throughput).
  """

  loss_fn: Callable[[PyTree, Any], Any]
  init_params: PyTree
  batches: Callable[[int, int], Iterator[Any]]
  batch_size: int

  def __post_init__(self) -> None:
    if not callable(self.loss_fn) or not callable(self.batches):
      raise TypeError("Task: loss_fn(params, batch) and batches(worker, seed) must be callable.")
    if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int):
      raise TypeError(f"Task: batch_size must be an int >= 1, got {self.batch_size!r}.")
    if self.batch_size < 1:
      raise ValueError(f"Task: batch_size must be >= 1, got {self.batch_size}.")

  @classmethod
  def from_problem(cls, problem: Any, batch_size: int) -> Task:
    """The task of a simulator problem (``sim.Problem``): its ``loss_fn`` and ``params``, and
    the simulator's batches (``batches(w, s)``: worker ``w``'s stream with ``seed=s``)."""
    from optax_lena._src.aladdin.sim.compute import batch_stream

    x, y = problem.x_train, problem.y_train

    def batches(worker: int, seed: int) -> Iterator[Any]:
      return batch_stream(x, y, batch_size, np.random.default_rng([seed, worker]))

    return cls(problem.loss_fn, problem.params, batches, batch_size)


# ALADDIN's calls carry up to this many periods of a worker's messages: a worker that outruns
# its calls folds what it queued into the next one instead of waiting (back-pressure).
FOLD_PERIODS = 8
# A shard applies a call's messages in blocks of up to this many periods, one compiled call
# each: it compiles every block size before the run, and a larger one costs seconds more.
BLOCK_PERIODS = 4


@dataclasses.dataclass(frozen=True)
class Plan:
  """How a worker's messages travel to the PS shards: computed once, on the driver, from the
  spec (``iteration.plan(spec)``) and shipped in the :class:`Config` to every worker and shard.

  Attributes:
    period: messages of a worker per reply at most (ALADDIN's period; 1 for the others); a
      call of more than ``period`` messages carries a multiple of it.
    max_fold: messages one call may carry.
    block: messages a shard applies in one compiled call (``max_fold`` at most).
  """

  period: int
  max_fold: int
  block: int

  def __post_init__(self) -> None:
    object.__setattr__(self, "block", min(self.block, self.max_fold))

  @property
  def reply_slots(self) -> int:
    """Replies one call may bring back: a worker triggers at most once per ``period``."""
    return -(-self.max_fold // self.period)

  def block_sizes(self) -> list[int]:
    """The call sizes a shard compiles: up to a period (flushes, slow steps) and whole
    periods up to a block."""
    p, b = self.period, self.block
    return sorted({*range(1, min(p, b) + 1), *range(p, b + 1, p)})


def _positive(name: str, value: Any, integer: bool = False, zero: bool = False) -> None:
  types = (int, np.integer) if integer else (int, float, np.integer, np.floating)
  ok = not isinstance(value, bool) and isinstance(value, types) and math.isfinite(value)
  if not (ok and (value >= 0 if zero else value > 0)):
    kind = "an int (e.g. 2, not 2.0)" if integer else "a finite number"
    raise ValueError(f"Config: {name} must be {kind} {'>= 0' if zero else '> 0'}, got {value!r}.")


def _resources(name: str, value: Mapping[str, float] | None) -> None:
  if value is None:
    return
  if not isinstance(value, Mapping) or not all(
    isinstance(k, str) and isinstance(v, int | float) and v > 0 for k, v in value.items()
  ):
    raise ValueError(f"Config: {name} must map resource names to amounts > 0, got {value!r}.")


@dataclasses.dataclass(frozen=True)
class Config:
  """How to train (``docs/ALADDIN-ray.md`` describes what each knob does to the run).

  Attributes:
    algorithm: the algorithm and its options, a spec of ``optax_lena.aladdin``
      (``al.algorithm("aladdin", worker_tx=tx)``), or the name of one whose defaults suffice.
    num_workers: n.
    ps_shards: number of PS shard actors, exactly (the flat model cut into equal slices).
    slowdown: ``{worker: factor}``; that worker sleeps ``(factor - 1)`` times its compute time
      every iteration.
    checkpoint_dir: directory of the shards' Orbax checkpoints (None: none); a run started on
      one that holds checkpoints resumes from them. Made absolute here, on the driver.
    checkpoint_every: a shard saves after the call that brings its global updates since the
      last save to this many.
    fold: ALADDIN: messages a worker queues before it makes a call to each shard (1 to 8
      periods; None: whole periods, as many as its step computes in ``fold_seconds``).
    fold_seconds: the compute time that a default ``fold`` spans.
    max_inflight: unanswered calls per worker and shard before a worker folds, then waits.
    chunk_seconds: wall time of one worker call scheduled by the driver.
    seed: seeds the workers' data order.
    worker_resources: Ray custom resources every worker actor requires (placement).
    server_resources: Ray custom resources every shard / reducer / mailbox actor requires.
    worker_gpus: accelerators Ray gives every worker actor (fractions share one device).
    server_gpus: accelerators of every shard actor.
    deterministic: one worker iteration at a time, round-robin, each waiting for its replies:
      the result does not depend on timing.
    worker_nice: the workers' ``os.nice``; None: 5 when the cluster has fewer CPUs than actors.
    intra_op_threads: threads of every actor's XLA CPU pool; None: 1 when the cluster has no
      more CPUs than actors, else XLA's default.
    pin_compute: every worker runs its step on ``intra_op_threads`` cores it claims on its node;
      None: pin when the pool is limited and the cluster has CPUs to spare.
    recheck_messages: the PS shards also check every slice they receive for NaN and Inf
      instead of trusting the worker's verdict.
    shared_memory: a worker whose PS shards all run on its node passes messages and replies
      through a shared-memory ring; elsewhere, or False, they travel in the calls.
  """

  algorithm: Any = "aladdin"
  num_workers: int = 4
  ps_shards: int = 1
  slowdown: Mapping[int, float] = dataclasses.field(default_factory=dict)
  checkpoint_dir: str | None = None
  checkpoint_every: int = 50
  fold: int | None = None
  fold_seconds: float = 0.015
  max_inflight: int = 2
  chunk_seconds: float = 0.5
  seed: int = 0
  worker_resources: Mapping[str, float] | None = None
  server_resources: Mapping[str, float] | None = None
  worker_gpus: float = 0.0
  server_gpus: float = 0.0
  deterministic: bool = False
  worker_nice: int | None = None
  intra_op_threads: int | None = None
  pin_compute: bool | None = None
  recheck_messages: bool = False
  shared_memory: bool = True
  plan: Plan = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self) -> None:
    from optax_lena._src.aladdin import algorithms
    from optax_lena._src.aladdin.ray import iterations  # noqa: F401 - attaches Ray's pieces

    spec = self.algorithm
    if isinstance(spec, str):
      spec = algorithms.algorithm(spec)
    if not isinstance(spec, algorithms.Spec):
      raise TypeError(
        "Config: algorithm must be a spec (al.algorithm('aladdin', worker_tx=...)) or a name, "
        f"got {type(spec).__name__}."
      )
    iteration = algorithms.entry(spec.name).engine("ray")  # an error listing what Ray runs
    spec.check_trainable()
    if getattr(spec, "reply_every", None) is not None:
      raise ValueError("Config: reply_every (a simulator ablation) is not supported on Ray.")
    if getattr(spec, "overlap", 1) == 0 and self.deterministic:
      raise ValueError("Config: SGP with overlap=0 cannot run the deterministic lockstep.")
    object.__setattr__(self, "algorithm", spec)
    object.__setattr__(self, "plan", iteration.plan(spec))
    for name in ("num_workers", "ps_shards", "checkpoint_every", "max_inflight"):
      _positive(name, getattr(self, name), integer=True)
    for name in ("fold_seconds", "chunk_seconds"):
      _positive(name, getattr(self, name))
    if self.fold is not None:
      _positive("fold", self.fold, integer=True)
      if self.fold > self.plan.max_fold:
        raise ValueError(
          f"Config: fold={self.fold} exceeds the {self.plan.max_fold} messages one call may "
          f"carry ({FOLD_PERIODS} periods of ALADDIN, 1 for the other algorithms)."
        )
    for name in ("worker_gpus", "server_gpus"):
      gpus = getattr(self, name)
      _positive(name, gpus, zero=True)
      if gpus > 1 and not float(gpus).is_integer():
        raise ValueError(f"Config: {name} above 1 must be a whole number, got {gpus!r}.")
    if self.intra_op_threads is not None:
      _positive("intra_op_threads", self.intra_op_threads, integer=True)
    if self.pin_compute not in (None, True, False):
      raise ValueError(f"Config: pin_compute must be None or a bool, got {self.pin_compute!r}.")
    if self.pin_compute and self.intra_op_threads is None:
      raise ValueError(
        "Config: pin_compute=True needs intra_op_threads=N, the cores each worker's step is "
        "pinned to (e.g. Config(pin_compute=True, intra_op_threads=1))."
      )
    for name in ("recheck_messages", "shared_memory", "deterministic"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"Config: {name} must be a bool, got {getattr(self, name)!r}.")
    nice = self.worker_nice
    if nice is not None and (
      isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= 19
    ):
      raise ValueError(f"Config: worker_nice must be None or an int in [0, 19], got {nice!r}.")
    if not isinstance(self.seed, int) or isinstance(self.seed, bool):
      raise ValueError(f"Config: seed must be an int, got {self.seed!r}.")
    if (path := self.checkpoint_dir) is not None:
      if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise ValueError(
          "Config: checkpoint_dir must be None (no checkpoints) or a non-empty path, e.g. "
          f"checkpoint_dir='checkpoints', got {path!r}."
        )
      if spec.server(self.num_workers) is None:
        raise ValueError(
          f"Config: checkpoint_dir needs parameter-server shards; {spec.name!r} has none."
        )
      object.__setattr__(self, "checkpoint_dir", os.path.abspath(os.fspath(path)))
    if not isinstance(self.slowdown, Mapping):
      raise ValueError(
        f"Config: slowdown must map worker indices to factors, got {self.slowdown!r}."
      )
    for worker, factor in self.slowdown.items():
      if isinstance(worker, bool) or not isinstance(worker, int):
        raise ValueError(f"Config: slowdown keys are worker indices (ints), got {worker!r}.")
      number = not isinstance(factor, bool) and isinstance(factor, int | float | np.number)
      if not (0 <= worker < self.num_workers and number and math.isfinite(factor) and factor >= 1):
        raise ValueError(
          f"Config: slowdown {worker}: {factor!r}: the worker must be in [0, {self.num_workers}) "
          "and the factor a finite number >= 1 (e.g. 2.0: that worker's iterations take twice "
          "as long)."
        )
    _resources("worker_resources", self.worker_resources)
    _resources("server_resources", self.server_resources)

  @property
  def spec(self) -> Any:
    """The algorithm's spec (``algorithm`` after validation)."""
    return self.algorithm


@dataclasses.dataclass(frozen=True)
class ShardStats:
  """A PS shard's counters (``Runtime.shard_stats()``, ``RunResult.shards``).

  Attributes:
    shard, pid, nice, threads_limited, node_id: its index, process, priority, whether XLA's
      intra-op pool is limited, its Ray node.
    received: messages received (each folded one counted): the accepted ones plus both
      rejection counts; calls: Ray calls.
    rejected_malformed, rejected_by_server: messages refused as malformed (shape, dtype,
      sender, ring rows) and by the server state (non-finite).
    global_updates, checkpoints, restored_updates: updates so far (counted from the restored
      step), checkpoints saved, the step restored at start (-1: none).
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
  restarted: bool
  node_id: str


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
  """A worker's identity, totals, transport and placement (``Runtime.worker_infos()``,
  ``RunResult.workers``).

  Attributes:
    worker, pid, incarnation, start_updates, loss: its index, process, restarts by Ray, the
      global updates of the model it (re)started from, its last loss.
    iterations, compute_s, sleep_s, wait_s, busy_s: totals over its calls (seconds in its
      step, asleep as a straggler, blocked on other processes, in its iterations).
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
  """What a run measured; it follows ``al.Result``, which describes ``algorithm``, ``samples``,
  ``throughput``, ``iterations``, ``curve`` and ``final_params``, in wall-clock seconds.

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
