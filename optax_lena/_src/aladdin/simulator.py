"""A deterministic discrete-event simulator of a training cluster, for ALADDIN and its baselines.

It runs the real JAX computations of n workers and of the parameter server (PS) in the order a
cluster with the given speeds would produce them (:mod:`optax_lena._src.aladdin.cluster` is the
cost model), and reports accuracy against *simulated* wall time. With ``problem=None`` it runs
no computation at all (messages carry sizes only): the timing-only mode, which simulates the
paper's model sizes on the paper's cluster in milliseconds of host time.

Events live in one heap ordered by ``(time, sequence number)``: two events at the same simulated
time happen in the order they were scheduled, so a run is a pure function of its inputs (same
seed, same trajectory, bitwise). The message patterns (who waits for what):

* ``aladdin``: a worker computes, applies its local self-update, pushes its gradient to the PS and
  starts its next iteration at once (it never waits, unless ``Cluster.send_buffer`` bounds the
  messages queued on its uplink and the link does not keep up); the replies that arrived during
  an iteration are merged (Eq. 3) at its end. The PS processes messages in arrival order and
  replies to a worker once every ``period`` of its gradients.
* ``ar_sgd``: a barrier every iteration: the all-reduce starts when the slowest worker is done
  and takes the ring all-reduce time; then every worker applies the mean gradient.
* ``asp``: a worker sends its gradient and waits for the updated global model (symmetric).
* ``easgd``: local steps; every ``tau`` iterations a worker sends its model to the PS and waits
  for the elastic exchange's answer.
* ``sgp``: push-sum gossip: each iteration a worker sends half its (model, weight) to one peer of
  a directed exponential graph and, before its next iteration, must have received the message
  its in-peer sent one iteration earlier (1-overlap).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time as _time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_lena._src.aladdin.cluster import Cluster

PyTree = Any

ALGORITHMS = ("aladdin", "ar_sgd", "asp", "easgd", "sgp")


# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Algorithm:
  """One training algorithm and its options (build with :func:`algorithm`).

  Attributes:
    name: one of ``ALGORITHMS``.
    worker_tx: the workers' local optimizer (ALADDIN, EASGD, SGP) or AR-SGD's optimizer (on the
      mean gradient); unused by ASP.
    server_tx: the PS optimizer (ALADDIN: on the normalised g~; ASP: on each gradient).
    period: ALADDIN's pi.
    normalise: ALADDIN's normalisation of g~.
    alpha: ALADDIN's merge weight.
    tau: EASGD's communication period.
    beta: EASGD's moving rate (None: 0.9 / n).
    reply_every: ALADDIN only: forward the PS's reply to a worker only once every
      ``reply_every`` of its gradients (None: every reply). With ``period=1`` this is an eager
      global update (x~ moves at every gradient) with replies every ``reply_every`` gradients:
      ALADDIN without its lazy global update (the ablation's L2).
    label: a display name.
  """

  name: str
  worker_tx: optax.GradientTransformation | None = None
  server_tx: optax.GradientTransformation | None = None
  period: int = 4
  normalise: str = "mean_of_locals"
  alpha: str | float = "count"
  tau: int = 2
  beta: float | None = None
  reply_every: int | None = None
  label: str = ""


def algorithm(name: str, **options: Any) -> Algorithm:
  """Builds an :class:`Algorithm`, checking the name and that the optimizers it needs are given.

  Args:
    name: ``"aladdin"``, ``"ar_sgd"``, ``"asp"``, ``"easgd"`` or ``"sgp"``.
    **options: the :class:`Algorithm` fields (``worker_tx``, ``server_tx``, ``period``, ...).
      In timing-only runs no optimizer is needed.

  Returns:
    The :class:`Algorithm`.
  """
  if name not in ALGORITHMS:
    raise ValueError(f"Unknown algorithm {name!r}; choose one of {ALGORITHMS}.")
  if int(options.get("period", 4)) < 1 or int(options.get("tau", 2)) < 1:
    raise ValueError("period and tau must be >= 1.")
  if options.get("reply_every") is not None and int(options["reply_every"]) < 1:
    raise ValueError("reply_every must be None or >= 1.")
  return Algorithm(name, **options)


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
  """A training problem for the simulator (arrays on the host; batches drawn per worker).

  Attributes:
    params: the initial parameters (every worker and the PS start from them).
    loss_fn: ``loss_fn(params, (x, y)) -> scalar`` (mean over the batch).
    accuracy_fn: ``accuracy_fn(params, (x, y)) -> scalar`` in [0, 1].
    x_train: training inputs.
    y_train: training labels.
    x_test: test inputs.
    y_test: test labels.
  """

  params: PyTree
  loss_fn: Callable[[PyTree, Any], Any]
  accuracy_fn: Callable[[PyTree, Any], Any]
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray


@dataclasses.dataclass
class EvalPoint:
  """One evaluation of the model being trained.

  Attributes:
    time: simulated seconds.
    samples: training samples processed so far, all workers.
    iterations: samples / (n x batch): cluster iterations (AR-SGD's updates).
    train_loss: mean of the workers' mini-batch losses since the previous point (nan if none).
    test_loss: loss of the evaluated model on the test set.
    test_accuracy: its accuracy.
    local_accuracy: test accuracy of the average of the workers' local models (ALADDIN and
      EASGD, whose evaluated model is the PS's; nan for the others).
  """

  time: float
  samples: int
  iterations: float
  train_loss: float
  test_loss: float
  test_accuracy: float
  local_accuracy: float = math.nan


@dataclasses.dataclass
class SimResult:
  """What one simulated run reports.

  Attributes:
    algorithm: the algorithm's name.
    time: simulated seconds at the end.
    samples: training samples processed (all workers).
    throughput: samples per simulated second.
    iterations: iterations completed by each worker.
    wait_time: simulated seconds each worker spent idle (waiting for a barrier, a reply or a
      peer; for AR-SGD the all-reduce counts as waiting).
    messages: messages each worker sent.
    evals: the evaluations (training mode only).
    params: the evaluated model at the end (training mode only).
    events: ``(time, kind, worker)`` of every worker event when ``record_events``.
    wall_time: host seconds of the run.
    jax_time: host seconds inside the JAX computations (with ``profile``; else 0).
    num_events: events processed.
  """

  algorithm: str
  time: float
  samples: int
  throughput: float
  iterations: list[int]
  wait_time: list[float]
  messages: list[int]
  evals: list[EvalPoint]
  params: PyTree
  events: list[tuple[float, str, int]]
  wall_time: float
  jax_time: float
  num_events: int

  @property
  def final_accuracy(self) -> float:
    """Test accuracy of the last evaluation (nan without evaluations)."""
    return self.evals[-1].test_accuracy if self.evals else math.nan

  def accuracy_at(self, time: float) -> float:
    """Test accuracy of the last evaluation at or before simulated ``time`` (nan if none)."""
    acc = math.nan
    for point in self.evals:
      if point.time <= time:
        acc = point.test_accuracy
    return acc

  def time_to_accuracy(self, target: float) -> float:
    """Simulated time of the first evaluation reaching ``target`` (inf if never)."""
    for point in self.evals:
      if point.test_accuracy >= target:
        return point.time
    return math.inf

  def summary(self) -> dict[str, Any]:
    """A JSON-friendly dict (no parameters, no events)."""
    out = dataclasses.asdict(self)
    out.pop("params")
    out.pop("events")
    return out


# ----------------------------------------------------------------------------------------------
# Event engine
# ----------------------------------------------------------------------------------------------


class _Engine:
  """The heap of events and the busy-until times of every link and PS shard."""

  def __init__(self, cluster: Cluster, record: bool):
    self.cluster = cluster
    self.heap: list[tuple[float, int, Callable[..., None], tuple]] = []
    self.seq = 0
    self.now = 0.0
    self.up_free = [0.0] * cluster.num_nics
    self.down_free = [0.0] * cluster.num_nics
    self.ps_free = [0.0] * cluster.num_shards
    self.record = record
    self.events: list[tuple[float, str, int]] = []
    self.num_events = 0
    self.stopped = False

  def at(self, when: float, handler: Callable[..., None], *args: Any) -> None:
    # The sequence number breaks ties: same-time events run in scheduling order, and the
    # handler is never compared.
    heapq.heappush(self.heap, (when, self.seq, handler, args))
    self.seq += 1

  def log(self, kind: str, worker: int) -> None:
    if self.record:
      self.events.append((self.now, kind, worker))

  def run(self, until: float) -> None:
    while self.heap and not self.stopped:
      when, _, handler, args = heapq.heappop(self.heap)
      if when > until:
        self.now = until
        self.stopped = True
        return
      self.now = when
      self.num_events += 1
      handler(*args)

  def send(
    self, src: int, dst: int, nbytes: float, on_arrival: Callable[..., None], *args: Any
  ) -> float:
    """A message from NIC ``src`` to NIC ``dst``: uplink now (FIFO), wire latency, downlink
    FIFO in the order the messages reach the receiver; ``on_arrival(*args)`` at the end.
    Returns the time the message has left the sender's uplink.

    Two endpoints on one machine (a worker and a co-located PS shard) exchange messages through
    memory: no NIC, no latency, arrival now."""
    if src == dst:
      self.at(self.now, on_arrival, *args)
      return self.now
    wire = self.cluster.wire_time(nbytes, src)
    start = max(self.now, self.up_free[src])
    self.up_free[src] = start + wire
    self.at(
      start + wire + self.cluster.latency,
      self._reach,
      dst,
      self.cluster.wire_time(nbytes, dst),
      on_arrival,
      args,
    )
    return start + wire

  def _reach(self, dst: int, wire: float, on_arrival: Callable[..., None], args: tuple) -> None:
    arrival = max(self.now, self.down_free[dst] + wire)
    self.down_free[dst] = arrival
    self.at(arrival, on_arrival, *args)

  def ps_process(
    self, shard: int, nbytes: float, update: bool, on_done: Callable[..., None], *args: Any
  ) -> None:
    """PS shard ``shard`` processes one message (FIFO, one at a time) and then calls
    ``on_done(*args)``."""
    start = max(self.now, self.ps_free[shard])
    self.ps_free[shard] = start + self.cluster.ps_time(nbytes, update=update)
    self.at(self.ps_free[shard], on_done, *args)


# ----------------------------------------------------------------------------------------------
# JAX side (training mode)
# ----------------------------------------------------------------------------------------------


class _Timer:
  """Host time inside JAX calls (blocking on results only when profiling)."""

  def __init__(self, profile: bool):
    self.profile = profile
    self.total = 0.0

  def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
    if not self.profile:
      return fn(*args)
    start = _time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    self.total += _time.perf_counter() - start
    return out


class _Batches:
  """One worker's stream of mini-batches: consecutive slices of per-epoch permutations."""

  def __init__(self, problem: Problem, batch_size: int, rng: np.random.Generator):
    self.x, self.y = problem.x_train, problem.y_train
    self.batch_size = batch_size
    self.rng = rng
    self.order = rng.permutation(len(self.x))
    self.pos = 0

  def next(self) -> tuple[np.ndarray, np.ndarray]:
    if self.pos + self.batch_size > len(self.order):
      self.order = self.rng.permutation(len(self.x))
      self.pos = 0
    idx = self.order[self.pos : self.pos + self.batch_size]
    self.pos += self.batch_size
    return self.x[idx], self.y[idx]


# ----------------------------------------------------------------------------------------------
# The simulation
# ----------------------------------------------------------------------------------------------


def simulate(
  alg: Algorithm,
  cluster: Cluster,
  *,
  batch_size: int,
  problem: Problem | None = None,
  model_bytes: float | None = None,
  num_samples: int | None = None,
  until_time: float = math.inf,
  num_evals: int = 20,
  seed: int = 0,
  record_events: bool = False,
  profile: bool = False,
) -> SimResult:
  """Simulates one run of ``alg`` on ``cluster``.

  Args:
    alg: the algorithm (:func:`algorithm`).
    cluster: the cluster (:class:`Cluster`).
    batch_size: examples per worker iteration.
    problem: the training problem; ``None`` is the timing-only mode (nothing is computed).
    model_bytes: bytes of one gradient/model message (default: the bytes of
      ``problem.params``; required in timing-only mode).
    num_samples: stop when this many training samples (all workers) have been processed.
    until_time: stop at this simulated time (at least one of the two limits is needed).
    num_evals: evaluations of the model, evenly spaced in samples (plus one at the start).
    seed: seeds every worker's batch order (training mode) and compute-time jitter.
    record_events: keep ``(time, kind, worker)`` of every worker event in the result.
    profile: block on and time every JAX call (``SimResult.jax_time``), to measure the
      simulator's own overhead.

  Returns:
    A :class:`SimResult`.
  """
  if num_samples is None and not math.isfinite(until_time):
    raise ValueError("Give num_samples or until_time, or the simulation never ends.")
  if problem is None and model_bytes is None:
    raise ValueError("The timing-only mode (problem=None) needs model_bytes.")
  if problem is not None and cluster.num_shards != 1:
    raise ValueError(
      "Training mode runs one PS shard (the server's computation is not split); sharding is "
      "modelled in the timing-only mode. Use num_shards=1."
    )
  if model_bytes is None and problem is not None:
    model_bytes = float(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(problem.params)))
  sim = {
    "aladdin": _Aladdin,
    "ar_sgd": _ArSgd,
    "asp": _Asp,
    "easgd": _Easgd,
    "sgp": _Sgp,
  }[alg.name](alg, cluster, batch_size, problem, model_bytes, num_samples, num_evals, seed)
  sim.engine.record = record_events
  sim.timer = _Timer(profile)
  start = _time.perf_counter()
  if sim.train:
    sim.evaluate()  # the initial model, at time 0
  sim.start()
  sim.engine.run(until_time)
  sim.finish()
  wall = _time.perf_counter() - start
  e = sim.engine
  return SimResult(
    algorithm=alg.name,
    time=e.now,
    samples=sim.samples,
    throughput=sim.samples / e.now if e.now > 0 else 0.0,
    iterations=list(sim.iterations),
    wait_time=list(sim.wait),
    messages=list(sim.messages),
    evals=sim.evals,
    params=sim.final_params,
    events=e.events,
    wall_time=wall,
    jax_time=sim.timer.total,
    num_events=e.num_events,
  )


class _Base:
  """Shared bookkeeping: counters, batches, the sample budget and evaluations."""

  def __init__(
    self,
    alg: Algorithm,
    cluster: Cluster,
    batch_size: int,
    problem: Problem | None,
    model_bytes: float,
    num_samples: int | None,
    num_evals: int,
    seed: int,
  ):
    self.alg, self.cluster, self.problem = alg, cluster, problem
    self.n = cluster.num_workers
    self.batch_size = batch_size
    self.nbytes = float(model_bytes)
    self.budget = num_samples
    self.engine = _Engine(cluster, False)
    self.timer = _Timer(False)
    self.train = problem is not None
    self.samples = 0
    self.iterations = [0] * self.n
    self.wait = [0.0] * self.n
    self.messages = [0] * self.n
    self.idle_since = [0.0] * self.n
    self.evals: list[EvalPoint] = []
    self.final_params: PyTree = None
    self.losses: list[Any] = []
    # Compute-time jitter: one generator per worker, apart from the batch streams' (seed, i).
    self.jitter_rngs = [np.random.default_rng([seed, i, 1]) for i in range(self.n)]
    self.eval_every = (num_samples / num_evals) if num_samples and num_evals > 0 else math.inf
    self.next_eval = self.eval_every
    if problem is not None:
      # One generator per worker, derived from (seed, worker): a worker's batches do not depend
      # on the other workers' speeds.
      self.batches = [
        _Batches(problem, batch_size, np.random.default_rng([seed, i])) for i in range(self.n)
      ]
      # Device scalars of the worker indices, made once (a jnp.int32(i) per message would cost
      # more host time than the simulator's own bookkeeping).
      self.worker_ids = [jnp.asarray(i, jnp.int32) for i in range(self.n)]
      self.x_test = jnp.asarray(problem.x_test)
      self.y_test = jnp.asarray(problem.y_test)
      self.eval_fn = _cached_jit(
        ("eval", problem.loss_fn, problem.accuracy_fn),
        lambda: jax.jit(
          lambda p, x, y: (problem.loss_fn(p, (x, y)), problem.accuracy_fn(p, (x, y)))
        ),
      )
      self.setup(problem)

  # -- hooks of the algorithms --------------------------------------------------------------
  def setup(self, problem: Problem) -> None:
    """Builds the JAX functions and the initial states (training mode)."""

  def start(self) -> None:
    """Schedules the first events."""

  def eval_params(self) -> PyTree:
    """The model evaluated for this algorithm."""
    raise NotImplementedError

  def local_models(self) -> list[PyTree] | None:
    """The workers' own models when they differ from the evaluated one (else None)."""
    return None

  # -- shared -------------------------------------------------------------------------------
  def compute_time(self, worker: int) -> float:
    base = self.cluster.compute_time[worker]
    if not self.cluster.jitter:
      return base
    return base * (1.0 + self.cluster.jitter * (2.0 * self.jitter_rngs[worker].random() - 1.0))

  def begin(self, worker: int) -> None:
    """Worker starts an iteration now (its idle time since ``idle_since`` counts as waiting)."""
    e = self.engine
    self.wait[worker] += e.now - self.idle_since[worker]
    e.at(e.now + self.compute_time(worker), self.computed, worker)

  def computed(self, worker: int) -> None:
    raise NotImplementedError

  def count_samples(self, count: int) -> None:
    """Adds processed samples; evaluates on the schedule and stops at the budget."""
    self.samples += count
    if self.train:
      while self.samples >= self.next_eval - 1e-9 and (
        self.budget is None or self.next_eval < self.budget - 1e-9
      ):
        self.evaluate()
        self.next_eval += self.eval_every
    if self.budget is not None and self.samples >= self.budget:
      self.engine.stopped = True

  def next_batch(self, worker: int) -> tuple[np.ndarray, np.ndarray]:
    return self.batches[worker].next()

  def evaluate(self) -> None:
    loss, acc = self.timer(self.eval_fn, self.eval_params(), self.x_test, self.y_test)
    train_loss = float(jnp.mean(jnp.stack(self.losses))) if self.losses else math.nan
    self.losses = []
    local_acc = math.nan
    locals_ = self.local_models()
    if locals_ is not None:
      mean = _cached_jit(("mean_models",), lambda: jax.jit(_mean_models))
      _, acc_locals = self.timer(self.eval_fn, mean(locals_), self.x_test, self.y_test)
      local_acc = float(acc_locals)
    self.evals.append(
      EvalPoint(
        time=self.engine.now,
        samples=self.samples,
        iterations=self.samples / (self.n * self.batch_size),
        train_loss=train_loss,
        test_loss=float(loss),
        test_accuracy=float(acc),
        local_accuracy=local_acc,
      )
    )

  def finish(self) -> None:
    if self.train:
      self.evaluate()
      self.final_params = self.eval_params()


_JIT_CACHE: dict[tuple, Any] = {}


def _mean_models(models: list[PyTree]) -> PyTree:
  return jax.tree.map(lambda *v: sum(v[1:], v[0]) / len(v), *models)


def _cached_jit(key: tuple, build: Callable[[], Any]) -> Any:
  """Jitted functions keyed by the (hashable) objects they close over, so that runs reusing the
  same loss and optimizers compile once."""
  if key not in _JIT_CACHE:
    _JIT_CACHE[key] = build()
  return _JIT_CACHE[key]


def _required_tx(
  tx: optax.GradientTransformation | None, field: str
) -> optax.GradientTransformation:
  if tx is None:
    raise ValueError(
      f"Training mode needs Algorithm.{field}: build it with algorithm(..., {field}=...)."
    )
  return tx


def _local_step_fn(problem: Problem, tx: optax.GradientTransformation | None) -> Any:
  from optax_lena._src.aladdin.worker import local_step

  tx = _required_tx(tx, "worker_tx")

  return _cached_jit(
    ("local_step", problem.loss_fn, tx), lambda: jax.jit(local_step(problem.loss_fn, tx))
  )


def _merge_fn() -> Any:
  from optax_lena._src.aladdin.worker import worker_merge

  return _cached_jit(("merge",), lambda: jax.jit(worker_merge))


def _tree_bytes(tree: PyTree) -> float:
  return float(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


class _Aladdin(_Base):
  """Workers push and never wait; the PS replies every ``period`` gradients of a worker."""

  def setup(self, problem: Problem) -> None:
    from optax_lena._src.aladdin.server import parameter_server

    alg = self.alg
    server = parameter_server(
      self.n, alg.server_tx, period=alg.period, normalise=alg.normalise, alpha=alg.alpha
    )
    self.server_state = server.init(problem.params)
    self.receive = _cached_jit(
      ("aladdin_receive", self.n, alg.server_tx, alg.period, alg.normalise, alg.alpha),
      lambda: jax.jit(server.receive),
    )
    self.step = _local_step_fn(problem, alg.worker_tx)
    self.merge = _merge_fn()
    self.params = [problem.params] * self.n
    self.opt_state = [_required_tx(alg.worker_tx, "worker_tx").init(problem.params)] * self.n

  def start(self) -> None:
    self.inbox: list[list[Any]] = [[] for _ in range(self.n)]
    self.leaving: list[list[float]] = [[] for _ in range(self.n)]
    # Per shard and worker: gradients since the last reply (the PS's c_i, tracked here to time
    # the global updates without reading the device).
    self.ps_counts = [[0] * self.n for _ in range(self.cluster.num_shards)]
    self.reply_counts = [[0] * self.n for _ in range(self.cluster.num_shards)]
    for i in range(self.n):
      self.begin(i)

  def eval_params(self) -> PyTree:
    return self.server_state.params

  def local_models(self) -> list[PyTree]:
    return self.params

  def computed(self, i: int) -> None:
    e = self.engine
    e.log("compute", i)
    self.iterations[i] += 1
    grads = None
    if self.train:
      x, y = self.next_batch(i)
      self.params[i], self.opt_state[i], grads, loss = self.timer(
        self.step, self.params[i], self.opt_state[i], (x, y)
      )
      self.losses.append(loss)
    self.idle_since[i] = e.now
    # A bounded send buffer: with `send_buffer` messages still queued on its uplink, the worker
    # waits until the oldest has left (never the case when the links keep up).
    queued = [t for t in self.leaving[i] if t > e.now]
    self.leaving[i] = queued
    limit = self.cluster.send_buffer
    if limit is not None and len(queued) >= limit:
      e.at(queued[len(queued) - limit], self.push, i, grads)
    else:
      self.push(i, grads)

  def push(self, i: int, grads: PyTree) -> None:
    e = self.engine
    # Push the gradient (each shard its slice); do not wait for an answer.
    self.messages[i] += 1
    src = self.cluster.worker_nic(i)
    left = e.now
    for s, nbytes in enumerate(self.cluster.shard_bytes(self.nbytes)):
      left = e.send(src, self.cluster.ps_nic(s), nbytes, self.ps_arrive, s, i, nbytes, grads)
    self.leaving[i].append(left)
    # Line 4 of Algorithm 1: merge the replies that arrived during this iteration.
    for reply in self.inbox[i]:
      if self.train:
        self.params[i] = self.timer(self.merge, self.params[i], reply.params, reply.alpha)
      e.log("merge", i)
    self.inbox[i] = []
    self.count_samples(self.batch_size)
    self.begin(i)

  def ps_arrive(self, s: int, i: int, nbytes: float, grads: PyTree) -> None:
    self.ps_counts[s][i] += 1
    update = self.ps_counts[s][i] >= self.alg.period
    if update:
      self.ps_counts[s][i] = 0
    reply = update
    if self.alg.reply_every:
      self.reply_counts[s][i] += 1
      reply = update and self.reply_counts[s][i] % self.alg.reply_every == 0
    self.engine.ps_process(s, nbytes, update, self.ps_done, s, i, nbytes, grads, reply)

  def ps_done(self, s: int, i: int, nbytes: float, grads: PyTree, update: bool) -> None:
    reply = None
    self.engine.log("receive", i)
    if self.train:
      self.server_state, reply = self.timer(
        self.receive, self.server_state, grads, self.worker_ids[i]
      )
    if update:
      self.engine.send(
        self.cluster.ps_nic(s), self.cluster.worker_nic(i), nbytes, self.reply_arrive, i, reply
      )

  def reply_arrive(self, i: int, reply: Any) -> None:
    self.engine.log("reply", i)
    self.inbox[i].append(reply)


class _ArSgd(_Base):
  """A barrier every iteration, then a ring all-reduce of the gradients."""

  def setup(self, problem: Problem) -> None:
    tx = _required_tx(self.alg.worker_tx, "worker_tx")
    grad = jax.value_and_grad(problem.loss_fn)

    def step(params, opt_state, xs, ys):
      # The n workers' gradients at the same parameters, then their mean (the all-reduce).
      losses, grads = jax.vmap(lambda x, y: grad(params, (x, y)))(xs, ys)
      mean = jax.tree.map(lambda g: jnp.mean(g, axis=0), grads)
      updates, opt_state = tx.update(mean, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, jnp.mean(losses)

    self.step = _cached_jit(("ar_sgd", problem.loss_fn, tx), lambda: jax.jit(step))
    self.params = problem.params
    self.opt_state = tx.init(problem.params)

  def eval_params(self) -> PyTree:
    return self.params

  def start(self) -> None:
    self.arrived = 0
    for i in range(self.n):
      self.begin(i)

  def computed(self, i: int) -> None:
    e = self.engine
    e.log("compute", i)
    self.iterations[i] += 1
    self.idle_since[i] = e.now
    self.arrived += 1
    if self.arrived == self.n:
      self.arrived = 0
      e.at(e.now + self.cluster.allreduce_time(self.nbytes), self.reduced)

  def reduced(self) -> None:
    if self.train:
      batches = [self.next_batch(i) for i in range(self.n)]
      xs = np.stack([b[0] for b in batches])
      ys = np.stack([b[1] for b in batches])
      self.params, self.opt_state, loss = self.timer(self.step, self.params, self.opt_state, xs, ys)
      self.losses.append(loss)
    for i in range(self.n):
      self.messages[i] += 1
    self.count_samples(self.n * self.batch_size)
    for i in range(self.n):
      self.begin(i)


class _SymmetricExchange(_Base):
  """A worker that waits for the PS's answer from every shard, then adopts the model it sent
  (ASP: x~; EASGD: the elastic local model) and starts its next iteration."""

  params: list[PyTree]
  pending: list[int]

  def start(self) -> None:
    self.pending = [0] * self.n
    for i in range(self.n):
      self.begin(i)

  def reply_arrive(self, i: int, params: PyTree) -> None:
    self.engine.log("reply", i)
    self.pending[i] -= 1
    if self.pending[i] == 0:
      if self.train:
        self.params[i] = params
      self.begin(i)


class _Asp(_SymmetricExchange):
  """Send the gradient, wait for the PS to apply it and send x~ back, replace the model."""

  def setup(self, problem: Problem) -> None:
    from optax_lena._src.aladdin.baselines import asp_server

    self.server = asp_server(self.alg.server_tx)
    self.server_state = self.server.init(problem.params)
    self.receive = _cached_jit(
      ("asp_receive", self.alg.server_tx), lambda: jax.jit(self.server.receive)
    )
    self.grad = _cached_jit(
      ("grad", problem.loss_fn), lambda: jax.jit(jax.value_and_grad(problem.loss_fn))
    )
    self.params = [problem.params] * self.n
    self.global_params = problem.params

  def eval_params(self) -> PyTree:
    return self.global_params

  def computed(self, i: int) -> None:
    e = self.engine
    e.log("compute", i)
    self.iterations[i] += 1
    grads = None
    if self.train:
      loss, grads = self.timer(self.grad, self.params[i], self.next_batch(i))
      self.losses.append(loss)
    self.messages[i] += 1
    self.idle_since[i] = e.now
    self.pending[i] = self.cluster.num_shards
    src = self.cluster.worker_nic(i)
    for s, nbytes in enumerate(self.cluster.shard_bytes(self.nbytes)):
      e.send(src, self.cluster.ps_nic(s), nbytes, self.ps_arrive, s, i, nbytes, grads)
    self.count_samples(self.batch_size)

  def ps_arrive(self, s: int, i: int, nbytes: float, grads: PyTree) -> None:
    self.engine.ps_process(s, nbytes, True, self.ps_done, s, i, nbytes, grads)

  def ps_done(self, s: int, i: int, nbytes: float, grads: PyTree) -> None:
    params = None
    if self.train:
      self.server_state, reply = self.timer(
        self.receive, self.server_state, grads, self.worker_ids[i]
      )
      params = self.global_params = reply.params
    self.engine.send(
      self.cluster.ps_nic(s), self.cluster.worker_nic(i), nbytes, self.reply_arrive, i, params
    )


class _Easgd(_SymmetricExchange):
  """Local steps; every ``tau`` iterations a symmetric elastic exchange with the PS."""

  def setup(self, problem: Problem) -> None:
    from optax_lena._src.aladdin.baselines import easgd_server

    alg = self.alg
    self.server = easgd_server(self.n, beta=alg.beta, tau=alg.tau)
    self.server_state = self.server.init(problem.params)
    self.exchange = _cached_jit(
      ("easgd_exchange", self.n, alg.beta, alg.tau), lambda: jax.jit(self.server.exchange)
    )
    self.step = _local_step_fn(problem, alg.worker_tx)
    self.params = [problem.params] * self.n
    self.opt_state = [_required_tx(alg.worker_tx, "worker_tx").init(problem.params)] * self.n

  def eval_params(self) -> PyTree:
    return self.server_state.params

  def local_models(self) -> list[PyTree]:
    return self.params

  def computed(self, i: int) -> None:
    e = self.engine
    e.log("compute", i)
    self.iterations[i] += 1
    if self.train:
      self.params[i], self.opt_state[i], _, loss = self.timer(
        self.step, self.params[i], self.opt_state[i], self.next_batch(i)
      )
      self.losses.append(loss)
    self.idle_since[i] = e.now
    self.count_samples(self.batch_size)
    if self.iterations[i] % self.alg.tau:
      self.begin(i)
      return
    self.messages[i] += 1
    self.pending[i] = self.cluster.num_shards
    src = self.cluster.worker_nic(i)
    for s, nbytes in enumerate(self.cluster.shard_bytes(self.nbytes)):
      e.send(src, self.cluster.ps_nic(s), nbytes, self.ps_arrive, s, i, nbytes)

  def ps_arrive(self, s: int, i: int, nbytes: float) -> None:
    self.engine.ps_process(s, nbytes, True, self.ps_done, s, i, nbytes)

  def ps_done(self, s: int, i: int, nbytes: float) -> None:
    new_local = None
    if self.train:
      self.server_state, new_local = self.timer(
        self.exchange, self.server_state, self.params[i], self.worker_ids[i]
      )
    self.engine.send(
      self.cluster.ps_nic(s), self.cluster.worker_nic(i), nbytes, self.reply_arrive, i, new_local
    )


class _Sgp(_Base):
  """Push-sum to one peer per iteration; wait for the in-peer's message of the previous
  iteration before starting the next (1-overlap). The push-sum pieces (peer, halving, mixing,
  de-biasing) are ``al.sgp``'s."""

  def __init__(self, alg: Algorithm, cluster: Cluster, *args: Any):
    from optax_lena._src.aladdin.baselines import sgp

    self.gossip = sgp(cluster.num_workers, overlap=1)
    super().__init__(alg, cluster, *args)

  def setup(self, problem: Problem) -> None:
    alg = self.alg
    grad = jax.value_and_grad(problem.loss_fn)
    tx = _required_tx(alg.worker_tx, "worker_tx")
    gossip = self.gossip

    def step(x, w, opt_state, batch):
      # The gradient at the de-biased model z = x / w; the update applies to the numerator x,
      # which then keeps half of itself (the other half is the message to the peer).
      z = gossip.debias(x, w)
      loss, grads = grad(z, batch)
      updates, opt_state = tx.update(grads, opt_state, z)
      (x, w), _ = gossip.send(optax.apply_updates(x, updates), w)
      return x, w, opt_state, loss

    def mean_debiased(xs, ws):
      return jax.tree.map(lambda *v: sum(v[1:], v[0]) / len(v), *map(gossip.debias, xs, ws))

    self.step = _cached_jit(("sgp_step", problem.loss_fn, tx, self.n), lambda: jax.jit(step))
    self.mix = _cached_jit(("sgp_mix", self.n), lambda: jax.jit(gossip.mix))
    self.debias = _cached_jit(("sgp_debias", self.n), lambda: jax.jit(mean_debiased))
    self.x = [problem.params] * self.n
    self.w = [jnp.ones([], jnp.float32)] * self.n
    self.opt_state = [tx.init(problem.params)] * self.n

  def eval_params(self) -> PyTree:
    # The average of the workers' de-biased models.
    return self.debias(self.x, self.w)

  def start(self) -> None:
    self.inbox: list[dict[int, Any]] = [{} for _ in range(self.n)]
    self.waiting_for = [-1] * self.n
    for i in range(self.n):
      self.begin(i)

  def computed(self, i: int) -> None:
    e = self.engine
    e.log("compute", i)
    k = self.iterations[i]
    self.iterations[i] += 1
    message = None
    if self.train:
      self.x[i], self.w[i], self.opt_state[i], loss = self.timer(
        self.step, self.x[i], self.w[i], self.opt_state[i], self.next_batch(i)
      )
      self.losses.append(loss)
      message = (self.x[i], self.w[i])
    self.messages[i] += 1
    peer = self.gossip.peer(i, k)
    e.send(
      self.cluster.worker_nic(i),
      self.cluster.worker_nic(peer),
      self.nbytes,
      self.peer_arrive,
      peer,
      k,
      message,
    )
    self.count_samples(self.batch_size)
    self.idle_since[i] = e.now
    if k == 0:
      self.begin(i)
    else:
      self.waiting_for[i] = k - 1
      self.try_continue(i)

  def peer_arrive(self, i: int, tag: int, message: Any) -> None:
    self.engine.log("gossip", i)
    self.inbox[i][tag] = message
    self.try_continue(i)

  def try_continue(self, i: int) -> None:
    tag = self.waiting_for[i]
    if tag < 0 or tag not in self.inbox[i]:
      return
    message = self.inbox[i].pop(tag)
    self.waiting_for[i] = -1
    if self.train:
      self.x[i], self.w[i] = self.timer(self.mix, self.x[i], self.w[i], *message)
    self.begin(i)
