"""Adding an algorithm is its spec with its worker program (plus a server if it has one) and one
simulator process (plus, for Ray, one iteration): registering a toy algorithm and running it
touches nothing else."""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_lena import aladdin as al
from optax_lena._src.aladdin import algorithms
from optax_lena._src.aladdin.sim import compute as sim_compute
from optax_lena._src.aladdin.sim import engine as sim_engine
from optax_lena._src.aladdin.sim import processes as sim_processes
from optax_lena._src.aladdin.sim import simulator as sim_module
from optax_lena.aladdin import simulator as sim
from tests.aladdin import simulator_cases as cases


# 1. The pure pieces: a spec (its options, validated) and its worker program.
@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalOnly(al.Spec):
  """Every worker trains alone; the evaluated model is the average of the local models."""

  name: ClassVar[str] = "local_only"
  shrink: float = 1.0

  def __post_init__(self):
    super().__post_init__()
    if not 0 < self.shrink <= 1:
      raise ValueError("shrink must be in (0, 1].")

  def program(self, loss_fn, num_workers):
    step = al.local_step(loss_fn, self.worker_tx, message="gradient")

    def init(params):
      return al.LocalState(params, self.worker_tx.init(params))

    def step_fn(state, batch):
      params, opt_state, message, loss = step(*state, batch)
      return al.LocalState(params, opt_state), message, loss

    return al.WorkerProgram(init, step_fn, lambda state, reply: state, lambda state: state.params)


# 2. One simulator process.
class LocalOnlyProcess(sim_engine.Process):
  def computed(self, w):
    self.engine.log("compute", w.index)
    w.iterations += 1
    self.compute.step(w)
    w.idle_since = self.engine.now
    self.count_samples(self.batch_size)
    self.begin(w)


def _module_tables():
  """Every module-level table of the ALADDIN modules (what adding an algorithm could edit)."""
  out = {}
  for module in (algorithms, sim_compute, sim_engine, sim_processes, sim_module):
    for key, value in vars(module).items():
      if isinstance(value, dict | list | tuple | set) and not key.startswith("__"):
        out[module.__name__, key] = repr(value)
  return out


def test_registering_a_toy_algorithm_is_all_it_takes():
  before_tables = _module_tables()
  before_names = algorithms.names()
  try:
    algorithms.register(LocalOnly)
    sim_processes.simulates("local_only")(LocalOnlyProcess)
    # The registry is the one table that changed, by one entry.
    assert algorithms.names() == (*before_names, "local_only")
    assert algorithms.entry("local_only").engines == {"simulator": LocalOnlyProcess}
    changed = {k for k, v in _module_tables().items() if before_tables.get(k) != v}
    assert changed <= {(algorithms.__name__, "_REGISTRY")}, changed

    spec = sim.algorithm("local_only", worker_tx=optax.sgd(0.05, momentum=0.9), shrink=0.5)
    cluster = sim.make_cluster(4, 1.0, slowdown=2.0, bandwidth=1e5, latency=1e-3)
    problem = cases.tiny_problem()
    result = sim.simulate(
      spec, cluster, batch_size=16, problem=problem, num_samples=1600, num_evals=2, seed=1
    )
    assert result.iterations[0] < result.iterations[1]  # worker 0 is twice as slow
    assert result.messages == [0, 0, 0, 0] and result.wait_time == [0.0] * 4
    assert result.evals[-1].test_accuracy > result.evals[0].test_accuracy + 0.2
    assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(result.params))
    timing = sim.simulate(spec, cluster, batch_size=16, model_bytes=1e3, until_time=40.0)
    assert timing.iterations == [20, 40, 40, 40] and timing.params is None
    assert jnp.shape(result.params["w"]) == (10, 3)
  finally:
    algorithms.unregister("local_only")
  assert algorithms.names() == before_names
