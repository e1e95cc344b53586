"""What the Ray runtime trains (:class:`Task`) and how (:class:`Config`); every knob is checked
here, where the user sets it, before any actor starts."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from optax_lena._src.aladdin import algorithms
from optax_lena._src.aladdin.batches import batch_stream
from optax_lena._src.aladdin.ray.plan import Plan

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Task:
  """What to train; shipped (cloudpickled) to every actor.

  The optimizers belong to the algorithm (``Config.algorithm``, e.g.
  ``al.algorithm("aladdin", worker_tx=tx)``).

  Attributes:
    loss_fn: ``loss_fn(params, batch) -> scalar loss`` (pure, jittable).
    init_params: the initial model (a pytree of floating-point arrays).
    batches: ``batches(worker, seed) -> iterator`` of that worker's mini-batches, endless; a
      worker that Ray restarts calls it again with another seed.
    batch_size: samples per mini-batch (for throughput).

  Raises:
    TypeError: ``loss_fn`` or ``batches`` is not callable, or ``batch_size`` is not an int.
    ValueError: ``batch_size < 1``.

  Examples:
    >>> import numpy as np
    >>> from optax_lena.aladdin import distributed as ad
    >>> def batches(worker, seed):
    ...   rng = np.random.default_rng([seed, worker])
    ...   while True:
    ...     x = rng.normal(size=(16, 4)).astype(np.float32)
    ...     yield x, x.sum(axis=1)
    >>> task = ad.Task(lambda p, b: ((b[0] @ p - b[1]) ** 2).mean(), np.zeros(4, np.float32),
    ...                batches, batch_size=16)
    >>> next(task.batches(0, 0))[0].shape
    (16, 4)
  """

  loss_fn: Callable[[PyTree, Any], Any]
  init_params: PyTree
  batches: Callable[[int, int], Iterator[Any]]
  batch_size: int

  def __post_init__(self) -> None:
    if not callable(self.loss_fn) or not callable(self.batches):
      raise TypeError("Task: loss_fn(params, batch) and batches(worker, seed) must be callable.")
    if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int):
      raise TypeError(f"Task: batch_size must be an int >= 1, got {self.batch_size!r}.")
    if self.batch_size < 1:
      raise ValueError(f"Task: batch_size must be >= 1, got {self.batch_size}.")

  @classmethod
  def from_problem(cls, problem: Any, batch_size: int) -> Task:
    """The task of a simulator problem: its ``loss_fn`` and ``params``, and the simulator's
    batches.

    Args:
      problem: a ``sim.Problem``.
      batch_size: samples per mini-batch.

    Returns:
      A :class:`Task` whose ``batches(w, s)`` is the stream the simulator gives worker ``w``
      with ``seed=s`` (``optax_lena._src.aladdin.batches.batch_stream``).
    """
    x, y = problem.x_train, problem.y_train

    def batches(worker: int, seed: int) -> Iterator[Any]:
      return batch_stream(x, y, batch_size, np.random.default_rng([seed, worker]))

    return cls(problem.loss_fn, problem.params, batches, batch_size)


def _positive(name: str, value: Any, integer: bool = False, zero: bool = False) -> None:
  types = (int, np.integer) if integer else (int, float, np.integer, np.floating)
  ok = not isinstance(value, bool) and isinstance(value, types) and math.isfinite(value)
  if not (ok and (value >= 0 if zero else value > 0)):
    kind = "an int (e.g. 2, not 2.0)" if integer else "a finite number"
    raise ValueError(f"Config: {name} must be {kind} {'>= 0' if zero else '> 0'}, got {value!r}.")


def _check_checkpoint_dir(path: str, num_shards: int) -> None:
  """Refuses a ``checkpoint_dir`` that cannot be a directory of the shards' directories: a
  file there or at ``shard_<k>``, or no directory to make it in (the runtime then makes them and
  writes a probe in each, before any actor starts)."""
  for target in [path, *(os.path.join(path, f"shard_{k}") for k in range(num_shards))]:
    if os.path.lexists(target) and not os.path.isdir(target):
      raise ValueError(
        f"Config: checkpoint_dir={path!r} cannot hold the shards' checkpoints: {target} exists "
        "and is not a directory. Remove it, or give another checkpoint_dir."
      )
  parent = os.path.dirname(path)
  while not os.path.lexists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise ValueError(
      f"Config: checkpoint_dir={path!r} cannot be made: {parent} is not a directory. Give a "
      "path under a directory you can write."
    )


def _resources(name: str, value: Mapping[str, float] | None) -> None:
  if value is None:
    return
  if not isinstance(value, Mapping) or not all(
    isinstance(k, str) and isinstance(v, int | float) and v > 0 for k, v in value.items()
  ):
    raise ValueError(f"Config: {name} must map resource names to amounts > 0, got {value!r}.")


@dataclasses.dataclass(frozen=True)
class Config:
  """How to train, checked where it is made, before any actor starts.

  ``docs/ALADDIN-ray.md`` describes what each knob does to the run. The algorithm's Ray
  iteration (``entry(name).engine("ray")``) derives the transport :attr:`plan` from the spec and
  checks the options it cannot run with (``Iteration.plan``, ``Iteration.check``).

  Attributes:
    algorithm: the algorithm and its options, a spec of ``optax_lena.aladdin``
      (``al.algorithm("aladdin", worker_tx=tx)``), or the name of one whose defaults suffice.
    num_workers: n.
    ps_shards: number of PS shard actors, exactly (the flat model cut into equal slices).
    slowdown: ``{worker: factor}``; that worker sleeps ``(factor - 1)`` times its compute time
      every iteration.
    checkpoint_dir: directory of the shards' Orbax checkpoints (None: none); a run started on
      one that holds checkpoints resumes from them. Made absolute here, on the driver.
    checkpoint_every: global updates between checkpoints: once shard 0 has made this many
      since the last one (read about twice a second), every shard saves the next run-wide
      generation.
    fold: ALADDIN: messages a worker queues before it makes a call to each shard (1 to 8
      periods; None: whole periods, as many as its step computes in ``fold_seconds``).
    fold_seconds: the compute time that a default ``fold`` spans.
    max_inflight: unanswered calls per worker and shard before a worker folds, then waits.
    chunk_seconds: wall time of one worker call scheduled by the driver.
    seed: seeds the workers' data order.
    worker_resources: Ray custom resources every worker actor requires (placement).
    server_resources: Ray custom resources every shard / reducer / mailbox actor requires.
    worker_gpus: accelerators Ray gives every worker actor (fractions share one device).
    server_gpus: accelerators of every shard actor.
    deterministic: one worker iteration at a time, round-robin, each waiting for its replies:
      the result does not depend on timing.
    worker_nice: the workers' ``os.nice``; None: 5 when the cluster has fewer CPUs than actors.
    intra_op_threads: threads of every actor's XLA CPU pool; None: 1 when the cluster has no
      more CPUs than actors, else XLA's default.
    pin_compute: every worker runs its step on ``intra_op_threads`` cores it claims on its node;
      None: pin when the pool is limited and the cluster has CPUs to spare.
    recheck_messages: the PS shards also check every slice they receive for NaN and Inf
      instead of trusting the worker's verdict.
    shared_memory: a worker whose PS shards all run on its node passes messages and replies
      through a shared-memory ring; elsewhere, or False, they travel in the calls.
    plan: the transport plan (``Plan``), derived from the spec (not an argument).

  Raises:
    TypeError: ``algorithm`` is neither a spec nor a name.
    ValueError: an option out of range or of the wrong type (the message names the valid
      values), an algorithm without a Ray iteration, or an option its iteration cannot run.

  References:
    Ko, Choi, Jei, Lee, Kim, "ALADDIN: Asymmetric Centralized Training for Distributed Deep
    Learning", CIKM 2021: the defaults of the spec are the recipe measured in
    ``docs/ALADDIN.md`` (update messages, period 4, alpha 0.5).

  Examples:
    >>> from optax_lena import aladdin as al
    >>> from optax_lena.aladdin import distributed as ad
    >>> spec = al.algorithm("aladdin", worker_tx=al.local_optimizer(0.05), period=2)
    >>> config = ad.Config(algorithm=spec, num_workers=4, ps_shards=2)
    >>> config.plan
    Plan(period=2, max_fold=16, block=8)
    >>> ad.Config(algorithm=spec, num_workers=2.0)
    Traceback (most recent call last):
    ...
    ValueError: Config: num_workers must be an int (e.g. 2, not 2.0) > 0, got 2.0.
  """

  algorithm: Any = "aladdin"
  num_workers: int = 4
  ps_shards: int = 1
  slowdown: Mapping[int, float] = dataclasses.field(default_factory=dict)
  checkpoint_dir: str | None = None
  checkpoint_every: int = 50
  fold: int | None = None
  fold_seconds: float = 0.015
  max_inflight: int = 2
  chunk_seconds: float = 0.5
  seed: int = 0
  worker_resources: Mapping[str, float] | None = None
  server_resources: Mapping[str, float] | None = None
  worker_gpus: float = 0.0
  server_gpus: float = 0.0
  deterministic: bool = False
  worker_nice: int | None = None
  intra_op_threads: int | None = None
  pin_compute: bool | None = None
  recheck_messages: bool = False
  shared_memory: bool = True
  plan: Plan = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self) -> None:
    spec = self.algorithm
    if isinstance(spec, str):
      spec = algorithms.algorithm(spec)
    if not isinstance(spec, algorithms.Spec):
      raise TypeError(
        "Config: algorithm must be a spec (al.algorithm('aladdin', worker_tx=...)) or a name, "
        f"got {type(spec).__name__}."
      )
    iteration = algorithms.entry(spec.name).engine("ray")  # an error listing what Ray runs
    spec.check_trainable()
    object.__setattr__(self, "algorithm", spec)
    object.__setattr__(self, "plan", iteration.plan(spec))
    for name in ("num_workers", "ps_shards", "checkpoint_every", "max_inflight"):
      _positive(name, getattr(self, name), integer=True)
    for name in ("fold_seconds", "chunk_seconds"):
      _positive(name, getattr(self, name))
    if self.fold is not None:
      _positive("fold", self.fold, integer=True)
      if self.fold > self.plan.max_fold:
        raise ValueError(
          f"Config: fold={self.fold} exceeds the {self.plan.max_fold} messages one call of "
          f"{spec.name} may carry; give fold <= {self.plan.max_fold}, or None (whole periods "
          "that span fold_seconds of the step)."
        )
    for name in ("worker_gpus", "server_gpus"):
      gpus = getattr(self, name)
      _positive(name, gpus, zero=True)
      if gpus > 1 and not float(gpus).is_integer():
        raise ValueError(f"Config: {name} above 1 must be a whole number, got {gpus!r}.")
    if self.intra_op_threads is not None:
      _positive("intra_op_threads", self.intra_op_threads, integer=True)
    if self.pin_compute not in (None, True, False):
      raise ValueError(f"Config: pin_compute must be None or a bool, got {self.pin_compute!r}.")
    if self.pin_compute and self.intra_op_threads is None:
      raise ValueError(
        "Config: pin_compute=True needs intra_op_threads=N, the cores each worker's step is "
        "pinned to (e.g. Config(pin_compute=True, intra_op_threads=1))."
      )
    for name in ("recheck_messages", "shared_memory", "deterministic"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"Config: {name} must be a bool, got {getattr(self, name)!r}.")
    nice = self.worker_nice
    if nice is not None and (
      isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= 19
    ):
      raise ValueError(f"Config: worker_nice must be None or an int in [0, 19], got {nice!r}.")
    if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
      raise ValueError(f"Config: seed must be an int >= 0 (e.g. seed=0), got {self.seed!r}.")
    if (path := self.checkpoint_dir) is not None:
      if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise ValueError(
          "Config: checkpoint_dir must be None (no checkpoints) or a non-empty path, e.g. "
          f"checkpoint_dir='checkpoints', got {path!r}."
        )
      if spec.server(self.num_workers) is None:
        raise ValueError(
          f"Config: checkpoint_dir needs parameter-server shards; {spec.name!r} has none."
        )
      path = os.path.abspath(os.fspath(path))
      _check_checkpoint_dir(path, self.ps_shards)
      object.__setattr__(self, "checkpoint_dir", path)
    if not isinstance(self.slowdown, Mapping):
      raise ValueError(
        f"Config: slowdown must map worker indices to factors, got {self.slowdown!r}."
      )
    for worker, factor in self.slowdown.items():
      if isinstance(worker, bool) or not isinstance(worker, int):
        raise ValueError(f"Config: slowdown keys are worker indices (ints), got {worker!r}.")
      number = not isinstance(factor, bool) and isinstance(factor, int | float | np.number)
      if not (0 <= worker < self.num_workers and number and math.isfinite(factor) and factor >= 1):
        raise ValueError(
          f"Config: slowdown {worker}: {factor!r}: the worker must be in [0, {self.num_workers}) "
          "and the factor a finite number >= 1 (e.g. 2.0: that worker's iterations take twice "
          "as long)."
        )
    _resources("worker_resources", self.worker_resources)
    _resources("server_resources", self.server_resources)
    iteration.check(spec, self)

  @property
  def spec(self) -> Any:
    """The algorithm's spec (``algorithm`` after validation)."""
    return self.algorithm
