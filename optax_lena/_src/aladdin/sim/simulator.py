"""A deterministic discrete-event simulator of a training cluster, for ALADDIN and its baselines:
the cost model (:mod:`.cluster`), the event engine (:mod:`.engine`), one process per message
pattern (:mod:`.processes`) and what is computed (:mod:`.compute`).
"""

from __future__ import annotations

import dataclasses
import math
import time as _time
from typing import Any

import jax

from optax_lena._src.aladdin import algorithms
from optax_lena._src.aladdin.algorithms import Spec, algorithm  # noqa: F401 (for tests)
from optax_lena._src.aladdin.sim import processes as _processes  # noqa: F401 (registers them)
from optax_lena._src.aladdin.sim.cluster import Cluster
from optax_lena._src.aladdin.sim.compute import Compute, EvalPoint, Problem, Training

PyTree = Any

#: The algorithms the simulator runs (those with a simulator process at import).
ALGORITHMS = algorithms.engine_names("simulator")

#: The spec base class ``al.Spec``, under the simulator's former name of its configuration class.
Algorithm = Spec


@dataclasses.dataclass
class SimResult:
  """What one simulated run reports, in simulated seconds; an ``al.Result``.

  ``wait_fraction``, ``curve`` and ``final_params``, the protocol's derived names, are
  properties computed from the fields.

  Attributes:
    algorithm: the algorithm's name.
    samples: training samples processed, all workers.
    throughput: samples per simulated second.
    iterations: local iterations of each worker.
    time: simulated seconds at the end.
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
  def wait_fraction(self) -> list[float]:
    """Per worker, ``wait_time / time``: the share of the simulated run it waited."""
    return [w / self.time if self.time > 0 else 0.0 for w in self.wait_time]

  @property
  def curve(self) -> list[tuple[float, float]]:
    """``(simulated seconds, test accuracy)`` of every evaluation (``evals``)."""
    return [(e.time, e.test_accuracy) for e in self.evals]

  @property
  def final_params(self) -> PyTree:
    """``params``, under the name the :class:`al.Result` protocol gives it."""
    return self.params

  @property
  def final_accuracy(self) -> float:
    """Test accuracy of the last evaluation (nan without evaluations)."""
    return self.evals[-1].test_accuracy if self.evals else math.nan

  def summary(self) -> dict[str, Any]:
    """A JSON-friendly dict (no parameters, no events)."""
    out = dataclasses.asdict(self)
    out.pop("params")
    out.pop("events")
    return out


class Simulator:
  """One algorithm on one problem (or timing only), runnable on any cluster, many times.

  It keeps the jitted functions (one compute object per number of workers), so that its runs
  compile once; nothing outlives it. :func:`simulate` is one run of a fresh one.

  Args:
    alg: the algorithm's spec (:func:`algorithm`).
    problem: the training problem; ``None`` is the timing-only mode (nothing is computed).

  Raises:
    TypeError: ``alg`` is not a spec.
    ValueError: the spec cannot train ``problem`` (e.g. no workers' optimizer), or the
      algorithm has no simulator process.
  """

  def __init__(self, alg: Spec, problem: Problem | None = None):
    if not isinstance(alg, Spec):
      raise TypeError(
        f"alg must be an algorithm spec, e.g. sim.algorithm('aladdin', worker_tx=tx), got "
        f"{type(alg).__name__}."
      )
    self.alg, self.problem = alg, problem
    self.process = algorithms.entry(alg.name).engine("simulator")
    if problem is not None:
      alg.check_trainable()
    self._computes: dict[int, Compute] = {}

  def run(
    self,
    cluster: Cluster,
    *,
    batch_size: int,
    model_bytes: float | None = None,
    num_samples: int | None = None,
    until_time: float = math.inf,
    num_evals: int = 20,
    seed: int = 0,
    record_events: bool = False,
    profile: bool = False,
  ) -> SimResult:
    """One run on ``cluster``, with the arguments and result of :func:`simulate`."""
    if num_samples is None and not math.isfinite(until_time):
      raise ValueError("Give num_samples or until_time, or the simulation never ends.")
    if self.problem is not None and cluster.num_shards != 1:
      raise ValueError(
        "Training mode runs one PS shard (the server's computation is not split); sharding is "
        "modelled in the timing-only mode. Use num_shards=1."
      )
    if model_bytes is None:
      if self.problem is None:
        raise ValueError("The timing-only mode (problem=None) needs model_bytes.")
      leaves = jax.tree.leaves(self.problem.params)
      model_bytes = float(sum(x.size * x.dtype.itemsize for x in leaves))
    n = cluster.num_workers
    if n not in self._computes:
      self._computes[n] = Compute() if self.problem is None else Training(self.alg, self.problem, n)
    compute = self._computes[n]
    process = self.process(
      self.alg,
      cluster,
      compute,
      batch_size=batch_size,
      nbytes=model_bytes,
      num_samples=num_samples,
      num_evals=num_evals,
      seed=seed,
      record_events=record_events,
    )
    compute.start(process.workers, batch_size=batch_size, seed=seed, profile=profile)
    start = _time.perf_counter()
    process.evaluate()  # the initial model, at time 0
    process.start()
    e = process.engine
    e.run(until_time)
    process.evaluate()
    wall = _time.perf_counter() - start
    return SimResult(
      algorithm=self.alg.name,
      time=e.now,
      samples=process.samples,
      throughput=process.samples / e.now if e.now > 0 else 0.0,
      iterations=[w.iterations for w in process.workers],
      wait_time=[w.wait for w in process.workers],
      messages=[w.messages for w in process.workers],
      evals=compute.evals,
      params=compute.final_params(),
      events=e.events,
      wall_time=wall,
      jax_time=compute.jax_time,
      num_events=e.num_events,
    )


def simulate(
  alg: Spec,
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
  """Simulates one run of an algorithm on a cluster whose workers run at given speeds.

  The real JAX computations of the n workers and of the server run in the order that the
  cluster's cost model (:class:`Cluster`) produces them, from one heap of events ordered by
  simulated time and scheduling order: nothing depends on the host's timing, so the same
  inputs give the same run, bitwise. Each worker's mini-batches come from its own generator,
  seeded by ``(seed, worker)``. With ``problem=None`` nothing is computed and the messages carry
  sizes only: the timing-only mode, which simulates the paper's model sizes on the paper's
  cluster in host milliseconds. It is ``Simulator(alg, problem).run(...)``; to run one
  algorithm many times and compile once, keep a :class:`Simulator`.

  Args:
    alg: the algorithm (:func:`algorithm`).
    cluster: the cluster (:class:`Cluster`).
    batch_size: examples per worker iteration.
    problem: the training problem; ``None`` is the timing-only mode (nothing is computed).
    model_bytes: bytes of one message (default: the bytes of ``problem.params``; required in
      timing-only mode).
    num_samples: stop when this many training samples (all workers) have been processed.
    until_time: stop at this simulated time (at least one of the two limits is needed).
    num_evals: evaluations of the model, evenly spaced in samples (plus one at the start).
    seed: seeds every worker's batch order (training mode) and compute-time jitter.
    record_events: keep ``(time, kind, worker)`` of every worker event in the result.
    profile: block on and time every JAX call (``SimResult.jax_time``), to measure the
      simulator's own overhead.

  Returns:
    A :class:`SimResult`: the evaluations of the model being trained (the server's for
    ALADDIN, ASP and EASGD, the one model of AR-SGD, the average of the de-biased models of
    SGP) against simulated time, the throughput, each worker's iterations, waits and messages.

  Raises:
    ValueError: neither ``num_samples`` nor a finite ``until_time`` is given, the timing-only
      mode lacks ``model_bytes``, or a training run is given a cluster of several PS shards.
    TypeError: ``alg`` is not a spec.

  References:
    Ko, Choi, Jei, Lee and Kim, "ALADDIN: Asymmetric Centralized Training for Distributed Deep
    Learning", CIKM 2021: the cluster of its Section 5 (:func:`paper_cluster`) and its
    Table 3's heterogeneous clusters (``PAPER_SLOWDOWNS``).

  Examples:
    A linear classifier trained by 4 workers, worker 0 ten times slower than the others:

    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import optax
    >>> from optax_lena import aladdin as al
    >>> from optax_lena.aladdin import simulator as sim
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(300, 4)).astype(np.float32)
    >>> y = (x[:, 0] > 0).astype(np.int32)
    >>> def loss_fn(params, batch):
    ...   logits = batch[0] @ params["w"]
    ...   return optax.softmax_cross_entropy_with_integer_labels(logits, batch[1]).mean()
    >>> def accuracy_fn(params, batch):
    ...   return jnp.mean(jnp.argmax(batch[0] @ params["w"], -1) == batch[1])
    >>> problem = sim.Problem(
    ...   {"w": jnp.zeros((4, 2))}, loss_fn, accuracy_fn, x[:200], y[:200], x[200:], y[200:]
    ... )
    >>> alg = sim.algorithm("aladdin", worker_tx=al.local_optimizer(0.1))
    >>> cluster = sim.make_cluster(4, compute_time=0.1, slowdown=10.0)
    >>> result = sim.simulate(alg, cluster, batch_size=16, problem=problem, num_samples=1600)
    >>> result.iterations  # nobody waits for the straggler
    [3, 33, 32, 32]
    >>> result.evals[-1].test_accuracy > 0.9
    True

    The timing-only mode: ResNet-50's messages on the paper's cluster, one worker ten times
    slower (Table 3's HE1), as a speed-up over one normal worker:

    >>> model = sim.PAPER_MODELS["ResNet-50"]
    >>> cluster = sim.paper_cluster(model.compute_time, slowdown=10.0)
    >>> timing = sim.simulate(
    ...   sim.algorithm("aladdin"), cluster, batch_size=model.batch_size,
    ...   model_bytes=model.nbytes, until_time=60.0,
    ... )
    >>> round(timing.throughput * model.compute_time / model.batch_size, 1)
    7.1
  """
  return Simulator(alg, problem).run(
    cluster,
    batch_size=batch_size,
    model_bytes=model_bytes,
    num_samples=num_samples,
    until_time=until_time,
    num_evals=num_evals,
    seed=seed,
    record_events=record_events,
    profile=profile,
  )
