"""One description of every training algorithm, shared by the simulator and the Ray runtime.

A frozen, validated spec per algorithm carries its pure pieces, the worker side
(:meth:`Spec.program`) and the server (:meth:`Spec.server`); the registry maps a name to its spec
and to the message pattern each engine attached (:func:`attacher`). ``docs/ALADDIN.md`` (section
4b) describes both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple, Protocol, cast, runtime_checkable

import jax
import jax.numpy as jnp
import optax

from optax_lena._src.aladdin import checks
from optax_lena._src.aladdin.baselines import asp_server, easgd_server, sgp
from optax_lena._src.aladdin.server import parameter_server
from optax_lena._src.aladdin.worker import (
  LocalState,
  WorkerProgram,
  check_message,
  local_step,
  stepping_program,
)

PyTree = Any


class Server(Protocol):
  """What every parameter server offers (ALADDIN's, ASP's, EASGD's)."""

  def init(self, params: PyTree) -> Any: ...

  def receive(self, state: Any, message: PyTree, worker: Any) -> tuple[Any, Any]: ...


@runtime_checkable
class Result(Protocol):
  """What a run reports on either engine (``sim.SimResult``, ``ad.RunResult``): ``algorithm``,
  ``samples``, ``throughput`` (samples per second), per worker ``iterations`` and
  ``wait_fraction`` (its share of time blocked on other processes), the ``curve`` of ``(seconds,
  metric)`` evaluations of the global model, ``final_params`` (that model at the end) and a
  JSON-friendly ``summary()``. Seconds are simulated in the simulator, wall-clock on Ray."""

  algorithm: str
  samples: int
  throughput: float
  iterations: list[int]

  @property
  def wait_fraction(self) -> list[float]: ...

  @property
  def curve(self) -> list[tuple[float, float]]: ...

  @property
  def final_params(self) -> PyTree: ...

  def summary(self) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Spec:
  """The options every algorithm has (subclass per algorithm; build with :func:`algorithm`).

  Attributes:
    worker_tx: the workers' optimizer (``al.local_optimizer(eta)`` is the paper's). Needed to
      train (not in the simulator's timing-only mode); unused by ASP.
    label: a display name for the caller's reports (the engines do not read it).
  """

  name: ClassVar[str]
  # Whether the workers' own models differ from the evaluated global one (the simulator then
  # also evaluates their average: ``EvalPoint.local_accuracy``).
  distinct_locals: ClassVar[bool] = False
  # A barrier every iteration: every worker runs the same number of iterations (AR-SGD).
  synchronous: ClassVar[bool] = False
  # The field of the optimizer that trains the model, which ``algorithm(name, optimizer=tx)`` sets.
  optimizer_field: ClassVar[str] = "worker_tx"

  worker_tx: optax.GradientTransformation | None = None
  label: str = ""

  def __post_init__(self) -> None:
    checks.check_tx(self.worker_tx, "worker_tx", "al.local_optimizer(0.1)", optional=True)
    if not isinstance(self.label, str):
      raise TypeError(f"label must be a str, got {self.label!r}.")

  def check_trainable(self) -> None:
    """Raises, naming the missing option, when this spec cannot train (only time)."""
    if self.worker_tx is None:
      raise ValueError(
        f"Training {self.name} needs the workers' optimizer: algorithm({self.name!r}, "
        f"worker_tx=al.local_optimizer(0.1)) (any Optax transformation)."
      )

  def server(self, num_workers: int) -> Server | None:
    """The parameter server of this algorithm for ``num_workers`` workers (None: it has none)."""
    del num_workers
    return None

  def program(self, loss_fn: Callable[..., Any], num_workers: int) -> WorkerProgram:
    """The worker side of this algorithm for ``loss_fn(params, batch) -> scalar`` and
    ``num_workers`` workers (pure, jittable), run by every engine."""
    raise NotImplementedError(f"{type(self).__name__} defines no worker program.")

  def _tx(self) -> optax.GradientTransformation:
    self.check_trainable()
    return cast(optax.GradientTransformation, getattr(self, self.optimizer_field))


def _gradient_step(loss_fn: Callable[..., Any]) -> Callable[..., Any]:
  """A step whose message is the gradient at the model, which it leaves as it is."""
  grad = jax.value_and_grad(loss_fn)

  def gradient(params, opt_state, batch):
    loss, grads = grad(params, batch)
    return params, opt_state, grads, loss

  return gradient


@dataclasses.dataclass(frozen=True, kw_only=True)
class Aladdin(Spec):
  """ALADDIN (Algorithms 1 and 2): wait-free pushes, lazy global updates every ``period``; the
  defaults are the recommended recipe.

  Attributes:
    message: ``"update"`` (the worker's displacement, the recipe) or ``"gradient"`` (Algorithm
      1 as printed).
    server_tx: the server's optimizer on the normalised accumulated messages (None: the one
      that fits ``message``: ``optax.sgd(1.0)`` for updates; gradient messages need one).
    period: pi, the server replies to a worker once every ``period`` of its messages.
    normalise: ``"sum"``, ``"mean"`` or ``"mean_of_locals"`` (see ``al.parameter_server``).
    alpha: the merge weight: ``"count"`` (Algorithm 2), ``"n_pi"`` (Section 3.2) or a float.
    reply_every: forward the server's reply to a worker only once every ``reply_every`` of its
      messages (None: every reply; the simulator's ablation).
  """

  name: ClassVar[str] = "aladdin"
  distinct_locals: ClassVar[bool] = True

  server_tx: optax.GradientTransformation | None = None
  message: str = "update"
  period: int = 4
  normalise: str = "mean_of_locals"
  alpha: str | float = 0.5
  reply_every: int | None = None

  def __post_init__(self) -> None:
    super().__post_init__()
    checks.check_tx(self.server_tx, "server_tx", "optax.sgd(1.0)", optional=True)
    check_message(self.message)
    checks.check_period(self.period)
    checks.check_normalise(self.normalise)
    object.__setattr__(self, "alpha", checks.check_alpha(self.alpha))
    if self.reply_every is not None:
      checks.check_positive_int(
        self.reply_every, "reply_every", "messages between forwarded replies"
      )

  @property
  def resolved_server_tx(self) -> optax.GradientTransformation:
    """``server_tx``, or the default for ``message`` (raises when there is none)."""
    if self.server_tx is not None:
      return self.server_tx
    if self.message == "update":
      return optax.sgd(1.0)
    raise ValueError(
      "ALADDIN with message='gradient' needs server_tx, the server's step on the accumulated "
      "gradients: server_tx=optax.sgd(eta) is Algorithm 2's plain step (the paper's literal "
      "reading: message='gradient', server_tx=optax.sgd(eta), alpha='count'); or use "
      "message='update', whose server needs no learning rate."
    )

  def check_trainable(self) -> None:
    super().check_trainable()
    self.resolved_server_tx  # noqa: B018 -- raises for gradient messages without a server_tx

  def server(self, num_workers: int) -> Server:
    tx = self.resolved_server_tx
    return parameter_server(
      num_workers, tx, period=self.period, normalise=self.normalise, alpha=self.alpha
    )

  def worker_step(self, loss_fn: Callable[..., Any]) -> Callable[..., Any]:
    """The worker's pure step: ``al.local_step`` with this spec's ``worker_tx`` and ``message``."""
    return local_step(loss_fn, self._tx(), message=self.message)

  def program(self, loss_fn: Callable[..., Any], num_workers: int) -> WorkerProgram:
    """Local steps that push this spec's ``message``; a reply is merged by Eq. 3."""
    return stepping_program(self.worker_step(loss_fn), self._tx())


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArSgd(Spec):
  """AR-SGD: a barrier every iteration, ``worker_tx`` steps on the mean of the n gradients."""

  name: ClassVar[str] = "ar_sgd"
  synchronous: ClassVar[bool] = True

  def program(self, loss_fn: Callable[..., Any], num_workers: int) -> WorkerProgram:
    """The message is the gradient at the model; the reply is the sum of the n gradients (the
    all-reduce), whose mean the worker steps on (divided here, fused into the step: the
    engines then compute the same bits whether the sum is made in the step or elsewhere)."""
    tx = self._tx()

    def apply(state: LocalState, total: Any) -> LocalState:
      mean = jax.tree.map(lambda t: t / num_workers, total)
      updates, opt_state = tx.update(mean, state.opt_state, state.params)
      return LocalState(optax.apply_updates(state.params, updates), opt_state)

    return stepping_program(_gradient_step(loss_fn), tx, apply)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Symmetric(Spec):
  """Base of the algorithms whose workers exchange with a server and wait for its answer (ASP,
  EASGD); both engines attach their exchange pattern to it, so a registered subclass that
  defines :meth:`Spec.program` and :meth:`Spec.server` runs on both."""

  @property
  def exchange_every(self) -> int:
    """Local steps per exchange (1: every step)."""
    return 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Asp(Symmetric):
  """ASP (Hogwild): a worker sends its gradient and adopts the server's answer.

  Attributes:
    server_tx: the server's optimizer, applied to every gradient at once (``optax.sgd(eta)``:
      the printed step; the paper's server ran momentum SGD).
  """

  name: ClassVar[str] = "asp"
  optimizer_field: ClassVar[str] = "server_tx"

  server_tx: optax.GradientTransformation | None = None

  def __post_init__(self) -> None:
    super().__post_init__()
    checks.check_tx(self.server_tx, "server_tx", "optax.sgd(0.1, momentum=0.9)", optional=True)
    if self.worker_tx is not None:
      raise ValueError(
        "ASP's workers have no optimizer (they send gradients and adopt the server's model): "
        "pass the optimizer as server_tx, e.g. algorithm('asp', server_tx=optax.sgd(0.1, "
        "momentum=0.9))."
      )

  def check_trainable(self) -> None:
    if self.server_tx is None:
      raise ValueError(
        "Training asp needs the server's optimizer: algorithm('asp', server_tx=optax.sgd(0.1, "
        "momentum=0.9)) (ASP's workers have none)."
      )

  def program(self, loss_fn: Callable[..., Any], num_workers: int) -> WorkerProgram:
    """The message is the gradient at the model; the reply, x~, is adopted."""
    return stepping_program(_gradient_step(loss_fn), None)

  def server(self, num_workers: int) -> Server:
    del num_workers
    return asp_server(self._tx())


@dataclasses.dataclass(frozen=True, kw_only=True)
class Easgd(Symmetric):
  """EASGD: local steps; every ``tau`` of them a symmetric elastic exchange with the server.

  Attributes:
    tau: local steps between exchanges (the paper: 2).
    beta: the elastic moving rate in (0, 1] (None: 0.9 / n, the paper's).
  """

  name: ClassVar[str] = "easgd"
  distinct_locals: ClassVar[bool] = True

  tau: int = 2
  beta: float | None = None

  def __post_init__(self) -> None:
    super().__post_init__()
    checks.check_positive_int(self.tau, "tau", "local steps between exchanges; the paper uses 2")
    checks.check_beta(self.beta, optional=True)

  @property
  def exchange_every(self) -> int:
    return self.tau

  def server(self, num_workers: int) -> Server:
    return easgd_server(num_workers, beta=self.beta, tau=self.tau)

  def program(self, loss_fn: Callable[..., Any], num_workers: int) -> WorkerProgram:
    """Local steps whose message is the new local model; the exchange's answer is adopted.
    (Every step makes the message; the engines send every ``tau``-th.)"""
    step = local_step(loss_fn, self._tx(), message="gradient")

    def model_step(params, opt_state, batch):
      params, opt_state, _, loss = step(params, opt_state, batch)
      return params, opt_state, params, loss

    return stepping_program(model_step, self._tx())


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sgp(Spec):
  """SGP: push-sum gossip over a directed exponential graph (no server).

  Attributes:
    overlap: 1 (a worker mixes the message sent to it one iteration earlier; the paper's) or 0.
  """

  name: ClassVar[str] = "sgp"

  overlap: int = 1

  def __post_init__(self) -> None:
    super().__post_init__()
    if self.overlap not in (0, 1) or isinstance(self.overlap, bool):
      raise ValueError(
        f"overlap must be 0 or 1 (iterations a gossip message may stay in flight), got "
        f"{self.overlap!r}."
      )

  def gossip(self, num_workers: int) -> Any:
    """The push-sum pieces (``al.sgp``) for ``num_workers`` workers."""
    return sgp(num_workers, overlap=self.overlap)

  def program(self, loss_fn: Callable[..., Any], num_workers: int) -> WorkerProgram:
    """Push-sum: the local step on the de-biased model z = x / w applied to the numerator x,
    which keeps half of itself (the other half is the message); a peer's message is mixed."""
    tx, grad, gossip = self._tx(), jax.value_and_grad(loss_fn), self.gossip(num_workers)

    def init(params: Any) -> PushSumState:
      return PushSumState(params, jnp.ones([], jnp.float32), tx.init(params))

    def step(state: PushSumState, batch: Any) -> tuple[PushSumState, Any, Any]:
      z = gossip.debias(state.numerator, state.weight)
      loss, grads = grad(z, batch)
      updates, opt_state = tx.update(grads, state.opt_state, z)
      (x, w), _ = gossip.send(optax.apply_updates(state.numerator, updates), state.weight)
      return PushSumState(x, w, opt_state), (x, w), loss

    def apply(state: PushSumState, message: Any) -> PushSumState:
      x, w = gossip.mix(state.numerator, state.weight, *message)
      return state._replace(numerator=x, weight=w)

    def params(state: PushSumState) -> Any:
      return gossip.debias(state.numerator, state.weight)

    return WorkerProgram(init, step, apply, params)


class PushSumState(NamedTuple):
  """An SGP worker's local state: its push-sum numerator x, weight w and optimizer state."""

  numerator: Any
  weight: Any
  opt_state: Any


@dataclasses.dataclass
class Entry:
  """One registered algorithm: its spec class and the piece each engine attached to it."""

  spec: type[Spec]
  engines: dict[str, Any] = dataclasses.field(default_factory=dict)

  def find(self, engine: str) -> Any:
    """The piece ``engine`` attached to this algorithm or to the nearest base class of its spec
    (None if there is none)."""
    if engine in self.engines:
      return self.engines[engine]
    return next((_PATTERNS[c, engine] for c in self.spec.__mro__ if (c, engine) in _PATTERNS), None)

  def engine(self, engine: str) -> Any:
    """:meth:`find`, with an error naming the fix if there is none."""
    piece = self.find(engine)
    if piece is None:
      raise ValueError(
        f"Algorithm {self.spec.name!r} has no {engine} implementation; the {engine} supports "
        f"{engine_names(engine)}."
      )
    return piece


_REGISTRY: dict[str, Entry] = {}
# Engine pieces attached to a spec class (``Symmetric``): every registered subclass runs them.
_PATTERNS: dict[tuple[type, str], Any] = {}


def register(spec: type[Spec]) -> type[Spec]:
  """Registers an algorithm's spec class under its ``name`` (usable as a class decorator)."""
  named = isinstance(getattr(spec, "name", None), str)
  if not (isinstance(spec, type) and issubclass(spec, Spec) and named):
    raise TypeError("register takes a Spec subclass with a class attribute name: ClassVar[str].")
  if spec.name in _REGISTRY and _REGISTRY[spec.name].spec is not spec:
    raise ValueError(f"An algorithm named {spec.name!r} is already registered.")
  _REGISTRY.setdefault(spec.name, Entry(spec))
  return spec


def unregister(name: str) -> None:
  """Removes a registered algorithm (e.g. a toy one registered by a test)."""
  _REGISTRY.pop(name, None)


def attacher(engine: str) -> Callable[..., Callable[[Any], Any]]:
  """An engine's class decorator ``attach(*targets)``: the class becomes that engine's piece of
  each target, an algorithm's name or a spec class (whose registered subclasses all run it)."""

  def attach(*targets: str | type[Spec]) -> Callable[[Any], Any]:
    def decorate(piece: Any) -> Any:
      for target in targets:
        if not isinstance(target, str):
          _PATTERNS[target, engine] = piece
        elif entry(target).engines.setdefault(engine, piece) is not piece:
          raise ValueError(f"{target!r} already has a {engine} implementation.")
      return piece

    return decorate

  return attach


def names() -> tuple[str, ...]:
  """The registered algorithms' names, in registration order."""
  return tuple(_REGISTRY)


def engine_names(engine: str) -> tuple[str, ...]:
  """The algorithms an engine implements."""
  return tuple(name for name, e in _REGISTRY.items() if e.find(engine) is not None)


def entry(name: str) -> Entry:
  """The registry entry of ``name`` (an error listing the known names otherwise)."""
  if name not in _REGISTRY:
    raise ValueError(f"Unknown algorithm {name!r}; choose one of {names()}.")
  return _REGISTRY[name]


def algorithm(
  name: str, *, optimizer: optax.GradientTransformation | None = None, **options: Any
) -> Spec:
  """The validated spec of algorithm ``name`` with ``options``.

  Args:
    name: ``"aladdin"``, ``"ar_sgd"``, ``"asp"``, ``"easgd"``, ``"sgp"`` or a registered one.
    optimizer: the optimizer that trains the model, whichever field holds it (the spec's
      ``optimizer_field``: ``worker_tx``, ASP's ``server_tx``); one call builds any spec.
    **options: the spec's fields (``worker_tx``, ``server_tx``, ``message``, ``period``,
      ``normalise``, ``alpha``, ``tau``, ``beta``, ...); an option the algorithm does not have
      raises an error listing those it has.
  """
  spec = entry(name).spec
  fields = tuple(f.name for f in dataclasses.fields(spec))
  unknown = sorted(set(options) - set(fields))
  if unknown:
    raise TypeError(
      f"{name} has no option {', '.join(map(repr, unknown))}; its options are {fields}."
    )
  if optimizer is not None:
    if spec.optimizer_field in options:
      raise TypeError(f"{name}: optimizer= sets {spec.optimizer_field}; give one, not both.")
    options[spec.optimizer_field] = optimizer
  return spec(**options)


for _spec in (Aladdin, ArSgd, Asp, Easgd, Sgp):
  register(_spec)

ALGORITHMS: tuple[str, ...] = names()
