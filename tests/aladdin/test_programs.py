"""Both engines run each algorithm's one worker program: on the same batches, the simulator's
training compute and the Ray runtime's iteration (its transport faked in-process: no cluster)
send the same messages, bit for bit, and end with the same models.

The transports stay each engine's own: the PS shard's receive on the flat model against the
simulator's server on the tree (equal bit for bit too), the reducer's sum against the
simulator's (XLA fuses the sum over the workers with each worker's sums over its batch, so the
two agree to rounding only: the fake reducer checks that and hands on the simulator's sum, so
that the workers' steps are compared bit for bit on the same input)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from optax_lena import aladdin as al
from optax_lena._src.aladdin import algorithms
from optax_lena._src.aladdin.ray import iterations as ray_iterations
from optax_lena._src.aladdin.ray.layout import FlatLayout
from optax_lena._src.aladdin.ray.rendezvous import total
from optax_lena._src.aladdin.ray.shard import folded_receive
from optax_lena._src.aladdin.sim.compute import Training
from optax_lena._src.aladdin.sim.engine import SimWorker
from tests.aladdin import simulator_cases as cases

N, ROUNDS, BATCH = 3, 4, 8
LOCAL = optax.sgd(0.1, momentum=0.9)
SPECS = {
  "aladdin": dict(worker_tx=LOCAL, period=2),
  "aladdin_gradient": dict(worker_tx=LOCAL, message="gradient", server_tx=optax.sgd(0.1)),
  "asp": dict(server_tx=optax.sgd(0.1, momentum=0.9)),
  "easgd": dict(worker_tx=LOCAL, tau=2),
  "ar_sgd": dict(worker_tx=LOCAL),
  "sgp": dict(worker_tx=LOCAL),
}


def bits(x: Any) -> bytes:
  return np.ascontiguousarray(np.asarray(x)).tobytes()


def assert_same_tree(a: Any, b: Any) -> None:
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    assert np.asarray(x).dtype == np.asarray(y).dtype and bits(x) == bits(y)


class Outbox:
  """The PS shard's own receive (``folded_receive``) on the flat model, called in-process."""

  def __init__(self, spec: Any, layout: FlatLayout, params: Any, worker: int, shared: dict):
    if "state" not in shared:
      server = spec.server(N)
      period = algorithms.entry(spec.name).engine("ray").plan(spec).period
      shared["receive"] = jax.jit(folded_receive(server, period))
      shared["state"] = server.init(jnp.asarray(layout.to_vector(params)))
    self.shared, self.worker, self.sent, self.replies = shared, worker, [], []

  def push(self, message: np.ndarray, finite: bool) -> float:
    self.sent.append(message.copy())
    state, n, alphas, params = self.shared["receive"](
      self.shared["state"], message[None], np.asarray([finite]), np.int32(self.worker)
    )
    self.shared["state"], n = state, int(n)
    self.replies.append([(np.asarray(params)[:n], np.asarray(alphas)[:n]) if n else None])
    return 0.0

  def flush(self) -> float:
    return 0.0

  def take(self) -> list[list[Any]]:
    replies, self.replies = self.replies, []
    return replies


class Reducers:
  """AR-SGD's barrier for workers on threads: the reducer's own sum, checked against the
  simulator's (``totals``, one per round), which it returns."""

  def __init__(self, totals: list[np.ndarray]) -> None:
    self.cond, self.parts, self.sent, self.totals = threading.Condition(), {}, {}, totals

  def allreduce(self, step: int, worker: int, flat: np.ndarray) -> np.ndarray:
    with self.cond:
      self.sent[step, worker] = flat.copy()
      self.parts.setdefault(step, {})[worker] = flat
      self.cond.notify_all()
      self.cond.wait_for(lambda: len(self.parts[step]) == N)
      own = total([self.parts[step][i] for i in range(N)])
      np.testing.assert_allclose(own, self.totals[step], rtol=1e-6, atol=1e-7)
      return self.totals[step]


class Mailbox:
  def __init__(self) -> None:
    self.slots: dict[Any, Any] = {}
    self.sent: list[Any] = []

  def post(self, node: int, step: int, message: Any) -> None:
    self.sent.append(message)
    self.slots[node, step] = message

  def request(self, node: int, step: int) -> Any:
    return node, step

  def receive(self, handle: Any, timeout: float | None) -> Any:
    return self.slots.pop(handle, None)


def run_ray(
  spec: Any, problem: Any, batches: list[list[Any]], totals: list[np.ndarray]
) -> tuple[list[Any], list[Any]]:
  """The Ray iterations of the n workers, deterministic round-robin (``run(sync=True)``)."""
  layout = FlatLayout(problem.params, 1)
  shared: dict[str, Any] = {}
  transport: Any = Reducers(totals) if spec.synchronous else Mailbox()
  iterations = []
  for i in range(N):
    program = spec.program(problem.loss_fn, N)
    link = Outbox(spec, layout, problem.params, i, shared) if spec.server(N) else transport
    local = ray_iterations.Local(
      i, program, layout, program.init(problem.params), iter(batches[i]), link, N
    )
    iterations.append(algorithms.entry(spec.name).engine("ray")(local, spec))

  def one(it: Any) -> None:
    it.local.iteration += it.iterate(True, None).iterations

  for _ in range(ROUNDS):
    if spec.synchronous:
      threads = [threading.Thread(target=one, args=(it,)) for it in iterations]
      [t.start() for t in threads]
      [t.join() for t in threads]
    else:
      [one(it) for it in iterations]
  if spec.synchronous:
    sent = [transport.sent[k, i] for k in range(ROUNDS) for i in range(N)]
  elif spec.server(N) is None:
    sent = transport.sent
  else:
    sent = [m for it in iterations for m in it.local.transport.sent]
  return sent, [it.local_params() for it in iterations]


def run_sim(
  spec: Any, problem: Any, batches: list[list[Any]], totals: list[np.ndarray]
) -> tuple[list[Any], list[Any]]:
  """The simulator's training compute, driven in the same order as the processes drive it."""
  compute = Training(spec, problem, N)
  workers = [SimWorker(i, np.random.default_rng(i)) for i in range(N)]
  compute.start(workers, batch_size=BATCH, seed=0, profile=False)
  for w in workers:
    w.batches = iter(batches[w.index])  # the same list for both engines
  sent: dict[int, list[Any]] = {i: [] for i in range(N)}
  ordered: list[Any] = []
  inbox: dict[tuple[int, int], Any] = {}
  gossip = spec.gossip(N) if spec.name == "sgp" else None
  served = spec.server(N) is not None
  for k in range(ROUNDS):
    if spec.synchronous:
      messages, summed = compute.cluster_step(workers)
      ordered += [jax.tree.map(lambda m, i=i: m[i], messages) for i in range(N)]
      totals.append(FlatLayout(problem.params, 1).to_vector(summed))
      continue
    for w in workers:
      message = compute.step(w)
      if spec.name == "sgp":
        ordered.append(message)
        inbox[gossip.peer(w.index, k), k] = message
        if k >= 1:
          compute.apply(w, inbox.pop((w.index, k - 1)))
        continue
      if not served or (isinstance(spec, al.Symmetric) and (k + 1) % spec.exchange_every):
        continue
      sent[w.index].append(message)
      reply = compute.receive(w, message)
      if bool(reply.ready):  # merged before the worker's next step
        compute.apply(w, reply)
  if not ordered:
    ordered = [m for i in range(N) for m in sent[i]]
  return ordered, [compute.program.params(w.state) for w in workers]


def problem_and_batches() -> tuple[Any, list[list[Any]], Any]:
  """The tiny problem from random parameters, and every worker's batches."""
  problem = cases.tiny_problem()
  rng = np.random.default_rng(1)
  params = jax.tree.map(
    lambda p: jnp.asarray(rng.normal(size=p.shape) * 0.1, p.dtype), problem.params
  )
  problem = dataclasses.replace(problem, params=params)
  idx = rng.integers(0, len(problem.x_train), size=(N, ROUNDS, BATCH))
  batches = [[(problem.x_train[j], problem.y_train[j]) for j in idx[i]] for i in range(N)]
  return problem, batches, params


@pytest.mark.parametrize("case", sorted(SPECS))
def test_both_engines_run_the_same_program_bit_for_bit(case: str) -> None:
  problem, batches, params = problem_and_batches()
  spec = al.algorithm(case.split("_gradient")[0], **SPECS[case])
  layout = FlatLayout(problem.params, 1)
  totals: list[np.ndarray] = []  # AR-SGD's all-reduce sums, per round
  sim_sent, sim_models = run_sim(spec, problem, batches, totals)
  ray_sent, ray_models = run_ray(spec, problem, batches, totals)
  assert len(sim_sent) == len(ray_sent) >= N * ROUNDS // (2 if case == "easgd" else 1)
  for s, r in zip(sim_sent, ray_sent, strict=True):
    if spec.name == "sgp":
      assert bits(layout.to_vector(s[0])) == bits(r[0]) and float(s[1]) == r[1]
    else:
      assert bits(layout.to_vector(s)) == bits(r)
  for s, r in zip(sim_models, ray_models, strict=True):
    assert_same_tree(s, r)
  # The runs trained: the models moved away from the start.
  assert not np.array_equal(layout.to_vector(sim_models[0]), layout.to_vector(params))
