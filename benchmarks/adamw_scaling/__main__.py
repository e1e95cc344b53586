"""``python -m benchmarks.adamw_scaling``: see the package's docstring."""

from benchmarks import driver
from benchmarks.adamw_scaling import grid, report, runner

GRID = driver.Grid(
  grid.cells, runner.run, report.report, driver.RunDirectories(settings=runner.settings)
)
STUDY = driver.Study(
  "benchmarks.adamw_scaling",
  {
    "default": driver.Setup(GRID, grid.Setup()),
    "smoke": driver.Setup(GRID, grid.SMOKE, folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
