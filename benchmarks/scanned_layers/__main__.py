"""``python -m benchmarks.scanned_layers``: see the package's docstring."""

from benchmarks import driver, harness
from benchmarks.scanned_layers import grid, report, runner

STORE = driver.RunDirectories(
  files=(*harness.RUN_FILES, grid.RESULT), settings=runner.settings, describe=runner.describe
)
GRID = driver.Grid(grid.cells, runner.run, report.report, STORE)
STUDY = driver.Study(
  "benchmarks.scanned_layers",
  {
    "default": driver.Setup(GRID, grid.Setup()),
    "smoke": driver.Setup(GRID, grid.SMOKE, folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
