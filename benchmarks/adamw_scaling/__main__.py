"""``python -m benchmarks.adamw_scaling``: see the package's docstring."""

from pathlib import Path

from benchmarks import adamw_scaling, driver
from benchmarks.adamw_scaling import grid, report, runner

GRID = driver.Grid(
  grid.cells, runner.run, report.report, driver.RunDirectories(settings=runner.settings)
)
STUDY = driver.Study(
  "benchmarks.adamw_scaling",
  adamw_scaling.__doc__ or "",
  Path(__file__).resolve().parent / "results",
  {
    "default": driver.Setup(GRID, grid.Setup()),
    "smoke": driver.Setup(GRID, grid.SMOKE, folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
