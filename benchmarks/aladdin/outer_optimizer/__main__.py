"""``python -m benchmarks.aladdin.outer_optimizer``: see the package's docstring."""

from benchmarks import driver
from benchmarks.aladdin.outer_optimizer import grid, report, runner

GRID = driver.Grid(grid.cells, runner.run_cell, report.report, driver.Summaries())
STUDY = driver.Study(
  "benchmarks.aladdin.outer_optimizer",
  {
    "default": driver.Setup(GRID, grid.SCALES["default"]),
    "smoke": driver.Setup(GRID, grid.SCALES["smoke"], folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
