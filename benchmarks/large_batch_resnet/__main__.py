"""``python -m benchmarks.large_batch_resnet``: see the package's docstring."""

from benchmarks import driver
from benchmarks.large_batch_resnet import grid, report, runner

MAIN = driver.Grid(
  grid.cells, runner.run, report.report, driver.RunDirectories(settings=runner.settings)
)
EQUAL = driver.Grid(
  grid.equal_tuning_cells,
  runner.equal_run,
  report.equal_report,
  driver.RunDirectories(grid.FILES, runner.equal_settings, describe=runner.described),
)
STUDY = driver.Study(
  "benchmarks.large_batch_resnet",
  {
    "default": driver.Setup(MAIN, grid.Sizes("default")),
    "equal_tuning": driver.Setup(EQUAL, grid.EQUAL_TUNING["default"], folder="equal_tuning"),
    "smoke": driver.Setup(MAIN, grid.Sizes("smoke"), folder=None),
    "equal_tuning_smoke": driver.Setup(EQUAL, grid.EQUAL_TUNING["smoke"], folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
