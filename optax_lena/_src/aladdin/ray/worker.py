"""A worker actor: its data, its program's state and its transport; runs its algorithm's
iterations (``Iteration``, resolved on the driver) in chunks scheduled by the driver."""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import ray

from optax_lena._src.aladdin.ray import channel
from optax_lena._src.aladdin.ray import cores as placement
from optax_lena._src.aladdin.ray.config import Config, Task
from optax_lena._src.aladdin.ray.layout import FlatLayout
from optax_lena._src.aladdin.ray.outbox import Outbox
from optax_lena._src.aladdin.ray.records import Stats, WorkerInfo
from optax_lena._src.aladdin.ray.seam import Iteration, Links, Local


@dataclasses.dataclass(frozen=True)
class WorkerSetup:
  """What every worker actor of a run is started with (its index aside).

  Attributes:
    task, config: the run's task and config.
    iteration: the algorithm's iteration class (resolved on the driver, so that an algorithm
      registered only there runs too).
    shards: the PS shard actors (empty: none).
    peers: what the iteration's ``start_peers`` returned (reducers, a mailbox, ...).
    nice: the worker's ``os.nice``.
    threads: XLA's intra-op threads (None: XLA's default).
    cores: cores of its own to pin the step to (0: none).
    run: the run's name, which the worker's shared-memory ring is named after.
  """

  task: Task
  config: Config
  iteration: type[Iteration]
  shards: Sequence[Any] = ()
  peers: Sequence[Any] = ()
  nice: int = 0
  threads: int | None = None
  cores: int = 0
  run: str = ""


class WorkerActor:
  """Worker ``index`` of a run (a Ray actor; plain class here), started from its
  :class:`WorkerSetup`."""

  def __init__(self, index: int, setup: WorkerSetup):
    task, config = setup.task, setup.config
    if 0 < config.worker_gpus < 1:
      # A device shared by fractions: JAX allocates on demand instead of 75% of it each. Set
      # before JAX starts its backend, in the first computation below.
      os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    ray_threads = placement.thread_ids()
    self.threads_limited = placement.limit_intra_op_threads(setup.threads)
    claim = placement.pin_step(setup.cores, ray_threads) if self.threads_limited else None
    self.cores = list(claim.cores) if claim else []
    if setup.nice:
      os.nice(setup.nice)
    self.index, self.config = index, config
    self.shards = list(setup.shards)
    self.layout = layout = FlatLayout(task.init_params, config.ps_shards)
    plan = config.plan
    self.outbox: Outbox | None = None
    params, self.start_updates = task.init_params, 0
    if self.shards:
      use_ring = config.shared_memory
      ring = self._open_ring(setup.run, plan.max_fold, plan.reply_slots) if use_ring else None
      self.outbox = Outbox(
        index,
        self.shards,
        layout,
        plan,
        max_inflight=config.max_inflight,
        min_fold=config.fold or plan.period,
        ring=ring,
      )
      # A worker (re)starts from the current global model: after a restart by Ray it resumes
      # the training where the cluster is, not from the initial parameters.
      replies = ray.get([s.params.remote() for s in self.shards])
      params = layout.to_tree(layout.join([p for p, _ in replies]))
      self.start_updates = min(n for _, n in replies)
    self.incarnation = int(bool(ray.get_runtime_context().was_current_actor_reconstructed))
    program = config.spec.program(task.loss_fn, config.num_workers)
    transport = setup.iteration.transport(Links(index, layout, self.outbox, list(setup.peers)))
    # Restarted incarnations draw another data order (the killed one's position is lost).
    batches = task.batches(index, config.seed * 1000 + 17 * self.incarnation)
    first = next(batches)  # kept for the first iteration
    self.local = Local(
      index,
      program,
      layout,
      program.init(jax.tree.map(jax.numpy.asarray, params)),
      itertools.chain([first], batches),
      transport,
      config.num_workers,
      slowdown=float(config.slowdown.get(index, 1.0)),
    )
    self.totals = Stats()
    self.algorithm = setup.iteration(self.local, config.spec)
    self.algorithm.warm_up(first)
    if claim is not None:
      placement.follow_the_step(claim, lambda: self.algorithm.warm_up(first))
    # The default fold follows the step's time: timed now, then over each chunk (a step timed
    # while the other actors start up is slower than in the run).
    self.adapt_fold = (
      self.outbox is not None and config.fold is None and plan.max_fold > plan.period
    )
    if self.adapt_fold:
      self._fold_for(self.algorithm.step_time(first))
    self.devices = [str(d) for d in jax.local_devices()]

  def _fold_for(self, step_seconds: float) -> None:
    """Sets the fold to whole periods of messages, as many as this worker computes in
    ``config.fold_seconds`` (1 period at least, the outbox's ``max_fold`` at most;
    ``docs/ALADDIN-ray.md`` says why)."""
    assert self.outbox is not None
    period, most = self.config.plan.period, self.config.plan.max_fold
    periods = int(self.config.fold_seconds // max(period * step_seconds, 1e-9))
    self.outbox.set_min_fold(period * max(1, min(periods, most // period)))

  def _open_ring(self, run: str, fold: int, replies: int) -> channel.Ring | None:
    """The worker's shared-memory ring where every shard runs on its node (else None)."""
    here = ray.get_runtime_context().get_node_id()
    if any(s.node_id != here for s in ray.get([s.stats.remote() for s in self.shards])):
      return None
    channel.sweep_stale()  # the rings of a killed run's workers on this node
    regions, size, dtype = self.config.max_inflight, self.layout.size, self.layout.dtype
    return channel.open_ring(run, self.index, regions, fold, replies, size, dtype)

  def run(
    self,
    deadline: float | None,
    max_seconds: float | None = None,
    max_iterations: int | None = None,
    sync: bool = False,
  ) -> Stats:
    """Runs iterations until ``deadline`` (``time.time()``), ``max_seconds`` or
    ``max_iterations``, whichever comes first; returns this chunk's :class:`Stats`. ``sync``:
    each iteration waits for every reply (the deterministic schedule)."""
    start = time.perf_counter()
    chunk = Stats()
    merges = self.local.merges
    while not (
      (deadline is not None and time.time() >= deadline)
      or (max_seconds is not None and time.perf_counter() - start >= max_seconds)
      or (max_iterations is not None and chunk.iterations >= max_iterations)
    ):
      chunk += self._counted(self.algorithm.iterate(sync, deadline))
    while (last := self.algorithm.finish()) is not None:  # a chunk leaves no step in flight
      chunk += self._counted(last)
    chunk.busy_s = time.perf_counter() - start
    chunk.merges = self.local.merges - merges
    self.totals += chunk
    if self.adapt_fold and not sync and chunk.iterations and chunk.compute_s > 0:
      self._fold_for(chunk.compute_s / chunk.iterations)
    return chunk

  def _counted(self, stats: Stats) -> Stats:
    self.local.iteration += stats.iterations
    return stats

  def flush(self) -> None:
    """Sends every folded message and merges every reply (the wait counts in the totals)."""
    self.totals.wait_s += self.algorithm.flush()

  def get_params(self) -> Any:
    """The local model x_i (NumPy; SGP: the de-biased model), pending replies merged."""
    return jax.tree.map(np.asarray, jax.device_get(self.algorithm.local_params()))

  def info(self) -> WorkerInfo:
    """Identity, running totals, transport and placement (a :class:`WorkerInfo`)."""
    context = ray.get_runtime_context()
    totals = self.totals
    return WorkerInfo(
      worker=self.index,
      pid=os.getpid(),
      incarnation=self.incarnation,
      start_updates=self.start_updates,
      loss=float(self.local.last_loss),
      iterations=totals.iterations,
      compute_s=totals.compute_s,
      sleep_s=totals.sleep_s,
      wait_s=totals.wait_s,
      busy_s=totals.busy_s,
      merges=self.local.merges,
      sent=list(self.outbox.sent) if self.outbox else [],
      calls=self.outbox.calls if self.outbox else 0,
      shared_memory=self.outbox is not None and self.outbox.ring is not None,
      fold=self.outbox.min_fold if self.outbox else 1,
      node_id=context.get_node_id(),
      devices=self.devices,
      accelerator_ids={k: list(v) for k, v in context.get_accelerator_ids().items()},
      cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
      nice=os.nice(0),
      threads_limited=self.threads_limited,
      cores=self.cores,
    )
