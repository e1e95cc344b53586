"""A worker's messages to the PS shards, sent by a thread of their own, so that the Ray calls
overlap the next local step (``docs/ALADDIN-ray.md``, "ALADDIN worker iteration"); one call
carries the same messages' slices to every shard, which Ray delivers in the order they were sent.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import numpy as np

from optax_lena._src.aladdin.ray.channel import Ring, Rows
from optax_lena._src.aladdin.ray.layout import FlatLayout, Rejected
from optax_lena._src.aladdin.ray.plan import Plan


class Outbox:
  """Queues messages, sends them in folded calls, returns the replies in order.

  Args:
    worker, shards, layout: the sender's index, the shard actors and the flat layout.
    plan: the :class:`~optax_lena._src.aladdin.ray.plan.Plan`: a worker that has
      ``plan.max_fold`` messages queued behind ``max_inflight`` unanswered calls waits
      (back-pressure); a call carries whole periods when it carries more than one.
    max_inflight: unanswered calls before messages are folded instead of sent.
    min_fold: messages queued before a call is made (a flush sends fewer).
    ring: the worker's shared-memory ring, with ``max_inflight`` regions of ``max_fold``
      messages (None: messages and replies travel in the calls).
  """

  def __init__(
    self,
    worker: int,
    shards: list[Any],
    layout: FlatLayout,
    plan: Plan,
    *,
    max_inflight: int,
    min_fold: int = 1,
    ring: Ring | None = None,
  ):
    self.worker, self.shards, self.layout = worker, shards, layout
    self.plan, self.max_inflight = plan, max_inflight
    self.min_fold = min(min_fold, plan.max_fold)
    self.ring = ring
    self._flushing = False
    self.sent = [0] * len(shards)  # messages (folded ones counted one by one) per shard
    self.calls = 0  # Ray calls per shard
    self._cond = threading.Condition()
    self._queue: list[tuple[np.ndarray, bool]] = []
    self._inflight = 0
    self._slots: dict[int, dict[int, Any]] = {}
    self._next_call = self._next_release = 0
    self._replies: list[list[Any]] = []
    self._error: BaseException | None = None
    # Started now, by the thread that creates the outbox: it runs on that thread's cores.
    self._thread = threading.Thread(target=self._send_loop, name="aladdin-outbox", daemon=True)
    self._thread.start()

  def push(self, message: np.ndarray, finite: bool) -> float:
    """Queues one message; returns the seconds waited (only when the queue is full)."""
    waited = 0.0
    with self._cond:
      self._raise()
      self._queue.append((message, finite))
      if len(self._queue) >= self.min_fold:  # wake the sender only when it has a call to make
        self._cond.notify_all()
      if len(self._queue) > self.plan.max_fold:
        t0 = time.perf_counter()
        self._cond.wait_for(lambda: len(self._queue) <= self.plan.max_fold or self._error)
        waited = time.perf_counter() - t0
    return waited

  def set_min_fold(self, min_fold: int) -> None:
    """Makes calls of at least ``min_fold`` messages from now on (``max_fold`` at most)."""
    with self._cond:
      self.min_fold = max(1, min(min_fold, self.plan.max_fold))
      self._cond.notify_all()

  def take(self) -> list[list[Any]]:
    """The replies of every call answered since the last take (per call, per shard)."""
    with self._cond:
      self._raise()
      replies, self._replies = self._replies, []
    return replies

  def flush(self) -> float:
    """Waits until every queued message has been sent and answered; returns the seconds."""
    t0 = time.perf_counter()
    with self._cond:
      self._flushing = True
      self._cond.notify_all()
      try:
        self._cond.wait_for(lambda: (not self._queue and not self._inflight) or self._error)
      finally:
        self._flushing = False
      self._raise()
    return time.perf_counter() - t0

  def _raise(self) -> None:
    if self._error is not None:
      raise RuntimeError(f"A message to the PS shards failed: {self._error}") from self._error

  def _send_loop(self) -> None:
    while True:
      with self._cond:
        self._cond.wait_for(
          lambda: (
            self._inflight < self.max_inflight
            and (len(self._queue) >= self.min_fold or (self._queue and self._flushing))
          )
        )
        take = self.plan.call_size(len(self._queue))
        batch, self._queue = self._queue[:take], self._queue[take:]
        self._inflight += 1
        call = self._next_call
        self._next_call += 1
        self._slots[call] = {}
        self._cond.notify_all()
      try:
        finite = np.asarray([f for _, f in batch])
        for s, (shard, part) in enumerate(zip(self.shards, self._parts(call, batch), strict=True)):
          ref = shard.receive.remote(self.worker, part, finite)
          ref.future().add_done_callback(
            lambda future, c=call, s=s, p=part: self._done(c, s, p, future)
          )
          self.sent[s] += len(batch)
        self.calls += 1
      except BaseException as err:
        return self._fail(err)

  def _fail(self, err: BaseException) -> None:
    with self._cond:
      self._error = err
      self._cond.notify_all()

  def _parts(self, call: int, batch: list[tuple[np.ndarray, bool]]) -> list[Any]:
    """What a call carries to each shard: its slices of the messages, or their rows in the
    ring (region ``call % max_inflight``: the call ``max_inflight`` earlier has been released,
    its replies copied out)."""
    bounds = self.layout.bounds
    if self.ring is None:
      parts = self.layout.split(np.stack([m for m, _ in batch]))
      return [np.ascontiguousarray(part) for part in parts]
    region = call % self.max_inflight
    self.ring.write(region, [m for m, _ in batch])
    return [self.ring.rows(region, len(batch), a, b) for a, b in itertools.pairwise(bounds)]

  def _done(self, call: int, shard: int, part: Any, future: Any) -> None:
    try:
      reply = future.result()
      if isinstance(reply, Rejected):
        raise RuntimeError(f"PS shard {shard} refused the call as malformed: {reply.reason}")
      if reply is not None and reply[0] is None:  # its slices are in the ring's reply rows
        assert self.ring is not None and isinstance(part, Rows)
        reply = (self.ring.replies_of(part, len(reply[1])), reply[1])
    except BaseException as err:
      return self._fail(err)
    with self._cond:
      self._slots[call][shard] = reply
      while len(self._slots.get(self._next_release, ())) == len(self.shards):
        slot = self._slots.pop(self._next_release)
        self._replies.append([slot[s] for s in range(len(self.shards))])
        self._next_release += 1
        self._inflight -= 1
      self._cond.notify_all()
