"""``python -m benchmarks.aladdin.ray_efficiency``: see the package's docstring."""

from pathlib import Path

from benchmarks import driver
from benchmarks.aladdin import ray_efficiency
from benchmarks.aladdin.ray_efficiency import grid, report, runner

GRID = driver.Grid(grid.cells, runner.run, report.report, driver.Files())
STUDY = driver.Study(
  "benchmarks.aladdin.ray_efficiency",
  ray_efficiency.__doc__ or "",
  Path(__file__).resolve().parent / "results",
  {
    "default": driver.Setup(GRID, grid.Efficiency()),
    "smoke": driver.Setup(GRID, grid.SMOKE, folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
