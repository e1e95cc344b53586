"""The driver: :class:`Runtime` starts the actors and waits until they are ready, runs the
algorithm's schedule, evaluates and checkpoints, and stops or kills everything (also on
Ctrl-C/SIGTERM). What it does for an algorithm goes through the seam (``Iteration`` and
``Driver``): nothing here depends on which algorithm runs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import ray

from optax_lena._src.aladdin import algorithms
from optax_lena._src.aladdin.ray import bootstrap, channel, schedulers, shard_checkpoints
from optax_lena._src.aladdin.ray.cluster import RuntimeCluster
from optax_lena._src.aladdin.ray.config import Config, Task
from optax_lena._src.aladdin.ray.errors import ClusterLostError
from optax_lena._src.aladdin.ray.layout import FlatLayout
from optax_lena._src.aladdin.ray.progress import Progress
from optax_lena._src.aladdin.ray.records import RunResult, ShardStats, Stats, WorkerInfo
from optax_lena._src.aladdin.ray.signals import StopSignals
from optax_lena._src.aladdin.ray.stall import StallClock
from optax_lena._src.aladdin.ray.worker import WorkerActor, WorkerSetup

PyTree = Any


class Runtime:
  """Runs an algorithm on Ray, from the start of its actors to their end.

  It starts the PS shards (or the algorithm's other peers) and the workers on Ray, runs the
  training, and tears everything down.

  The entry point of the Ray runtime. Use it as a context manager (or call :meth:`shutdown`):
  actors are killed and, when this runtime started the local cluster, the cluster is shut
  down, also on Ctrl-C, SIGTERM or an error, at any moment from the constructor on. A signal
  ends in :class:`Interrupted` once everything is down.

  Args:
    task: what to train (:class:`Task`).
    config: how (:class:`Config`, validated when made).
    address: an existing cluster's address (``"host:port"``); None starts a private local
      node (:func:`connect`).
    num_cpus: CPUs the local node advertises (None: the machine's).
    num_gpus: GPUs the local node advertises (None: the ones Ray detects).
    resources: custom resources of the local node (placement, ``Config.worker_resources``).
    temp_dir: the local node's session directory root (None: Ray's default).
    stall_timeout: seconds without any worker result, not counting the time Ray spends
      restarting one of the run's actors, before the cluster counts as lost.
    restart_timeout: the longest that restarts pause the stall clock at a stretch (an actor
      that Ray cannot bring back is a stall).

  Raises:
    TypeError: ``task`` or ``config`` is not a :class:`Task` / :class:`Config`.
    ValueError: the model cannot be cut into ``config.ps_shards`` slices.
    ValueError: ``config.checkpoint_dir`` cannot be made or written (naming the path).
    CheckpointError: ``config.checkpoint_dir`` holds checkpoints and one shard has no intact
      generation left (naming the directory to delete).
    ClusterLostError: the cluster at ``address`` cannot be joined, or the actors never start.
    Interrupted: SIGINT or SIGTERM while starting (everything started is shut down).

  References:
    Ko, Choi, Jei, Lee, Kim, "ALADDIN: Asymmetric Centralized Training for Distributed Deep
    Learning", CIKM 2021 (DOI 10.1145/3459637.3482412): Algorithms 1 (the workers) and 2 (the
    PS shards), Section 3.3 (memory-wise sharding).

  Examples:
    A least-squares model trained by ALADDIN with two workers and one PS shard for one second
    (it starts a local Ray node: seconds to minutes on a loaded machine).

    >>> import numpy as np
    >>> from optax_lena import aladdin as al
    >>> from optax_lena.aladdin import distributed as ad
    >>> def loss_fn(params, batch):
    ...   x, y = batch
    ...   return ((x @ params["w"] - y) ** 2).mean()
    >>> def batches(worker, seed):
    ...   rng = np.random.default_rng([seed, worker])
    ...   while True:
    ...     x = rng.normal(size=(16, 4)).astype(np.float32)
    ...     yield x, x.sum(axis=1)
    >>> task = ad.Task(loss_fn, {"w": np.zeros(4, np.float32)}, batches, batch_size=16)
    >>> config = ad.Config(al.algorithm("aladdin", worker_tx=al.local_optimizer(0.05)),
    ...                    num_workers=2)
    >>> with ad.Runtime(task, config, num_cpus=2) as runtime:  # doctest: +SKIP
    ...   result = runtime.run(time_budget=1.0, progress=False)
    >>> result.throughput > 0  # doctest: +SKIP
    True

    The run needs a Ray node, hence ``+SKIP`` here; ``tests/aladdin/ray/test_runtime.py`` runs
    this example on its cluster.
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
    restart_timeout: float = 600.0,
  ):
    if not isinstance(task, Task) or not isinstance(config, Config):
      raise TypeError("Runtime(task, config) takes an ad.Task and an ad.Config.")
    self.task, self.config, self.stall_timeout = task, config, stall_timeout
    self.restart_timeout = restart_timeout
    self.iteration = algorithms.entry(config.spec.name).engine("ray")
    self.layout = FlatLayout(task.init_params, config.ps_shards)  # errors before Ray starts
    self.cluster: RuntimeCluster | None = None
    self.owns_cluster = False
    self.run_name = channel.run_name()  # the workers' shared-memory rings are named after it
    self.rings_removed: dict[str, list[str]] = {}  # by other nodes' ids, at shutdown
    channel.sweep_stale()  # a killed earlier run's, on this node (its workers sweep theirs)
    resume = None
    if config.checkpoint_dir is not None:  # before any actor: a usable directory, a generation
      shard_checkpoints.prepare(config.checkpoint_dir, config.ps_shards)
      resume = shard_checkpoints.agree(config.checkpoint_dir, config.ps_shards)
    self.checkpoints: shard_checkpoints.CheckpointClock | None = None
    self._closed = False
    self.signals = StopSignals()
    try:
      with self.signals.deferred():  # a half-started node cannot be cleaned up
        self.owns_cluster = bootstrap.connect(
          address, num_cpus=num_cpus, num_gpus=num_gpus, resources=resources, temp_dir=temp_dir
        )
      self.signals.check()
      threads = bootstrap.intra_op_threads(config, config.num_workers + config.ps_shards)
      cores = bootstrap.step_cores(config, threads)
      # Lower where the workers pin their step (``docs/ALADDIN-ray.md``, "Cores", says why).
      shard_nice = 10 if cores else 0
      self.cluster = RuntimeCluster(
        config, self.layout, task.init_params, self._get, threads, shard_nice, resume
      )
      self.cluster.set_peers(self.iteration.start_peers(self.cluster))
      if config.checkpoint_dir is not None and self.shards:
        self.checkpoints = shard_checkpoints.CheckpointClock(
          self.shards, config.checkpoint_every, max(resume or [0])
        )
      actors = config.num_workers + len(self.cluster.started)
      setup = WorkerSetup(
        task=task,
        config=config,
        iteration=self.iteration,
        shards=self.cluster.shards,
        peers=self.peers,
        nice=bootstrap.worker_nice(config, actors),
        threads=threads,
        cores=cores,
        run=self.run_name,
      )
      worker_cls = ray.remote(WorkerActor).options(**bootstrap.actor_options(config, "worker"))
      self.cluster.set_workers([worker_cls.remote(i, setup) for i in range(config.num_workers)])
      # Constructors (imports, restores, compilation, first fetch of the global model) finish
      # here, so that the clock of a run starts with every actor ready.
      self._get([w.info.remote() for w in self.workers], timeout=None)
    except BaseException:
      self.shutdown(checkpoint=False)
      raise

  @property
  def workers(self) -> list[Any]:
    """The worker actors, in index order."""
    return self.cluster.workers if self.cluster else []

  @property
  def shards(self) -> list[Any]:
    """The PS shard actors (empty for an algorithm without a server)."""
    return self.cluster.shards if self.cluster else []

  @property
  def peers(self) -> list[Any]:
    """What the algorithm's ``Iteration.start_peers`` returned (AR-SGD's reducers, SGP's
    mailbox; empty for a PS algorithm)."""
    return self.cluster.peers if self.cluster else []

  def _actors(self) -> list[Any]:
    """Every actor of the run (killed at shutdown; watched by the stall clock)."""
    return [*self.workers, *self.cluster.started, *self.peers] if self.cluster else []

  def _stall_clock(self) -> StallClock:
    return StallClock(self._actors, bootstrap.gcs_reachable, self.restart_timeout)

  def _get(self, refs: Any, timeout: float | None) -> Any:
    """``ray.get`` that a signal cannot be lost in (polled once a second); past ``timeout``
    seconds, or stalled (:meth:`_check`), the cluster counts as lost."""
    start, clock = time.time(), self._stall_clock()
    pending = list(refs) if isinstance(refs, list) else [refs]
    while True:
      ready, _ = ray.wait(pending, num_returns=len(pending), timeout=1.0)
      if len(ready) == len(pending):
        self.signals.check()
        return ray.get(refs)
      if timeout is not None and time.time() - start > timeout:
        raise ClusterLostError(f"No answer from the cluster within {timeout:.0f} s.")
      self._check(clock, progressed=False)

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
        if checkpoint and self.checkpoints is not None:
          with contextlib.suppress(Exception):
            self.checkpoints.final(timeout=60)
        for actor in self._actors():
          with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        if self.workers:
          with contextlib.suppress(Exception):
            self.rings_removed = bootstrap.remove_rings_on_other_nodes(self.run_name)
      if ray.is_initialized() and self.owns_cluster:
        bootstrap.disconnect()
      channel.remove_rings(self.run_name)  # this node's
      self.cluster = None
      self.owns_cluster = False
      self._closed = True
    self.signals.restore()
    self.signals.check()

  def global_params(self, timeout: float | None = 60) -> PyTree:
    """The global model: the shards' x~ (ALADDIN, ASP, EASGD), worker 0's model (AR-SGD) or
    the average of the workers' de-biased models (SGP)."""
    if self.cluster is None:
      raise RuntimeError("The runtime is shut down: read the global model before shutdown().")
    return self.iteration.global_params(self.cluster, timeout)

  def shard_stats(self, timeout: float | None = 60) -> list[ShardStats]:
    """Each shard's counters."""
    return self._get([s.stats.remote() for s in self.shards], timeout) if self.shards else []

  def worker_infos(self, timeout: float | None = 60) -> list[WorkerInfo]:
    """Each worker's identity, totals, messages sent and devices."""
    return self._get([w.info.remote() for w in self.workers], timeout)

  def _check(self, clock: StallClock, progressed: bool) -> None:
    """Acts on a signal; raises :class:`ClusterLostError` when ``clock`` has run for
    ``stall_timeout`` seconds without progress (restarts of the run's actors not counted)."""
    self.signals.check()
    if progressed:
      clock.progress()
      return
    stalled = clock.stalled_for()
    if stalled < self.stall_timeout:
      return
    if not bootstrap.gcs_reachable():
      reason = "its GCS does not accept connections"
    elif clock.restarting_for() >= self.restart_timeout:
      reason = f"Ray has been restarting its actors for {clock.restarting_for():.0f} s"
    else:
      reason = "no answer"
    resume = (
      f"The shards' last checkpoints are under {self.config.checkpoint_dir!r}: restart the "
      "cluster and run again with the same checkpoint_dir to resume."
      if self.config.checkpoint_dir
      else "Nothing was checkpointed (checkpoint_dir=None): the run cannot be resumed."
    )
    raise ClusterLostError(
      f"Lost the Ray cluster: {reason}, and no worker reported progress for "
      f"{stalled:.0f} s. {resume}"
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
      together = self.iteration.scheduler.barrier
      schedule: schedulers.Schedule = schedulers.Lockstep(self.workers, iterations, together)
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
      schedule = self.iteration.scheduler(self.workers, deadline, config.chunk_seconds)
    next_eval = [start]
    done = [0]  # iterations of all workers so far
    curve_iterations: list[int] = []

    def tick(now: float) -> None:
      if self.checkpoints is not None:
        self.checkpoints.tick()
      if eval_fn is not None and not config.deterministic and next_eval[0] <= now < deadline:
        curve.append((now - start, float(eval_fn(self.global_params()))))
        curve_iterations.append(done[0])
        next_eval[0] = time.time() + eval_every

    def on_result(now: float, totals: list[Stats]) -> None:
      iterations_done = done[0] = sum(t.iterations for t in totals)
      bar.update(iterations_done / n if config.deterministic else now - start, iterations_done)

    clock = self._stall_clock()
    check = lambda progressed: self._check(clock, progressed)
    try:
      totals = schedulers.drive(schedule, check=check, on_result=on_result, tick=tick)
      wall = time.time() - start
      # No timeouts of their own: the stall clock bounds them, paused while an actor restarts.
      self._get([w.flush.remote() for w in self.workers], None)
      final = self.global_params(timeout=None)
      if eval_fn is not None:
        curve.append((wall, float(eval_fn(final))))
        curve_iterations.append(done[0])
      shards = self.shard_stats(timeout=None)
      workers = self.worker_infos(timeout=None)
    except ray.exceptions.RaySystemError as err:
      raise ClusterLostError(f"Lost the Ray cluster: {err}") from err
    finally:
      bar.close()
    busy = [max(t.busy_s, 1e-9) for t in totals]
    its = [t.iterations for t in totals]
    samples = sum(its) * self.task.batch_size
    return RunResult(
      algorithm=config.spec.name,
      wall_s=wall,
      samples=samples,
      throughput=samples / wall,
      iterations=its,
      wait_fraction=[t.wait_s / b for t, b in zip(totals, busy, strict=True)],
      compute_fraction=[t.compute_s / b for t, b in zip(totals, busy, strict=True)],
      merges=[w.merges for w in workers],  # the final flush's merges included
      curve=curve,
      curve_iterations=curve_iterations,
      shards=shards,
      workers=workers,
      final_params=final,
    )
