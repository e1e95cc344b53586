"""The ALADDIN cluster simulator: determinism, event order, the cost model against hand
calculations, and training on a tiny problem with every algorithm."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from optax_lena import aladdin as al
from optax_lena._src.aladdin.sim import cluster as cl
from optax_lena._src.aladdin.sim import compute as sim_compute
from optax_lena._src.aladdin.sim import simulator as sim
from tests.aladdin import simulator_cases as cases

# A toy cluster for hand calculations: 1 s per iteration, 0.1 s of wire per message, no latency,
# no PS processing cost, every worker and the PS on NICs of their own.
WIRE = 0.1
TOY = dict(bandwidth=1000.0, latency=0.0, ps_cost_per_byte=0.0)
NBYTES = WIRE * TOY["bandwidth"]


def toy(n, slowdown=1.0, **kwargs):
  return cl.make_cluster(n, 1.0, slowdown=slowdown, **{**TOY, **kwargs})


def timing(name, cluster, until, **options):
  return sim.simulate(
    sim.algorithm(name, **options), cluster, batch_size=1, model_bytes=NBYTES, until_time=until
  )


# ------------------------------------------------------------------------------------------------
# Timing-only mode against hand calculations
# ------------------------------------------------------------------------------------------------


def test_aladdin_workers_never_wait_and_send_in_proportion_to_speed():
  r = sim.simulate(
    sim.algorithm("aladdin"),
    toy(4, slowdown=10.0),
    batch_size=1,
    model_bytes=NBYTES,
    until_time=1000.0,
    record_events=True,
  )
  assert r.wait_time == [0.0] * 4
  # Worker 0 is 10x slower: it computed and sent 10x fewer gradients (100 vs 1000 in 1000 s).
  assert r.messages == [100, 1000, 1000, 1000]
  assert r.iterations == r.messages
  # Events come out in time order, and worker 0's computations are 10 s apart.
  times = [t for t, _, _ in r.events]
  assert times == sorted(times)
  w0 = [t for t, kind, w in r.events if kind == "compute" and w == 0]
  assert np.allclose(np.diff(w0), 10.0)
  # Each worker got one reply per `period` = 4 gradients (those in flight at the end aside).
  replies = [sum(1 for _, k, w in r.events if k == "reply" and w == i) for i in range(4)]
  assert 24 <= replies[0] <= 25 and all(249 <= x <= 250 for x in replies[1:])
  # Speed-up over one normal worker: 3 + 1/10.
  assert r.throughput == pytest.approx(3.1, rel=1e-3)


def test_ar_sgd_iteration_time_is_slowest_worker_plus_ring_allreduce():
  c = toy(4, slowdown=3.0, latency=0.01)
  r = timing("ar_sgd", c, until=1000.0)
  allreduce = 2 * 3 / 4 * WIRE + 2 * 3 * 0.01  # 2 (n-1)/n b/B + 2 (n-1) latency
  assert c.allreduce_time(NBYTES) == pytest.approx(allreduce)
  per_iteration = 3.0 + allreduce
  iters = math.floor(1000.0 / per_iteration)
  assert r.samples == 4 * iters  # an iteration counts once its all-reduce is done
  # Fast workers wait for the slow one and for the all-reduce; the slow one for the all-reduce.
  assert r.wait_time[0] == pytest.approx(iters * allreduce)
  assert r.wait_time[1] == pytest.approx(iters * (2.0 + allreduce))
  assert r.throughput * per_iteration == pytest.approx(4.0, rel=0.01)


def test_asp_worker_waits_for_the_round_trip():
  # One worker: compute 1 s, gradient up 0.1 s, PS (cost per byte 1e-3 s -> 0.1 s per message,
  # doubled for the update: 0.2 s), parameters back 0.1 s.
  c = toy(1, ps_cost_per_byte=1e-3)
  r = timing("asp", c, until=1000.0)
  per_iteration = 1.0 + WIRE + 0.2 + WIRE
  assert r.iterations[0] == math.floor(1000.0 / per_iteration)
  assert r.wait_time[0] == pytest.approx(r.iterations[0] * (per_iteration - 1.0))
  # Four workers: they stagger behind the shared PS link, then each waits 0.2 s per iteration.
  r4 = timing("asp", toy(4), until=3000.0)
  assert min(r4.wait_time) > 0.19 * min(r4.iterations)
  assert r4.throughput == pytest.approx(4 / 1.2, rel=0.01)


def test_easgd_exchanges_every_tau_iterations_and_waits():
  r = timing("easgd", toy(1), until=1000.0, tau=2)
  # Two iterations (2 s) then model up and back (0.2 s): 2.2 s per exchange.
  assert r.messages[0] == math.floor(1000.0 / 2.2)
  assert r.throughput == pytest.approx(2 / 2.2, rel=0.01)
  assert r.wait_time[0] == pytest.approx(r.messages[0] * 0.2, rel=0.01)


def test_sgp_gossip_overlaps_one_iteration_and_is_held_back_by_a_slow_peer():
  ho = timing("sgp", toy(8), until=1000.0)
  assert ho.wait_time == [0.0] * 8  # a 0.1 s message arrives within the 1 s next iteration
  assert ho.throughput == pytest.approx(8.0, rel=0.01)
  he = timing("sgp", toy(8, slowdown=10.0), until=5000.0)
  # Every worker needs its in-peer's message of the previous iteration: the slow worker's
  # progress bounds everyone's within a few iterations (the strong graph is connected).
  assert max(he.iterations) - min(he.iterations) <= 8
  assert he.throughput == pytest.approx(0.8, rel=0.05)


def test_ps_shards_and_shared_nics():
  # A 100x slower PS (cost 1e-2 s per byte on 100-byte messages = 1 s per gradient) is the
  # bottleneck of 4 ALADDIN workers: 1 message per second in total, not 4.
  slow_ps = timing("aladdin", toy(4, ps_cost_per_byte=1e-2, num_shards=1), until=2000.0)
  assert slow_ps.throughput == pytest.approx(4.0, rel=1e-3)  # workers still never wait...
  assert slow_ps.wait_time == [0.0] * 4
  # ...but the PS falls behind: replies come late. Two shards halve the per-shard work.
  one = timing("asp", toy(4, ps_cost_per_byte=1e-2, num_shards=1), until=2000.0)
  two = timing("asp", toy(4, ps_cost_per_byte=1e-2, num_shards=2), until=2000.0)
  assert one.throughput == pytest.approx(1 / 2.0, rel=0.02)  # PS: 2 s per gradient (update)
  assert two.throughput == pytest.approx(1 / 1.0, rel=0.02)
  # Four PS shards with their own NICs: a worker's four 0.1875 s slices leave one after another
  # and each shard answers as soon as its slice is in, so the replies overlap the sends: an
  # iteration takes 1 + 4 x 0.1875 + 0.1875 s. Four workers sharing one NIC: its uplink carries
  # 4 x 0.75 s per round, so a round takes 3 s.
  kwargs = dict(bandwidth=NBYTES / 0.75, num_shards=4)
  own = timing("asp", toy(4, **kwargs), until=3000.0)
  shared = timing("asp", toy(4, workers_per_machine=4, **kwargs), until=3000.0)
  assert toy(4, workers_per_machine=4).worker_nic(3) == 0
  assert own.throughput == pytest.approx(4 / (1 + 5 * 0.1875), rel=0.01)
  assert shared.throughput == pytest.approx(4 / 3.0, rel=0.01)


def test_aladdin_send_buffer_throttles_a_worker_whose_uplink_cannot_keep_up():
  # Two workers share a NIC and each gradient takes 0.75 s on it: 1.5 s of uplink per 1 s round.
  kwargs = dict(workers_per_machine=2, bandwidth=NBYTES / 0.75)
  unbounded = timing("aladdin", toy(2, **kwargs), until=3000.0)
  assert unbounded.wait_time == [0.0, 0.0] and unbounded.throughput == pytest.approx(2.0, 1e-3)
  bounded = timing("aladdin", toy(2, send_buffer=1, **kwargs), until=3000.0)
  assert bounded.throughput == pytest.approx(2 / 1.5, rel=0.01)
  assert min(bounded.wait_time) > 0.45 * min(bounded.iterations)


def test_jitter_is_seeded_and_dephases_equal_workers():
  c = toy(4, jitter=0.2)
  runs = [
    sim.simulate(
      sim.algorithm("aladdin"),
      c,
      batch_size=1,
      model_bytes=NBYTES,
      until_time=200.0,
      seed=seed,
      record_events=True,
    )
    for seed in (0, 0, 1)
  ]
  assert runs[0].events == runs[1].events and runs[0].events != runs[2].events
  # Equal workers no longer finish together, and the mean compute time stays 1 s.
  first = [t for t, kind, _ in runs[0].events if kind == "compute"][:4]
  assert len(set(first)) == 4 and all(0.8 <= t < 1.2 for t in first)
  assert runs[0].throughput == pytest.approx(4.0, rel=0.05)
  with pytest.raises(ValueError, match="jitter"):
    toy(2, jitter=1.0)


def test_paper_cluster_speedups_are_ordered_like_the_paper():
  model = cl.PAPER_MODELS["ResNet-50"]
  speedup = {}
  for name, factor in cl.PAPER_SLOWDOWNS.items():
    c = cl.paper_cluster(model.compute_time, factor)
    for alg in ("aladdin", "ar_sgd"):
      r = sim.simulate(
        sim.algorithm(alg),
        c,
        batch_size=model.batch_size,
        model_bytes=model.nbytes,
        until_time=30 * max(c.compute_time),
      )
      speedup[alg, name] = r.throughput * model.compute_time / model.batch_size
  for name in ("HE0", "HE1", "HE2"):
    assert speedup["aladdin", name] > speedup["ar_sgd", name]
  assert speedup["ar_sgd", "HE2"] < 0.1 < 6.5 < speedup["aladdin", "HE2"]
  c = cl.paper_cluster(1.0)
  assert cl.calibrated_compute_time(model, 5.40, c) == pytest.approx(
    5.40 * c.allreduce_time(model.nbytes) / (8 - 5.40)
  )


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="Unknown algorithm"):
    sim.algorithm("hogwild")
  with pytest.raises(ValueError, match="period must be >= 1"):
    sim.algorithm("aladdin", period=0)
  with pytest.raises(ValueError, match="tau must be an int >= 1"):
    sim.algorithm("easgd", tau=0)
  with pytest.raises(ValueError, match=r"ASP's workers have no optimizer.*as server_tx"):
    sim.algorithm("asp", worker_tx=optax.sgd(0.1))
  with pytest.raises(ValueError, match="needs the workers' optimizer"):
    sim.Simulator(sim.algorithm("sgp"), _toy_problem())
  with pytest.raises(ValueError, match="never ends"):
    sim.simulate(sim.algorithm("aladdin"), toy(2), batch_size=1, model_bytes=1.0)
  with pytest.raises(ValueError, match="model_bytes"):
    sim.simulate(sim.algorithm("aladdin"), toy(2), batch_size=1, until_time=1.0)
  with pytest.raises(ValueError, match="compute_time"):
    cl.Cluster((1.0, 0.0))


# ------------------------------------------------------------------------------------------------
# Training mode
# ------------------------------------------------------------------------------------------------


# The tiny softmax-regression problem of the recorded runs (simulator_cases.py).
_loss = cases.loss_fn
_toy_problem = cases.tiny_problem


@pytest.fixture(scope="module")
def problem():
  return _toy_problem()


LOCAL = optax.sgd(0.05, momentum=0.9)
ALGS = {
  "aladdin": dict(worker_tx=LOCAL),  # the recipe's defaults
  "ar_sgd": dict(worker_tx=optax.sgd(0.2, momentum=0.9)),
  "asp": dict(server_tx=optax.sgd(0.05)),
  "easgd": dict(worker_tx=LOCAL),
  "sgp": dict(worker_tx=LOCAL),
}


def _train(problem, name, seed=0, slowdown=3.0, **kwargs):
  cluster = cl.make_cluster(4, 1.0, slowdown=slowdown, bandwidth=1e5, latency=1e-3)
  return sim.simulate(
    sim.algorithm(name, **ALGS[name]),
    cluster,
    batch_size=16,
    problem=problem,
    num_samples=3200,
    num_evals=4,
    seed=seed,
    **kwargs,
  )


@pytest.mark.parametrize("name", sim.ALGORITHMS)
def test_training_reduces_the_loss(problem, name):
  r = _train(problem, name)
  first, last = r.evals[0], r.evals[-1]
  assert r.samples >= 3200 and len(r.evals) == 5
  assert last.test_loss < 0.8 * first.test_loss
  assert last.test_accuracy > 0.8
  assert [p.time for p in r.evals] == sorted(p.time for p in r.evals)
  assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(r.params))


def test_same_seed_same_trajectory_bitwise(problem):
  a = _train(problem, "aladdin", seed=3, record_events=True)
  b = _train(problem, "aladdin", seed=3, record_events=True)
  c = _train(problem, "aladdin", seed=4)
  assert a.events == b.events
  assert [dataclass_tuple(p) for p in a.evals] == [dataclass_tuple(p) for p in b.evals]
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert any(
    not np.array_equal(np.asarray(x), np.asarray(y))
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(c.params), strict=True)
  )


def dataclass_tuple(point):
  return (point.time, point.samples, point.train_loss, point.test_loss, point.test_accuracy)


def test_profiling_times_the_jax_calls_and_changes_nothing_else(problem):
  plain = _train(problem, "aladdin", seed=3, record_events=True)
  profiled = _train(problem, "aladdin", seed=3, record_events=True, profile=True)
  assert plain.jax_time == 0.0 < profiled.jax_time <= profiled.wall_time
  assert profiled.events == plain.events
  assert [dataclass_tuple(p) for p in profiled.evals] == [dataclass_tuple(p) for p in plain.evals]
  for x, y in zip(jax.tree.leaves(plain.params), jax.tree.leaves(profiled.params), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_training_follows_the_event_order(problem):
  # With alpha = 0 (no merges) every worker is plain local SGD on its own batch stream, so the
  # global model must equal a replay of the server on those messages in the simulated order in
  # which they reached the PS -- bitwise.
  options = dict(ALGS["aladdin"], alpha=0.0)
  cluster = cl.make_cluster(4, 1.0, slowdown=10.0, bandwidth=1e5, latency=1e-3)
  r = sim.simulate(
    sim.algorithm("aladdin", **options),
    cluster,
    batch_size=16,
    problem=problem,
    num_samples=3200,
    num_evals=0,
    seed=5,
    record_events=True,
  )
  computes = [w for _, kind, w in r.events if kind == "compute"]
  assert 9 * computes.count(0) <= computes.count(1) <= 10 * computes.count(0) + 10
  order = [w for _, kind, w in r.events if kind == "receive"]
  assert 0 < len(order) <= len(computes)

  step = jax.jit(al.local_step(_loss, options["worker_tx"], message="update"))
  server = al.parameter_server(4, optax.sgd(1.0), alpha=0.0)
  receive = jax.jit(server.receive)
  streams = [
    sim_compute.batch_stream(problem.x_train, problem.y_train, 16, np.random.default_rng([5, i]))
    for i in range(4)
  ]
  local = [(problem.params, options["worker_tx"].init(problem.params)) for _ in range(4)]
  state = server.init(problem.params)
  for w in order:
    params, opt_state, grads, _ = step(*local[w], next(streams[w]))
    local[w] = (params, opt_state)
    state, _ = receive(state, grads, jnp.int32(w))
  for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(r.params), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_message_modes_agree_with_plain_sgd_workers_in_the_simulator(problem):
  # The spec's message reaches the simulated workers: with plain SGD workers, update messages to
  # an sgd(1.0) server and gradient messages to an sgd(eta) server are one algorithm.
  eta = 0.05
  cluster = cl.make_cluster(4, 1.0, slowdown=3.0, bandwidth=1e5, latency=1e-3, jitter=0.1)
  results = {}
  for message, server_tx in (("update", None), ("gradient", optax.sgd(eta))):
    alg = sim.algorithm(
      "aladdin", worker_tx=optax.sgd(eta), message=message, server_tx=server_tx, alpha="count"
    )
    results[message] = sim.simulate(
      alg, cluster, batch_size=16, problem=problem, num_samples=1600, num_evals=2, seed=2
    )
  a, b = results["update"], results["gradient"]
  assert a.iterations == b.iterations and a.messages == b.messages
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)
  assert a.final_accuracy > 0.8
