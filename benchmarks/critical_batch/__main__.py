"""``python -m benchmarks.critical_batch``: see the package's docstring."""

from benchmarks import driver
from benchmarks.critical_batch import grid, report, runner

GRID = driver.Grid(grid.cells, runner.run, report.report, driver.Files())
STUDY = driver.Study(
  "benchmarks.critical_batch",
  {
    "default": driver.Setup(GRID, grid.DEFAULT),
    "smoke": driver.Setup(GRID, grid.SMOKE, folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
