"""``python -m benchmarks.ci_time``: see the package's docstring."""

from benchmarks import driver
from benchmarks.ci_time import grid, report, runner

GRID = driver.Grid(
  driver.measurement("per_test"), runner.run, report.report, driver.Files(".json.xz")
)
STUDY = driver.Study(
  "benchmarks.ci_time",
  {"default": driver.Setup(GRID, grid.CiTime())},
)

if __name__ == "__main__":
  driver.main(STUDY)
