"""One iteration per algorithm, on a :class:`~optax_lena._src.aladdin.ray.worker.Worker`,
attached to the algorithm registry of ``optax_lena.aladdin`` (``entry(name).engine("ray")``).

Each class compiles its pieces from the algorithm's spec (``w.config.spec``) and the pure
functions of ``optax_lena.aladdin``, and runs one iteration with :meth:`iterate`, which returns
its compute / sleep / wait seconds. Its class attributes tell the driver what it needs:
``peers`` (the actors its workers talk to: ``"shards"``, ``"reducers"`` or ``"mailbox"``),
``rounds`` (AR-SGD's barrier: equal iteration counts) and ``global_model`` (where the global
model is read: ``"shards"``, ``"worker0"``, ``"mean"`` of the workers'). A reply the worker
adopts or mixes (ALADDIN's ``(x~, alpha)``, ASP's x~, EASGD's new local model) is merged at the
start of the next step, inside the same compiled call (Eq. 3 between two steps).
"""

from __future__ import annotations

import collections
import time
from typing import Any

import numpy as np

from optax_lena._src.aladdin import algorithms

Stats = dict[str, float]


def timed(fn: Any, *args: Any) -> tuple[Any, float]:
  import jax

  t0 = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return out, time.perf_counter() - t0


# ALADDIN's calls carry up to this many periods of a worker's messages: a worker that outruns
# its calls folds what it queued into the next one instead of waiting (back-pressure).
FOLD_PERIODS = 8
# In a run until a deadline, ALADDIN's worker keeps this many steps dispatched beyond the one
# whose message it reads: its Python work overlaps XLA's steps, and a late wake-up of its
# thread does not leave XLA idle (at batch 32 a step takes about 0.3 ms).
STEPS_AHEAD = 2
# A shard applies a call's messages in blocks of up to this many periods, one compiled call
# each: it compiles every block size before the run, and a larger one costs seconds more.
BLOCK_PERIODS = 4


def max_fold(iteration: type, spec: Any) -> int:
  """Messages one call may carry (ALADDIN: ``FOLD_PERIODS`` periods; the others: 1)."""
  return int(getattr(iteration, "max_fold", lambda spec: 1)(spec))


class _Iteration:
  """What every algorithm's iteration has: nothing in flight unless it dispatches ahead."""

  def finish(self) -> Stats | None:
    """Completes a step dispatched ahead; called until None at the end of a chunk."""
    return None


class _Served(_Iteration):
  """Shared by the algorithms whose workers talk to PS shards: the fused merge-then-step."""

  peers, rounds, global_model = "shards", False, "shards"

  def __init__(self, w: Any, step: Any):
    import jax

    from optax_lena._src.aladdin.server import all_finite
    from optax_lena._src.aladdin.worker import worker_merge

    self.w, layout = w, w.layout

    def fused(params, opt_state, batch, global_flat, alphas):
      if global_flat is not None:
        merged = worker_merge(layout.ravel(params), global_flat, layout.per_element(alphas))
        params = layout.unravel(merged)
      params, opt_state, message, loss = step(params, opt_state, batch)
      flat = layout.ravel(message)
      return params, opt_state, flat, all_finite(flat), loss

    self.plain = jax.jit(lambda p, s, b: fused(p, s, b, None, None))
    self.merging = jax.jit(fused)

  def warm_up(self, batch: Any) -> None:
    w = self.w
    timed(self.plain, w.params, w.opt_state, batch)
    timed(self.merging, w.params, w.opt_state, batch, w.global_flat, w.alphas)

  def dispatch(self) -> tuple[Any, Any, float]:
    """Starts the next step (merging what is pending) without waiting for it; returns its
    message and finiteness (device arrays) and when it was dispatched."""
    w = self.w
    batch = next(w.batches)
    pending = w.take_pending()
    args = (
      (w.params, w.opt_state, batch)
      if pending is None
      else (w.params, w.opt_state, batch, *pending)
    )
    t0 = time.perf_counter()
    w.params, w.opt_state, flat, finite, w.last_loss = (
      self.plain if pending is None else self.merging
    )(*args)
    return flat, finite, t0

  def step(self) -> tuple[np.ndarray, bool, float]:
    """The next step, waited for; returns the message, its finiteness and the compute
    seconds."""
    flat, finite, t0 = self.dispatch()
    # One executable: its message on the host means every output is ready (no walk over the
    # state's leaves to block on each).
    message, finite = np.asarray(flat), bool(finite)
    return message, finite, time.perf_counter() - t0


class Aladdin(_Served):
  """Algorithm 1: local step, push (no waiting: the outbox sends, folding while
  ``max_inflight`` calls are unanswered), merge the replies that have arrived.

  In a run until a deadline, the next ``STEPS_AHEAD`` steps are dispatched before this one's
  message is read: XLA computes them while the worker's thread pushes the message and takes the
  replies, which the next step dispatched merges (a reply is merged ``STEPS_AHEAD`` steps later
  than between two waited-for steps; the order of messages and of merges is the same), and a
  chunk completes its steps in flight before it returns. Steps are waited for where the order of
  events must be exact (the deterministic schedule), where a run is bounded by a number of
  iterations, and where the step's time must be known before the next one starts (an emulated
  straggler sleeps in proportion to it).
  """

  def __init__(self, w: Any):
    super().__init__(w, w.config.spec.worker_step(w.task.loss_fn))
    self.inflight: collections.deque[tuple[Any, Any, float]] = collections.deque()
    self.last_ready = self.waited = 0.0

  @staticmethod
  def max_fold(spec: Any) -> int:
    return FOLD_PERIODS * int(spec.period)

  def iterate(self, sync: bool, deadline: float | None) -> Stats:
    w = self.w
    if sync or deadline is None or w.slowdown > 1.0:
      message, finite, compute = self.step()
      sleep = w.sleep_for(compute)
      return self._send(message, finite, compute, sleep, sync)
    while len(self.inflight) < STEPS_AHEAD:
      self.inflight.append(self.dispatch())
    return self._complete(ahead=True)

  def finish(self) -> Stats | None:
    """Completes the oldest step in flight (called until None at the end of a chunk)."""
    return self._complete(ahead=False) if self.inflight else None

  def _complete(self, ahead: bool) -> Stats:
    """Reads the message of the oldest step in flight (dispatching the next one first if
    ``ahead``) and sends it.

    Its compute seconds run from its dispatch, or from the previous message if that came later,
    to its message, less the back-pressure wait in between: the step computes throughout that
    time unless the worker's own work (sending, taking replies, the next batch) takes longer
    than a step, which the wait-free loop keeps short.
    """
    flat, finite, dispatched = self.inflight.popleft()
    if ahead:
      self.inflight.append(self.dispatch())
    message, ok = np.asarray(flat), bool(finite)
    ready = time.perf_counter()
    since = ready - max(dispatched, self.last_ready)
    compute = max(0.0, since - self.waited)
    stats = self._send(message, ok, compute, 0.0, False)
    self.last_ready, self.waited = ready, stats["wait_s"]
    return stats

  def _send(
    self, message: np.ndarray, finite: bool, compute: float, sleep: float, sync: bool
  ) -> Stats:
    w = self.w
    wait = w.outbox.push(message, finite)
    if sync:  # the deterministic schedule: every reply merged before the next message
      wait += w.outbox.flush()
    w.accept(w.outbox.take())
    return {"compute_s": compute, "sleep_s": sleep, "wait_s": wait}


class Asp(_Served):
  """Hogwild: the gradient at the current model, sent; wait for x~ and adopt it."""

  def __init__(self, w: Any):
    import jax

    grad = jax.value_and_grad(w.task.loss_fn)

    def step(params, opt_state, batch):
      loss, grads = grad(params, batch)
      return params, opt_state, grads, loss

    super().__init__(w, step)

  def iterate(self, sync: bool, deadline: float | None) -> Stats:
    w = self.w
    message, finite, compute = self.step()
    sleep = w.sleep_for(compute)
    wait = w.outbox.push(message, finite) + w.outbox.flush()
    w.accept(w.outbox.take())
    return {"compute_s": compute, "sleep_s": sleep, "wait_s": wait}


class Easgd(_Served):
  """Elastic averaging: local steps; every ``tau``-th, exchange the model with the shards and
  adopt the answer."""

  def __init__(self, w: Any):
    from optax_lena._src.aladdin.worker import local_step

    step = local_step(w.task.loss_fn, w.config.spec.worker_tx, message="gradient")

    def model_step(params, opt_state, batch):
      params, opt_state, _, loss = step(params, opt_state, batch)
      return params, opt_state, params, loss  # the message is the new local model

    super().__init__(w, model_step)

  def iterate(self, sync: bool, deadline: float | None) -> Stats:
    w = self.w
    message, finite, compute = self.step()
    sleep = w.sleep_for(compute)
    wait = 0.0
    if (w.iteration + 1) % w.config.spec.tau == 0:
      wait = w.outbox.push(message, finite) + w.outbox.flush()
      w.accept(w.outbox.take())
    return {"compute_s": compute, "sleep_s": sleep, "wait_s": wait}


class ArSgd(_Iteration):
  """Synchronous: the gradient, all-reduced by the reducers (a barrier), the same step on every
  worker."""

  peers, rounds, global_model = "reducers", True, "worker0"

  def __init__(self, w: Any):
    import jax
    import optax

    from optax_lena._src.aladdin.server import all_finite

    self.w, layout, tx = w, w.layout, w.config.spec.worker_tx
    grad = jax.value_and_grad(w.task.loss_fn)

    def gradient(params, batch):
      loss, grads = grad(params, batch)
      flat = layout.ravel(grads)
      return flat, all_finite(flat), loss

    def apply(params, opt_state, mean):
      updates, opt_state = tx.update(layout.unravel(mean), opt_state, params)
      return optax.apply_updates(params, updates), opt_state

    self.gradient, self.apply = jax.jit(gradient), jax.jit(apply)

  def warm_up(self, batch: Any) -> None:
    w = self.w
    (flat, _, _), _ = timed(self.gradient, w.params, batch)
    timed(self.apply, w.params, w.opt_state, flat)

  def iterate(self, sync: bool, deadline: float | None) -> Stats:
    import ray

    w = self.w
    (flat, _, w.last_loss), compute = timed(self.gradient, w.params, next(w.batches))
    sleep = w.sleep_for(compute)
    parts = w.layout.split(np.asarray(flat))
    t0 = time.perf_counter()
    refs = [r.reduce.remote(w.iteration, w.index, p) for r, p in zip(w.peers, parts, strict=True)]
    mean = w.layout.join(ray.get(refs))
    wait = time.perf_counter() - t0
    w.params, w.opt_state = self.apply(w.params, w.opt_state, mean)
    return {"compute_s": compute, "sleep_s": sleep, "wait_s": wait}


class Sgp(_Iteration):
  """Push-sum gossip: step on the de-biased model, keep half, push half to this round's peer,
  then mix the message the in-peer pushed ``overlap`` rounds earlier (the paper: 1), waiting for
  it at most until the deadline (a chunk that ends first mixes it at the start of the next)."""

  peers, rounds, global_model = "mailbox", False, "mean"

  def __init__(self, w: Any):
    import jax
    import optax

    spec = w.config.spec
    self.w, layout, tx = w, w.layout, spec.worker_tx
    self.overlap = spec.overlap
    self.gossip = gossip = spec.gossip(w.config.num_workers)
    grad = jax.value_and_grad(w.task.loss_fn)
    self.weight = np.float32(1.0)
    self.awaiting: Any = None

    def step(x, weight, opt_state, batch):
      z = gossip.debias(x, weight)
      loss, grads = grad(z, batch)
      updates, opt_state = tx.update(grads, opt_state, z)
      (x, weight), _ = gossip.send(optax.apply_updates(x, updates), weight)
      return x, weight, opt_state, layout.ravel(x), loss

    def mix(x, weight, message, message_weight):
      return gossip.mix(x, weight, layout.unravel(message), message_weight)

    self.step, self.mix = jax.jit(step), jax.jit(mix)
    self.debias = jax.jit(gossip.debias)

  def warm_up(self, batch: Any) -> None:
    w = self.w
    (x, weight, _, flat, _), _ = timed(self.step, w.params, self.weight, w.opt_state, batch)
    timed(self.mix, x, weight, flat, weight)
    timed(self.debias, x, weight)

  def _receive(self, deadline: float | None) -> tuple[bool, float]:
    """Mixes the awaited message; False if the deadline came first."""
    import ray

    w = self.w
    if self.awaiting is None:
      return True, 0.0
    t0 = time.perf_counter()
    timeout = None if deadline is None else max(0.0, deadline - time.time())
    ready, _ = ray.wait([self.awaiting], timeout=timeout)
    wait = time.perf_counter() - t0
    if not ready:
      return False, wait
    message, message_weight = ray.get(self.awaiting)
    self.awaiting = None
    w.params, self.weight = self.mix(w.params, self.weight, message, np.float32(message_weight))
    w.totals["merges"] += 1
    return True, wait

  def iterate(self, sync: bool, deadline: float | None) -> Stats:
    w = self.w
    mixed, wait = self._receive(deadline)
    if not mixed:
      return {"compute_s": 0.0, "sleep_s": 0.0, "wait_s": wait, "skipped": 1.0}
    k = w.iteration
    (w.params, self.weight, w.opt_state, flat, w.last_loss), compute = timed(
      self.step, w.params, self.weight, w.opt_state, next(w.batches)
    )
    sleep = w.sleep_for(compute)
    mailbox = w.peers[0]
    mailbox.post.remote(self.gossip.peer(w.index, k), k, (np.asarray(flat), float(self.weight)))
    if k >= self.overlap:
      self.awaiting = mailbox.take.remote(w.index, k - self.overlap)
      _, more = self._receive(deadline)
      wait += more
    return {"compute_s": compute, "sleep_s": sleep, "wait_s": wait}

  def local_params(self) -> Any:
    return self.debias(self.w.params, self.weight)


for _name, _iteration in (
  ("aladdin", Aladdin),
  ("ar_sgd", ArSgd),
  ("asp", Asp),
  ("easgd", Easgd),
  ("sgp", Sgp),
):
  algorithms.entry(_name).attach("ray", _iteration)
