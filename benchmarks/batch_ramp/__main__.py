"""``python -m benchmarks.batch_ramp``: see the package's docstring."""

from benchmarks import harness

if __name__ == "__main__":  # a program, not an import (the tests import STUDY)
  harness.reexec_with_caching_malloc()  # before jax: a steadier time per sample

from benchmarks import driver
from benchmarks.batch_ramp import grid, report, runner

STORE = driver.Summaries("summary.json", key="runs", describe=runner.describe)
GRID = driver.Grid(grid.cells, runner.run, report.report, STORE)
PILOT = driver.Grid(grid.pilot_cells, runner.pilot, report.pilot_report, driver.Files())
STUDY = driver.Study(
  "benchmarks.batch_ramp",
  {
    "cnn": driver.Setup(GRID, grid.SETUPS["cnn"]),
    "attention_pilot": driver.Setup(PILOT, grid.ATTENTION, folder="attention"),
    "attention": driver.Setup(GRID, grid.ATTENTION, folder="attention"),
    "pilot": driver.Setup(PILOT, grid.SETUPS["cnn"], folder=None),
    "smoke": driver.Setup(GRID, grid.SMOKE, folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
