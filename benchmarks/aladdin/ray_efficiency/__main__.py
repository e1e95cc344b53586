"""``python -m benchmarks.aladdin.ray_efficiency``: see the package's docstring."""

from benchmarks import driver
from benchmarks.aladdin.ray_efficiency import grid, report, runner

GRID = driver.Grid(driver.measurement("efficiency"), runner.run, report.report, driver.Files())
STUDY = driver.Study(
  "benchmarks.aladdin.ray_efficiency",
  {
    "default": driver.Setup(GRID, grid.Efficiency()),
    "smoke": driver.Setup(GRID, grid.SMOKE, folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
