"""What the simulated workers and servers compute: one compute object per algorithm.

:class:`Compute` is the timing-only mode: every computation does nothing and returns None (the
messages carry sizes only). A training compute (:class:`Training` and one subclass per
algorithm) owns the jitted functions of one algorithm on one problem for ``n`` workers, so that
they are compiled once for as long as the :class:`~optax_lena._src.aladdin.simulator.Simulator`
that made it lives, and holds the run's state (the server's, and each worker's in its record).
"""

from __future__ import annotations

import dataclasses
import math
import time as _time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_lena._src.aladdin.worker import local_step, worker_merge

PyTree = Any


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


class Timer:
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


class Batches:
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


@dataclasses.dataclass(eq=False)
class Local:
  """A worker's training state (``Worker.model``): its batches, model and optimizer state."""

  batches: Batches
  params: PyTree = None
  opt_state: Any = None
  weight: Any = None  # SGP's push-sum weight


class Compute:
  """The timing-only mode: nothing is computed, every message carries None.

  The hooks a process calls (each algorithm uses some of them): ``step`` (a worker's local
  iteration, returns its message), ``gradient`` (a gradient at the worker's model),
  ``cluster_step`` (one synchronous step of all workers), ``receive`` (the server processes a
  message, returns its reply), ``merge`` (a worker applies a reply), ``mix`` (a worker mixes a
  peer's message), ``evaluate``."""

  evals: list[EvalPoint]

  def start(self, workers: Sequence[Any], *, batch_size: int, seed: int, timer: Timer) -> None:
    del workers, batch_size, seed, timer
    self.evals = []

  def step(self, worker: Any) -> Any:
    return None

  def gradient(self, worker: Any) -> Any:
    return None

  def cluster_step(self, workers: Sequence[Any]) -> None:
    return None

  def receive(self, worker: Any, message: Any) -> Any:
    return None

  def merge(self, worker: Any, reply: Any) -> None:
    return None

  def mix(self, worker: Any, message: Any) -> None:
    return None

  def evaluate(self, time: float, samples: int, iterations: float) -> None:
    return None

  def final_params(self) -> PyTree:
    return None

  @property
  def jax_time(self) -> float:
    return 0.0


def _mean_models(models: list[PyTree]) -> PyTree:
  return jax.tree.map(lambda *v: sum(v[1:], v[0]) / len(v), *models)


class Training(Compute):
  """The training mode's shared part: batches, losses, evaluations (subclass per algorithm).

  Subclasses build their jitted functions in :meth:`build` (once) and their run state in
  :meth:`reset` (every run), and implement :meth:`eval_params` (the evaluated model) and, when
  the workers' models differ from it, :meth:`local_models`."""

  def __init__(self, spec: Any, problem: Problem, num_workers: int):
    self.spec, self.problem, self.n = spec, problem, num_workers
    # Device scalars of the worker indices, made once (a jnp.int32(i) per message would cost
    # more host time than the simulator's own bookkeeping).
    self.worker_ids = [jnp.asarray(i, jnp.int32) for i in range(num_workers)]
    self.x_test = jnp.asarray(problem.x_test)
    self.y_test = jnp.asarray(problem.y_test)
    loss_fn, accuracy_fn = problem.loss_fn, problem.accuracy_fn
    self.eval_fn = jax.jit(lambda p, x, y: (loss_fn(p, (x, y)), accuracy_fn(p, (x, y))))
    self.mean_models = jax.jit(_mean_models)
    self.merge_fn = jax.jit(worker_merge)
    self.build()

  def build(self) -> None:
    """Builds the algorithm's jitted functions."""

  def reset(self, workers: Sequence[Any]) -> None:
    """Sets the initial state of a run (the workers' ``model`` has its batches already)."""

  def start(self, workers: Sequence[Any], *, batch_size: int, seed: int, timer: Timer) -> None:
    self.evals = []
    self.losses: list[Any] = []
    self.timer = timer
    # One generator per worker, derived from (seed, worker): a worker's batches do not depend
    # on the other workers' speeds.
    for w in workers:
      w.model = Local(Batches(self.problem, batch_size, np.random.default_rng([seed, w.index])))
    self.workers = workers
    self.reset(workers)

  def eval_params(self) -> PyTree:
    raise NotImplementedError

  def local_models(self) -> list[PyTree] | None:
    return None

  def worker_tx(self) -> optax.GradientTransformation:
    self.spec.check_trainable()
    return self.spec.worker_tx

  def next_batch(self, worker: Any) -> tuple[np.ndarray, np.ndarray]:
    return worker.model.batches.next()

  def merge(self, worker: Any, reply: Any) -> None:
    m = worker.model
    m.params = self.timer(self.merge_fn, m.params, reply.params, reply.alpha)

  def evaluate(self, time: float, samples: int, iterations: float) -> None:
    loss, acc = self.timer(self.eval_fn, self.eval_params(), self.x_test, self.y_test)
    train_loss = float(jnp.mean(jnp.stack(self.losses))) if self.losses else math.nan
    self.losses = []
    local_acc = math.nan
    locals_ = self.local_models()
    if locals_ is not None:
      mean = self.timer(self.mean_models, locals_)
      _, acc_locals = self.timer(self.eval_fn, mean, self.x_test, self.y_test)
      local_acc = float(acc_locals)
    self.evals.append(
      EvalPoint(time, samples, iterations, train_loss, float(loss), float(acc), local_acc)
    )

  def final_params(self) -> PyTree:
    return self.eval_params()

  @property
  def jax_time(self) -> float:
    return self.timer.total


class AladdinTraining(Training):
  """Local steps that produce the message, the server's ``receive``, the merge."""

  def build(self) -> None:
    self.server = self.spec.server(self.n)
    self.receive_fn = jax.jit(self.server.receive)
    self.step_fn = jax.jit(self.spec.worker_step(self.problem.loss_fn))

  def reset(self, workers: Sequence[Any]) -> None:
    params = self.problem.params
    self.server_state = self.server.init(params)
    opt_state = self.worker_tx().init(params)
    for w in workers:
      w.model.params, w.model.opt_state = params, opt_state

  def step(self, worker: Any) -> Any:
    m = worker.model
    m.params, m.opt_state, message, loss = self.timer(
      self.step_fn, m.params, m.opt_state, self.next_batch(worker)
    )
    self.losses.append(loss)
    return message

  def receive(self, worker: Any, message: Any) -> Any:
    self.server_state, reply = self.timer(
      self.receive_fn, self.server_state, message, self.worker_ids[worker.index]
    )
    return reply

  def eval_params(self) -> PyTree:
    return self.server_state.params

  def local_models(self) -> list[PyTree]:
    return [w.model.params for w in self.workers]


class ArSgdTraining(Training):
  """The n workers' gradients at one model, their mean (the all-reduce), one step."""

  def build(self) -> None:
    tx = self.worker_tx()
    grad = jax.value_and_grad(self.problem.loss_fn)

    def step(params, opt_state, xs, ys):
      losses, grads = jax.vmap(lambda x, y: grad(params, (x, y)))(xs, ys)
      mean = jax.tree.map(lambda g: jnp.mean(g, axis=0), grads)
      updates, opt_state = tx.update(mean, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, jnp.mean(losses)

    self.step_fn = jax.jit(step)

  def reset(self, workers: Sequence[Any]) -> None:
    self.params = self.problem.params
    self.opt_state = self.worker_tx().init(self.params)

  def cluster_step(self, workers: Sequence[Any]) -> None:
    batches = [self.next_batch(w) for w in workers]
    xs = np.stack([b[0] for b in batches])
    ys = np.stack([b[1] for b in batches])
    self.params, self.opt_state, loss = self.timer(
      self.step_fn, self.params, self.opt_state, xs, ys
    )
    self.losses.append(loss)

  def eval_params(self) -> PyTree:
    return self.params


class AspTraining(Training):
  """A gradient at the worker's copy of x~; the server applies it and answers x~."""

  def build(self) -> None:
    self.server = self.spec.server(self.n)
    self.receive_fn = jax.jit(self.server.receive)
    self.grad_fn = jax.jit(jax.value_and_grad(self.problem.loss_fn))

  def reset(self, workers: Sequence[Any]) -> None:
    self.server_state = self.server.init(self.problem.params)
    self.global_params = self.problem.params
    for w in workers:
      w.model.params = self.problem.params

  def gradient(self, worker: Any) -> Any:
    loss, grads = self.timer(self.grad_fn, worker.model.params, self.next_batch(worker))
    self.losses.append(loss)
    return grads

  def receive(self, worker: Any, message: Any) -> Any:
    self.server_state, reply = self.timer(
      self.receive_fn, self.server_state, message, self.worker_ids[worker.index]
    )
    self.global_params = reply.params
    return reply

  def eval_params(self) -> PyTree:
    return self.global_params


class EasgdTraining(AladdinTraining):
  """Local steps; the server's elastic exchange with the worker's current model."""

  def build(self) -> None:
    self.server = self.spec.server(self.n)
    self.receive_fn = jax.jit(self.server.receive)
    self.step_fn = jax.jit(local_step(self.problem.loss_fn, self.worker_tx(), message="gradient"))

  def receive(self, worker: Any, message: Any) -> Any:
    # The worker waits for the answer, so its model is the one it sent.
    return super().receive(worker, worker.model.params)


class SgpTraining(Training):
  """Push-sum: the local step on the de-biased model, halving, mixing (``al.sgp``'s pieces)."""

  def build(self) -> None:
    tx = self.worker_tx()
    grad = jax.value_and_grad(self.problem.loss_fn)
    gossip = self.gossip = self.spec.gossip(self.n)

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

    self.step_fn = jax.jit(step)
    self.mix_fn = jax.jit(gossip.mix)
    self.debias_fn = jax.jit(mean_debiased)

  def reset(self, workers: Sequence[Any]) -> None:
    opt_state = self.worker_tx().init(self.problem.params)
    for w in workers:
      w.model.params, w.model.weight = self.problem.params, jnp.ones([], jnp.float32)
      w.model.opt_state = opt_state

  def step(self, worker: Any) -> Any:
    m = worker.model
    m.params, m.weight, m.opt_state, loss = self.timer(
      self.step_fn, m.params, m.weight, m.opt_state, self.next_batch(worker)
    )
    self.losses.append(loss)
    return (m.params, m.weight)

  def mix(self, worker: Any, message: Any) -> None:
    m = worker.model
    m.params, m.weight = self.timer(self.mix_fn, m.params, m.weight, *message)

  def eval_params(self) -> PyTree:
    # The average of the workers' de-biased models.
    return self.debias_fn(
      [w.model.params for w in self.workers], [w.model.weight for w in self.workers]
    )
