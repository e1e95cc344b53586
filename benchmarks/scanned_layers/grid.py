"""The scanned-layers study's declared cells: the methods, the two S, the shared rate grid and
its edge extensions, the selection seed and the reported seeds, and the selection rule (the
final validation accuracy of the selection seed, never a test number).

The cells join in phases, each once every cell of the phase before has finished, so that the
list only grows by appending (the shards of concurrent processes stay disjoint): the rate grid
of every method at every S on the selection seed; the one extension beyond an edge where a
method's best rate is the grid's smallest or largest; then, at each method's chosen rate, the
reported seeds and the two logging reruns.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

RESULT = "result.json"  # what the runner writes last in a run directory: the cell's summary
GROUPS = ("select", "final", "log")  # selection seed (validation), reported seeds, logging


class Method(NamedTuple):
  """An arm: its label, the trainer's registry entry and the fields the arm sets."""

  label: str
  optimizer: str
  layer_axes: str  # the trainer's 'model' (a ratio and a warm-up per block's slice) or 'none'
  reference_batch: bool  # the rate is the reference batch's, scaled by the rule
  warmup: str  # the trainer's 'default' (the entry's paper warm-up) or 'fixed'


METHODS: dict[str, Method] = {
  "lena_slice": Method("LENA-AdamW per slice", "lena_adamw", "model", True, "default"),
  "lena_stack": Method("LENA-AdamW per stack", "lena_adamw", "none", True, "default"),
  # One global ratio: per slice and per stack give the same numbers, so it runs once.
  "adascale": Method("AdaScale-AdamW", "adascale_adamw", "model", True, "default"),
  "adamw": Method("tuned AdamW", "adamw", "model", False, "fixed"),
  # Optax's trust ratio is per leaf: per stack on the scanned model.
  "lamb": Method("LAMB (trust ratio per stack)", "lamb", "model", False, "fixed"),
}
PRIMARY = ("lena_slice", "lena_stack")  # the primary comparison: per slice minus per stack
# The secondary comparisons, each per slice minus the other arm, and their endpoints.
SECONDARY: tuple[tuple[str, str, str], ...] = (
  ("lena_slice", "adascale", "test_accuracy"),
  ("lena_slice", "adamw", "test_accuracy"),
  ("lena_slice", "lamb", "test_accuracy"),
  ("lena_slice", "lena_stack", "test_loss"),
  ("lena_slice", "lena_stack", "validation_accuracy"),
)
LOG_METHODS = ("lena_slice", "lena_stack")  # the logging reruns: gain ratios by block


@dataclasses.dataclass(frozen=True)
class Setup:
  """The study's sizes, every one fixed before any of its runs (``SMOKE``: the smoke test's).

  ``below`` / ``above``: the one rate run beyond the grid's smallest / largest when a method's
  best is there (None: no extension). ``log_scale`` and ``log_seed``: the S and the seed of the
  logging reruns (``log_seed=None``: none), ``log_every`` their records' spacing.
  """

  scales: tuple[int, ...] = (64, 256)
  rates: tuple[float, ...] = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
  below: float | None = 3e-4
  above: float | None = 3e-1
  selection_seed: int = 100
  seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
  methods: tuple[str, ...] = tuple(METHODS)
  log_scale: int = 64
  log_seed: int | None = 0
  log_every: int = 10
  num_epochs: int = 16
  depth: int = 4
  width: int = 0  # 0: the model's (24)
  num_samples: int = 10_000  # MNIST-1D examples before its 80/20 train/test split
  num_validation: int = 1000  # training examples held out as the validation split
  per_worker_batch: int = 8
  reference_batch: int = 64  # the rate is the rate at this batch: k = S x 8 / 64
  rng_impl: str = "default"


# Seconds: two tiny cells a group (two seeds, so that intervals exist), no edge extension.
SMOKE = Setup(
  scales=(16,),
  rates=(1e-2,),
  below=None,
  above=None,
  seeds=(0, 1),
  methods=PRIMARY,
  log_scale=16,
  log_every=1,
  num_epochs=1,
  depth=2,
  width=8,
  num_samples=1000,
  num_validation=200,
  rng_impl="rbg",
)


@dataclasses.dataclass(frozen=True)
class Cell:
  """One training run; ``name`` is its directory under ``runs/``."""

  group: str  # 'select' (selection seed, validation only), 'final' (test once) or 'log'
  method: str
  scale: int  # S, per-worker gradients of an update
  rate: float
  seed: int

  @property
  def name(self) -> str:
    return f"{self.group}_S{self.scale}_{self.method}_lr{self.rate:g}_seed{self.seed}"


def read_result(out: Path, cell: Cell) -> dict[str, Any] | None:
  """The summary the runner wrote for ``cell`` (None: not finished)."""
  path = out / "runs" / cell.name / RESULT
  return json.loads(path.read_text()) if path.exists() else None


def pick(scores: Mapping[float, float]) -> float:
  """The rate of the highest score; ties go to the smaller rate."""
  return max(sorted(scores), key=lambda rate: scores[rate])


def edge_rate(setup: Setup, best: float) -> float | None:
  """The rate beyond the grid's edge when ``best`` is its smallest or largest (else None)."""
  if best == min(setup.rates):
    return setup.below
  if best == max(setup.rates):
    return setup.above
  return None


def selection(
  setup: Setup, score: Callable[[float], float | None]
) -> tuple[list[float], float | None]:
  """The rates one method runs at one S and the rate chosen (None until they have finished).

  ``score(rate)`` is the final validation accuracy of the selection seed's run at that rate
  (None: not finished). The grid is ``setup.rates``; if its best is at an edge, the one rate
  beyond it joins (once), and the choice is made over all of them.
  """
  swept = list(setup.rates)
  scores = {rate: score(rate) for rate in swept}
  if any(v is None for v in scores.values()):
    return swept, None
  extra = edge_rate(setup, pick(scores))  # type: ignore[arg-type]  # no None left
  if extra is not None:
    swept.append(extra)
    scores[extra] = score(extra)
    if scores[extra] is None:
      return swept, None
  return swept, pick(scores)  # type: ignore[arg-type]


def validation_score(out: Path, setup: Setup, method: str, scale: int) -> Callable[[float], Any]:
  """``score(rate)`` of :func:`selection`: the selection run's final validation accuracy."""

  def score(rate: float) -> float | None:
    result = read_result(out, Cell("select", method, scale, rate, setup.selection_seed))
    return None if result is None else float(result["validation_accuracy"])

  return score


def chosen_rates(setup: Setup, out: Path) -> dict[tuple[str, int], tuple[list[float], Any]]:
  """(method, S) -> (the rates it runs on the selection seed, the chosen rate or None)."""
  return {
    (method, s): selection(setup, validation_score(out, setup, method, s))
    for s in setup.scales
    for method in setup.methods
  }


def cells(setup: Setup, out: Path) -> list[Cell]:
  """The grid on the selection seed; once it has finished, the edge extensions; once every
  rate is chosen, the reported seeds (seed-major: a change of the machine's load falls on every
  arm) and the logging reruns."""
  for method in setup.methods:
    if method not in METHODS:
      raise ValueError(f"Unknown method {method!r}; valid methods: {', '.join(METHODS)}.")
  grid = [
    Cell("select", method, s, rate, setup.selection_seed)
    for s in setup.scales
    for method in setup.methods
    for rate in setup.rates
  ]
  if any(read_result(out, c) is None for c in grid):
    return grid
  choices = chosen_rates(setup, out)
  edges = [
    Cell("select", method, s, rates[-1], setup.selection_seed)
    for (method, s), (rates, _) in choices.items()
    if len(rates) > len(setup.rates)
  ]
  if any(rate is None for _, rate in choices.values()):
    return grid + edges
  final = [
    Cell("final", method, s, choices[(method, s)][1], seed)
    for seed in setup.seeds
    for s in setup.scales
    for method in setup.methods
  ]
  log = []
  if setup.log_seed is not None:
    log = [
      Cell("log", m, setup.log_scale, choices[(m, setup.log_scale)][1], setup.log_seed)
      for m in LOG_METHODS
      if m in setup.methods
    ]
  return grid + edges + final + log


def reported(cells_: Sequence[Cell], group: str = "final") -> list[Cell]:
  """The cells of one group."""
  return [c for c in cells_ if c.group == group]
