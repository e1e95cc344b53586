"""``python -m benchmarks.aladdin.baselines``: see the package's docstring."""

from benchmarks import driver
from benchmarks.aladdin.baselines import grid, report, runner

GRID = driver.Grid(grid.cells, runner.run_cell, report.report, driver.Summaries())
STUDY = driver.Study(
  "benchmarks.aladdin.baselines",
  {
    "default": driver.Setup(GRID, grid.SCALES["default"]),
    "smoke": driver.Setup(GRID, grid.SCALES["smoke"], folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
