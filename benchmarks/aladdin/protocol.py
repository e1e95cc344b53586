"""What the ALADDIN simulator studies declare alike: the sizes of the training problem
(:data:`PRESETS`), the clusters and algorithms in the tables' order, the target of the
time-to-target columns and the rate selection rule.

Light (no JAX): the studies' grids and reports read it; the simulation itself is
``training.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

# The simulator's algorithms (``optax_lena.aladdin.simulator.ALGORITHMS``), in the tables' order.
ALGORITHMS = ("aladdin", "ar_sgd", "asp", "easgd", "sgp")
CLUSTERS = ("HO", "HE0", "HE1", "HE2")
LABELS = {"aladdin": "ALADDIN", "ar_sgd": "AR-SGD", "asp": "ASP", "easgd": "EASGD", "sgp": "SGP"}


@dataclasses.dataclass(frozen=True)
class Preset:
  """The sizes of the training problem and of its simulated cluster."""

  num_samples: int  # MNIST-1D examples before the 80/20 split
  batch_size: int  # per worker
  epochs: float  # the sample budget of every run, in passes over the training set
  lr: float  # the workers' (and one-gradient) learning rate
  ar_lr: float  # AR-SGD's rate on the mean of n gradients
  num_workers: int
  seeds: tuple[int, ...]
  clusters: tuple[str, ...]  # Table 2's clusters
  study_cluster: str  # where the ablation, period and choices run
  choice_seeds: tuple[int, ...]
  num_evals: int
  width: int  # CNN1D features
  jitter: float = 0.1  # +-10% per-iteration compute time: equal workers drift out of phase


PRESETS = {
  "default": Preset(
    num_samples=5000,
    batch_size=32,
    epochs=15,
    lr=0.1,
    ar_lr=0.2,
    num_workers=8,
    seeds=(0, 1, 2),
    clusters=("HO", "HE1", "HE2"),
    study_cluster="HE1",
    choice_seeds=(0,),
    num_evals=15,
    width=32,
  ),
  "smoke": Preset(
    num_samples=1000,
    batch_size=16,
    epochs=1,
    lr=0.05,
    ar_lr=0.2,
    num_workers=4,
    seeds=(0,),
    clusters=("HE1",),
    study_cluster="HE1",
    choice_seeds=(0,),
    num_evals=3,
    width=8,
  ),
}


def not_run_note(cells: Sequence[Any], runs: dict[str, dict]) -> list[str]:
  """The report's footer naming the cells without a result yet (none when every one ran)."""
  missing = [c.name for c in cells if c.name not in runs]
  return [f"Not run yet ({len(missing)} cells), e.g. `{missing[0]}`.\n"] if missing else []


TARGET = 0.8  # test accuracy of the time-to-target columns


def accuracy_at(run: dict[str, Any], time: float) -> float:
  """The last accuracy of ``run`` evaluated at or before simulated ``time`` (nan before any)."""
  acc = math.nan
  for t, a, _ in run["curve"]:
    if t <= time + 1e-9:
      acc = a
  return acc


def time_to(run: dict[str, Any], target: float) -> float | None:
  """The simulated time of ``run``'s first evaluation at or above ``target``, or None."""
  return next((t for t, a, _ in run["curve"] if a >= target), None)


def best_rate(means: dict[float, float]) -> float:
  """The rate of the best mean validation accuracy; ties go to the smaller rate."""
  return min(lr for lr, m in means.items() if m == max(means.values()))
