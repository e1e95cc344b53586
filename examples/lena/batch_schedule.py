"""The batch schedule: how many per-worker gradients S each update of a run averages.

``config.batch_ramp`` (``--set batch_ramp=...`` on the command line) names one of four records,
built by :func:`from_config`:

* ``'none'`` (the default), :class:`Fixed`: S = ``batch_scale`` (or ``global_batch_size /
  per_worker_batch``) for every update.
* ``'steps:U0:S0,U1:S1,...'``, :class:`Steps`: from update U_i on (``U0 = 0``), S_i per-worker
  gradients (Megatron-LM's step batch-size schedule), e.g. ``steps:0:2,12:8``; it replaces
  ``batch_scale``.
* ``'noise'`` or ``'noise:every=N,factor=K,max=M,growth=G'``, :class:`NoiseRamp`: every N
  updates (default 50) S becomes ``ol.advise_num_samples`` of the optimizer state:
  ``ceil(K * B_crit)`` (default K = 1, B_crit the state's critical-batch estimate) rounded up
  to a multiple of the data-parallel devices, never smaller than before, at most G (default 2)
  times the previous S and at most M; the first S is ``batch_scale``.
* ``'seesaw'`` or ``'seesaw:max=M'``, :class:`Seesaw`: wherever the exponential rate decay
  ``eta0 * lr_decay ** progress`` has lost another factor 2, S doubles and the rate is
  multiplied by sqrt(2) instead, so each halving becomes a 1/sqrt(2) (Seesaw, Meterez et al.
  2025); the first S is ``batch_scale``. The rate is the base rate of the rule, which
  multiplies it by its gain ratio as always.

The trainer's loop (``train.train_and_evaluate``) asks the record for the S of every update
(:meth:`Fixed.next_num_samples` and its namesakes) from where the run stands (:class:`Progress`)
and the run's :class:`Plan`, made once when the run starts (``plan``).

A fixed S runs whole updates: ``num_steps``, or ``num_epochs`` epochs rounded down to whole
updates, evaluating every ``eval_every`` updates (0: every ``round(updates per epoch)``). A ramp
(every other record) runs a budget of examples, the same at every S: ``num_epochs`` epochs, or
with ``num_steps > 0`` that many updates of the first S; it ends with the first update that
reaches the budget and evaluates every ``eval_every`` updates (0: at the end of every epoch).
Its per-worker batch is fixed: the data-parallel devices are those of the first S (over all
processes) and S grows through more micro-batches per device, so every S is a multiple of
them. Its rate schedule and warm-up count samples over the budget (T1 in base steps, as for a
fixed S), so a ramp needs an optimizer on the sample clock (the registry's entries with
diagnostics); each distinct S gets its own transformation (same state, its S's clip and beta),
built from :class:`ScheduledHyperparams`. A ramp's checkpoints keep its :class:`Progress`, so a
run stopped mid-ramp and resumed ends bitwise identical to an uninterrupted one; a fixed S's
progress is its step.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import numpy as np
import optax

import optax_lena as ol
from examples import optimizers
from examples.lena import mesh, parallel
from examples.lena.configs import Config, ConfigError

FORMS = (
  "'none', 'steps:U0:S0,U1:S1,...' (e.g. 'steps:0:2,12:8'), 'noise' or "
  "'noise:every=N,factor=K,max=M,growth=G', 'seesaw' or 'seesaw:max=M'"
)


@dataclasses.dataclass(frozen=True)
class Progress:
  """Where a run stands: the state of its schedule (a ramp's checkpoints keep it)."""

  updates: int  # updates done
  samples_seen: int  # examples those updates used
  num_samples: int  # S of the last update (the first S before any)

  def after(self, num_samples: int, per_worker_batch: int) -> Progress:
    """The progress after one more update of ``num_samples`` per-worker batches."""
    seen = self.samples_seen + num_samples * per_worker_batch
    return Progress(self.updates + 1, seen, num_samples)


@dataclasses.dataclass(frozen=True)
class Plan:
  """A run's length and bounds, fixed when it starts (``schedule.plan``)."""

  examples: int  # the run ends with the first update whose examples reach this budget
  eval_every: int  # updates between evaluations; 0: at the end of every epoch
  base_steps: int | float  # T1, the run in reference batches (rate schedule and warm-ups)
  multiple: int  # every S is a multiple of this: the data-parallel devices
  max_num_samples: int  # the largest S
  updates: int | None  # a fixed S's updates; None for a ramp (known when it ends)


@dataclasses.dataclass(frozen=True)
class ScheduledHyperparams(optimizers.Hyperparams):
  """The registry's hyperparameters with the run's length in base steps (a ramp's is its
  budget of examples, not updates x k) and a constant factor on the rate (Seesaw's sqrt(2) per
  doubling)."""

  run_base_steps: int | float = 1
  rate_factor: float = 1.0

  @property
  def base_steps_total(self) -> int | float:  # type: ignore[override]
    return self.run_base_steps

  def sample_schedule(self) -> optax.ScalarOrSchedule:
    base = super().sample_schedule()
    c = self.rate_factor
    if c == 1.0:
      return base  # exactly the schedule of a fixed S
    if callable(base):
      return lambda t: c * base(t)
    return c * base


def base_steps(examples: int, config: Config) -> int | float:
  """``examples`` in reference batches (``reference_batch_size``, by default the per-worker
  batch): the sample clock's base steps, an int when whole (so a fixed S's are updates x k)."""
  reference = config.reference_batch_size or config.per_worker_batch
  return examples // reference if examples % reference == 0 else examples / reference


def _check_fits(num_samples: int, config: Config, num_train: int) -> None:
  if num_samples * config.per_worker_batch > num_train:
    raise ConfigError(
      f"The global batch {num_samples * config.per_worker_batch} (S={num_samples}) exceeds the "
      f"{num_train} training examples; lower batch_scale or per_worker_batch."
    )


@dataclasses.dataclass(frozen=True)
class Fixed:
  """The same S for every update (``batch_ramp='none'``)."""

  num_samples: int
  ramped: ClassVar[bool] = False

  @property
  def first(self) -> int:
    return self.num_samples

  def sizes(self) -> tuple[int, ...]:
    """The S the record names in advance."""
    return (self.num_samples,)

  def layout_config(self, config: Config) -> Config:
    """The configuration whose ``parallel.batch_layout`` places the first S: ``config``'s own
    (its ``num_devices`` and ``micro_batches``)."""
    return config

  def plan(self, config: Config, num_train: int, multiple: int) -> Plan:
    """``num_steps`` updates, or ``num_epochs`` epochs in whole updates; evaluations every
    ``eval_every`` updates, by default about once an epoch."""
    _check_fits(self.num_samples, config, num_train)
    global_batch = self.num_samples * config.per_worker_batch
    per_epoch = num_train / global_batch
    updates = config.num_steps if config.num_steps > 0 else int(config.num_epochs * per_epoch)
    updates = max(updates, 1)
    every = config.eval_every if config.eval_every > 0 else max(1, round(per_epoch))
    examples = updates * global_batch
    return Plan(examples, every, base_steps(examples, config), multiple, self.num_samples, updates)

  def next_num_samples(
    self, at: Progress, plan: Plan, opt_state: Callable[[], optax.OptState]
  ) -> int:
    return self.num_samples

  def rate_factor(self, num_samples: int) -> float:
    return 1.0


class _Ramp:
  """What the ramps share: the budget of examples and the devices of the first S."""

  ramped: ClassVar[bool] = True
  first: int
  max_num_samples: int = 0  # 0: the default bound

  def layout_config(self, config: Config) -> Config:
    """The configuration whose ``parallel.batch_layout`` places the first S: its devices stay
    those of the run, and later S add micro-batches."""
    return dataclasses.replace(config, batch_scale=self.first, global_batch_size=0, micro_batches=0)

  def sizes(self) -> tuple[int, ...]:
    """The S the record names in advance."""
    return (self.first,)

  def plan(self, config: Config, num_train: int, multiple: int) -> Plan:
    """The budget of examples, evaluations every ``eval_every`` updates (0: every epoch's end)
    and the largest S (:meth:`largest`).

    Raises:
      ConfigError: an S that is not a multiple of the devices (naming the nearest that is), or
        a batch larger than the training set.
    """
    b = config.per_worker_batch
    for s in self.sizes():
      if s % multiple:
        nearest = max(multiple, (s + multiple // 2) // multiple * multiple)
        raise ConfigError(
          f"batch_ramp {config.batch_ramp!r}: S={s} is not a multiple of the {multiple} "
          f"data-parallel devices of the first S={self.first} (over all processes); use "
          f"S={nearest}, the nearest multiple of {multiple} (or set num_devices)."
        )
    _check_fits(max(self.sizes()), config, num_train)
    if config.num_steps > 0:
      examples = config.num_steps * self.first * b
    else:
      examples = int(config.num_epochs * num_train)
    cap = self.largest(num_train // b, multiple)
    return Plan(examples, config.eval_every, base_steps(examples, config), multiple, cap, None)

  def largest(self, batches_in_training_set: int, multiple: int) -> int:
    """The largest S: ``max`` rounded down to the devices, by default 64 times the first S or
    the training set, whichever is smaller (never below the first S)."""
    cap = self.max_num_samples or min(64 * self.first, batches_in_training_set)
    return max(self.first, cap // multiple * multiple)

  def rate_factor(self, num_samples: int) -> float:
    return 1.0


@dataclasses.dataclass(frozen=True)
class Steps(_Ramp):
  """From update ``U_i`` on, ``S_i`` per-worker gradients (``batch_ramp='steps:...'``)."""

  steps: tuple[tuple[int, int], ...]  # (first update, S), the first update 0, increasing

  @property
  def first(self) -> int:  # type: ignore[override]
    return self.steps[0][1]

  def sizes(self) -> tuple[int, ...]:
    return tuple(s for _, s in self.steps)

  def largest(self, batches_in_training_set: int, multiple: int) -> int:
    return max(self.sizes())

  def next_num_samples(
    self, at: Progress, plan: Plan, opt_state: Callable[[], optax.OptState]
  ) -> int:
    return [s for first, s in self.steps if first <= at.updates][-1]


@functools.cache
def _advice(
  factor: float, max_growth: float, first: int, multiple: int, cap: int
) -> Callable[[optax.OptState], jax.Array]:
  # One compiled policy per run's bounds (the state's shapes are the same at every S).
  return jax.jit(
    functools.partial(
      ol.advise_num_samples,
      max_num_samples=cap,
      multiple=multiple,
      factor=factor,
      min_num_samples=first,
      max_growth=max_growth,
    )
  )


@dataclasses.dataclass(frozen=True)
class NoiseRamp(_Ramp):
  """S from the state's gradient noise scale every ``every`` updates (``batch_ramp='noise'``)."""

  first: int
  every: int = 50  # updates between readings of the estimate
  factor: float = 1.0  # S = factor x B_crit
  max_num_samples: int = 0  # 0: the default bound
  max_growth: float = 2.0  # at most this factor per reading

  def next_num_samples(
    self, at: Progress, plan: Plan, opt_state: Callable[[], optax.OptState]
  ) -> int:
    """``ol.advise_num_samples`` of the state after every ``every`` updates, else the last S."""
    if not (at.updates and at.updates % self.every == 0):
      return at.num_samples
    advise = _advice(self.factor, self.max_growth, self.first, plan.multiple, plan.max_num_samples)
    return int(mesh.host_value(advise(opt_state())))


@dataclasses.dataclass(frozen=True)
class Seesaw(_Ramp):
  """S doubles, and the rate grows by sqrt(2), at every halving of the decaying rate
  (``batch_ramp='seesaw'``; Meterez et al. 2025)."""

  first: int
  lr_decay: float  # the rate's decay over the run, in (0, 1)
  max_num_samples: int = 0  # 0: the default bound

  def next_num_samples(
    self, at: Progress, plan: Plan, opt_state: Callable[[], optax.OptState]
  ) -> int:
    """The first S doubled once per factor 2 the decay ``lr_decay ** progress`` has lost by
    the examples seen, at most ``plan.max_num_samples``."""
    halvings = math.floor(at.samples_seen / plan.examples * math.log2(1.0 / self.lr_decay) + 1e-9)
    s = self.first
    while halvings > 0 and 2 * s <= plan.max_num_samples:
      s, halvings = 2 * s, halvings - 1
    return s

  def rate_factor(self, num_samples: int) -> float:
    """sqrt(S / first): the rate's sqrt(2) per doubling."""
    return math.sqrt(num_samples / self.first)


BatchSchedule = Fixed | Steps | NoiseRamp | Seesaw


def _options(kind: str, text: str, allowed: dict[str, type]) -> dict[str, Any]:
  """``key=value,...`` of ``batch_ramp='KIND:text'``, each converted to its type."""
  out: dict[str, Any] = {}
  for item in filter(None, text.split(",")):
    key, sep, value = item.partition("=")
    if not sep or key not in allowed:
      raise ConfigError(
        f"batch_ramp '{kind}:{text}': expected key=value with keys {', '.join(allowed)}, got "
        f"{item!r}."
      )
    try:
      out[key] = allowed[key](value)
    except ValueError:
      raise ConfigError(
        f"batch_ramp {kind}: {key}={value!r} is not a {allowed[key].__name__}."
      ) from None
  return out


def _steps(spec: str, text: str) -> Steps:
  pairs = []
  for item in text.split(","):
    first, sep, s = item.partition(":")
    if not (sep and first.strip().isdigit() and s.strip().isdigit() and int(s) > 0):
      raise ConfigError(
        f"batch_ramp {spec!r}: each entry is UPDATE:S (S > 0), e.g. 'steps:0:2,12:8'."
      )
    pairs.append((int(first), int(s)))
  firsts = [u for u, _ in pairs]
  if firsts[0] != 0 or firsts != sorted(set(firsts)):
    raise ConfigError(
      f"batch_ramp {spec!r}: the updates must start at 0 and increase, e.g. 'steps:0:2,12:8'."
    )
  return Steps(tuple(pairs))


def from_config(config: Config) -> BatchSchedule:
  """The schedule ``config.batch_ramp`` names, its first S from ``config`` where it takes one.

  Raises:
    ConfigError: an unknown or malformed ``batch_ramp`` (the message names the valid forms), or
      Seesaw without a decaying rate.

  Examples:
    >>> from examples.lena import batch_schedule, configs
    >>> config = configs.get_config("tiny_test")
    >>> batch_schedule.from_config(config)
    Fixed(num_samples=8)
    >>> ramp = configs.override(config, ["batch_ramp=steps:0:2,12:8"])
    >>> batch_schedule.from_config(ramp)
    Steps(steps=((0, 2), (12, 8)))
  """
  spec = config.batch_ramp
  kind, _, rest = spec.strip().partition(":")
  if kind == "none" and not rest:
    return Fixed(parallel.num_samples(config))
  if kind == "steps":
    return _steps(spec, rest)
  if kind == "noise":
    opts = _options(kind, rest, {"every": int, "factor": float, "max": int, "growth": float})
    noise = NoiseRamp(
      parallel.num_samples(config),
      every=opts.get("every", 50),
      factor=opts.get("factor", 1.0),
      max_num_samples=opts.get("max", 0),
      max_growth=opts.get("growth", 2.0),
    )
    if noise.every < 1 or noise.factor <= 0 or noise.max_growth < 1 or noise.max_num_samples < 0:
      raise ConfigError(
        f"batch_ramp {spec!r}: needs every >= 1, factor > 0, growth >= 1 and max >= 0."
      )
    return noise
  if kind == "seesaw":
    opts = _options(kind, rest, {"max": int})
    if not (config.lr_decay and 0 < config.lr_decay < 1):
      raise ConfigError("batch_ramp='seesaw' needs a decaying rate: lr_decay in (0, 1).")
    return Seesaw(parallel.num_samples(config), config.lr_decay, max(0, opts.get("max", 0)))
  raise ConfigError(f"Unknown batch_ramp {spec!r}; valid forms: {FORMS}.")


def check_optimizer(schedule: BatchSchedule, config: Config) -> None:
  """Raises ConfigError when a ramp's optimizer is not on the sample clock (naming those that
  are): the rate of such an optimizer follows the updates, whose size a ramp changes."""
  if not schedule.ramped or optimizers.get(config.optimizer).diagnostics:
    return
  valid = [n for n in optimizers.names() if optimizers.get(n).diagnostics]
  raise ConfigError(
    f"batch_ramp needs an optimizer on the sample clock with gradient statistics; "
    f"{config.optimizer!r} is not one: use one of {', '.join(valid)}."
  )


def progress_arrays(progress: Progress) -> dict[str, np.ndarray]:
  """A ramp's progress as a checkpoint holds it (beside the state and the data position)."""
  return {
    "samples_seen": np.array(progress.samples_seen, np.int64),
    "num_samples": np.array(progress.num_samples, np.int64),
  }
