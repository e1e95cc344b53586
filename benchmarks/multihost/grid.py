"""The multi-host measurements' declared sizes (each one cell, one JSON)."""

from __future__ import annotations

import dataclasses

LAYOUTS = {"1x8": (1, 8, 16), "2x4": (2, 4, 16), "1x4": (1, 4, 8)}  # processes, devices, S


@dataclasses.dataclass(frozen=True)
class Bench:
  """The step time: runs of each layout (alternating), updates per run, updates before the
  timed window, examples per worker (the compute per update)."""

  rounds: int = 5
  steps: int = 30
  skip: int = 10
  per_worker_batch: int = 32

  def __post_init__(self) -> None:
    if not 0 < self.skip < self.steps:
      raise ValueError(f"skip must be in (0, steps), got skip={self.skip}, steps={self.steps}.")


@dataclasses.dataclass(frozen=True)
class Allreduce:
  """The all-reduce: runs of each layout (alternating), all-reduces timed per run."""

  rounds: int = 3
  repeats: int = 100
