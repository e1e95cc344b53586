"""One description of every training algorithm, shared by the simulator and the Ray runtime.

A frozen, validated spec per algorithm carries its pure pieces, the worker side
(:meth:`Spec.program`) and the server (:meth:`Spec.server`); the registry maps a name to its spec
and to the message pattern each engine attached (:func:`attacher`).
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
  """What a run reports on either engine (``sim.SimResult``, ``ad.RunResult``).

  Seconds are simulated in the simulator, wall-clock on Ray; ``isinstance(result, al.Result)``
  holds for both engines' results.

  Attributes:
    algorithm: the algorithm's registered name.
    samples: training samples processed, all workers.
    throughput: samples per second.
    iterations: per worker, the local iterations it ran.
    wait_fraction: per worker, its share of the run spent blocked on other processes.
    curve: ``(seconds, metric)`` of every evaluation of the global model.
    final_params: the global model at the end.
    summary: ``summary()``, a JSON-friendly dict of the run.
  """

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
  """Base of every algorithm's frozen, validated spec; build one with :func:`algorithm`.

  A spec holds an algorithm's options and builds its pure pieces, which both engines run: the
  worker side (:meth:`program`) and the server (:meth:`server`). A subclass per algorithm sets
  the class attribute ``name`` and adds its options as fields; :func:`register` files it under
  its name. A wrong value raises at construction, with the fix in the message.

  Attributes:
    worker_tx: the workers' optimizer (``al.local_optimizer(eta)`` is the paper's). Needed to
      train (not in the simulator's timing-only mode); unused by ASP.
    label: a display name for the caller's reports (the engines do not read it).
    name: (class attribute) the registered name.
    optimizer_field: (class attribute) the field that holds the optimizer that trains the
      model, which ``algorithm(name, optimizer=tx)`` sets (``"worker_tx"``; ASP's
      ``"server_tx"``).
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
    """Raises a ValueError naming the missing option when this spec cannot train (only time)."""
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
  """ALADDIN: wait-free workers and a server that replies to each once every ``period`` messages.

  Every worker runs :func:`local_step` and pushes its message without waiting; the server is
  :func:`parameter_server` with this spec's options, and a worker merges each reply by Eq. 3
  (:func:`worker_merge`). The defaults are the recommended recipe (update messages, the plain
  average on the server, ``period=4``, ``alpha=0.5``), so ``Aladdin(worker_tx=tx)`` needs no
  server optimizer; the paper's literal reading is ``message="gradient",
  server_tx=optax.sgd(eta), alpha="count"``.

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

  References:
    Ko, Choi, Jei, Lee and Kim, "ALADDIN: Asymmetric Centralized Training for Distributed Deep
    Learning", CIKM 2021: Algorithms 1 and 2, Eq. 3.

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
  """AR-SGD: a barrier every iteration, ``worker_tx`` steps on the mean of the n gradients.

  References:
    Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017; the
    AR-SGD baseline of Ko et al., CIKM 2021.
  """

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
  """Base of the algorithms whose workers exchange with a server and wait for its answer.

  ASP and EASGD are its subclasses. Both engines attach their exchange pattern to this class
  (after every ``exchange_every``-th local step the worker sends its message and applies the
  reply before its next step), so a registered subclass that defines :meth:`Spec.program` and
  :meth:`Spec.server` runs on both, the Ray PS shards included.
  """

  @property
  def exchange_every(self) -> int:
    """Local steps per exchange (1: every step)."""
    return 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Asp(Symmetric):
  """ASP (Hogwild through a server): a worker sends its gradient and adopts the server's answer.

  The server is :func:`asp_server`; the workers have no optimizer, so ``worker_tx`` must be left
  out (``algorithm("asp", optimizer=tx)`` sets ``server_tx``).

  Attributes:
    server_tx: the server's optimizer, applied to every gradient at once (``optax.sgd(eta)``:
      the printed step; the paper's server ran momentum SGD).

  References:
    Recht, Re, Wright and Niu, "Hogwild!", NeurIPS 2011, Algorithm 1; the ASP baseline of Ko et
    al., CIKM 2021.
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

  The server is :func:`easgd_server`; the worker's message is its model and the answer its
  new model, which it adopts.

  Attributes:
    tau: local steps between exchanges (the ALADDIN paper's baseline: 2).
    beta: the elastic moving rate in (0, 1] (None: 0.9 / n).

  References:
    Zhang, Choromanska and LeCun, "Deep learning with Elastic Averaging SGD", NeurIPS 2015,
    Algorithm 1 (asynchronous EASGD).
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

  Its pieces are :func:`sgp`'s: each worker steps on its de-biased model, keeps half of its
  push-sum numerator and weight and sends the other half to one peer per iteration. The model
  evaluated is the average of the workers' de-biased models.

  Attributes:
    overlap: 1 (a worker mixes the message sent to it one iteration earlier; the paper's) or 0.

  References:
    Assran, Loizou, Ballas and Rabbat, "Stochastic Gradient Push for Distributed Deep
    Learning", ICML 2019, Algorithm 1 and its overlap variant.
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
  """Registers an algorithm's spec class under its ``name``; usable as a class decorator.

  Both engines then build the algorithm by name (:func:`algorithm`); each runs it with the
  message pattern attached to its name or to its nearest base class (a :class:`Symmetric`
  subclass runs on both engines as it is).

  Args:
    spec: a :class:`Spec` subclass with a class attribute ``name: ClassVar[str]``.

  Returns:
    ``spec`` itself.

  Raises:
    TypeError: ``spec`` is not a :class:`Spec` subclass with a ``name``.
    ValueError: another class is registered under that name.

  Examples:
    >>> import dataclasses
    >>> from typing import ClassVar
    >>> from optax_lena import aladdin as al
    >>> @al.register
    ... @dataclasses.dataclass(frozen=True, kw_only=True)
    ... class Toy(al.Symmetric):
    ...   name: ClassVar[str] = "toy"
    >>> type(al.algorithm("toy")).__name__
    'Toy'
    >>> al.unregister("toy")
  """
  named = isinstance(getattr(spec, "name", None), str)
  if not (isinstance(spec, type) and issubclass(spec, Spec) and named):
    raise TypeError("register takes a Spec subclass with a class attribute name: ClassVar[str].")
  if spec.name in _REGISTRY and _REGISTRY[spec.name].spec is not spec:
    raise ValueError(f"An algorithm named {spec.name!r} is already registered.")
  _REGISTRY.setdefault(spec.name, Entry(spec))
  return spec


def unregister(name: str) -> None:
  """Removes a registered algorithm (e.g. a toy one registered by a test); see :func:`register`.

  Args:
    name: the algorithm's name; an unknown name is ignored.
  """
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
  """The validated spec of a registered algorithm, which the simulator and the Ray runtime run.

  Every option has one spelling in both engines. The specs are :class:`Aladdin`,
  :class:`ArSgd`, :class:`Asp`, :class:`Easgd` and :class:`Sgp` (and any :func:`register`-ed
  one); ``spec.program(loss_fn, n)`` is its worker side and ``spec.server(n)`` its server.

  Args:
    name: ``"aladdin"``, ``"ar_sgd"``, ``"asp"``, ``"easgd"``, ``"sgp"`` or a registered one.
    optimizer: the optimizer that trains the model, whichever field holds it (the spec's
      ``optimizer_field``: ``worker_tx``, ASP's ``server_tx``); one call builds any spec.
    **options: the spec's fields (``worker_tx``, ``server_tx``, ``message``, ``period``,
      ``normalise``, ``alpha``, ``tau``, ``beta``, ...).

  Returns:
    The frozen spec, an instance of the algorithm's :class:`Spec` subclass.

  Raises:
    ValueError: ``name`` is not registered (the message lists the names), or an option's
      value is wrong (the message names the fix).
    TypeError: the algorithm has no such option (the message lists those it has), both
      ``optimizer`` and the field it sets are given, or an option has the wrong type.

  References:
    Ko, Choi, Jei, Lee and Kim, "ALADDIN: Asymmetric Centralized Training for Distributed Deep
    Learning", CIKM 2021: Algorithms 1 and 2 (ALADDIN) and the baselines of its experiments.

  Examples:
    >>> import optax
    >>> from optax_lena import aladdin as al
    >>> spec = al.algorithm("aladdin", worker_tx=al.local_optimizer(0.1))  # the recipe
    >>> spec.message, spec.period, spec.alpha, spec.server(8).normalise
    ('update', 4, 0.5, 'mean_of_locals')
    >>> al.algorithm("asp", optimizer=optax.sgd(0.1)).optimizer_field
    'server_tx'
    >>> al.algorithm("easgd", period=2)
    Traceback (most recent call last):
    TypeError: easgd has no option 'period'; its options are ('worker_tx', 'label', 'tau', 'beta').
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

#: The names of the algorithms registered at import (``al.algorithm`` also builds later ones).
ALGORITHMS: tuple[str, ...] = names()
