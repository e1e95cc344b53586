"""The receive-cost benchmark's declared sizes (one measurement: the cell ``receive_cost``)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ReceiveCost:
  """Interleaved rounds per candidate, and the period of the lazy global update."""

  repeats: int = 15
  period: int = 4


SMOKE = ReceiveCost(repeats=3)
