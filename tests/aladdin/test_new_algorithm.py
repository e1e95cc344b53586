"""Adding an algorithm through public names only: a baseline with a server that exchanges like
ASP and EASGD is its spec (a subclass of ``al.Symmetric``: worker program and server) and runs in
both engines once registered; an algorithm with a message pattern of its own adds one simulator
process (``sim.Process``, ``@sim.simulates``) and one Ray iteration (``ad.Iteration``,
``@ad.runs``). Both are checked in the simulator and on Ray's iterations, the latter through the
in-process transports of ``test_programs`` (no cluster)."""

from __future__ import annotations

import dataclasses
import sys
import time
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
      return {"compute_s": time.perf_counter() - t0, "sleep_s": 0.0, "wait_s": 0.0}

  return ad.runs("local_only")(LocalOnlyIteration)


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
