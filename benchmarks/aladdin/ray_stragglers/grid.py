"""The stragglers benchmark's declared setups: which algorithms, clusters and runtime options."""

from __future__ import annotations

import dataclasses
from pathlib import Path

CLUSTERS = {"HO": {}, "HE1": {0: 10.0}, "HE2": {0: 100.0}}  # worker -> slowdown factor
ALGORITHMS = ("aladdin", "ar_sgd", "asp", "sgp")


@dataclasses.dataclass(frozen=True)
class Stragglers:
  """The pairs to run and the runtime's options (the ALADDIN program's ``Options``)."""

  algorithms: tuple[str, ...] = ALGORITHMS
  clusters: tuple[str, ...] = tuple(CLUSTERS)
  workers: int = 4
  time_budget: float = 20.0  # seconds of training per pair
  worker_nice: int | None = None  # None: the runtime's
  num_cpus: int = 2  # of the local Ray node
  server_momentum: bool = False  # the server (and ASP's step): SGD with momentum 0.9


SETUPS = {
  "recipe": Stragglers(algorithms=("aladdin", "ar_sgd"), clusters=("HO", "HE1")),
  "sgd_server": Stragglers(),
  "momentum_server": Stragglers(server_momentum=True),
  "defaults": Stragglers(),
}


@dataclasses.dataclass(frozen=True)
class Pair:
  """One algorithm on one cluster (its key in the results' ``runs``)."""

  cluster: str
  algorithm: str

  @property
  def name(self) -> str:
    return f"{self.cluster}/{self.algorithm}"


def cells(setup: Stragglers, out: Path) -> list[Pair]:
  """Cluster by cluster, every algorithm."""
  del out  # the grid does not depend on results
  return [Pair(c, a) for c in setup.clusters for a in setup.algorithms]
