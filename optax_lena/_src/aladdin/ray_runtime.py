"""ALADDIN and its baselines on Ray: parameter-server shards and workers as Ray actors.

Everything distributed goes through Ray (transport, scheduling, process management, restarts);
the JAX computations are the pure functions of :mod:`optax_lena.aladdin` (the server's
``receive``, the worker's ``local_step`` and ``worker_merge``), jitted inside the actors.

Processes:

* **PS shards** (``ServerShard``, one Ray actor per shard): each holds its slice of the global
  model (memory-wise sharding) and runs the algorithm's server on it: ALADDIN's Algorithm 2,
  ASP's apply-and-reply or EASGD's elastic exchange. A shard can checkpoint its state with Orbax
  every N global updates and restores it when Ray restarts it.
* **Reducers** (``Reducer``, AR-SGD only, one per shard): an asyncio actor that returns the mean
  of the n workers' gradient slices of one iteration once all of them have arrived (the barrier).
* **Workers** (``Worker``, one Ray actor per worker): loop over their own mini-batches in chunks
  of about ``chunk_seconds`` (the driver keeps one chunk queued ahead, so a worker never idles
  between chunks). ALADDIN workers push each gradient to every shard without waiting, poll the
  replies with ``ray.wait(..., timeout=0)`` and merge ``(x~, alpha)`` whenever one has arrived.
* **The driver** (:class:`Runtime`) creates the actors, schedules the chunks, evaluates the
  global model, draws the progress bar, detects a lost cluster and tears everything down (also on
  Ctrl-C).

Ray is imported only here (and by the example), never by the core package.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

PyTree = Any

ALGORITHMS = ("aladdin", "ar_sgd", "asp", "easgd")

# Ray's switch for "multi-node clusters allowed" doubles as the one that makes a local node
# advertise, and therefore bind, the loopback address instead of the machine's external IP.
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class ClusterLostError(RuntimeError):
  """The driver lost its Ray cluster (GCS unreachable, or no actor answers)."""


# ----------------------------------------------------------------------------------------------
# What to train and how
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Task:
  """What to train; shipped (cloudpickled) to every actor.

  Attributes:
    loss_fn: ``loss_fn(params, batch) -> scalar loss``.
    init_params: the initial model (a pytree of arrays).
    batches: ``batches(worker, seed) -> iterator`` of that worker's mini-batches, endless.
    local_tx: the workers' optimizer (ALADDIN's local self-update, EASGD's and AR-SGD's step).
    server_tx: the server's optimizer (ALADDIN's lazy global update, ASP's step).
    batch_size: samples per mini-batch (for throughput).
  """

  loss_fn: Callable[[PyTree, Any], Any]
  init_params: PyTree
  batches: Callable[[int, int], Iterator[Any]]
  local_tx: Any
  server_tx: Any
  batch_size: int


@dataclasses.dataclass(frozen=True)
class Config:
  """How to train.

  Attributes:
    algorithm: ``"aladdin"``, ``"ar_sgd"``, ``"asp"`` or ``"easgd"``.
    num_workers: n.
    period: ALADDIN's pi (the server replies once every ``period`` gradients of a worker).
    normalise: ALADDIN's normalisation of the accumulated gradient.
    alpha: ALADDIN's merge weight rule.
    ps_shards: number of PS shards (memory-wise sharding, one actor each).
    slowdown: ``{worker: factor}``; that worker sleeps ``(factor - 1)`` times its compute time
      every iteration, so that its iteration takes ``factor`` times longer.
    easgd_beta: EASGD's moving rate (None: 0.9 / n).
    easgd_tau: EASGD's communication period.
    checkpoint_dir: directory of the shards' Orbax checkpoints (None: no checkpoints). A run
      started on a directory that holds checkpoints resumes from them.
    checkpoint_every: a shard saves its state every this many global updates.
    max_inflight: unanswered pushes per worker and shard before the worker waits for the oldest
      (back-pressure, so that a slow server cannot make the queues grow without bound).
    chunk_seconds: wall time of one worker call scheduled by the driver.
    seed: seeds the workers' data order.
    worker_resources: Ray custom resources every worker actor requires (placement).
    server_resources: Ray custom resources every shard / reducer actor requires.
    deterministic: the driver runs one worker iteration at a time, round-robin, and each
      iteration waits for the shards' replies: the message order, hence the result, does not
      depend on timing (the multi-node test compares runs bit for bit).
    worker_nice: the workers lower their CPU priority by this much (``os.nice``), so that on a
      machine with fewer cores than processes the PS shards, which a real cluster gives cores of
      their own, are not starved by the workers.
  """

  algorithm: str = "aladdin"
  num_workers: int = 4
  period: int = 4
  normalise: str = "mean_of_locals"
  alpha: str | float = "count"
  ps_shards: int = 1
  slowdown: Mapping[int, float] = dataclasses.field(default_factory=dict)
  easgd_beta: float | None = None
  easgd_tau: int = 2
  checkpoint_dir: str | None = None
  checkpoint_every: int = 50
  max_inflight: int = 32
  chunk_seconds: float = 0.5
  seed: int = 0
  worker_resources: Mapping[str, float] | None = None
  server_resources: Mapping[str, float] | None = None
  deterministic: bool = False
  worker_nice: int = 0

  def __post_init__(self) -> None:
    if self.algorithm not in ALGORITHMS:
      raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}.")
    if self.num_workers < 1 or self.ps_shards < 1:
      raise ValueError("num_workers and ps_shards must be >= 1.")
    if self.checkpoint_every < 1:
      raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}.")
    for worker, factor in self.slowdown.items():
      if not 0 <= int(worker) < self.num_workers or not factor >= 1:
        raise ValueError(
          f"slowdown {worker}:{factor}: the worker must be in [0, {self.num_workers}) and the "
          "factor >= 1."
        )


# ----------------------------------------------------------------------------------------------
# Sharding (the memory-wise sharding of optax_lena.aladdin when it is available)
# ----------------------------------------------------------------------------------------------


class _Sharding:
  """``split(tree) -> [shard trees]`` and ``merge(shards) -> tree`` for ``num_shards`` shards."""

  def __init__(self, params: PyTree, num_shards: int):
    import jax

    self.num_shards = num_shards
    if num_shards == 1:
      self._spec = None
      return
    from optax_lena import aladdin as al

    # Memory-wise: shards of at most total / num_shards bytes (a larger leaf is cut across
    # shards); greedy packing may need one shard more than asked, which the runtime then uses.
    total = sum(np.asarray(x).nbytes for x in jax.tree.leaves(params))
    self._spec = al.shard_params(params, max_shard_bytes=math.ceil(total / num_shards))
    self.num_shards = self._spec.num_shards

  def split(self, tree: PyTree) -> list[PyTree]:
    return [tree] if self._spec is None else list(self._spec.split(tree))

  def merge(self, shards: Sequence[PyTree]) -> PyTree:
    return shards[0] if self._spec is None else self._spec.merge(list(shards))


def _to_numpy(tree: PyTree) -> PyTree:
  import jax

  return jax.tree.map(np.asarray, jax.device_get(tree))


# ----------------------------------------------------------------------------------------------
# Actors (plain classes; Runtime turns them into Ray actors)
# ----------------------------------------------------------------------------------------------


class ServerShard:
  """One PS shard: the algorithm's server on one slice of the model."""

  def __init__(
    self,
    shard: int,
    params: PyTree,
    server_tx: Any,
    config: Config,
  ):
    import jax
    import jax.numpy as jnp

    from optax_lena import aladdin as al
    from optax_lena._src.aladdin.server import all_finite

    self.shard, self.config = shard, config
    self.num_bad_tree = 0
    self.num_messages = 0
    self.num_since_checkpoint = 0
    self.num_checkpoints = 0
    self.restored_updates = -1
    self.updates = 0  # global updates of this shard (ALADDIN: replies; ASP/EASGD: messages)
    self.state: Any = None  # ServerState, ASPState or EASGDState
    algorithm = config.algorithm
    if algorithm == "aladdin":
      from optax_lena._src.aladdin.server import build_server

      aladdin_server, receive_accepting = build_server(
        config.num_workers,
        server_tx,
        period=config.period,
        normalise=config.normalise,
        alpha=config.alpha,
      )
      self.state = aladdin_server.init(params)

      def receive(state, grads, worker, finite):
        # the sender's verdict on its whole gradient and this shard's check of its own slice
        return receive_accepting(state, grads, worker, jnp.logical_and(finite, all_finite(grads)))

      self._receive = jax.jit(receive)
    elif algorithm == "asp":
      asp = al.asp_server(server_tx)
      self.state = asp.init(params)
      self._receive = jax.jit(asp.receive)
    elif algorithm == "easgd":
      easgd = al.easgd_server(config.num_workers, beta=config.easgd_beta, tau=config.easgd_tau)
      self.state = easgd.init(params)
      self._exchange = jax.jit(easgd.exchange)
    else:
      raise ValueError(f"ServerShard does not serve {algorithm!r}.")
    self._treedef: Any = jax.tree.structure(params)
    self._warm_up(params)
    self._manager: Any = None
    if config.checkpoint_dir is not None:
      self._open_checkpoints()

  def _warm_up(self, params: PyTree) -> None:
    """Compiles the server's function once (result discarded), before the run's clock starts."""
    import jax
    import jax.numpy as jnp

    zeros = jax.tree.map(np.zeros_like, params)
    if self.config.algorithm == "aladdin":
      out = self._receive(self.state, zeros, np.int32(0), np.bool_(False))
    elif self.config.algorithm == "asp":
      out = self._receive(self.state, zeros)
    else:
      out = self._exchange(self.state, params, jnp.int32(0))
    jax.block_until_ready(out)

  # -- checkpoints --------------------------------------------------------------------------

  def _open_checkpoints(self) -> None:
    import jax
    import orbax.checkpoint as ocp

    path = os.path.join(os.path.abspath(str(self.config.checkpoint_dir)), f"shard_{self.shard}")
    options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=False)
    self._manager = ocp.CheckpointManager(path, options=options)
    step = self._manager.latest_step()
    if step is not None:
      target = {"state": self.state, "updates": np.asarray(0, np.int64)}
      target = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
      payload = self._manager.restore(step, args=ocp.args.StandardRestore(target))
      self.state, self.updates = payload["state"], int(payload["updates"])
      self.restored_updates = self.updates

  def _num_updates(self) -> int:
    return self.updates

  def checkpoint(self) -> int:
    """Saves the state now (also called by the driver on a clean stop); returns its step."""
    import orbax.checkpoint as ocp

    if self._manager is None:
      return -1
    if self._manager.latest_step() != self.updates:
      payload = {"state": self.state, "updates": np.asarray(self.updates, np.int64)}
      self._manager.save(self.updates, args=ocp.args.StandardSave(payload))
      self._manager.wait_until_finished()
      self.num_checkpoints += 1
    self.num_since_checkpoint = 0
    return self.updates

  def _after_update(self) -> None:
    self.updates += 1
    self.num_since_checkpoint += 1
    if self._manager is not None and self.num_since_checkpoint >= self.config.checkpoint_every:
      self.checkpoint()

  # -- messages -----------------------------------------------------------------------------

  def _reject(self, why: Any) -> None:
    self.num_bad_tree += 1
    self.last_rejection = str(why)[:300]

  def _well_formed(self, tree: PyTree) -> bool:
    import jax

    return bool(jax.tree.structure(tree) == self._treedef)

  def push(self, worker: int, grads: PyTree, finite: bool = True) -> Any:
    """ALADDIN: receive one gradient slice; ``(params, alpha)`` when it triggered, else None.

    ``finite`` is the sender's verdict on its whole gradient, so that a NaN in one shard's slice
    makes every shard reject the message and their counters stay equal; this shard checks its
    own slice as well. A message of the wrong tree, shapes or dtypes is rejected and counted
    (``num_bad_tree``), never applied.
    """
    self.num_messages += 1
    if not self._well_formed(grads):
      self._reject("wrong tree structure")
      return None
    try:
      self.state, reply = self._receive(self.state, grads, np.int32(worker), np.bool_(finite))
    except (ValueError, TypeError, IndexError) as err:
      self._reject(err)  # shapes, dtypes or worker index the server refuses
      return None
    if not bool(reply.ready):
      return None
    self._after_update()
    return _to_numpy(reply.params), float(reply.alpha)

  def push_asp(self, worker: int, grads: PyTree) -> PyTree | None:
    """ASP: apply the gradient now and return the new global slice (None if rejected)."""
    del worker
    self.num_messages += 1
    if not self._well_formed(grads):
      self._reject("wrong tree structure")
      return None
    try:
      self.state, params = self._receive(self.state, grads)
    except (ValueError, TypeError) as err:
      self._reject(err)
      return None
    self._after_update()
    return _to_numpy(params)

  def exchange(self, worker: int, local: PyTree) -> PyTree | None:
    """EASGD: the elastic exchange; returns the worker's new local slice (None if rejected)."""
    import jax.numpy as jnp

    self.num_messages += 1
    if not self._well_formed(local):
      self._reject("wrong tree structure")
      return None
    try:
      self.state, new_local = self._exchange(self.state, local, jnp.int32(worker))
    except (ValueError, TypeError, IndexError) as err:
      self._reject(err)
      return None
    self._after_update()
    return _to_numpy(new_local)

  # -- inspection ---------------------------------------------------------------------------

  def params(self) -> tuple[PyTree, int]:
    """The global slice x~ and the number of global updates so far."""
    params = self.state.params if hasattr(self.state, "params") else self.state
    return _to_numpy(params), self._num_updates()

  def stats(self) -> dict[str, Any]:
    """Counters: messages, updates, rejections, checkpoints, restarts, node.

    ``rejected_by_server`` is the server state's count (non-finite gradient or unknown worker);
    ``rejected_bad_tree`` counts messages of the wrong tree, shapes or dtypes, refused before
    they reach the server's function.
    """
    import ray

    return {
      "shard": self.shard,
      "pid": os.getpid(),
      "messages": self.num_messages,
      "global_updates": self._num_updates(),
      "rejected_by_server": int(getattr(self.state, "num_rejected", 0)),
      "rejected_bad_tree": self.num_bad_tree,
      "last_rejection": getattr(self, "last_rejection", ""),
      "checkpoints": self.num_checkpoints,
      "restored_updates": self.restored_updates,
      "restarted": bool(ray.get_runtime_context().was_current_actor_reconstructed),
      "node_id": ray.get_runtime_context().get_node_id(),
    }


class Reducer:
  """AR-SGD's barrier on one shard: the mean of the n workers' gradient slices of an iteration."""

  def __init__(self, num_workers: int):
    self.num_workers = num_workers
    self.rounds: dict[int, dict[str, Any]] = {}

  async def reduce(self, step: int, worker: int, grads: PyTree) -> PyTree:
    """Waits until the n workers sent their slices for ``step``; returns their mean.

    The sum runs in worker-index order, so the result does not depend on arrival order.
    """
    from optax_lena import aladdin as al

    entry = self.rounds.setdefault(step, {"grads": {}, "event": asyncio.Event(), "served": 0})
    entry["grads"][int(worker)] = grads
    if len(entry["grads"]) == self.num_workers:
      ordered = [entry["grads"][i] for i in range(self.num_workers)]
      entry["mean"] = _to_numpy(al.ar_sgd_mean(ordered))
      entry["event"].set()
    else:
      await entry["event"].wait()
    entry["served"] += 1
    mean = entry["mean"]
    if entry["served"] == self.num_workers:
      del self.rounds[step]
    return mean


class Worker:
  """One worker: its data, local model and optimizer state; runs the algorithm's iterations."""

  def __init__(
    self,
    index: int,
    task: Task,
    config: Config,
    shards: Sequence[Any],
    reducers: Sequence[Any],
  ):
    import jax
    import optax
    import ray

    from optax_lena import aladdin as al
    from optax_lena._src.aladdin.server import all_finite

    self.index, self.task, self.config = index, task, config
    self.shards, self.reducers = list(shards), list(reducers)
    self.sharding = _Sharding(task.init_params, config.ps_shards)
    self.incarnation = int(bool(ray.get_runtime_context().was_current_actor_reconstructed))
    self.slowdown = float(config.slowdown.get(index, 1.0))
    if config.worker_nice:
      os.nice(config.worker_nice)
    # A worker (re)starts from the current global model: after a restart by Ray it resumes the
    # training where the cluster is, not from the initial parameters.
    self.start_updates = 0
    if config.algorithm == "ar_sgd":
      params = task.init_params
    else:
      params, self.start_updates = self._fetch_global()
    self.params = jax.tree.map(jax.numpy.asarray, params)
    self.opt_state = task.local_tx.init(self.params)
    self.local_step = jax.jit(al.local_step(task.loss_fn, task.local_tx))
    self.grad_fn = jax.jit(jax.value_and_grad(task.loss_fn))

    def apply(params, opt_state, grads):
      updates, opt_state = task.local_tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state

    self.apply = jax.jit(apply)
    self.merge = jax.jit(al.worker_merge)
    self.all_finite = jax.jit(all_finite)
    # Restarted incarnations draw another data order (the killed one's position is lost).
    self.batches = task.batches(index, config.seed * 1000 + 17 * self.incarnation)
    self._warm_up()
    self.pending: list[tuple[int, Any]] = []  # (shard, reply ref), oldest first
    self.iteration = 0
    self.corrupt: str | None = None
    self.totals = {"iterations": 0, "merges": 0, "wait_s": 0.0, "compute_s": 0.0, "busy_s": 0.0}

  def _warm_up(self) -> None:
    """Compiles this algorithm's functions on the first batch (kept for the first iteration),
    so that the run's clock starts with compiled workers."""
    import itertools

    import jax

    batch = next(self.batches)
    self.batches = itertools.chain([batch], self.batches)
    if self.config.algorithm in ("aladdin", "easgd"):
      jax.block_until_ready(self.local_step(self.params, self.opt_state, batch))
    else:
      _, grads = self.grad_fn(self.params, batch)
      jax.block_until_ready(self.apply(self.params, self.opt_state, grads))
    if self.config.algorithm == "aladdin":
      for part in self.sharding.split(self.params):
        jax.block_until_ready(self.merge(part, part, np.float32(0.0)))

  def _fetch_global(self) -> tuple[PyTree, int]:
    import ray

    replies = ray.get([s.params.remote() for s in self.shards])
    return self.sharding.merge([p for p, _ in replies]), min(n for _, n in replies)

  # -- helpers --------------------------------------------------------------------------------

  def set_corrupt(self, mode: str | None) -> None:
    """Test hook: send NaN (``"nan"``), Inf (``"inf"``) or a wrong tree (``"tree"``) gradients."""
    self.corrupt = mode

  def _corrupted(self, grads: PyTree) -> PyTree:
    import jax

    if self.corrupt == "nan":
      return jax.tree.map(lambda g: g * np.nan, grads)
    if self.corrupt == "inf":
      return jax.tree.map(lambda g: g + np.inf, grads)
    if self.corrupt == "tree":
      return {"not": jax.tree.leaves(grads)[0]}
    return grads

  def _sleep_for(self, compute_s: float) -> float:
    if self.slowdown <= 1.0:
      return 0.0
    pause = (self.slowdown - 1.0) * compute_s
    time.sleep(pause)
    return pause

  def _merge_reply(self, shard: int, reply: Any) -> None:
    global_slice, alpha = reply
    parts = self.sharding.split(self.params)
    parts[shard] = self.merge(parts[shard], global_slice, np.float32(alpha))
    self.params = self.sharding.merge(parts)
    self.totals["merges"] += 1

  def _drain(self, block_oldest: bool) -> float:
    """Merges every reply that has arrived (oldest first); returns the seconds spent waiting.

    Never blocks unless ``block_oldest`` (back-pressure): ``ray.wait(timeout=0)`` only polls.
    """
    import ray

    waited = 0.0
    if not self.pending:
      return waited
    if block_oldest:
      t0 = time.perf_counter()
      ray.wait([self.pending[0][1]], num_returns=1, timeout=None)
      waited = time.perf_counter() - t0
    refs = [ref for _, ref in self.pending]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)
    ready_set = set(ready)
    keep = []
    for shard, ref in self.pending:
      if ref in ready_set:
        reply = ray.get(ref)
        if reply is not None:
          self._merge_reply(shard, reply)
      else:
        keep.append((shard, ref))
    self.pending = keep
    return waited

  # -- one iteration per algorithm ------------------------------------------------------------

  def _iterate(self, sync: bool) -> dict[str, float]:
    """One iteration; returns its compute / sleep / wait seconds."""
    import jax
    import ray

    algorithm = self.config.algorithm
    batch = next(self.batches)
    t0 = time.perf_counter()
    wait = 0.0
    if algorithm in ("aladdin", "easgd"):
      self.params, self.opt_state, grads, loss = self.local_step(self.params, self.opt_state, batch)
    else:  # asp and ar_sgd send the gradient at the current model and step on the answer
      loss, grads = self.grad_fn(self.params, batch)
    jax.block_until_ready(grads)
    compute = time.perf_counter() - t0
    sleep = self._sleep_for(compute)

    if algorithm == "aladdin":
      grads = _to_numpy(self._corrupted(grads))
      if self.corrupt == "tree":
        finite, parts = True, [grads] * len(self.shards)
      else:
        finite, parts = bool(self.all_finite(grads)), self.sharding.split(grads)
      for k, shard in enumerate(self.shards):
        self.pending.append((k, shard.push.remote(self.index, parts[k], finite)))
      wait += self._drain(block_oldest=False)
      while len(self.pending) > self.config.max_inflight * len(self.shards):
        wait += self._drain(block_oldest=True)
      if sync:  # deterministic schedule: every reply is merged before the next message
        while self.pending:
          wait += self._drain(block_oldest=True)
    elif algorithm == "asp":
      parts = self.sharding.split(_to_numpy(self._corrupted(grads)))
      t1 = time.perf_counter()
      replies = ray.get(
        [s.push_asp.remote(self.index, p) for s, p in zip(self.shards, parts, strict=True)]
      )
      wait += time.perf_counter() - t1
      if all(r is not None for r in replies):
        self.params = jax.tree.map(jax.numpy.asarray, self.sharding.merge(replies))
        self.totals["merges"] += 1
    elif algorithm == "ar_sgd":
      parts = self.sharding.split(_to_numpy(grads))
      t1 = time.perf_counter()
      refs = [
        r.reduce.remote(self.iteration, self.index, p)
        for r, p in zip(self.reducers, parts, strict=True)
      ]
      mean = self.sharding.merge(ray.get(refs))
      wait += time.perf_counter() - t1
      self.params, self.opt_state = self.apply(self.params, self.opt_state, mean)
    elif algorithm == "easgd" and (self.iteration + 1) % self.config.easgd_tau == 0:
      parts = self.sharding.split(_to_numpy(self.params))
      t1 = time.perf_counter()
      refs = [s.exchange.remote(self.index, p) for s, p in zip(self.shards, parts, strict=True)]
      replies = ray.get(refs)
      wait += time.perf_counter() - t1
      if all(r is not None for r in replies):
        self.params = jax.tree.map(jax.numpy.asarray, self.sharding.merge(replies))
        self.totals["merges"] += 1
    self.iteration += 1
    self.last_loss = float(loss)
    return {"compute_s": compute, "sleep_s": sleep, "wait_s": wait}

  def run(
    self,
    deadline: float | None,
    max_seconds: float | None = None,
    max_iterations: int | None = None,
  ) -> dict[str, Any]:
    """Runs iterations until ``deadline`` (``time.time()``), ``max_seconds`` or
    ``max_iterations``, whichever comes first; returns this chunk's statistics."""
    start = time.perf_counter()
    stats = {"iterations": 0, "compute_s": 0.0, "sleep_s": 0.0, "wait_s": 0.0}
    merges0 = self.totals["merges"]
    while True:
      if deadline is not None and time.time() >= deadline:
        break
      if max_seconds is not None and time.perf_counter() - start >= max_seconds:
        break
      if max_iterations is not None and stats["iterations"] >= max_iterations:
        break
      for key, value in self._iterate(sync=False).items():
        stats[key] += value
      stats["iterations"] += 1
    stats["busy_s"] = time.perf_counter() - start
    stats["merges"] = self.totals["merges"] - merges0
    stats.update(self._identity())
    for key in ("iterations", "wait_s", "compute_s", "busy_s"):
      self.totals[key] += stats[key]
    return stats

  def step_sync(self) -> dict[str, Any]:
    """One iteration that waits for the shards' replies (deterministic schedule)."""
    stats = self._iterate(sync=True)
    stats["iterations"] = 1
    stats.update(self._identity())
    return stats

  def flush(self) -> int:
    """Waits for every pending reply and merges it; returns how many were pending."""
    n = len(self.pending)
    while self.pending:
      self._drain(block_oldest=True)
    return n

  def _identity(self) -> dict[str, Any]:
    return {
      "worker": self.index,
      "pid": os.getpid(),
      "incarnation": self.incarnation,
      "start_updates": self.start_updates,
      "loss": getattr(self, "last_loss", float("nan")),
    }

  def get_params(self) -> PyTree:
    """The local model x_i (numpy)."""
    return _to_numpy(self.params)

  def info(self) -> dict[str, Any]:
    """Identity (pid, node, incarnation, global updates at start) and running totals."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    return {**self._identity(), **self.totals, "node_id": node}


# ----------------------------------------------------------------------------------------------
# Connecting to Ray
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _loopback_node():
  """Makes a new local Ray node advertise, and so bind, 127.0.0.1 (Ray 2.x).

  ``ray.init(_node_ip_address="127.0.0.1")`` alone is not enough: Ray replaces a loopback node
  address by the machine's external IP (so that other nodes could reach it) and its gRPC servers
  then listen on every interface. Ray keeps loopback only where "clusters" are disabled, which
  is decided by the environment variable below (read at import time, hence the module patch).
  The processes the node starts inherit the variable; it is restored afterwards, so a later
  ``ray.init(address=...)`` in the same process joins a remote cluster normally.
  """
  import ray._private.ray_constants as ray_constants

  old_env = os.environ.get(_LOOPBACK_ENV)
  old_const = ray_constants.ENABLE_RAY_CLUSTER
  os.environ[_LOOPBACK_ENV] = "0"
  ray_constants.ENABLE_RAY_CLUSTER = False
  try:
    yield
  finally:
    ray_constants.ENABLE_RAY_CLUSTER = old_const
    if old_env is None:
      os.environ.pop(_LOOPBACK_ENV, None)
    else:
      os.environ[_LOOPBACK_ENV] = old_env


def connect(
  address: str | None = None,
  *,
  num_cpus: int | None = None,
  resources: Mapping[str, float] | None = None,
  temp_dir: str | None = None,
  log_to_driver: bool = False,
) -> bool:
  """Starts a secure local Ray cluster, or joins ``address``; returns True if it started one.

  A local cluster binds every Ray service to 127.0.0.1 and starts no dashboard (hence no job
  submission API, which runs arbitrary code for anyone who reaches it). Ray's token
  authentication (on by default for local clusters since Ray 2.5x) stays on. To join a remote
  cluster pass its ``address`` (``"host:port"``); its TLS (``RAY_USE_TLS`` and the certificate
  variables) and token authentication (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN`` or the token
  file) are configured with Ray's own environment variables, see docs/ALADDIN-ray.md.

  Args:
    address: an existing cluster's address, or None to start a local one.
    num_cpus: CPUs the local node advertises (the actors themselves request none).
    resources: custom resources of the local node.
    temp_dir: Ray's session directory root (an absolute path; None: Ray's default).
    log_to_driver: forward the actors' stdout/stderr to the driver.

  Returns:
    True when this call started the cluster (the caller shuts it down), False when Ray was
    already initialised or ``address`` was joined.

  Raises:
    ClusterLostError: ``address`` cannot be reached.
  """
  import ray

  if ray.is_initialized():
    return False
  if address is not None:
    # Ray retries an unreachable GCS for minutes; a TCP probe of "host:port" fails in seconds.
    host, _, port = address.rpartition(":")
    if host and port.isdigit() and "://" not in address:
      try:
        with socket.create_connection((host, int(port)), timeout=5.0):
          pass
      except OSError as err:
        raise ClusterLostError(
          f"Could not join the Ray cluster at {address!r}: {err}. Check the address (the head "
          "node's GCS, port 6379 by default) and that the cluster is up."
        ) from err
    try:
      ray.init(address=address, log_to_driver=log_to_driver, include_dashboard=False)
    except (ConnectionError, TimeoutError, RuntimeError) as err:
      raise ClusterLostError(
        f"Could not join the Ray cluster at {address!r}: {err}. Check the address, that the "
        "cluster is up, and its TLS / token settings (RAY_USE_TLS, RAY_AUTH_MODE)."
      ) from err
    return False
  kwargs: dict[str, Any] = {}
  if temp_dir is not None:
    kwargs["_temp_dir"] = os.path.abspath(temp_dir)
  with _loopback_node():
    ray.init(
      num_cpus=num_cpus,
      resources=dict(resources) if resources else None,
      include_dashboard=False,
      log_to_driver=log_to_driver,
      configure_logging=True,
      logging_level=logging.WARNING,
      _node_ip_address="127.0.0.1",
      **kwargs,
    )
  return True


def _gcs_reachable(timeout: float = 2.0) -> bool:
  """Whether the cluster's GCS accepts a TCP connection (cheap; never hangs)."""
  import ray

  try:
    host, port = ray.get_runtime_context().gcs_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout):
      return True
  except (OSError, ValueError, AttributeError):
    return False


# ----------------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class RunResult:
  """What a run measured.

  Attributes:
    algorithm: the algorithm.
    wall_s: seconds from the first scheduled chunk to the last result.
    samples: samples processed by all workers.
    throughput: samples per second over the run.
    iterations: per worker.
    wait_fraction: per worker, time blocked on other processes / time in its iterations.
    merges: per worker, replies merged (ALADDIN), models replaced (ASP) or exchanges (EASGD).
    curve: ``(seconds, metric)`` evaluations of the global model during the run.
    shards: each shard's counters at the end.
    workers: each worker's identity and totals at the end.
    final_params: the global model at the end.
  """

  algorithm: str
  wall_s: float
  samples: int
  throughput: float
  iterations: list[int]
  wait_fraction: list[float]
  merges: list[int]
  curve: list[tuple[float, float]]
  shards: list[dict[str, Any]]
  workers: list[dict[str, Any]]
  final_params: PyTree


class Runtime:
  """Creates the PS shards and workers on Ray, runs the training, tears everything down.

  Use as a context manager (or call :meth:`shutdown`): actors are killed and, when this runtime
  started the local cluster, the cluster is shut down, also on Ctrl-C or an error.
  """

  def __init__(
    self,
    task: Task,
    config: Config,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    resources: Mapping[str, float] | None = None,
    temp_dir: str | None = None,
    stall_timeout: float = 30.0,
  ):
    import ray

    self.task, self.config = task, config
    self.stall_timeout = stall_timeout
    self.owns_cluster = connect(address, num_cpus=num_cpus, resources=resources, temp_dir=temp_dir)
    # Every process derives the same ShardSpec from (init_params, config.ps_shards); the number
    # of shards actually used is self.sharding.num_shards.
    self.sharding = _Sharding(task.init_params, config.ps_shards)
    params = _to_numpy(task.init_params)
    slices = self.sharding.split(params)
    # Actors request no CPU: a small machine runs more actors than it has cores, and placement
    # is done with custom resources (server_resources / worker_resources) instead.
    server_opts: dict[str, Any] = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": -1}
    if config.server_resources:
      server_opts["resources"] = dict(config.server_resources)
    worker_opts: dict[str, Any] = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": -1}
    if config.worker_resources:
      worker_opts["resources"] = dict(config.worker_resources)
    self.shards: list[Any] = []
    self.reducers: list[Any] = []
    try:
      if config.algorithm == "ar_sgd":
        reducer_cls = ray.remote(Reducer).options(
          **{**server_opts, "max_restarts": 0, "max_task_retries": 0}, max_concurrency=1000
        )
        self.reducers = [reducer_cls.remote(config.num_workers) for _ in slices]
      else:
        shard_cls = ray.remote(ServerShard).options(**server_opts)
        self.shards = [shard_cls.remote(k, s, task.server_tx, config) for k, s in enumerate(slices)]
      worker_cls = ray.remote(Worker).options(**worker_opts)
      self.workers: list[Any] = [
        worker_cls.remote(i, task, config, self.shards, self.reducers)
        for i in range(config.num_workers)
      ]
      # Constructors (imports, restores, first fetch of the global model) finish here, so that
      # the clock of the run starts with every actor ready.
      ray.get([w.info.remote() for w in self.workers])
    except BaseException:
      self.shutdown()
      raise

  # -- context manager ----------------------------------------------------------------------

  def __enter__(self) -> Runtime:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.shutdown()

  def shutdown(self, checkpoint: bool = True) -> None:
    """Saves the shards (when checkpointing), kills every actor, stops an owned cluster."""
    import ray

    if not ray.is_initialized():
      return
    if checkpoint and self.config.checkpoint_dir is not None and getattr(self, "shards", None):
      with contextlib.suppress(Exception):
        ray.get([s.checkpoint.remote() for s in self.shards], timeout=30)
    for actor in [*getattr(self, "workers", []), *self.shards, *self.reducers]:
      with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)
    self.workers, self.shards, self.reducers = [], [], []
    if self.owns_cluster:
      ray.shutdown()

  # -- model access -------------------------------------------------------------------------

  def global_params(self, timeout: float | None = 60) -> PyTree:
    """The global model: the shards' x~ (ALADDIN, ASP, EASGD) or worker 0's model (AR-SGD)."""
    import ray

    if self.config.algorithm == "ar_sgd":
      return ray.get(self.workers[0].get_params.remote(), timeout=timeout)
    replies = ray.get([s.params.remote() for s in self.shards], timeout=timeout)
    return self.sharding.merge([p for p, _ in replies])

  def shard_stats(self, timeout: float | None = 60) -> list[dict[str, Any]]:
    """Each shard's counters."""
    import ray

    return ray.get([s.stats.remote() for s in self.shards], timeout=timeout)

  # -- running ------------------------------------------------------------------------------

  def _check_cluster(self, since_progress: float) -> None:
    if since_progress < self.stall_timeout:
      return
    reason = "its GCS does not accept connections" if not _gcs_reachable() else "no answer"
    if self.config.checkpoint_dir:
      resume = (
        f"The shards' last checkpoints are under {self.config.checkpoint_dir!r}: restart the "
        "cluster and run again with the same checkpoint_dir to resume."
      )
    else:
      resume = "Nothing was checkpointed (checkpoint_dir=None): the run cannot be resumed."
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
    on_chunk: Callable[[Runtime, dict[str, Any]], None] | None = None,
  ) -> RunResult:
    """Trains for ``time_budget`` seconds (or ``iterations`` per worker, deterministic mode).

    Args:
      time_budget: wall seconds of training (asynchronous modes).
      iterations: iterations per worker (deterministic mode; also caps AR-SGD).
      eval_fn: ``eval_fn(global_params) -> metric``, run on the driver every ``eval_every``
        seconds and at the end (the curve of the result).
      eval_every: seconds between evaluations.
      progress: draw a progress bar (tqdm if installed, else a line every few seconds).
      on_chunk: called with every chunk's statistics (tests use it to inject faults).

    Returns:
      A :class:`RunResult`.

    Raises:
      ClusterLostError: the cluster stopped answering for ``stall_timeout`` seconds.
    """
    import ray

    if self.config.deterministic:
      return self._run_deterministic(iterations or 1, eval_fn)
    if time_budget is None:
      raise ValueError("time_budget (seconds) is required outside the deterministic mode.")
    n = self.config.num_workers
    totals: list[dict[str, Any]] = [
      {"iterations": 0, "wait_s": 0.0, "busy_s": 0.0, "merges": 0} for _ in range(n)
    ]
    curve: list[tuple[float, float]] = []
    bar = _Progress(time_budget, enabled=progress)
    previous_sigterm = _raise_on_sigterm()
    start = time.time()
    deadline = start + time_budget
    chunk = self.config.chunk_seconds
    synchronous = self.config.algorithm == "ar_sgd"
    # AR-SGD runs in rounds: every worker gets the same number of iterations per call (a barrier
    # cannot end on a clock), the size adapted so that a round lasts about chunk_seconds.
    round_iterations = 1
    round_left: dict[int, int] = {}  # round -> results still missing
    inflight: dict[Any, tuple[int, int]] = {}  # ref -> (worker, round)

    def submit_round(r: int) -> None:
      round_left[r] = n
      for i, w in enumerate(self.workers):
        inflight[w.run.remote(None, max_iterations=round_iterations)] = (i, r)

    last_progress = time.time()
    next_eval = start
    try:
      for r in range(2):  # one chunk running, one queued behind it
        if synchronous:
          submit_round(r)
        else:
          for i, w in enumerate(self.workers):
            inflight[w.run.remote(deadline, max_seconds=chunk)] = (i, r)
      next_round = 2
      while inflight:
        ready, _ = ray.wait(list(inflight), num_returns=1, timeout=1.0)
        now = time.time()
        if eval_fn is not None and next_eval <= now < deadline:
          curve.append((now - start, float(eval_fn(self.global_params()))))
          next_eval = time.time() + eval_every
        if not ready:
          self._check_cluster(now - last_progress)
          continue
        last_progress = now
        for ref in ready:
          i, r = inflight.pop(ref)
          try:
            stats = ray.get(ref)
          except ray.exceptions.RayActorError as err:
            raise ClusterLostError(f"Worker {i} died and could not be restarted: {err}") from err
          for key in totals[i]:
            totals[i][key] += stats[key]
          if on_chunk is not None:
            on_chunk(self, stats)
          bar.update(min(now - start, time_budget), sum(t["iterations"] for t in totals))
          if now >= deadline:
            continue
          if not synchronous:
            inflight[self.workers[i].run.remote(deadline, max_seconds=chunk)] = (i, r + 2)
            continue
          round_left[r] -= 1
          if round_left[r] == 0:
            per_iteration = stats["busy_s"] / max(stats["iterations"], 1)
            round_iterations = max(1, min(1000, int(chunk / max(per_iteration, 1e-4))))
            submit_round(next_round)
            next_round += 1
      wall = time.time() - start
      if self.config.algorithm == "aladdin":
        ray.get([w.flush.remote() for w in self.workers], timeout=self.stall_timeout)
      final = self.global_params(timeout=self.stall_timeout)
      if eval_fn is not None:
        curve.append((wall, float(eval_fn(final))))
      shards = self.shard_stats(timeout=self.stall_timeout) if self.shards else []
      workers = ray.get([w.info.remote() for w in self.workers], timeout=self.stall_timeout)
    except ray.exceptions.RaySystemError as err:
      raise ClusterLostError(f"Lost the Ray cluster: {err}") from err
    finally:
      bar.close()
      signal.signal(signal.SIGTERM, previous_sigterm)
    samples = sum(t["iterations"] for t in totals) * self.task.batch_size
    return RunResult(
      algorithm=self.config.algorithm,
      wall_s=wall,
      samples=samples,
      throughput=samples / wall,
      iterations=[t["iterations"] for t in totals],
      wait_fraction=[t["wait_s"] / max(t["busy_s"], 1e-9) for t in totals],
      merges=[t["merges"] for t in totals],
      curve=curve,
      shards=shards,
      workers=workers,
      final_params=final,
    )

  def _run_deterministic(
    self, iterations: int, eval_fn: Callable[[PyTree], float] | None
  ) -> RunResult:
    """Round-robin: worker 0, 1, ..., n-1, each one iteration that waits for its replies."""
    import ray

    n = self.config.num_workers
    start = time.time()
    waits = [0.0] * n
    for _ in range(iterations):
      if self.config.algorithm == "ar_sgd":  # a barrier: all n take part in every iteration
        for i, stats in enumerate(ray.get([w.step_sync.remote() for w in self.workers])):
          waits[i] += stats["wait_s"]
        continue
      for i, w in enumerate(self.workers):
        waits[i] += ray.get(w.step_sync.remote())["wait_s"]
    wall = time.time() - start
    final = self.global_params()
    curve = [(wall, float(eval_fn(final)))] if eval_fn is not None else []
    workers: list[dict[str, Any]] = ray.get([w.info.remote() for w in self.workers])
    samples = n * iterations * self.task.batch_size
    return RunResult(
      algorithm=self.config.algorithm,
      wall_s=wall,
      samples=samples,
      throughput=samples / wall,
      iterations=[iterations] * n,
      wait_fraction=[w / wall for w in waits],
      merges=[w["merges"] for w in workers],
      curve=curve,
      shards=self.shard_stats() if self.shards else [],
      workers=workers,
      final_params=final,
    )


def _raise_on_sigterm() -> Any:
  """SIGTERM raises KeyboardInterrupt in the driver, so the same clean shutdown runs."""

  def handler(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")

  try:
    return signal.signal(signal.SIGTERM, handler)
  except ValueError:  # not the main thread
    return signal.getsignal(signal.SIGTERM)


class _Progress:
  """tqdm over the time budget when available, else a plain line every 5 seconds."""

  def __init__(self, total: float, enabled: bool):
    self.enabled, self.total = enabled, total
    self._bar = None
    self._last = 0.0
    if not enabled:
      return
    try:
      from tqdm.auto import tqdm

      self._bar = tqdm(total=round(total, 1), unit="s", desc="training", leave=False)
    except ImportError:
      self._bar = None

  def update(self, elapsed: float, iterations: int) -> None:
    if not self.enabled:
      return
    if self._bar is not None:
      self._bar.n = round(elapsed, 1)
      self._bar.set_postfix(iterations=iterations, refresh=False)
      self._bar.refresh()
    elif elapsed - self._last >= 5.0:
      self._last = elapsed
      print(f"  {elapsed:6.1f} / {self.total:.0f} s, {iterations} iterations", file=sys.stderr)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
