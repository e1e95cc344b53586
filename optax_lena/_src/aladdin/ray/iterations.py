"""The iterations of ALADDIN and the baselines on Ray, attached to the algorithm registry of
``optax_lena.aladdin`` (``entry(name).engine("ray")``) through the public seam
(:mod:`~optax_lena._src.aladdin.ray.seam`) that any new algorithm uses too.

The worker math is the spec's program (``spec.program``, the simulator's too): an iteration only
moves its messages, times them and compiles the program's pieces around the flat wire format.
A reply the worker adopts or merges is merged at the start of the next step, inside the same
compiled call (Eq. 3 between two steps).
"""

from __future__ import annotations

import collections
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from optax_lena._src.aladdin import algorithms
from optax_lena._src.aladdin.ray.config import Config
from optax_lena._src.aladdin.ray.layout import FlatLayout
from optax_lena._src.aladdin.ray.plan import BLOCK_PERIODS, FOLD_PERIODS, Plan
from optax_lena._src.aladdin.ray.records import Stats
from optax_lena._src.aladdin.ray.rendezvous import Mailbox, Reducer
from optax_lena._src.aladdin.ray.schedulers import Rounds
from optax_lena._src.aladdin.ray.seam import Driver, Iteration, Links, Local, runs, timed
from optax_lena._src.aladdin.server import Reply, all_finite

# ALADDIN's steps dispatched beyond the one whose message it reads, in a run until a deadline
# (``docs/ALADDIN-ray.md``, "Cores", says why).
STEPS_AHEAD = 2


def flat_reply(layout: FlatLayout, global_flat: Any, alphas: Any) -> Any:
  """The shards' replies as one :class:`~optax_lena._src.aladdin.server.Reply` (traceable):
  x~ in the wire's dtype and each shard's weight on its slice."""
  alpha = alphas[0] if layout.num_shards == 1 else layout.unravel(layout.per_element(alphas), False)
  return Reply(jnp.asarray(True), layout.unravel(global_flat, False), alpha)


class Served(Iteration):
  """Shared by the algorithms whose workers talk to PS shards: the fused merge-then-step, and
  the replies kept for it (a call's reply: None, or ``(slices[n], alphas[n])``, its ``n``
  global updates in order)."""

  def __init__(self, local: Local, spec: Any):
    super().__init__(local, spec)
    program, layout = local.program, local.layout

    def fused(state, batch, global_flat, alphas):
      if global_flat is not None:
        state = program.apply(state, flat_reply(layout, global_flat, alphas))
      state, message, loss = program.step(state, batch)
      flat = layout.ravel(message)
      return state, flat, all_finite(flat), loss

    self.plain = jax.jit(lambda state, batch: fused(state, batch, None, None))
    self.merging = jax.jit(fused)
    self.merge = jax.jit(lambda s, g, a: program.apply(s, flat_reply(layout, g, a)))
    self.global_flat = layout.to_vector(program.params(local.state))  # the last x~ received
    self.alphas = np.zeros(layout.num_shards, np.float32)
    self.pending = False

  def warm_up(self, batch: Any) -> None:
    state = self.local.state
    timed(self.plain, state, batch)
    timed(self.merging, state, batch, self.global_flat, self.alphas)
    # Two replies before one step merge the first outside it.
    timed(self.merge, state, self.global_flat, self.alphas)

  def accept(self, calls: list[list[Any]]) -> None:
    """Keeps the replies of finished calls for the next step's merge; a shard's second reply
    before that step merges its first at once, so that every reply is applied, in order."""
    bounds = self.local.layout.bounds
    for replies in calls:
      rounds = max((len(r[1]) for r in replies if r is not None), default=0)
      for j in range(rounds):
        for s, reply in enumerate(replies):
          if reply is None or j >= len(reply[1]):
            continue
          if self.pending and self.alphas[s] != 0:
            self.merge_pending()
          self.global_flat[bounds[s] : bounds[s + 1]] = reply[0][j]
          self.alphas[s] = reply[1][j]
          self.pending = True
        self.local.merges += 1

  def take_pending(self) -> tuple[np.ndarray, np.ndarray] | None:
    """The replies to merge at the start of the next step (None if none), then forgotten."""
    if not self.pending:
      return None
    alphas = self.alphas.copy()
    self.alphas[:] = 0.0
    self.pending = False
    return self.global_flat.copy(), alphas

  def merge_pending(self) -> None:
    """Merges what is pending now (Eq. 3), outside a step."""
    pending = self.take_pending()
    if pending is not None:
      self.local.state = self.merge(self.local.state, *pending)

  def local_params(self) -> Any:
    self.merge_pending()
    return super().local_params()

  def flush(self) -> float:
    wait = self.local.transport.flush()
    self.accept(self.local.transport.take())
    self.merge_pending()
    return wait

  def dispatch(self) -> tuple[Any, Any, float]:
    """Starts the next step (merging what is pending) without waiting for it; returns its
    message and finiteness (device arrays) and when it was dispatched."""
    local = self.local
    batch = next(local.batches)
    pending = self.take_pending()
    fn, merged = (self.plain, ()) if pending is None else (self.merging, pending)
    t0 = time.perf_counter()
    local.state, flat, finite, local.last_loss = fn(local.state, batch, *merged)
    return flat, finite, t0

  def step(self) -> tuple[np.ndarray, bool, float, float]:
    """The next step, waited for, then the straggler's sleep; returns the message, its
    finiteness and the compute and sleep seconds."""
    flat, finite, t0 = self.dispatch()
    # One executable: its message on the host means every output is ready (no walk over the
    # state's leaves to block on each).
    message, finite = np.asarray(flat), bool(finite)
    compute = time.perf_counter() - t0
    return message, finite, compute, self.local.sleep_for(compute)

  def exchange(self, message: np.ndarray, finite: bool, wait_reply: bool = True) -> float:
    """Sends the message and keeps the replies that have arrived (``wait_reply``: after
    waiting for its own); returns the seconds waited."""
    outbox = self.local.transport
    wait = outbox.push(message, finite) + (outbox.flush() if wait_reply else 0.0)
    self.accept(outbox.take())
    return wait


@runs("aladdin")
class AladdinIteration(Served):
  """Algorithm 1: local step, push (no waiting: the outbox sends), merge the replies that have
  arrived; in a run until a deadline, ``STEPS_AHEAD`` steps are in flight."""

  @staticmethod
  def plan(spec: algorithms.Aladdin) -> Plan:
    """Calls of up to ``FOLD_PERIODS`` periods, applied in blocks of ``BLOCK_PERIODS``."""
    period = spec.period
    return Plan(period=period, max_fold=FOLD_PERIODS * period, block=BLOCK_PERIODS * period)

  @staticmethod
  def check(spec: algorithms.Aladdin, config: Config) -> None:
    if spec.reply_every is not None:
      raise ValueError("Config: reply_every (a simulator ablation) is not supported on Ray.")

  def __init__(self, local: Local, spec: Any):
    super().__init__(local, spec)
    self.inflight: collections.deque[tuple[Any, Any, float]] = collections.deque()
    self.last_ready = self.waited = 0.0

  def iterate(self, sync: bool, deadline: float | None) -> Stats:
    if sync or deadline is None or self.local.slowdown > 1.0:
      # Steps waited for: the deterministic schedule (every reply merged before the next
      # message), a run bounded by iterations, a straggler (its sleep is in proportion to them).
      message, finite, compute, sleep = self.step()
      return Stats.iteration(compute, sleep, self.exchange(message, finite, wait_reply=sync))
    while len(self.inflight) < STEPS_AHEAD:
      self.inflight.append(self.dispatch())
    return self._complete(ahead=True)

  def finish(self) -> Stats | None:
    return self._complete(ahead=False) if self.inflight else None

  def _complete(self, ahead: bool) -> Stats:
    """Reads the message of the oldest step in flight (dispatching the next one first if
    ``ahead``) and sends it. Its compute seconds run from its dispatch, or from the previous
    message if that came later, to its message, less the back-pressure wait in between."""
    flat, finite, dispatched = self.inflight.popleft()
    if ahead:
      self.inflight.append(self.dispatch())
    message, ok = np.asarray(flat), bool(finite)
    ready = time.perf_counter()
    since = ready - max(dispatched, self.last_ready)
    compute = max(0.0, since - self.waited)
    stats = Stats.iteration(compute, 0.0, self.exchange(message, ok, wait_reply=False))
    self.last_ready, self.waited = ready, stats.wait_s
    return stats


@runs(algorithms.Symmetric)
class ExchangeIteration(Served):
  """ASP, EASGD and every other symmetric spec: a local step; after every
  ``spec.exchange_every``-th, send its message, wait for the answer and apply it."""

  def iterate(self, sync: bool, deadline: float | None) -> Stats:
    message, finite, compute, sleep = self.step()
    exchange = (self.local.iteration + 1) % self.spec.exchange_every == 0
    return Stats.iteration(compute, sleep, self.exchange(message, finite) if exchange else 0.0)


class ReducerLink:
  """AR-SGD's all-reduce through the reducer actors (one per slice of the model)."""

  def __init__(self, reducers: list[Any], layout: FlatLayout):
    self.reducers, self.layout = reducers, layout

  def allreduce(self, step: int, worker: int, flat: np.ndarray) -> np.ndarray:
    import ray

    parts = self.layout.split(flat)
    refs = [r.reduce.remote(step, worker, p) for r, p in zip(self.reducers, parts, strict=True)]
    return self.layout.join(ray.get(refs))


@runs("ar_sgd")
class ArSgdIteration(Iteration):
  """Synchronous: the gradient, all-reduced by the reducers (a barrier), the same step on every
  worker; one reducer per slice of the model, rounds of iterations."""

  scheduler = Rounds

  def __init__(self, local: Local, spec: Any):
    super().__init__(local, spec)
    program, layout = local.program, local.layout

    def gradient(state, batch):
      state, grads, loss = program.step(state, batch)
      flat = layout.ravel(grads)
      return flat, all_finite(flat), loss

    self.plain = jax.jit(gradient)
    # The sum arrives as a tree (cut on the host): XLA fusing the cut into the step would
    # change its last bits, and the simulator's step would differ.
    self.apply = jax.jit(program.apply)

  @staticmethod
  def start_peers(driver: Driver) -> list[Any]:
    n, shards = driver.config.num_workers, driver.config.ps_shards
    return [driver.start_meeting(Reducer, n) for _ in range(shards)]

  @staticmethod
  def transport(links: Links) -> ReducerLink:
    return ReducerLink(list(links.peers), links.layout)

  @staticmethod
  def global_params(driver: Driver, timeout: float | None) -> Any:
    """Worker 0's model (every worker holds the same)."""
    return driver.worker_params(timeout, [0])[0]

  def warm_up(self, batch: Any) -> None:
    (flat, _, _), _ = timed(self.plain, self.local.state, batch)
    timed(self.apply, self.local.state, self.local.layout.to_tree(np.asarray(flat)))

  def iterate(self, sync: bool, deadline: float | None) -> Stats:
    local = self.local
    (flat, _, local.last_loss), compute = timed(self.plain, local.state, next(local.batches))
    sleep = local.sleep_for(compute)
    total, wait = timed(local.transport.allreduce, local.iteration, local.index, np.asarray(flat))
    local.state = self.apply(local.state, local.layout.to_tree(total))
    return Stats.iteration(compute, sleep, wait)


class MailboxLink:
  """SGP's gossip through the mailbox actor: ``post`` a message to ``(node, round)``,
  ``request`` one and ``receive`` it (None if it has not come within ``timeout``)."""

  def __init__(self, mailbox: Any):
    self.mailbox = mailbox

  def post(self, node: int, step: int, message: Any) -> None:
    self.mailbox.post.remote(node, step, message)

  def request(self, node: int, step: int) -> Any:
    return self.mailbox.take.remote(node, step)

  def receive(self, handle: Any, timeout: float | None) -> Any:
    import ray

    ready, _ = ray.wait([handle], timeout=timeout)
    return ray.get(handle) if ready else None


@runs("sgp")
class SgpIteration(Iteration):
  """Push-sum gossip: step on the de-biased model, keep half, push half to this round's peer,
  then mix the message the in-peer pushed ``overlap`` rounds earlier (the paper: 1), waiting for
  it at most until the deadline (a chunk that ends first mixes it at the start of the next)."""

  def __init__(self, local: Local, spec: Any):
    super().__init__(local, spec)
    program, layout = local.program, local.layout
    self.gossip = spec.gossip(local.num_workers)
    self.awaiting: Any = None

    def step(state, batch):
      state, (numerator, _), loss = program.step(state, batch)
      return state, layout.ravel(numerator), loss

    mix = lambda state, message, weight: program.apply(state, (layout.unravel(message), weight))
    self.plain, self.mix = jax.jit(step), jax.jit(mix)

  @staticmethod
  def check(spec: algorithms.Sgp, config: Config) -> None:
    if spec.overlap == 0 and config.deterministic:
      raise ValueError("Config: SGP with overlap=0 cannot run the deterministic lockstep.")

  @staticmethod
  def start_peers(driver: Driver) -> list[Any]:
    return [driver.start_meeting(Mailbox)]

  @staticmethod
  def transport(links: Links) -> MailboxLink:
    return MailboxLink(links.peers[0])

  @staticmethod
  def global_params(driver: Driver, timeout: float | None) -> Any:
    """The average of the workers' de-biased models (in float64, on the driver)."""
    layout = driver.layout
    vectors = [layout.to_vector(m) for m in driver.worker_params(timeout)]
    return layout.to_tree(np.asarray(np.mean(vectors, axis=0, dtype=np.float64)))

  def warm_up(self, batch: Any) -> None:
    (state, flat, _), _ = timed(self.plain, self.local.state, batch)
    timed(self.mix, state, flat, state.weight)

  def _receive(self, deadline: float | None) -> tuple[bool, float]:
    """Mixes the awaited message; False if the deadline came first."""
    local = self.local
    if self.awaiting is None:
      return True, 0.0
    timeout = None if deadline is None else max(0.0, deadline - time.time())
    message, wait = timed(local.transport.receive, self.awaiting, timeout)
    if message is None:
      return False, wait
    self.awaiting = None
    local.state = self.mix(local.state, message[0], np.float32(message[1]))
    local.merges += 1
    return True, wait

  def iterate(self, sync: bool, deadline: float | None) -> Stats:
    local = self.local
    mixed, wait = self._receive(deadline)
    if not mixed:  # the deadline came first: no step
      return Stats(wait_s=wait)
    k, batch = local.iteration, next(local.batches)
    (local.state, flat, local.last_loss), compute = timed(self.plain, local.state, batch)
    sleep = local.sleep_for(compute)
    weight = float(local.state.weight)
    local.transport.post(self.gossip.peer(local.index, k), k, (np.asarray(flat), weight))
    if k >= self.spec.overlap:
      self.awaiting = local.transport.request(local.index, k - self.spec.overlap)
      _, more = self._receive(deadline)
      wait += more
    return Stats.iteration(compute, sleep, wait)
