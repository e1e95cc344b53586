"""The receive-cost benchmark's declared sizes (one measurement: the cell ``receive_cost``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class ReceiveCost:
  """Interleaved rounds per candidate, and the period of the lazy global update."""

  repeats: int = 15
  period: int = 4


SMOKE = ReceiveCost(repeats=3)


@dataclasses.dataclass(frozen=True)
class Measurement:
  name: str = "receive_cost"


def cells(setup: ReceiveCost, out: Path) -> list[Measurement]:
  """The one measurement (``receive_cost.json``)."""
  del setup, out
  return [Measurement()]
