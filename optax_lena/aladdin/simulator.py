"""The deterministic cluster simulator for ALADDIN and its baselines (public names):
``from optax_lena.aladdin import simulator as sim``; ``docs/ALADDIN.md``, section 5.
"""

from optax_lena._src.aladdin.algorithms import algorithm
from optax_lena._src.aladdin.sim.cluster import (
  GIGABIT,
  PAPER_MODELS,
  PAPER_SLOWDOWNS,
  Cluster,
  ModelSize,
  calibrated_compute_time,
  make_cluster,
  paper_cluster,
)
from optax_lena._src.aladdin.sim.engine import Process
from optax_lena._src.aladdin.sim.processes import simulates
from optax_lena._src.aladdin.sim.simulator import (
  ALGORITHMS,
  Algorithm,
  EvalPoint,
  Problem,
  SimResult,
  Simulator,
  simulate,
)

__all__ = [
  "ALGORITHMS",
  "GIGABIT",
  "PAPER_MODELS",
  "PAPER_SLOWDOWNS",
  "Algorithm",
  "Cluster",
  "EvalPoint",
  "ModelSize",
  "Problem",
  "Process",
  "SimResult",
  "Simulator",
  "algorithm",
  "calibrated_compute_time",
  "make_cluster",
  "paper_cluster",
  "simulate",
  "simulates",
]
