"""``python -m benchmarks.aladdin.receive_cost``: see the package's docstring."""

from benchmarks import harness

if __name__ == "__main__":  # a program, not an import (the tests import STUDY)
  harness.reexec_with_caching_malloc()  # before jax: steadier ratios (see the package docstring)

from benchmarks import driver
from benchmarks.aladdin.receive_cost import grid, report, runner

GRID = driver.Grid(driver.measurement("receive_cost"), runner.run, report.report, driver.Files())
STUDY = driver.Study(
  "benchmarks.aladdin.receive_cost",
  {
    "default": driver.Setup(GRID, grid.ReceiveCost()),
    "smoke": driver.Setup(GRID, grid.SMOKE, folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
