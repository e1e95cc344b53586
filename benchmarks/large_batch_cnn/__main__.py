"""``python -m benchmarks.large_batch_cnn``: see the package's docstring."""

from benchmarks import driver
from benchmarks.large_batch_cnn import grid, report, runner

GRID = driver.Grid(
  grid.cells, runner.run, report.report, driver.RunDirectories(settings=runner.settings)
)
STUDY = driver.Study(
  "benchmarks.large_batch_cnn",
  {
    "default": driver.Setup(GRID, grid.SETUPS["default"]),
    "quick": driver.Setup(GRID, grid.SETUPS["quick"], folder=None),
    "full": driver.Setup(GRID, grid.SETUPS["full"], folder=None),
    "smoke": driver.Setup(GRID, grid.SETUPS["smoke"], folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
