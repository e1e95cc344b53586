"""The batch-ramp study's declared setups, arms and seeds, and the rules that read a run (the
step schedule of the ``steps`` arm, the crossing of the target)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

ARMS = ("small", "large", "steps", "noise", "seesaw")
PILOT_SEED = 100  # outside every setup's seeds: the pilot that fixed the target


@dataclasses.dataclass(frozen=True)
class Setup:
  """The study's sizes, all fixed before it runs (``quick()``: the smoke test's)."""

  config: str = "default"  # the trainer's MNIST-1D CNN configuration
  num_epochs: int = 30
  num_validation: int = 1000  # training examples held out: the target is read off these
  small: int = 2  # S of the small fixed batch and every ramp's first S
  large: int = 16  # S of the large fixed batch and every ramp's largest S
  step_fractions: tuple[float, ...] = (0.25, 0.5, 0.75)  # 'steps': S doubles at these
  noise_every: int = 50  # 'noise': updates between readings of B_crit
  seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
  # A validation accuracy, fixed before the study from a pilot run of 'small' on PILOT_SEED
  # (outside `seeds`): about two points below its final one (RESULTS.md gives the pilot).
  target: float = 0.92
  mnist1d_samples: int = 10_000
  per_worker_batch: int = 0  # 0: the configuration's
  width: int = 0  # CNN features; 0: the configuration's
  rng_impl: str = "default"


# The attention model at the CNN's sizes (its runs are short enough for the time budget); the
# target is about two points below the final validation accuracy of its pilot (`--pilot`).
ATTENTION = Setup(config="mnist1d_attention", target=0.82)
SETUPS = {"cnn": Setup(), "attention": ATTENTION}
# A seconds-long setup for the smoke test (two seeds, so that intervals exist).
SMOKE = Setup(
  num_epochs=2,
  num_validation=200,
  small=1,
  large=4,
  noise_every=3,
  seeds=(0, 1),
  target=0.15,
  mnist1d_samples=1000,
  per_worker_batch=16,
  width=8,
  rng_impl="rbg",
)


@dataclasses.dataclass(frozen=True)
class Run:
  arm: str
  seed: int

  @property
  def name(self) -> str:
    return f"{self.arm}_seed{self.seed}"


def runs_of(setup: Setup) -> list[Run]:
  """Seed-major order: a change of the machine's load during the study falls on every arm."""
  return [Run(arm, seed) for seed in setup.seeds for arm in ARMS]


def step_schedule(small: int, large: int, fractions: Sequence[float], batches: float) -> str:
  """``steps:0:S0,U1:S1,...``: S doubles from ``small`` (capped at ``large``) when the
  examples reach each of ``fractions`` of the budget (``batches`` per-worker batches).

  Update ``U_i`` is the first update whose examples reach ``fractions[i] x batches``."""
  s, u, seen, entries = small, 0, 0.0, [f"0:{small}"]
  for f in fractions:
    if 2 * s > large:
      break
    # Updates of S until the examples reach this fraction (a ceiling: never before it).
    n = math.ceil((f * batches - seen) / s - 1e-9)
    u, seen, s = u + n, seen + n * s, 2 * s
    entries.append(f"{u}:{s}")
  return "steps:" + ",".join(entries)


def crossing(evals: Sequence[Sequence[float]], target: float) -> float | None:
  """The (fractional) update where the accuracy first reaches ``target``, linear between the
  evaluation before and the first at or above it (None: never). ``evals``: ``(update,
  accuracy)`` pairs in order; before the first evaluation the curve starts at update 0 with
  the first accuracy."""
  prev_u, prev_a = 0.0, None
  for u, a in evals:
    if a >= target:
      if prev_a is None or a == prev_a:
        return float(u)
      return float(prev_u + (target - prev_a) / (a - prev_a) * (u - prev_u))
    prev_u, prev_a = float(u), a
  return None


def cells(setup: Setup, out: Path) -> list[Run]:
  """The setup's runs (the grid does not depend on results)."""
  del out
  return runs_of(setup)


@dataclasses.dataclass(frozen=True)
class Pilot:
  """The pilot: ``small`` on :data:`PILOT_SEED`, validation only (``pilot.json``)."""

  name: str = "pilot"


def pilot_cells(setup: Setup, out: Path) -> list[Pilot]:
  """The one pilot run."""
  del setup, out
  return [Pilot()]
