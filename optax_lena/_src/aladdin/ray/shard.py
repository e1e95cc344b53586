"""A parameter-server shard: the algorithm's server on one flat slice of the global model.

One receive entry for every algorithm (:meth:`ServerShard.receive`), which never raises; Orbax
checkpoints of the run-wide generations the driver asks for, each sealed by a digest
(``shard_checkpoints``), restored when the run resumes or Ray restarts the actor.
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
from optax_lena._src.aladdin.ray.layout import Rejected
from optax_lena._src.aladdin.ray.records import ShardCounts, ShardStats
from optax_lena._src.aladdin.server import folded_receive


def _own(tree: Any) -> Any:
  return jax.tree.map(lambda x: jnp.array(x, copy=True), tree)


def _restarted() -> bool:
  """Whether Ray restarted this actor (False outside Ray, e.g. in the in-process tests)."""
  import ray

  return ray.is_initialized() and bool(ray.get_runtime_context().was_current_actor_reconstructed)


class ServerShard:
  """Shard ``shard`` of the global model (a Ray actor; plain class here).

  Args:
    shard: its index; it holds slice ``shard`` of the flat model.
    params: its slice of the initial model (a fresh run's x~).
    config: the run's config.
    threads: XLA's intra-op threads (None: XLA's default).
    nice: its ``os.nice``.
    generation: the checkpoint generation to resume from (the driver's choice, ``agree``;
      None: a fresh run). A shard restarted by Ray resumes from its newest intact one instead.
  """

  def __init__(
    self,
    shard: int,
    params: np.ndarray,
    config: Config,
    threads: int | None = None,
    nice: int = 0,
    generation: int | None = None,
  ):
    self.threads_limited = limit_intra_op_threads(threads)
    if nice:
      os.nice(nice)
    self.shard, self.config = shard, config
    self.size, self.dtype = params.shape[-1], params.dtype
    self.counts = ShardCounts()
    self.num_checkpoints = 0
    self.restored_updates = self.restored_generation = -1
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
      self._open_checkpoints(generation)
    # Every block size (``Plan``) is compiled before the run's clock starts (result discarded).
    self.block = plan.block
    for k in plan.block_sizes():
      zeros = np.zeros((k, self.size), self.dtype)
      jax.block_until_ready(self._receive(_own(self.state), zeros, np.zeros(k, bool), np.int32(0)))

  def receive(self, worker: int, messages: Any, finite: Any) -> Any:
    """Applies ``k`` messages of ``worker`` in order: ``messages[k, slice]``, or a
    :class:`~optax_lena._src.aladdin.ray.channel.Rows` record of where they lie in the worker's
    ring; ``finite[k]``, the sender's verdict on each whole message.

    Returns:
      None, or ``(global slices[n], alphas[n])`` when ``n`` messages triggered a reply, in
      order (from a ring: ``(None, alphas[n])``, the slices written into its reply rows). A
      call it refuses (a malformed message, an unknown worker, a ring record naming anything
      but a ring of this run) is never applied, counts as one malformed message whatever it
      claims to hold, and is answered with a :class:`Rejected` record saying why: it never
      raises.
    """
    self.counts.calls += 1
    rows = messages if isinstance(messages, channel.Rows) else None
    try:
      if rows is not None:
        if not self.rings.valid(rows):
          return self._reject("a ring record that is not this shard's slice of this run's rings")
        messages = self.rings.read(rows)
      messages, finite, worker = self._checked(messages, finite, worker)
    except Exception as err:  # anything a sender can put in a call: a planted file, junk
      return self._reject(str(err))
    k = len(messages)
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
    if rows is not None:
      self.rings.write_replies(rows, params)
      return None, alphas
    return params, alphas

  def _checked(self, messages: Any, finite: Any, worker: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """The call's messages ``[k, size]``, verdicts ``[k]`` and sender, or ``ValueError`` saying
    what is wrong with them."""
    messages = np.asarray(messages)
    if messages.ndim == 1:
      messages = messages[None]
    finite = np.asarray(finite, bool).reshape(-1)
    if messages.ndim != 2 or messages.shape[1] != self.size or messages.dtype != self.dtype:
      raise ValueError(
        f"messages of shape {messages.shape} and dtype {messages.dtype}, not "
        f"[k, {self.size}] {self.dtype}"
      )
    k = messages.shape[0]
    if finite.shape != (k,) or not 1 <= k <= self.max_fold:
      raise ValueError(f"{k} messages with {finite.size} verdicts ({self.max_fold} at most)")
    if isinstance(worker, bool) or not isinstance(worker, int | np.integer):
      raise ValueError(f"a sender {worker!r} that is not a worker index")
    if not 0 <= worker < self.config.num_workers:
      raise ValueError(f"no worker {worker} in this run")
    return messages, finite, int(worker)

  def _reject(self, reason: str) -> Rejected:
    """Counts one malformed message, received and never applied."""
    self.counts.received += 1
    self.counts.rejected_malformed += 1
    return Rejected(reason)

  def _open_checkpoints(self, generation: int | None) -> None:
    import orbax.checkpoint as ocp

    checkpoint_dir = str(self.config.checkpoint_dir)  # made absolute by the Config
    if _restarted():  # its killed incarnation's unfinished save; then its newest intact one
      shard_checkpoints.sweep_unfinished(checkpoint_dir, self.shard)
      generation = None
    self._manager = shard_checkpoints.manager(checkpoint_dir, self.shard)
    target = {"state": self.state, "updates": np.asarray(0, np.int64)}
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    restored = shard_checkpoints.restore(
      self._manager, checkpoint_dir, self.shard, target, generation
    )
    if restored is not None:
      self.restored_generation, payload = restored
      self.state = _own(payload["state"])
      self.counts.global_updates = self.restored_updates = int(payload["updates"])

  def checkpoint(self, generation: int | None = None) -> int | None:
    """Saves the state as checkpoint ``generation`` (the driver's run-wide number; None: the
    next after its newest) and returns it; a generation it already holds, or older than its
    newest (a call retried on a restarted shard), is not saved again. None without a
    ``checkpoint_dir``."""
    if self._manager is None:
      return None
    newest = self._manager.latest_step()
    if generation is None:
      generation = (newest or 0) + 1
    if newest is not None and generation <= newest:
      return generation
    payload = {"state": self.state, "updates": np.asarray(self.counts.global_updates, np.int64)}
    shard_checkpoints.save(self._manager, generation, payload)
    self.num_checkpoints += 1
    return generation

  def updates(self) -> int:
    """The number of global updates so far (the driver's checkpoint clock reads it)."""
    return self.counts.global_updates

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
      restored_generation=self.restored_generation,
      restarted=bool(context.was_current_actor_reconstructed),
      node_id=context.get_node_id(),
    )
