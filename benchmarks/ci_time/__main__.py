"""``python -m benchmarks.ci_time``: see the package's docstring."""

from pathlib import Path

from benchmarks import ci_time, driver
from benchmarks.ci_time import grid, report, runner

GRID = driver.Grid(grid.cells, runner.run, report.report, driver.Files(".json.xz"))
STUDY = driver.Study(
  "benchmarks.ci_time",
  ci_time.__doc__ or "",
  Path(__file__).resolve().parent / "results",
  {"default": driver.Setup(GRID, grid.CiTime())},
)

if __name__ == "__main__":
  driver.main(STUDY)
