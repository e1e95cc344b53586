"""The call-cost benchmark's declared sizes (one measurement: the cell ``call_cost``)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CallCost:
  """Fold sizes (messages per call), calls per run, and runs of each path, alternating."""

  folds: tuple[int, ...] = (1, 4, 16, 32)
  calls: int = 300
  repeats: int = 5


SMOKE = CallCost(folds=(4,), calls=50, repeats=1)
