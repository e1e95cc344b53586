"""Adding an algorithm through public names only: a baseline with a server that exchanges like
ASP and EASGD is its spec (a subclass of ``al.Symmetric``: worker program and server) and runs in
both engines once registered; an algorithm with a message pattern of its own adds one simulator
process (``sim.Process``, ``@sim.simulates``) and one Ray iteration (``ad.Iteration``,
``@ad.runs``). Both are checked in the simulator and on Ray's iterations, the latter through the
in-process transports of ``test_programs`` (no cluster)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from optax_lena import aladdin as al
from optax_lena.aladdin import simulator as sim
from tests.aladdin import simulator_cases as cases
from tests.aladdin import test_programs as engines


# ---- 1. A baseline with a server: the spec is all of it --------------------------------------
class AveragingState(NamedTuple):
  params: Any
  exchanges: jax.Array


class AveragingServer(NamedTuple):
  init: Any
  receive: Any


def averaging_server(num_workers: int, weight: float) -> AveragingServer:
  """x~ moves 1/n of the way to each model it receives; the reply merges x~ with ``weight``."""

  def init(params):
    return AveragingState(params, jnp.zeros([], jnp.int32))

  def receive(state, model, worker):
    del worker
    center = jax.tree.map(lambda c, m: c + (m - c) / num_workers, state.params, model)
    reply = al.Reply(jnp.asarray(True), center, jnp.asarray(weight, jnp.float32))
    return AveragingState(center, state.exchanges + 1), reply

  return AveragingServer(init, receive)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Averaging(al.Symmetric):
  """Local steps; every ``every`` of them the worker sends its model and merges the answer."""

  name: ClassVar[str] = "averaging"
  every: int = 2
  weight: float = 0.5

  @property
  def exchange_every(self) -> int:
    return self.every

  def server(self, num_workers):
    return averaging_server(num_workers, self.weight)

  def program(self, loss_fn, num_workers):
    tx, step = self.worker_tx, al.local_step(loss_fn, self.worker_tx, message="gradient")

    def step_fn(state, batch):
      params, opt_state, _, loss = step(state.params, state.opt_state, batch)
      return al.LocalState(params, opt_state), params, loss

    def apply(state, reply):
      return state._replace(params=al.worker_merge(state.params, reply.params, reply.alpha))

    return al.WorkerProgram(
      lambda p: al.LocalState(p, tx.init(p)), step_fn, apply, lambda state: state.params
    )


# ---- 2. A message pattern of its own: a process and an iteration ------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalOnly(al.Spec):
  """Every worker trains alone; the evaluated model is the average of the local models."""

  name: ClassVar[str] = "local_only"

  def program(self, loss_fn, num_workers):
    step = al.local_step(loss_fn, self.worker_tx, message="gradient")

    def step_fn(state, batch):
      params, opt_state, message, loss = step(*state, batch)
      return al.LocalState(params, opt_state), message, loss

    return al.WorkerProgram(
      lambda p: al.LocalState(p, self.worker_tx.init(p)),
      step_fn,
      lambda state, reply: state,
      lambda state: state.params,
    )


class LocalOnlyProcess(sim.Process):
  def computed(self, w):
    self.engine.log("compute", w.index)
    w.iterations += 1
    self.compute.step(w)
    w.idle_since = self.engine.now
    self.count_samples(self.batch_size)
    self.begin(w)


def local_only_iteration():
  from optax_lena.aladdin import distributed as ad

  class LocalOnlyIteration(ad.Iteration):
    def __init__(self, local, spec):
      super().__init__(local, spec)
      self.plain = jax.jit(local.program.step)

    def iterate(self, sync, deadline):
      local, t0 = self.local, time.perf_counter()
      local.state, _, local.last_loss = self.plain(local.state, next(local.batches))
      return ad.Stats.iteration(time.perf_counter() - t0)

  return ad.runs("local_only")(LocalOnlyIteration)


# ---- 3. A topology of its own: its own meeting actor and schedule, on Ray only ----------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class PeriodicAveraging(al.Spec):
  """Local SGD with periodic model averaging: every ``every`` local steps the n workers
  average their models at a meeting actor of the algorithm's own (a barrier; no PS shard)."""

  name: ClassVar[str] = "periodic_averaging"
  every: int = 3

  def program(self, loss_fn, num_workers):
    tx, step = self.worker_tx, al.local_step(loss_fn, self.worker_tx, message="gradient")

    def step_fn(state, batch):
      params, opt_state, _, loss = step(state.params, state.opt_state, batch)
      return al.LocalState(params, opt_state), params, loss

    return al.WorkerProgram(
      lambda p: al.LocalState(p, tx.init(p)),
      step_fn,
      lambda state, mean: state._replace(params=mean),  # the average is adopted
      lambda state: state.params,
    )


def _mean(models: dict[int, np.ndarray]) -> np.ndarray:
  return np.mean(np.stack([models[w] for w in sorted(models)]), axis=0)


class Averager:
  """The meeting actor (asyncio): ``average(round, worker, model)`` returns the mean of the n
  workers' models of that round once all n have arrived."""

  def __init__(self, num_workers: int):
    self.n, self.rounds = num_workers, {}

  async def average(self, round_: int, worker: int, model: np.ndarray) -> np.ndarray:
    import asyncio

    slot = self.rounds.setdefault(round_, {"models": {}, "done": asyncio.Event(), "served": 0})
    slot["models"][worker] = model
    if len(slot["models"]) == self.n:
      slot["done"].set()
    await slot["done"].wait()
    slot["served"] += 1
    if slot["served"] == self.n:
      del self.rounds[round_]
    return _mean(slot["models"])


class AveragerLink:
  """A worker's transport to the averager actor."""

  def __init__(self, averager: Any):
    self.averager = averager

  def average(self, round_: int, worker: int, model: np.ndarray) -> np.ndarray:
    import ray

    return ray.get(self.averager.average.remote(round_, worker, model))


def periodic_averaging_iteration():
  """The Ray iteration: it names its peers (one averager), its transport, its scheduler (rounds:
  a barrier needs every worker at the same iteration) and where the global model is."""
  from optax_lena.aladdin import distributed as ad

  class PeriodicAveragingIteration(ad.Iteration):
    scheduler = ad.Rounds

    @staticmethod
    def start_peers(driver: ad.Driver) -> list[Any]:
      return [driver.start_meeting(Averager, driver.config.num_workers)]

    @staticmethod
    def transport(links: ad.Links) -> AveragerLink:
      return AveragerLink(links.peers[0])

    @staticmethod
    def global_params(driver: ad.Driver, timeout: float | None) -> Any:
      vectors = [driver.layout.to_vector(m) for m in driver.worker_params(timeout)]
      return driver.layout.to_tree(_mean(dict(enumerate(vectors))))

    def __init__(self, local: ad.Local, spec: PeriodicAveraging):
      super().__init__(local, spec)
      program, layout = local.program, local.layout

      def step(state, batch):
        state, params, loss = program.step(state, batch)
        return state, layout.ravel(params), loss

      self.plain = jax.jit(step)
      self.adopt = jax.jit(lambda state, mean: program.apply(state, layout.unravel(mean)))

    def iterate(self, sync: bool, deadline: float | None) -> ad.Stats:
      local, t0 = self.local, time.perf_counter()
      out = jax.block_until_ready(self.plain(local.state, next(local.batches)))
      local.state, flat, local.last_loss = out
      compute = time.perf_counter() - t0
      sleep, wait = local.sleep_for(compute), 0.0
      if (local.iteration + 1) % self.spec.every == 0:
        t1 = time.perf_counter()
        round_ = local.iteration // self.spec.every
        mean = local.transport.average(round_, local.index, np.asarray(flat))
        local.state, wait = self.adopt(local.state, mean), time.perf_counter() - t1
        local.merges += 1
      return ad.Stats.iteration(compute, sleep, wait)

  return PeriodicAveragingIteration


@contextlib.contextmanager
def periodic_averaging_registered() -> Iterator[Any]:
  """Registers the spec and attaches its Ray iteration for the block; yields the iteration."""
  from optax_lena.aladdin import distributed as ad

  al.register(PeriodicAveraging)
  try:
    yield ad.runs("periodic_averaging")(periodic_averaging_iteration())
  finally:
    al.unregister("periodic_averaging")


def periodic_averaging_reference(
  batches: Any, params: dict[str, np.ndarray], n: int, iterations: int, every: int, lr: float
) -> dict[str, np.ndarray]:
  """The average of the n models after ``iterations`` rounds, in float64 NumPy, for the least
  squares of ``tests/aladdin/ray/helpers.py`` (``mean((x @ w + b - y) ** 2)``) and plain SGD."""
  models = [{k: v.astype(np.float64) for k, v in params.items()} for _ in range(n)]
  data = [batches(i, 0) for i in range(n)]
  for k in range(iterations):
    for i, model in enumerate(models):
      x, y = (a.astype(np.float64) for a in next(data[i]))
      r = x @ model["w"] + model["b"] - y
      model["w"] = model["w"] - lr * 2 * x.T @ r / r.size
      model["b"] = model["b"] - lr * 2 * r.sum(axis=0) / r.size
    if (k + 1) % every == 0:
      mean = {key: np.mean([m[key] for m in models], axis=0) for key in params}
      models = [dict(mean) for _ in range(n)]
  return {key: np.mean([m[key] for m in models], axis=0) for key in params}


class ThreadedAverager:
  """The averager for workers on threads (the in-process transport)."""

  def __init__(self, n: int):
    self.n, self.cond, self.rounds = n, threading.Condition(), {}

  def average(self, round_: int, worker: int, model: np.ndarray) -> np.ndarray:
    with self.cond:
      self.rounds.setdefault(round_, {})[worker] = model
      self.cond.notify_all()
      self.cond.wait_for(lambda: len(self.rounds[round_]) == self.n)
      return _mean(self.rounds[round_])


def _module_tables():
  """Every module-level table of the loaded ALADDIN modules (what registering could edit)."""
  out = {}
  for name, module in list(sys.modules.items()):
    if name.startswith(("optax_lena._src.aladdin", "optax_lena.aladdin")):
      for key, value in vars(module).items():
        if isinstance(value, dict | list | tuple | set) and not key.startswith("__"):
          out[name, key] = repr(value)
  return out


@pytest.fixture
def registered():
  before_tables = _module_tables()
  al.register(Averaging)
  al.register(LocalOnly)
  sim.simulates("local_only")(LocalOnlyProcess)
  try:
    # The registry is the one table that changed.
    changed = {k for k, v in _module_tables().items() if before_tables.get(k) != v}
    assert {key for _, key in changed} <= {"_REGISTRY"}, changed
    yield
  finally:
    al.unregister("averaging")
    al.unregister("local_only")
  with pytest.raises(ValueError, match="Unknown algorithm 'averaging'"):
    al.algorithm("averaging")


def test_a_symmetric_baseline_runs_in_the_simulator(registered):
  spec = sim.algorithm("averaging", worker_tx=optax.sgd(0.05, momentum=0.9), every=2)
  with pytest.raises(TypeError, match="has no option 'tau'"):
    sim.algorithm("averaging", tau=2)
  cluster = sim.make_cluster(4, 1.0, slowdown=2.0, bandwidth=1e5, latency=1e-3)
  result = sim.simulate(
    spec, cluster, batch_size=16, problem=cases.tiny_problem(), num_samples=1600, num_evals=2
  )
  assert result.evals[-1].test_accuracy > result.evals[0].test_accuracy + 0.2
  # One message every 2 iterations; the workers wait for the answers.
  assert result.messages == [i // 2 for i in result.iterations]
  assert min(result.messages) >= 1 and min(result.wait_time) > 0
  timing = sim.simulate(spec, cluster, batch_size=16, model_bytes=1e3, until_time=40.0)
  assert timing.messages == [i // 2 for i in timing.iterations] and timing.params is None

  # The server against a float64 NumPy reference.
  server = spec.server(4)
  c0, m = np.linspace(-1.0, 1.0, 6), np.linspace(2.0, -3.0, 6)
  state, reply = server.receive(server.init(jnp.asarray(c0, jnp.float32)), jnp.asarray(m), 0)
  np.testing.assert_allclose(reply.params, c0 + (m - c0) / 4, rtol=1e-6, atol=1e-7)
  assert int(state.exchanges) == 1 and float(reply.alpha) == 0.5


@pytest.mark.parametrize("name", ["averaging", "local_only"])
def test_both_engines_run_a_new_algorithm_bit_for_bit(registered, name):
  pytest.importorskip("ray")
  if name == "local_only":
    local_only_iteration()
  spec = al.algorithm(name, worker_tx=optax.sgd(0.1, momentum=0.9))
  problem, batches, params = engines.problem_and_batches()
  totals: list[np.ndarray] = []
  sim_sent, sim_models = engines.run_sim(spec, problem, batches, totals)
  ray_sent, ray_models = engines.run_ray(spec, problem, batches, totals)
  layout = engines.FlatLayout(problem.params, 1)
  expected = engines.N * engines.ROUNDS // 2 if name == "averaging" else 0
  assert len(sim_sent) == len(ray_sent) == expected
  for s, r in zip(sim_sent, ray_sent, strict=True):
    assert engines.bits(layout.to_vector(s)) == engines.bits(r)
  for s, r in zip(sim_models, ray_models, strict=True):
    engines.assert_same_tree(s, r)
  assert not np.array_equal(layout.to_vector(sim_models[0]), layout.to_vector(params))
  if name == "averaging":  # the merges made the workers' models differ from local training
    alone = engines.run_sim(LocalOnly(worker_tx=spec.worker_tx), problem, batches, [])[1]
    assert not np.array_equal(layout.to_vector(alone[0]), layout.to_vector(sim_models[0]))


def test_a_new_topology_runs_in_ray_iterations_against_float64():
  """The periodic-averaging iterations of 3 workers on threads, the averager in-process: the
  model average after 7 rounds (2 averagings) is the float64 NumPy reference's. The same
  algorithm runs on a Ray cluster in ``tests/aladdin/ray/test_runtime.py``."""
  pytest.importorskip("ray")
  from optax_lena.aladdin import distributed as ad
  from tests.aladdin.ray import helpers

  n, rounds, lr = 3, 7, 0.05
  with periodic_averaging_registered() as iteration:
    spec = al.algorithm("periodic_averaging", worker_tx=optax.sgd(lr), every=3)
    layout, averager = ad.FlatLayout(helpers.init_params(), 1), ThreadedAverager(n)
    workers = []
    for i in range(n):
      program = spec.program(helpers.loss_fn, n)
      state = program.init(helpers.init_params())
      local = ad.Local(i, program, layout, state, helpers.batches(i, 0), averager, n)
      workers.append(iteration(local, spec))

    def run(worker):
      for _ in range(rounds):
        worker.local.iteration += worker.iterate(True, None).iterations

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]
    models = [layout.to_vector(w.local_params()) for w in workers]
  assert [w.local.merges for w in workers] == [rounds // 3] * n
  expected = periodic_averaging_reference(helpers.batches, helpers.init_params(), n, rounds, 3, lr)
  got = layout.to_tree(np.mean(models, axis=0))
  for key in expected:
    np.testing.assert_allclose(got[key], expected[key], rtol=2e-5, atol=1e-6)
  assert np.abs(expected["w"]).max() > 0.05  # it trained
