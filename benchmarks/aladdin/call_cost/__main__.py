"""``python -m benchmarks.aladdin.call_cost``: see the package's docstring."""

from pathlib import Path

from benchmarks import driver
from benchmarks.aladdin import call_cost
from benchmarks.aladdin.call_cost import grid, report, runner

GRID = driver.Grid(grid.cells, runner.run, report.report, driver.Files())
STUDY = driver.Study(
  "benchmarks.aladdin.call_cost",
  call_cost.__doc__ or "",
  Path(__file__).resolve().parent / "results",
  {
    "default": driver.Setup(GRID, grid.CallCost()),
    "smoke": driver.Setup(GRID, grid.SMOKE, folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
