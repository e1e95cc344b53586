"""Shared by the overhead sections: settings, the optimizers under test, interleaved timing."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from examples import optimizers as registry

PyTree = Any
AXIS = "batch"
# A constant rate eta0, theta of LENA's state-aware warm-up and W of LSW's fixed one (base steps).
LR, MOMENTUM, WEIGHT_DECAY, THETA, WARMUP_STEPS = 0.1, 0.9, 5e-4, 50.0, 100.0
NUM_WORKERS = 8
TOTAL_STEPS = 1000  # the run length the warm-up fractions refer to (T1 = TOTAL_STEPS x S)
# The optimizers under test: registry names, except the baseline, which this benchmark's tables
# call what it is (the registry's "sgd" is momentum SGD with coupled weight decay).
OPTIMIZERS = ("sgd_momentum", "lena", "adascale", "linear_scaling", "lars", "lamb")
REGISTRY_NAMES = {"sgd_momentum": "sgd"}

# Target id -> (what, limit on the ratio). "memory" is checked on bytes, see memory_rows.
TARGETS = {
  "update_only": ("update only (statistics given) vs SGD-momentum", 1.15),
  "update_only_scanned": ("update only, scanned tree, LENA per slice vs SGD-momentum", 1.10),
  "stacked": ("stacked statistics + update (S=8) vs sum of the slices / S + SGD-momentum", 1.10),
  "pmap_step": ("data-parallel step vs pmean + SGD-momentum", 1.10),
  "train_step": ("whole training step vs linear scaling", 1.03),
  "memory": ("state = SGD-momentum + O(leaves) scalars (<= 64 B per leaf)", 64.0),
  "compile": ("compile time at the largest leaf count vs SGD-momentum", 1.5),
}

# ----------------------------------------------------------------------------------------------
# Optimizers.


def optimizers(
  num_samples: int = NUM_WORKERS, layer_axes: Any = None
) -> dict[str, tuple[optax.GradientTransformation, bool]]:
  """name -> (transformation, whether its update takes grad_stats), from the example registry.

  Each optimizer with its paper warm-up (LENA: theta = THETA, LSW: W = WARMUP_STEPS base
  steps, AdaScale and the others none) and the constant rate LR; ``num_samples`` is the S the
  statistics will have (the number of devices in the data-parallel sections). ``layer_axes``
  (``optax_lena``'s, for parameters that stack their layers) goes to the optax_lena entries, as
  the trainer passes it; optax's own LARS and LAMB have one trust ratio per stacked leaf.
  """
  t1 = TOTAL_STEPS * num_samples
  hp = registry.Hyperparams(
    learning_rate=LR,
    num_samples=num_samples,
    total_steps=TOTAL_STEPS,
    momentum=MOMENTUM,
    weight_decay=WEIGHT_DECAY,
    lr_decay=None,  # constant: the timings are of the update, not of a schedule
    warmup_alpha=THETA / t1,
    warmup_fraction=WARMUP_STEPS / t1,
    layer_axes=layer_axes,
  )
  out = {}
  for name in OPTIMIZERS:
    entry_name = REGISTRY_NAMES.get(name, name)
    entry = registry.get(entry_name)
    tx = registry.build(entry_name, dataclasses.replace(hp, warmup=entry.paper_warmup))
    out[name] = (tx, entry.diagnostics)
  return out


def slices_mean(stacked: PyTree) -> PyTree:
  """The mean over the leading (worker) axis as the sum of the S slices over S: the baseline a
  careful user writes. On XLA:CPU (jax 0.10) ``jnp.mean(g, axis=0)`` is a scalar loop over the
  worker axis, about 40x slower (RESULTS.md), while the sum of slices is one vectorised
  elementwise kernel that XLA fuses into the update that reads it."""

  def mean(g: jax.Array) -> jax.Array:
    total = g[0]
    for i in range(1, g.shape[0]):
      total = total + g[i]
    return total / g.shape[0]

  return jax.tree.map(mean, stacked)


def fresh(tree: PyTree) -> PyTree:
  """Own copies of every array: an optimizer's init may return one array in two places of its
  state, which cannot be donated twice."""
  return jax.tree.map(jnp.copy, tree)


def apply_update(tx, uses_stats, grads, opt_state, params, stats=None):
  if uses_stats:
    updates, opt_state = tx.update(grads, opt_state, params, grad_stats=stats)
  else:
    updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state


# ----------------------------------------------------------------------------------------------
# Timing.


class Stepper:
  """Runs ``fn(*carry, *consts) -> carry`` in place (the carry is donated, as in training)."""

  def __init__(self, fn: Callable[..., Any], carry: tuple, consts: tuple = ()):
    self.fn, self.carry, self.consts = fn, carry, consts

  def __call__(self) -> None:
    self.carry = self.fn(*self.carry, *self.consts)
    jax.block_until_ready(self.carry)


def update_stepper(
  fn: Callable[..., Any], tx: optax.GradientTransformation, params: PyTree, consts: tuple
) -> Stepper:
  """``fn(params, opt_state, *consts)`` jitted with its carry donated, from ``params`` and a
  fresh state of ``tx``: the runner of the update-only sections."""
  return Stepper(jax.jit(fn, donate_argnums=(0, 1)), (params, fresh(tx.init(params))), consts)


def time_interleaved(
  runners: Mapping[str, Callable[[], None]],
  repeats: int,
  warmup: int = 2,
  min_seconds: float = 0.0,
) -> dict[str, np.ndarray]:
  """Seconds per call of every runner: warm-up calls (compiles), then interleaved repeats.

  Candidates alternate in order A B C, C B A, ... so that slow drifts of the machine (other
  processes, frequency) hit all of them alike; compare medians. With ``min_seconds``, rounds
  continue past ``repeats`` until that much time is spent (at most 20 x ``repeats`` rounds):
  steps of a few milliseconds need hundreds of samples for a stable median on a shared machine.
  """
  names = list(runners)
  for i in range(warmup):
    for name in names:
      start = time.perf_counter()
      runners[name]()
      if i == 0:
        log(f"    first call (compile) of {name}: {time.perf_counter() - start:.1f} s")
  times: dict[str, list[float]] = {name: [] for name in names}
  start_all = time.perf_counter()
  i = 0
  while i < repeats or (time.perf_counter() - start_all < min_seconds and i < 20 * repeats):
    for name in names if i % 2 == 0 else names[::-1]:
      start = time.perf_counter()
      runners[name]()
      times[name].append(time.perf_counter() - start)
    i += 1
  return {name: np.asarray(t) for name, t in times.items()}


@dataclasses.dataclass
class Row:
  section: str
  tree: str
  candidate: str
  baseline: str
  candidate_ms: float
  baseline_ms: float
  ratio: float
  target: str | None = None

  @property
  def passed(self) -> bool | None:
    return None if self.target is None else self.ratio <= TARGETS[self.target][1]


def rows_from_times(section, tree, times, baseline, targets=None) -> list[Row]:
  """One row per non-baseline candidate: ratio of medians, with absolute medians."""
  targets = targets or {}
  base = float(np.median(times[baseline]))
  rows = []
  for name, t in times.items():
    if name == baseline:
      continue
    med = float(np.median(t))
    rows.append(
      Row(section, tree, name, baseline, 1e3 * med, 1e3 * base, med / base, targets.get(name))
    )
  return rows


def log(msg: str) -> None:
  print(msg, flush=True)


def log_rows(rows: list[Row]) -> None:
  for r in rows:
    verdict = "" if r.passed is None else ("  PASS" if r.passed else "  FAIL")
    log(
      f"    {r.candidate:>34} / {r.baseline:<28} {r.ratio:6.3f}x  "
      f"({r.candidate_ms:8.2f} ms vs {r.baseline_ms:8.2f} ms){verdict}"
    )


def timed_rows(
  section: str,
  tree: str,
  runners: Mapping[str, Stepper],
  repeats: int,
  baseline: str,
  targets: Mapping[str, str] | None = None,
) -> list[Row]:
  """Times ``runners`` side by side (:func:`time_interleaved`) and logs and returns their rows
  against ``baseline`` (:func:`rows_from_times`)."""
  rows = rows_from_times(section, tree, time_interleaved(runners, repeats), baseline, targets)
  log_rows(rows)
  return rows
