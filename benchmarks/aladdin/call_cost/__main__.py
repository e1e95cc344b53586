"""``python -m benchmarks.aladdin.call_cost``: see the package's docstring."""

from benchmarks import driver
from benchmarks.aladdin.call_cost import grid, report, runner

GRID = driver.Grid(driver.measurement("call_cost"), runner.run, report.report, driver.Files())
STUDY = driver.Study(
  "benchmarks.aladdin.call_cost",
  {
    "default": driver.Setup(GRID, grid.CallCost()),
    "smoke": driver.Setup(GRID, grid.SMOKE, folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
