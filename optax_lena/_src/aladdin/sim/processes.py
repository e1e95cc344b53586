"""The message pattern of every algorithm in the simulator: one process per algorithm (or per
spec class: :class:`ExchangeProcess` runs every ``Symmetric`` spec), attached to the algorithm
registry by :func:`simulates`. A process decides who waits for what and when; it calls the
compute object for every computation (the spec's worker program and server), which in the
timing-only mode does nothing. ``docs/ALADDIN.md`` (section 5) tabulates the patterns.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

from optax_lena._src.aladdin import algorithms
from optax_lena._src.aladdin.sim.engine import Process, SimWorker

_attach_process = algorithms.attacher("simulator")


def simulates(*targets: str | type[algorithms.Spec]) -> Callable[[type[Process]], type[Process]]:
  """A class decorator: the decorated :class:`Process` is the simulator's pattern of ``targets``.

  A new algorithm whose workers exchange like ASP and EASGD needs no process (a registered
  ``al.Symmetric`` subclass runs on the simulator's exchange process); a new message pattern
  subclasses :class:`Process` and is attached with this decorator.

  Args:
    *targets: registered algorithm names, or spec classes (then every registered subclass
      without a process of its own runs this one).

  Returns:
    The decorator, which returns the class unchanged.

  Raises:
    ValueError: when decorating, a name is not registered or already has a simulator process.
  """
  return _attach_process(*targets)


@dataclasses.dataclass(eq=False)
class AladdinWorker(SimWorker):
  inbox: list[Any] = dataclasses.field(default_factory=list)  # replies not merged yet
  leaving: list[float] = dataclasses.field(default_factory=list)  # when queued messages leave
  # By PS shard: messages since the last reply (the PS's c_i, tracked here to time the global
  # updates without reading the device) and replies (for ``reply_every``).
  ps_counts: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
  reply_counts: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)


@simulates("aladdin")
class AladdinProcess(Process):
  """Workers push and never wait; the PS replies every ``period`` messages of a worker."""

  worker_type = AladdinWorker
  workers: list[AladdinWorker]

  def computed(self, w: AladdinWorker) -> None:
    e = self.engine
    message = self.computed_step(w)
    # A bounded send buffer: with `send_buffer` messages still queued on its uplink, the worker
    # waits until the oldest has left (never the case when the links keep up).
    w.leaving = [t for t in w.leaving if t > e.now]
    limit = self.cluster.send_buffer
    if limit is not None and len(w.leaving) >= limit:
      e.at(w.leaving[len(w.leaving) - limit], self.push, w, message)
    else:
      self.push(w, message)

  def push(self, w: AladdinWorker, message: Any) -> None:
    w.messages += 1
    w.leaving.append(self.to_shards(w, message))
    # Line 4 of Algorithm 1: merge the replies that arrived during this iteration.
    for reply in w.inbox:
      self.compute.apply(w, reply)
      self.engine.log("merge", w.index)
    w.inbox = []
    self.count_samples(self.batch_size)
    self.begin(w)

  def ps_arrive(self, s: int, w: AladdinWorker, nbytes: float, message: Any) -> None:
    w.ps_counts[s] += 1
    update = w.ps_counts[s] >= self.spec.period
    if update:
      w.ps_counts[s] = 0
    reply = update
    if self.spec.reply_every:
      w.reply_counts[s] += 1
      reply = update and w.reply_counts[s] % self.spec.reply_every == 0
    self.engine.ps_process(s, nbytes, update, self.ps_done, s, w, nbytes, message, reply)

  def ps_done(self, s: int, w: AladdinWorker, nbytes: float, message: Any, send: bool) -> None:
    self.engine.log("receive", w.index)
    reply = self.compute.receive(w, message)
    if send:
      self.to_worker(s, w, nbytes, reply)

  def reply_arrive(self, w: AladdinWorker, reply: Any) -> None:
    self.engine.log("reply", w.index)
    w.inbox.append(reply)


@simulates("ar_sgd")
class ArSgdProcess(Process):
  """A barrier every iteration, then a ring all-reduce of the gradients."""

  arrived = 0  # workers at the barrier

  def computed(self, w: SimWorker) -> None:
    self.computed_step(w, step=False)
    self.arrived += 1
    if self.arrived == self.n:
      self.arrived = 0
      self.engine.at(self.engine.now + self.cluster.allreduce_time(self.nbytes), self.reduced)

  def reduced(self) -> None:
    self.compute.cluster_step(self.workers)
    self.count_samples(self.n * self.batch_size)
    for w in self.workers:
      w.messages += 1
      self.begin(w)


@dataclasses.dataclass(eq=False)
class SymmetricWorker(SimWorker):
  pending: int = 0  # shards whose answer has not arrived yet


@simulates(algorithms.Symmetric)
class ExchangeProcess(Process):
  """Every ``spec.exchange_every`` iterations (ASP: 1, EASGD: ``tau``) send the message to every
  shard, wait for all the answers, apply the last and start the next iteration."""

  worker_type = SymmetricWorker

  def computed(self, w: SymmetricWorker) -> None:
    message = self.computed_step(w)
    self.count_samples(self.batch_size)
    if w.iterations % self.spec.exchange_every:
      self.begin(w)
      return
    w.messages += 1
    w.pending = self.cluster.num_shards
    self.to_shards(w, message)

  def ps_arrive(self, s: int, w: SymmetricWorker, nbytes: float, message: Any) -> None:
    self.engine.ps_process(s, nbytes, True, self.ps_done, s, w, nbytes, message)

  def ps_done(self, s: int, w: SymmetricWorker, nbytes: float, message: Any) -> None:
    self.to_worker(s, w, nbytes, self.compute.receive(w, message))

  def reply_arrive(self, w: SymmetricWorker, reply: Any) -> None:
    self.engine.log("reply", w.index)
    w.pending -= 1
    if w.pending == 0:
      self.compute.apply(w, reply)
      self.begin(w)


@dataclasses.dataclass(eq=False)
class SgpWorker(SimWorker):
  inbox: dict[int, Any] = dataclasses.field(default_factory=dict)  # round -> peer's message
  waiting_for: int = -1  # the round whose message it needs before its next iteration


@simulates("sgp")
class SgpProcess(Process):
  """Push-sum to one peer per iteration; wait for the in-peer's message of the previous
  iteration before starting the next (1-overlap). The peers are ``al.sgp``'s."""

  worker_type = SgpWorker
  workers: list[SgpWorker]

  def start(self) -> None:
    self.gossip = self.spec.gossip(self.n)
    super().start()

  def computed(self, w: SgpWorker) -> None:
    k = w.iterations
    message = self.computed_step(w)
    w.messages += 1
    peer, nic = self.workers[self.gossip.peer(w.index, k)], self.cluster.worker_nic
    self.engine.send(nic(w.index), nic(peer.index), self.nbytes, self.peer_arrive, peer, k, message)
    self.count_samples(self.batch_size)
    if k == 0:
      self.begin(w)
    else:
      w.waiting_for = k - 1
      self.try_continue(w)

  def peer_arrive(self, w: SgpWorker, tag: int, message: Any) -> None:
    self.engine.log("gossip", w.index)
    w.inbox[tag] = message
    self.try_continue(w)

  def try_continue(self, w: SgpWorker) -> None:
    tag = w.waiting_for
    if tag < 0 or tag not in w.inbox:
      return
    message = w.inbox.pop(tag)
    w.waiting_for = -1
    self.compute.apply(w, message)
    self.begin(w)
