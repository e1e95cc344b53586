"""The seam between the Ray runtime and an algorithm: what an algorithm's iteration is given
(:class:`Driver` on the driver; :class:`Links` and :class:`Local` in a worker) and what it
provides (:class:`Iteration`: its peers, its transport, its schedule, its step), so that an
algorithm with a topology of its own is added without editing the runtime
(``docs/ALADDIN-ray.md``, "Adding an algorithm").
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Protocol

import jax

from optax_lena._src.aladdin import algorithms
from optax_lena._src.aladdin.ray.config import Config
from optax_lena._src.aladdin.ray.layout import FlatLayout
from optax_lena._src.aladdin.ray.plan import Plan
from optax_lena._src.aladdin.ray.records import Stats
from optax_lena._src.aladdin.ray.schedulers import AsyncChunks, Schedule

PyTree = Any

_attach_ray = algorithms.attacher("ray")


def runs(*targets: str | type) -> Callable[[Any], Any]:
  """Attaches a class as the Ray iteration of algorithms (a class decorator).

  Args:
    *targets: algorithm names (``"aladdin"``), or spec classes (``al.Symmetric``: every
      registered subclass then runs the class).

  Returns:
    A decorator that files the class under each target and returns it unchanged.

  Raises:
    ValueError: a named algorithm is not registered, or already has a Ray iteration.

  Examples:
    >>> import dataclasses
    >>> from optax_lena import aladdin as al
    >>> from optax_lena.aladdin import distributed as ad
    >>> @al.register
    ... @dataclasses.dataclass(frozen=True, kw_only=True)
    ... class Alone(al.Spec):
    ...   name = "alone"
    >>> @ad.runs("alone")
    ... class AloneIteration(ad.Iteration):
    ...   pass
    >>> import optax
    >>> ad.Config(algorithm=Alone(worker_tx=optax.sgd(0.1))).plan  # Config finds the iteration
    Plan(period=1, max_fold=1, block=1)
    >>> al.unregister("alone")
  """
  return _attach_ray(*targets)


def timed(fn: Any, *args: Any) -> tuple[Any, float]:
  """``fn(*args)`` waited for (``jax.block_until_ready``), and its seconds."""
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return out, time.perf_counter() - t0


@dataclasses.dataclass(eq=False)
class Local:
  """What a worker's iteration runs on, made by the worker actor.

  Attributes:
    index: the worker's index in ``[0, num_workers)``.
    program: the spec's worker program (``spec.program(loss_fn, n)``, ``al.WorkerProgram``).
    layout: the flat wire format of the model (:class:`FlatLayout`).
    state: the program's local state (``program.init(params)``); the iteration replaces it.
    batches: the worker's endless iterator of mini-batches.
    transport: what :meth:`Iteration.transport` made from the worker's :class:`Links`.
    num_workers: n.
    slowdown: the emulated straggler's factor (``Config.slowdown``; 1: none).
    iteration: iterations completed so far (kept by the worker from the :class:`Stats`).
    last_loss: the loss of the last step.
    merges: replies merged, models adopted or messages mixed (kept by the iteration).
  """

  index: int
  program: Any
  layout: FlatLayout
  state: Any
  batches: Iterator[Any]
  transport: Any
  num_workers: int
  slowdown: float = 1.0
  iteration: int = 0
  last_loss: Any = math.nan
  merges: int = 0

  def sleep_for(self, compute_s: float) -> float:
    """The emulated straggler: sleeps ``(slowdown - 1)`` times the compute time; returns the
    seconds slept."""
    if self.slowdown <= 1.0:
      return 0.0
    pause = (self.slowdown - 1.0) * compute_s
    time.sleep(pause)
    return pause


@dataclasses.dataclass(frozen=True)
class Links:
  """What a worker holds to reach its peers.

  From it, :meth:`Iteration.transport` makes the iteration's transport.

  Attributes:
    index: the worker's index.
    layout: the flat wire format of the model.
    outbox: the worker's sender to the PS shards (an ``Outbox``: ``push``, ``flush``,
      ``take``), or None where the algorithm started no shards.
    peers: the actor handles that :meth:`Iteration.start_peers` returned on the driver.
  """

  index: int
  layout: FlatLayout
  outbox: Any
  peers: Sequence[Any]


class Driver(Protocol):
  """The runtime as an algorithm's driver-side hooks see it.

  What the runtime gives :meth:`Iteration.start_peers` and :meth:`Iteration.global_params`,
  instead of the runtime itself.

  Attributes:
    config: the run's validated :class:`Config` (``config.spec`` is the algorithm's spec).
    layout: the flat wire format of the model, cut into ``config.ps_shards`` slices.
    workers: the worker actors, in index order (empty while the peers start).
    shards: the PS shard actors that :meth:`start_shards` started (empty if none).
    peers: what :meth:`Iteration.start_peers` returned (empty while it runs).
  """

  config: Config
  layout: FlatLayout

  @property
  def workers(self) -> list[Any]: ...

  @property
  def shards(self) -> list[Any]: ...

  @property
  def peers(self) -> list[Any]: ...

  def start_shards(self) -> list[Any]:
    """Starts one PS shard actor per slice of the model, each running ``spec.server(n)``
    (restarted by Ray from its checkpoint); returns them."""
    ...

  def start_meeting(self, cls: type, *args: Any) -> Any:
    """Starts an actor of ``cls`` (``cls(*args)``) that workers meet at: a barrier, a mailbox,
    a board. It may keep callers waiting (up to 1000 calls at once; ``async def`` methods run
    on one event loop), so Ray never restarts it mid-round; the runtime kills it at the end."""
    ...

  def get(self, refs: Any, timeout: float | None = None) -> Any:
    """``ray.get(refs)``, in which a stop signal or a lost cluster is noticed (a
    ``ClusterLostError`` past ``timeout`` seconds, or past the stall timeout)."""
    ...

  def shard_params(self, timeout: float | None = None) -> PyTree:
    """The global model the shards hold (x~), joined from their slices."""
    ...

  def worker_params(
    self, timeout: float | None = None, workers: Sequence[int] | None = None
  ) -> list[PyTree]:
    """The local models of ``workers`` (default: all), each pending reply merged."""
    ...


class Iteration:
  """An algorithm's Ray iteration: subclass it and attach it with ``@ad.runs(name)``.

  The class-level hooks run on the driver (:meth:`plan` and :meth:`check` when the ``Config``
  is made, :meth:`start_peers` and :meth:`global_params` with the :class:`Driver`); an
  instance lives in each worker actor (:meth:`transport` makes its link to the peers, then
  :meth:`iterate` runs on ``self.local``, a :class:`Local`, and ``self.spec``). The defaults are
  a PS topology: shards that every worker pushes its messages to, one per call, asynchronous
  chunks, the global model held by the shards.

  Attributes:
    scheduler: how the driver hands out work: ``ad.AsyncChunks`` (every worker runs on its own
      clock) or ``ad.Rounds`` (every call gives every worker the same number of iterations:
      a barrier per iteration). ``Config(deterministic=True)`` runs one iteration at a time
      instead (all workers at once with ``ad.Rounds``).
    plain: the jitted local step without a merge, ``plain(state, batch)`` (timed at start-up
      by :meth:`step_time` where the worker folds its messages).

  Args:
    local: the worker's program, state, data and transport (the runtime builds it in the
      worker actor and constructs the iteration; an algorithm subclasses, never calls, this).
    spec: the algorithm's spec (``al.algorithm(name, ...)``), read by :meth:`iterate`.
  """

  scheduler: ClassVar[type[Schedule]] = AsyncChunks
  plain: Any

  def __init__(self, local: Local, spec: Any):
    self.local, self.spec = local, spec

  # ---- on the driver --------------------------------------------------------------------
  @staticmethod
  def plan(spec: Any) -> Plan:
    """How this algorithm's messages travel to the shards (default: one message per call, a
    reply to each)."""
    return Plan(period=1, max_fold=1, block=1)

  @staticmethod
  def check(spec: Any, config: Config) -> None:
    """Raises ``ValueError`` (naming the fix) for an option this iteration cannot run with;
    called when the ``Config`` is made, before any actor starts."""

  @staticmethod
  def start_peers(driver: Driver) -> list[Any]:
    """Starts the actors the workers talk to and returns those the workers need (default: the
    PS shards, which every worker reaches through its outbox)."""
    driver.start_shards()
    return []

  @staticmethod
  def global_params(driver: Driver, timeout: float | None) -> PyTree:
    """The global model (default: the shards' x~)."""
    return driver.shard_params(timeout)

  # ---- in a worker ------------------------------------------------------------------------
  @staticmethod
  def transport(links: Links) -> Any:
    """The worker's transport, kept as ``local.transport`` (default: the outbox)."""
    return links.outbox

  def iterate(self, sync: bool, deadline: float | None) -> Stats:
    """One iteration.

    Args:
      sync: wait for every reply before returning (the deterministic schedule).
      deadline: ``time.time()`` at which the run ends (None: none; a wait may end there).

    Returns:
      Its :class:`Stats`: ``iterations=1`` with its seconds (``ad.Stats.iteration(compute,
      sleep, wait)``), or ``iterations=0`` if it ended before it could step.
    """
    raise NotImplementedError

  def warm_up(self, batch: Any) -> None:
    """Compiles every piece before the run (results discarded)."""

  def finish(self) -> Stats | None:
    """Completes a step dispatched ahead; called until None at the end of a chunk."""
    return None

  def flush(self) -> float:
    """Sends what is queued and applies every reply; returns the seconds waited."""
    return 0.0

  def local_params(self) -> PyTree:
    """The worker's model (SGP: de-biased), every pending reply applied."""
    return self.local.program.params(self.local.state)

  def step_time(self, batch: Any) -> float:
    """The median seconds of 5 local steps (results discarded: the model does not move)."""
    return statistics.median(timed(self.plain, self.local.state, batch)[1] for _ in range(5))
