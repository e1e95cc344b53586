"""The driver: :class:`Runtime` starts the actors and waits until they are ready, runs a
schedule, evaluates and checkpoints, and stops or kills everything (also on Ctrl-C/SIGTERM)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import ray

from optax_lena._src.aladdin import algorithms
from optax_lena._src.aladdin.ray import bootstrap, channel, schedulers, shard_checkpoints
from optax_lena._src.aladdin.ray.config import (
  ClusterLostError,
  Config,
  RunResult,
  ShardStats,
  Task,
  WorkerInfo,
)
from optax_lena._src.aladdin.ray.layout import FlatLayout
from optax_lena._src.aladdin.ray.progress import Progress
from optax_lena._src.aladdin.ray.shard import ServerShard
from optax_lena._src.aladdin.ray.signals import StopSignals
from optax_lena._src.aladdin.ray.worker import WorkerActor

PyTree = Any


class Runtime:
  """Creates the PS shards and workers on Ray, runs the training, tears everything down.

  Use as a context manager (or call :meth:`shutdown`): actors are killed and, when this runtime
  started the local cluster, the cluster is shut down, also on Ctrl-C, SIGTERM or an error, at
  any moment from the constructor on. A signal ends in :class:`Interrupted` once everything
  is down.

  Args:
    task: what to train.
    config: how.
    address, num_cpus, num_gpus, resources, temp_dir: the cluster to join or the local node to
      start (:func:`~optax_lena._src.aladdin.ray.bootstrap.connect`).
    stall_timeout: seconds without any worker result before the cluster counts as lost.
  """

  def __init__(
    self,
    task: Task,
    config: Config,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    resources: Mapping[str, float] | None = None,
    temp_dir: str | None = None,
    stall_timeout: float = 30.0,
  ):
    if not isinstance(task, Task) or not isinstance(config, Config):
      raise TypeError("Runtime(task, config) takes an ad.Task and an ad.Config.")
    self.task, self.config, self.stall_timeout = task, config, stall_timeout
    self.iteration = algorithms.entry(config.spec.name).engine("ray")
    self.layout = FlatLayout(task.init_params, config.ps_shards)  # errors before Ray starts
    self.workers: list[Any] = []
    self.shards: list[Any] = []
    self.peers: list[Any] = []
    self.owns_cluster = False
    self.run_name = channel.run_name()  # the workers' shared-memory rings are named after it
    self.rings_removed: dict[str, list[str]] = {}  # by other nodes' ids, at shutdown
    channel.sweep_stale()  # a killed earlier run's, on this node (its workers sweep theirs)
    if config.checkpoint_dir is not None:  # before any actor: one step for every shard
      shard_checkpoints.agree(config.checkpoint_dir, config.ps_shards)
    self._closed = False
    self.signals = StopSignals()
    try:
      with self.signals.deferred():  # a half-started node cannot be cleaned up
        self.owns_cluster = bootstrap.connect(
          address, num_cpus=num_cpus, num_gpus=num_gpus, resources=resources, temp_dir=temp_dir
        )
      self.signals.check()
      self.threads = bootstrap.intra_op_threads(config, config.num_workers + config.ps_shards)
      self.cores = bootstrap.step_cores(config, self.threads)
      self.iteration.start_peers(self, ray)
      nice = bootstrap.worker_nice(config, config.num_workers + len(self.shards) + len(self.peers))
      worker_cls = ray.remote(WorkerActor).options(**bootstrap.actor_options(config, "worker"))
      args = (task, config, self.shards, self.peers, nice, self.threads, self.cores, self.run_name)
      self.workers = [worker_cls.remote(i, *args) for i in range(config.num_workers)]
      # Constructors (imports, restores, compilation, first fetch of the global model) finish
      # here, so that the clock of a run starts with every actor ready.
      self._get([w.info.remote() for w in self.workers], timeout=None)
    except BaseException:
      self.shutdown(checkpoint=False)
      raise

  def _start_shards(self, ray: Any) -> None:
    """The PS shards, one per slice of the model (``Iteration.start_peers``)."""
    shard_cls = ray.remote(ServerShard).options(**bootstrap.actor_options(self.config, "server"))
    params = self.layout.to_vector(self.task.init_params)
    # Lower where the workers pin their step (``docs/ALADDIN-ray.md``, "Cores", says why).
    nice = 10 if self.cores else 0
    self.shards = [
      shard_cls.remote(k, part, self.config, self.threads, nice)
      for k, part in enumerate(self.layout.split(params))
    ]

  def _start_meeting(self, ray: Any, cls: type, *args: Any) -> Any:
    """A barrier or a mailbox (``Iteration.start_peers``): it keeps its waiting callers, so it
    is never restarted mid-round."""
    options = bootstrap.actor_options(self.config, "server")
    options |= {"max_restarts": 0, "max_task_retries": 0, "max_concurrency": 1000}
    return ray.remote(cls).options(**options).remote(*args)

  def _get(self, refs: Any, timeout: float | None) -> Any:
    """``ray.get`` that a signal cannot be lost in (polled once a second)."""
    start = time.time()
    pending = list(refs) if isinstance(refs, list) else [refs]
    while True:
      ready, _ = ray.wait(pending, num_returns=len(pending), timeout=1.0)
      self.signals.check()
      if len(ready) == len(pending):
        return ray.get(refs)
      waited = time.time() - start
      if timeout is not None and waited > timeout:
        raise ClusterLostError(f"No answer from the cluster within {timeout:.0f} s.")
      if waited > self.stall_timeout and not bootstrap.gcs_reachable():
        raise ClusterLostError("Lost the Ray cluster: its GCS does not accept connections.")

  def __enter__(self) -> Runtime:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.shutdown()

  def shutdown(self, checkpoint: bool = True) -> None:
    """Saves the shards (when checkpointing), kills every actor, stops an owned cluster; a
    signal received meanwhile is acted on afterwards (:class:`Interrupted`)."""
    if self._closed:
      return
    with self.signals.deferred():
      # A lost cluster is not asked anything: Ray's calls to a dead GCS (``ray.nodes``,
      # ``ray.kill``) retry for a minute, then Ray's C++ ends the process.
      if ray.is_initialized() and bootstrap.gcs_reachable():
        if checkpoint and self.config.checkpoint_dir is not None and self.shards:
          with contextlib.suppress(Exception):
            ray.get([s.checkpoint.remote() for s in self.shards], timeout=30)
        for actor in [*self.workers, *self.shards, *self.peers]:
          with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        if self.workers:
          with contextlib.suppress(Exception):
            self.rings_removed = bootstrap.remove_rings_on_other_nodes(self.run_name)
      if ray.is_initialized() and self.owns_cluster:
        ray.shutdown()
      channel.remove_rings(self.run_name)  # this node's
      self.workers, self.shards, self.peers = [], [], []
      self.owns_cluster = False
      self._closed = True
    self.signals.restore()
    self.signals.check()

  def global_params(self, timeout: float | None = 60) -> PyTree:
    """The global model: the shards' x~ (ALADDIN, ASP, EASGD), worker 0's model (AR-SGD) or
    the average of the workers' de-biased models (SGP)."""
    return self.iteration.global_params(self, timeout)

  def shard_stats(self, timeout: float | None = 60) -> list[ShardStats]:
    """Each shard's counters."""
    return self._get([s.stats.remote() for s in self.shards], timeout) if self.shards else []

  def worker_infos(self, timeout: float | None = 60) -> list[WorkerInfo]:
    """Each worker's identity, totals, messages sent and devices."""
    return self._get([w.info.remote() for w in self.workers], timeout)

  def _check(self, since_progress: float) -> None:
    self.signals.check()
    if since_progress < self.stall_timeout:
      return
    reason = "its GCS does not accept connections" if not bootstrap.gcs_reachable() else "no answer"
    resume = (
      f"The shards' last checkpoints are under {self.config.checkpoint_dir!r}: restart the "
      "cluster and run again with the same checkpoint_dir to resume."
      if self.config.checkpoint_dir
      else "Nothing was checkpointed (checkpoint_dir=None): the run cannot be resumed."
    )
    raise ClusterLostError(
      f"Lost the Ray cluster: {reason}, and no worker reported progress for "
      f"{since_progress:.0f} s. {resume}"
    )

  def run(
    self,
    time_budget: float | None = None,
    *,
    iterations: int | None = None,
    eval_fn: Callable[[PyTree], float] | None = None,
    eval_every: float = 2.0,
    progress: bool = True,
  ) -> RunResult:
    """Trains for ``time_budget`` seconds (or ``iterations`` per worker, deterministic mode).

    Args:
      time_budget: wall seconds of training (asynchronous modes).
      iterations: iterations per worker (deterministic mode).
      eval_fn: ``eval_fn(global_params) -> metric``, run on the driver every ``eval_every``
        seconds and at the end (the curve of the result).
      eval_every: seconds between evaluations.
      progress: a progress bar on a terminal; elsewhere a line every 15 s.

    Raises:
      ClusterLostError: the cluster stopped answering for ``stall_timeout`` seconds.
      Interrupted: SIGINT or SIGTERM (the runtime is then shut down).
    """
    config, n = self.config, self.config.num_workers
    if config.deterministic:
      if iterations is None or iterations < 1:
        raise ValueError("The deterministic mode needs iterations >= 1 (per worker).")
      schedule: Any = schedulers.Lockstep(self.workers, iterations, self.config.spec.synchronous)
      total, unit = float(iterations), "rounds"
    else:
      if time_budget is None or not time_budget > 0:
        raise ValueError("time_budget (seconds > 0) is required outside the deterministic mode.")
      total, unit = float(time_budget), "s"
    curve: list[tuple[float, float]] = []
    bar = Progress(total, enabled=progress, unit=unit)
    start = time.time()
    deadline = start + (time_budget or 0.0)
    if not config.deterministic:
      kind = schedulers.Rounds if self.config.spec.synchronous else schedulers.AsyncChunks
      schedule = kind(self.workers, deadline, config.chunk_seconds)
    next_eval = [start]
    done = [0]  # iterations of all workers so far
    curve_iterations: list[int] = []

    def tick(now: float) -> None:
      if eval_fn is not None and not config.deterministic and next_eval[0] <= now < deadline:
        curve.append((now - start, float(eval_fn(self.global_params()))))
        curve_iterations.append(done[0])
        next_eval[0] = time.time() + eval_every

    def on_result(now: float, totals: list[dict[str, Any]]) -> None:
      iterations_done = done[0] = sum(t.get("iterations", 0) for t in totals)
      bar.update(iterations_done / n if config.deterministic else now - start, iterations_done)

    try:
      totals = schedulers.drive(schedule, check=self._check, on_result=on_result, tick=tick)
      wall = time.time() - start
      self._get([w.flush.remote() for w in self.workers], self.stall_timeout)
      final = self.global_params(timeout=self.stall_timeout)
      if eval_fn is not None:
        curve.append((wall, float(eval_fn(final))))
        curve_iterations.append(done[0])
      shards = self.shard_stats(timeout=self.stall_timeout)
      workers = self.worker_infos(timeout=self.stall_timeout)
    except ray.exceptions.RaySystemError as err:
      raise ClusterLostError(f"Lost the Ray cluster: {err}") from err
    finally:
      bar.close()
    busy = [max(t.get("busy_s", 0.0), 1e-9) for t in totals]
    its = [int(t.get("iterations", 0)) for t in totals]
    samples = sum(its) * self.task.batch_size
    return RunResult(
      algorithm=config.spec.name,
      wall_s=wall,
      samples=samples,
      throughput=samples / wall,
      iterations=its,
      wait_fraction=[t.get("wait_s", 0.0) / b for t, b in zip(totals, busy, strict=True)],
      compute_fraction=[t.get("compute_s", 0.0) / b for t, b in zip(totals, busy, strict=True)],
      merges=[w.merges for w in workers],  # the final flush's merges included
      curve=curve,
      curve_iterations=curve_iterations,
      shards=shards,
      workers=workers,
      final_params=final,
    )
