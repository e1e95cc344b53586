"""The deterministic cluster simulator for ALADDIN and its baselines.

``from optax_lena.aladdin import simulator as sim``. :func:`simulate` runs the real JAX
computations of an algorithm's workers and server (a :class:`Problem`) in the order that a
cluster of workers of given speeds and a given network (a :class:`Cluster`, from
:func:`make_cluster` or :func:`paper_cluster`) would produce them, and reports accuracy against
simulated time, throughput and each worker's waits; without a problem it times the messages
only. The same inputs give the same run, bitwise. ``docs/ALADDIN.md`` (section 5) states the
cost model and its assumptions.
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
