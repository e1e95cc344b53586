"""The call-cost benchmark's declared sizes (one measurement: the cell ``call_cost``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class CallCost:
  """Fold sizes (messages per call), calls per run, and runs of each path, alternating."""

  folds: tuple[int, ...] = (1, 4, 16, 32)
  calls: int = 300
  repeats: int = 5


SMOKE = CallCost(folds=(4,), calls=50, repeats=1)


@dataclasses.dataclass(frozen=True)
class Measurement:
  name: str = "call_cost"


def cells(setup: CallCost, out: Path) -> list[Measurement]:
  """The one measurement (``call_cost.json``)."""
  del setup, out
  return [Measurement()]
