"""One problem description and one result vocabulary for both engines: a ``sim.Problem`` is the
Ray runtime's task (``ad.Task.from_problem``, the simulator's batches), and both engines'
results follow ``al.Result`` with the same meanings."""

import math

import numpy as np
import optax
import pytest

from optax_lena import aladdin as al
from optax_lena._src.aladdin.ray.config import Task
from optax_lena._src.aladdin.ray.records import RunResult
from optax_lena._src.aladdin.sim import compute as sim_compute
from optax_lena.aladdin import simulator as sim
from tests.aladdin import simulator_cases as cases


@pytest.fixture(scope="module")
def problem():
  return cases.tiny_problem()


def test_a_problem_is_the_ray_task_with_the_simulators_batches(problem):
  task = Task.from_problem(problem, 16)
  assert (task.loss_fn, task.init_params, task.batch_size) == (problem.loss_fn, problem.params, 16)
  for worker, seed in ((0, 0), (3, 7)):
    # The simulator's stream of that worker (Training.start), over more than an epoch of 500.
    ours = sim_compute.batch_stream(
      problem.x_train, problem.y_train, 16, np.random.default_rng([seed, worker])
    )
    theirs = task.batches(worker, seed)
    for _ in range(40):
      for a, b in zip(next(ours), next(theirs), strict=True):
        np.testing.assert_array_equal(a, b)
  first = [next(task.batches(w, 0))[1] for w in (0, 1)]
  assert not np.array_equal(*first)  # each worker its own order


@pytest.mark.parametrize("name", ["aladdin", "ar_sgd"])
def test_a_simulator_result_follows_the_shared_vocabulary(problem, name):
  cluster = sim.make_cluster(4, 1.0, slowdown=3.0, bandwidth=1e5, latency=1e-3)
  spec = sim.algorithm(name, optimizer=optax.sgd(0.05, momentum=0.9))
  r = sim.simulate(spec, cluster, batch_size=16, problem=problem, num_samples=1600, num_evals=4)
  assert isinstance(r, al.Result)
  assert r.algorithm == name and r.throughput == pytest.approx(r.samples / r.time)
  # The share of the (simulated) run each worker waited: AR-SGD's fast workers wait at the
  # barrier, ALADDIN's never.
  assert r.wait_fraction == [w / r.time for w in r.wait_time]
  assert all(0.0 <= f <= 1.0 for f in r.wait_fraction)
  assert (max(r.wait_fraction) > 0.3) == (name == "ar_sgd")
  # (seconds, metric) of the evaluated model: the test accuracy, from time 0 to the end.
  assert r.curve == [(e.time, e.test_accuracy) for e in r.evals]
  assert r.curve[0][0] == 0.0 and r.curve[-1] == (r.time, r.final_accuracy)
  assert r.final_params is r.params
  # summary() is unchanged: the fields only (the studies' recorded results).
  assert "wait_fraction" not in r.summary() and "curve" not in r.summary()


def test_a_ray_result_follows_the_shared_vocabulary():
  r = RunResult(
    algorithm="aladdin",
    wall_s=2.0,
    samples=64,
    throughput=32.0,
    iterations=[2, 2],
    wait_fraction=[0.0, 0.25],
    compute_fraction=[1.0, 0.75],
    merges=[0, 1],
    curve=[(1.0, 0.5), (2.0, 0.75)],
    curve_iterations=[2, 4],
    shards=[],
    workers=[],
    final_params={"w": np.zeros(3)},
  )
  assert isinstance(r, al.Result)
  assert not isinstance(object(), al.Result)
  assert math.isclose(r.summary()["throughput"], 32.0)
