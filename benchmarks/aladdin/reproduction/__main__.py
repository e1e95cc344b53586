"""``python -m benchmarks.aladdin.reproduction``: see the package's docstring."""

from benchmarks import driver
from benchmarks.aladdin.reproduction import grid, report, runner

FIRST = driver.Grid(
  grid.cells,
  runner.run,
  report.reproduction_report,
  {driver.Measurement: driver.Files(), grid.RunSpec: driver.Summaries()},
)
VALIDATION = driver.Grid(
  grid.validation_cells, runner.run_cell, report.validation_report, driver.Summaries()
)
SMOKE = grid.Reproduction("smoke", ("table3", "table2", "ablation"), table3_sizes=(8, 4, 20))
STUDY = driver.Study(
  "benchmarks.aladdin.reproduction",
  {
    "first": driver.Setup(FIRST, grid.Reproduction()),
    "validation": driver.Setup(VALIDATION, grid.SCALES["default"], folder="validation"),
    "smoke": driver.Setup(FIRST, SMOKE, folder=None),
    "validation_smoke": driver.Setup(VALIDATION, grid.SCALES["smoke"], folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
