"""The efficiency benchmark's declared sizes (one measurement: the cell ``efficiency``)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Efficiency:
  """What one measurement runs: ``single`` at each batch size, then ``cluster``."""

  batch_sizes: tuple[int, ...] = (128, 32)
  seconds: float = 4.0  # per loop and per Ray run
  repeats: int = 5  # of each loop against the Ray run, alternating
  cluster_seconds: float = 10.0
  cluster_repeats: int = 1
  workers: int = 4  # of the cluster measurement
  compare: bool = True  # the cluster measurement also with the workers at the shards' priority
  num_cpus: int | None = None  # of the local Ray node (None: Ray's default)


SMOKE = Efficiency((32,), 1.0, 1, 2.0, 1, 2, compare=False)
