"""A parameter-server shard: the algorithm's server on one flat slice of the global model.

One receive entry for every algorithm (:meth:`ServerShard.receive`); Orbax checkpoints every
``checkpoint_every`` global updates, each sealed by a digest (``shard_checkpoints``), restored
when Ray restarts the actor.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from optax_lena._src.aladdin.ray import channel, shard_checkpoints
from optax_lena._src.aladdin.ray.config import Config
from optax_lena._src.aladdin.ray.cores import limit_intra_op_threads
from optax_lena._src.aladdin.ray.records import ShardCounts, ShardStats
from optax_lena._src.aladdin.server import folded_receive


def _own(tree: Any) -> Any:
  return jax.tree.map(lambda x: jnp.array(x, copy=True), tree)


class ServerShard:
  """Shard ``shard`` of the global model (a Ray actor; plain class here)."""

  def __init__(
    self, shard: int, params: np.ndarray, config: Config, threads: int | None = None, nice: int = 0
  ):
    self.threads_limited = limit_intra_op_threads(threads)
    if nice:
      os.nice(nice)
    self.shard, self.config = shard, config
    self.size, self.dtype = params.shape[-1], params.dtype
    self.counts = ShardCounts()
    self.since_checkpoint = self.num_checkpoints = 0
    self.restored_updates = -1
    server = config.spec.server(config.num_workers)
    plan = config.plan
    self.max_fold = plan.max_fold
    # Own buffers for every leaf (an init may share one zero between two counters), which the
    # donation below requires.
    self.state: Any = _own(server.init(jax.numpy.asarray(params)))
    # The state is donated: XLA updates the shard's buffers in place, message after message.
    receive = folded_receive(server, plan.period, recheck=config.recheck_messages)
    self._receive = jax.jit(receive, donate_argnums=0)
    self.rings = channel.Mapped(self.size, self.dtype, self.max_fold)
    self._manager: Any = None
    if config.checkpoint_dir is not None:
      self._open_checkpoints()
    # Every block size (``Plan``) is compiled before the run's clock starts (result discarded).
    self.block = plan.block
    for k in plan.block_sizes():
      zeros = np.zeros((k, self.size), self.dtype)
      jax.block_until_ready(self._receive(_own(self.state), zeros, np.zeros(k, bool), np.int32(0)))

  def receive(self, worker: int, messages: Any, finite: np.ndarray) -> Any:
    """Applies ``k`` messages of ``worker`` in order: ``messages[k, slice]``, or a
    :class:`~optax_lena._src.aladdin.ray.channel.Rows` record of where they lie in the worker's
    ring; ``finite[k]``, the sender's verdict on each whole message.

    Returns:
      None, or ``(global slices[n], alphas[n])`` when ``n`` messages triggered a reply, in
      order (from a ring: ``(None, alphas[n])``, the slices written into its reply rows). A
      malformed message, or one from an unknown worker, is counted and never applied.
    """
    self.counts.calls += 1
    rows = messages if isinstance(messages, channel.Rows) else None
    if rows is not None and not self.rings.valid(rows):
      return self._reject(rows.count if isinstance(rows.count, int) and rows.count > 0 else 1)
    if rows is not None:
      try:
        messages = self.rings.read(rows)
      except channel.RingError:  # a planted file: refused like a malformed message
        return self._reject(rows.count)
    messages = np.asarray(messages)
    if messages.ndim == 1:
      messages = messages[None]
    finite = np.asarray(finite, bool).reshape(-1)
    k = messages.shape[0]
    if (
      messages.ndim != 2
      or messages.shape[1] != self.size
      or messages.dtype != self.dtype
      or finite.shape != (k,)
      or not 1 <= k <= self.max_fold
      or not 0 <= int(worker) < self.config.num_workers
    ):
      return self._reject(k)
    self.counts.received += k
    # The ring's rows are read (and the fold applied) before the reply, which frees them.
    blocks: list[tuple[np.ndarray, np.ndarray]] = []
    for a in range(0, k, self.block):
      block = slice(a, a + self.block)
      self.state, n, alphas, params = self._receive(
        self.state, messages[block], finite[block], np.int32(worker)
      )
      n = int(n)
      if n:  # sliced on the host: slicing the device arrays would dispatch more computations
        blocks.append((np.asarray(params)[:n], np.asarray(alphas)[:n]))
    if not blocks:
      return None
    # Copies, the reply's own (the device buffers are reused by the next call).
    params, alphas = (np.concatenate(part) for part in zip(*blocks, strict=True))
    n = len(alphas)
    self.counts.global_updates += n
    self.since_checkpoint += n
    if self._manager is not None and self.since_checkpoint >= self.config.checkpoint_every:
      self.checkpoint()
    if rows is not None:
      self.rings.write_replies(rows, params)
      return None, alphas
    return params, alphas

  def _reject(self, count: int) -> None:
    """Counts ``count`` malformed messages, received and never applied."""
    self.counts.received += count
    self.counts.rejected_malformed += count

  def _open_checkpoints(self) -> None:
    import orbax.checkpoint as ocp

    checkpoint_dir = str(self.config.checkpoint_dir)  # made absolute by the Config
    path = shard_checkpoints.shard_dir(checkpoint_dir, self.shard)
    options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=False)
    self._manager = ocp.CheckpointManager(path, options=options)
    target = {"state": self.state, "updates": np.asarray(0, np.int64)}
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    payload = shard_checkpoints.restore(self._manager, checkpoint_dir, self.shard, target)
    if payload is not None:
      self.state = _own(payload["state"])
      self.counts.global_updates = self.restored_updates = int(payload["updates"])

  def checkpoint(self) -> None:
    """Saves the state now (also called by the driver on a clean stop)."""
    if self._manager is None:
      return
    updates = self.counts.global_updates
    if self._manager.latest_step() != updates:
      payload = {"state": self.state, "updates": np.asarray(updates, np.int64)}
      shard_checkpoints.save(self._manager, updates, payload)
      self.num_checkpoints += 1
    self.since_checkpoint = 0

  def params(self) -> tuple[np.ndarray, int]:
    """The global slice x~ and the number of global updates so far."""
    return np.array(self.state.params), self.counts.global_updates

  def stats(self) -> ShardStats:
    """Its counters (:class:`~optax_lena._src.aladdin.ray.records.ShardStats`)."""
    import ray

    context = ray.get_runtime_context()
    return ShardStats(
      shard=self.shard,
      pid=os.getpid(),
      nice=os.nice(0),
      threads_limited=self.threads_limited,
      **dataclasses.asdict(self.counts),
      rejected_by_server=int(getattr(self.state, "num_rejected", 0)),
      checkpoints=self.num_checkpoints,
      restored_updates=self.restored_updates,
      restarted=bool(context.was_current_actor_reconstructed),
      node_id=context.get_node_id(),
    )
