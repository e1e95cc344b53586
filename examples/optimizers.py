"""The optimizer registry: one entry per optimizer, read by every program of the repository.

The trainer (``--set optimizer=NAME``), the demo, the reproduction study, the overhead benchmark
and the notebook all build their optimizers here, so adding one is one :func:`register` call::

  from examples import optimizers

  optimizers.register(optimizers.Optimizer(
    name="adam",
    label="Adam",
    build=lambda hp: optax.adam(hp.update_schedule()),
  ))

``build`` receives :class:`Hyperparams` (eta0, S, run length, warm-up, ...) and returns an
Optax transformation. Every update is called with ``grad_stats=`` (the per-layer gradient
statistics): Optax's ``chain`` forwards extra keyword arguments only to the members that accept
them, so plain optimizers ignore it. To use a registered optimizer from the command line, put
the ``register`` call in a configuration file and pass ``--config my_config.py`` (see
``examples/lena/configs/user_optimizer.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import optax

import optax_lena as ol
from examples import models

WARMUPS = ("none", "fixed", "state_aware")
GROUPINGS: dict[str, Any] = {"leaf": None, "module": "module"}


@dataclasses.dataclass(frozen=True)
class Hyperparams:
  """What an optimizer builder needs to know about the run.

  The rate is the paper's exponential decay ``eta0 * lr_decay ** progress`` (``lr_decay=None``:
  the constant ``eta0``). Warm-up lengths are fractions of T1 = ``total_steps x k``, the
  reference-batch iterations of the same epoch budget (k = S, single-worker iterations, unless
  a reference batch is given): theta = ``warmup_alpha x T1`` for the state-aware warm-up, W =
  ``warmup_fraction x T1`` base steps for the fixed one.

  ``reference_batch_size`` (b0, with ``per_worker_batch_size`` b) is the batch at which
  ``learning_rate`` was tuned, when it is not the per-worker batch: an update of S per-worker
  gradients then holds k = S b / b0 reference batches (:attr:`scale`), which the entries whose
  ``takes_reference_batch`` is set pass on to ``optax_lena`` (the ratio's cap, LSW's factor,
  the sample clock and the warm-ups count k).

  ``layer_axes`` says which parameters stack several layers, and on which axis (``optax_lena``'s
  ``layer_axes=``; None: one layer per parameter leaf). The trainer reads it from a model whose
  blocks are scanned (``scan_layers``) and the entries that build an ``optax_lena`` optimizer
  pass it on, so that LENA's ratios and warm-ups are per block, as in the unscanned model.
  Optax's own optimizers ignore it (LARS and LAMB then have one trust ratio per stack).
  """

  learning_rate: float  # eta0, the rate at the reference batch (the per-worker batch by default)
  num_samples: int = 1  # S, per-worker gradients per update
  total_steps: int = 1  # updates of the run
  momentum: float = 0.9  # SGD's momentum; the AdamW entries' b1
  weight_decay: float = 0.0  # coupled for SGD; decoupled, on kernels only, for AdamW
  lr_decay: float | None = 0.01
  warmup: str = "none"  # 'none', 'fixed' or 'state_aware' (already resolved from 'default')
  warmup_alpha: float = 0.05
  warmup_fraction: float = 0.055
  grouping: str = "leaf"  # LENA's ratios per 'leaf' (the paper) or per 'module'
  per_worker_batch_size: int | None = None  # b, examples per per-worker gradient
  reference_batch_size: int | None = None  # b0 (None: the rate was tuned at the per-worker batch)
  # A pytree of int | None (hashable, e.g. a flax.core.FrozenDict, as every field) or a callable.
  layer_axes: Any = None

  @property
  def scale(self) -> int:
    """k = S b / b0, reference batches per update (S without a reference batch).

    Raises:
      ValueError: only one of the batch sizes given, or S b not a multiple of b0 (the message
        names the nearest divisor); ``optax_lena``'s own check, run here at construction.
    """
    return ol.linear_scaling_rule(**self.batch_kwargs()).scale(self.num_samples)

  @property
  def base_steps_total(self) -> int:
    """T1: the reference-batch iterations of the run (updates x k; k = S by default)."""
    return self.total_steps * self.scale

  def batch_kwargs(self) -> dict[str, int | None]:
    """``per_worker_batch_size=`` and ``reference_batch_size=`` for ``optax_lena`` (empty
    without a reference batch, so the default builds exactly what it built before)."""
    if self.reference_batch_size is None:
      return {}
    return {
      "per_worker_batch_size": self.per_worker_batch_size,
      "reference_batch_size": self.reference_batch_size,
    }

  def sample_schedule(self) -> optax.ScalarOrSchedule:
    """The rate as a function of base steps t * k (use with ``clock='samples'``), so the same
    function of samples seen at every batch size."""
    eta0, decay, t1 = self.learning_rate, self.lr_decay, self.base_steps_total
    if decay is None:
      return eta0
    return lambda base_steps: eta0 * decay ** (base_steps / t1)

  def update_schedule(self) -> optax.ScalarOrSchedule:
    """The same decay on the update count, times the fixed warm-up factor when ``warmup ==
    'fixed'`` (for optimizers without a warm-up of their own)."""
    eta0, decay, total = self.learning_rate, self.lr_decay, self.total_steps
    fixed = self.warmup == "fixed"
    if decay is None and not fixed:
      return eta0
    warmup_updates = self.warmup_fraction * total  # W / S updates

    def schedule(count: jax.Array) -> jax.typing.ArrayLike:
      rate = eta0 if decay is None else eta0 * decay ** (count / total)
      if fixed:  # same factor as LSW's min(t S / W, 1), t = count + 1
        rate = rate * jnp.minimum((count + 1) / warmup_updates, 1.0)
      return rate

    return schedule

  def warmup_kwargs(self) -> dict[str, Any]:
    """``warmup_threshold=`` (state-aware) or ``warmup_steps=`` (fixed) for ``optax_lena``."""
    if self.warmup == "state_aware":
      return {"warmup_threshold": self.warmup_alpha * self.base_steps_total}
    if self.warmup == "fixed":
      return {"warmup_steps": self.warmup_fraction * self.base_steps_total}
    return {}


@dataclasses.dataclass(frozen=True)
class Optimizer:
  """One registry entry.

  Attributes:
    name: the configuration value (``optimizer=NAME``).
    build: ``Hyperparams -> optax.GradientTransformation``.
    label: the name in tables and plots.
    paper_warmup: the warm-up the paper pairs with it (``warmup=default`` picks it).
    diagnostics: its state carries LENA/AdaScale statistics, so the trainer logs
      ``ol.diagnostics`` (per-layer rate multipliers, gain ratios, warm-up ends).
    warmups: the warm-ups ``build`` implements (``state_aware`` needs gradient statistics).
    takes_reference_batch: ``build`` honours ``Hyperparams.reference_batch_size`` (the
      others refuse one: their rate does not scale with the batch).
  """

  name: str
  build: Callable[[Hyperparams], optax.GradientTransformation]
  label: str
  paper_warmup: str = "none"
  diagnostics: bool = False
  warmups: tuple[str, ...] = ("none", "fixed")
  takes_reference_batch: bool = False


_REGISTRY: dict[str, Optimizer] = {}


def register(optimizer: Optimizer, *, replace: bool = False) -> Optimizer:
  """Adds ``optimizer`` to the registry (``replace=True`` overwrites an entry of that name)."""
  if optimizer.name in _REGISTRY and not replace:
    raise ValueError(f"Optimizer {optimizer.name!r} is already registered.")
  unknown = set(optimizer.warmups) - set(WARMUPS) or {optimizer.paper_warmup} - set(WARMUPS)
  if unknown or optimizer.paper_warmup not in optimizer.warmups:
    raise ValueError(
      f"Optimizer {optimizer.name!r}: warm-ups must be among {', '.join(WARMUPS)} and include "
      f"paper_warmup {optimizer.paper_warmup!r}."
    )
  _REGISTRY[optimizer.name] = optimizer
  return optimizer


@contextlib.contextmanager
def registered(*entries: Optimizer) -> Iterator[None]:
  """Registers ``entries`` for the duration of a ``with`` block (a study's own variants)."""
  previous = {e.name: _REGISTRY.get(e.name) for e in entries}
  for e in entries:
    register(e, replace=True)
  try:
    yield
  finally:
    for name, old in previous.items():
      if old is None:
        del _REGISTRY[name]
      else:
        _REGISTRY[name] = old


def names() -> tuple[str, ...]:
  """The registered names, in registration order."""
  return tuple(_REGISTRY)


def get(name: str) -> Optimizer:
  """The entry of ``name``; ValueError listing the valid names if there is none."""
  try:
    return _REGISTRY[name]
  except KeyError:
    raise ValueError(
      f"Unknown optimizer {name!r}; valid optimizers: {', '.join(_REGISTRY)}."
    ) from None


def build(name: str, hp: Hyperparams) -> optax.GradientTransformationExtraArgs:
  """The transformation of ``name``, checked against its warm-ups.

  Returns:
    A transformation whose update accepts (and forwards to those that take it) ``grad_stats=``.

  Raises:
    ValueError: unknown name, unsupported warm-up or reference batch, or a reference batch that
      does not divide the global batch (the message says what to use instead).
  """
  entry = get(name)
  if hp.warmup not in entry.warmups:
    stats = [o.name for o in _REGISTRY.values() if hp.warmup in o.warmups]
    why = " (it needs gradient statistics)" if hp.warmup == "state_aware" else ""
    raise ValueError(
      f"warmup={hp.warmup!r}{why} is not implemented by optimizer {name!r}, which has "
      f"{', '.join(entry.warmups)}. Optimizers with warmup={hp.warmup!r}: {', '.join(stats)}."
    )
  if hp.reference_batch_size is not None and not entry.takes_reference_batch:
    takers = [o.name for o in _REGISTRY.values() if o.takes_reference_batch]
    raise ValueError(
      f"reference_batch_size={hp.reference_batch_size} (the batch learning_rate was tuned at) "
      f"is not implemented by optimizer {name!r}, whose rate does not scale with the batch: "
      f"use one of {', '.join(takers)}, or leave reference_batch_size unset (0 in the "
      "trainer's config) and give learning_rate for this run's batch."
    )
  _ = hp.scale  # a reference batch that does not divide the global batch fails here, not in jit
  # A no-op for chains (already GradientTransformationExtraArgs); makes a bare transformation
  # accept (and ignore) grad_stats=.
  return optax.with_extra_args_support(entry.build(hp))


# ----------------------------------------------------------------------------------------------
# The built-in entries
# ----------------------------------------------------------------------------------------------


def _large_batch(
  alias: Callable[..., optax.GradientTransformation], grouped: bool = False, adamw: bool = False
) -> Callable[[Hyperparams], optax.GradientTransformation]:
  """Builder of an ``optax_lena`` alias: the rate on the sample clock t * S (the paper's),
  either warm-up, the reference batch, the layer axes; ``grouped``: it takes ``grouping=``.
  Momentum SGD with
  coupled weight decay, or with ``adamw`` an AdamW alias: ``momentum`` as b1, the weight decay
  decoupled and on kernels only (``models.decay_mask``), the library's ``power`` (the
  square-root rule), b2 and eps."""

  def build_fn(hp: Hyperparams) -> optax.GradientTransformation:
    family: dict[str, Any] = (
      {"b1": hp.momentum, "weight_decay_mask": models.decay_mask}
      if adamw
      else {"momentum": hp.momentum}
    )
    kw: dict[str, Any] = dict(
      **family,
      weight_decay=hp.weight_decay,
      clock="samples",
      num_samples=hp.num_samples,
      **hp.warmup_kwargs(),
      **hp.batch_kwargs(),
      layer_axes=hp.layer_axes,
    )
    if grouped:
      kw["grouping"] = GROUPINGS[hp.grouping]
    return alias(hp.sample_schedule(), **kw)

  return build_fn


def _register_large_batch(
  name: str, alias: Callable[..., optax.GradientTransformation], label: str, paper_warmup: str
) -> None:
  """Registers a large-batch rule (LENA takes ``grouping=``; ``*_adamw`` are AdamW's)."""
  build = _large_batch(alias, grouped=name.startswith("lena"), adamw=name.endswith("_adamw"))
  register(
    Optimizer(
      name=name,
      build=build,
      label=label,
      paper_warmup=paper_warmup,
      diagnostics=True,
      warmups=WARMUPS,
      takes_reference_batch=True,
    )
  )


def _sgd(hp: Hyperparams) -> optax.GradientTransformation:
  """The single-worker baseline: momentum SGD with coupled weight decay (PyTorch semantics)."""
  return optax.chain(
    optax.add_decayed_weights(hp.weight_decay),
    optax.sgd(hp.update_schedule(), momentum=hp.momentum),
  )


def _lars(hp: Hyperparams) -> optax.GradientTransformation:
  return optax.lars(hp.update_schedule(), weight_decay=hp.weight_decay, momentum=hp.momentum)


def _lamb(hp: Hyperparams) -> optax.GradientTransformation:
  return optax.lamb(hp.update_schedule(), weight_decay=hp.weight_decay)


register(Optimizer(name="sgd", build=_sgd, label="SGD 1 worker"))
_register_large_batch("linear_scaling", ol.linear_scaling, "LSW", "fixed")
_register_large_batch("adascale", ol.adascale, "AdaScale", "none")
_register_large_batch("lena", ol.lena, "LENA", "state_aware")
register(Optimizer(name="lars", build=_lars, label="LARS"))
register(Optimizer(name="lamb", build=_lamb, label="LAMB"))


def _adamw(hp: Hyperparams) -> optax.GradientTransformation:
  """One worker's AdamW: the rate does not follow the batch (b2 and eps are Optax's)."""
  return optax.adamw(
    hp.update_schedule(), b1=hp.momentum, weight_decay=hp.weight_decay, mask=models.decay_mask
  )


register(Optimizer(name="adamw", build=_adamw, label="AdamW 1 worker"))
_register_large_batch("linear_scaling_adamw", ol.linear_scaling_adamw, "sqrt LSW AdamW", "fixed")
_register_large_batch("adascale_adamw", ol.adascale_adamw, "AdaScale-AdamW", "none")
_register_large_batch("lena_adamw", ol.lena_adamw, "LENA-AdamW", "state_aware")
