"""What the simulated workers and servers compute: nothing in the timing-only mode
(:class:`Compute`), or the spec's worker program and server on a problem (:class:`Training`,
compiled once for as long as its simulator lives).
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

from optax_lena._src.aladdin.batches import batch_stream

PyTree = Any


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
  """A training problem for the simulator: a model, its loss and accuracy, host arrays.

  Each worker draws its mini-batches from ``(x_train, y_train)`` with its own generator, seeded
  by ``(seed, worker)``; the evaluated model is scored on ``(x_test, y_test)``.

  Attributes:
    params: the initial parameters, where every worker and the server start.
    loss_fn: ``loss_fn(params, (x, y)) -> scalar``, the mean loss over the batch.
    accuracy_fn: ``accuracy_fn(params, (x, y)) -> scalar`` in [0, 1].
    x_train: training inputs (NumPy, first axis the examples).
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


class Compute:
  """The timing-only mode: nothing is computed, every message carries None.

  The hooks a process calls: ``step`` (a worker's local iteration, returns its message),
  ``cluster_step`` (one synchronous step of all workers, returns their messages stacked and
  their sum), ``receive`` (the server processes a message, returns its reply), ``apply`` (a
  worker applies a reply or a peer's message), ``evaluate``."""

  evals: list[EvalPoint]
  jax_time = 0.0  # host seconds inside the JAX calls (when profiling)

  def start(self, workers: Sequence[Any], *, batch_size: int, seed: int, profile: bool) -> None:
    del workers, batch_size, seed, profile
    self.evals = []

  def step(self, worker: Any) -> Any:
    return None

  def cluster_step(self, workers: Sequence[Any]) -> Any:
    return None

  def receive(self, worker: Any, message: Any) -> Any:
    return None

  def apply(self, worker: Any, reply: Any) -> None:
    return None

  def evaluate(self, time: float, samples: int, iterations: float) -> None:
    return None

  def final_params(self) -> PyTree:
    return None


def average_in_leaf_precision(models: Sequence[PyTree]) -> PyTree:
  """The average of the workers' ``models``, computed in each leaf's own dtype.

  The models are added in worker order and the sum is divided by their number, every operation
  rounded to the leaf's dtype (float32 for a float32 model). The simulator evaluates SGP's model
  and ALADDIN's and EASGD's ``local_accuracy`` on this average. The Ray runtime averages SGP's
  models in float64 on its driver and rounds once to each leaf's dtype, so the engines' SGP
  models may differ in the last bits; the simulator keeps the leaf precision, which its recorded
  golden runs (``tests/aladdin/test_simulator_golden.py``) hold bit for bit.

  Args:
    models: the workers' models, pytrees of one structure.

  Returns:
    Their average, with the structure, shapes and dtypes of ``models[0]``.
  """
  return jax.tree.map(lambda *leaves: sum(leaves[1:], leaves[0]) / len(leaves), *models)


class Training(Compute):
  """The training mode: the spec's worker program and server on the problem's batches.

  The evaluated model is the server's (ALADDIN, ASP, EASGD), the one model of a synchronous
  algorithm (AR-SGD), or else the average of the workers' (SGP)."""

  def __init__(self, spec: Any, problem: Problem, num_workers: int):
    self.spec, self.problem = spec, problem
    # Device scalars of the worker indices, made once (a jnp.int32(i) per message would cost
    # more host time than the simulator's own bookkeeping).
    self.worker_ids = [jnp.asarray(i, jnp.int32) for i in range(num_workers)]
    self.x_test = jnp.asarray(problem.x_test)
    self.y_test = jnp.asarray(problem.y_test)
    loss_fn, accuracy_fn = problem.loss_fn, problem.accuracy_fn
    self.eval_fn = jax.jit(lambda p, x, y: (loss_fn(p, (x, y)), accuracy_fn(p, (x, y))))
    program = self.program = spec.program(loss_fn, num_workers)
    self.step_fn, self.apply_fn = jax.jit(program.step), jax.jit(program.apply)
    self.mean_params = jax.jit(
      lambda states: average_in_leaf_precision([program.params(s) for s in states])
    )
    self.server = spec.server(num_workers)
    if self.server is not None:
      self.receive_fn = jax.jit(self.server.receive)

    def cluster_step(state, xs, ys):
      # Every worker's message (gradient) at the one model, their sum (the all-reduce), and
      # the reply applied: all in one computation. (XLA may fuse the sum over the workers with
      # the sums over each batch, so its last bit may differ from a sum of the messages.)
      messages, losses = jax.vmap(lambda x, y: program.step(state, (x, y))[1:])(xs, ys)
      total = jax.tree.map(lambda g: jnp.sum(g, axis=0), messages)
      return program.apply(state, total), jnp.mean(losses), messages, total

    self.cluster_step_fn = jax.jit(cluster_step)

  def start(self, workers: Sequence[Any], *, batch_size: int, seed: int, profile: bool) -> None:
    self.evals = []
    self.losses: list[Any] = []
    self.profile, self.jax_time = profile, 0.0
    state = self.program.init(self.problem.params)
    # One generator per worker, derived from (seed, worker): a worker's batches do not depend
    # on the other workers' speeds.
    for w in workers:
      rng = np.random.default_rng([seed, w.index])
      w.batches = batch_stream(self.problem.x_train, self.problem.y_train, batch_size, rng)
      w.state = state
    self.workers = workers
    if self.server is not None:
      self.server_state = self.server.init(self.problem.params)

  def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; when profiling, waited for and its host seconds added to ``jax_time``."""
    if not self.profile:
      return fn(*args)
    start = _time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    self.jax_time += _time.perf_counter() - start
    return out

  def step(self, worker: Any) -> Any:
    worker.state, message, loss = self._run(self.step_fn, worker.state, next(worker.batches))
    self.losses.append(loss)
    return message

  def cluster_step(self, workers: Sequence[Any]) -> tuple[PyTree, PyTree]:
    xs, ys = (np.stack(part) for part in zip(*[next(w.batches) for w in workers], strict=True))
    state, loss, messages, total = self._run(self.cluster_step_fn, workers[0].state, xs, ys)
    for w in workers:
      w.state = state
    self.losses.append(loss)
    return messages, total

  def receive(self, worker: Any, message: Any) -> Any:
    self.server_state, reply = self._run(
      self.receive_fn, self.server_state, message, self.worker_ids[worker.index]
    )
    return reply

  def apply(self, worker: Any, reply: Any) -> None:
    worker.state = self._run(self.apply_fn, worker.state, reply)

  def final_params(self) -> PyTree:
    if self.server is not None:
      return self.server_state.params
    if self.spec.synchronous:
      return self.program.params(self.workers[0].state)
    return self.mean_params([w.state for w in self.workers])

  def evaluate(self, time: float, samples: int, iterations: float) -> None:
    loss, acc = self._run(self.eval_fn, self.final_params(), self.x_test, self.y_test)
    train_loss = float(jnp.mean(jnp.stack(self.losses))) if self.losses else math.nan
    self.losses = []
    local_acc = math.nan
    if self.spec.distinct_locals:
      mean = self._run(self.mean_params, [w.state for w in self.workers])
      _, acc_locals = self._run(self.eval_fn, mean, self.x_test, self.y_test)
      local_acc = float(acc_locals)
    self.evals.append(
      EvalPoint(time, samples, iterations, train_loss, float(loss), float(acc), local_acc)
    )
