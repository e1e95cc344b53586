"""``python -m benchmarks.aladdin.ray_stragglers``: see the package's docstring."""

import functools

from benchmarks import driver
from benchmarks.aladdin.ray_stragglers import grid, report, runner


def _setup(name: str, folder: str | None = "") -> driver.Setup:
  """The setup ``name``: its pairs' summaries under ``runs`` in ``<name>.json``."""
  store = driver.Summaries(f"{name}.json", key="runs", describe=runner.describe)
  grid_of = driver.Grid(grid.cells, runner.run, functools.partial(report.report, name), store)
  return driver.Setup(grid_of, grid.SETUPS[name], folder)


STUDY = driver.Study(
  "benchmarks.aladdin.ray_stragglers",
  {
    "recipe": _setup("recipe"),
    "sgd_server": _setup("sgd_server"),
    "momentum_server": _setup("momentum_server"),
    "defaults": _setup("defaults", folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
