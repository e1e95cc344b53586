"""``python -m benchmarks.aladdin.recipe``: see the package's docstring."""

from benchmarks import driver
from benchmarks.aladdin.recipe import grid, report, runner

CANDIDATES = driver.Grid(
  grid.candidate_cells, runner.run_candidate, report.candidates_report, driver.Summaries()
)
VALIDATION = driver.Grid(
  grid.validation_cells, runner.run_cell, report.validation_report, driver.Summaries()
)
STUDY = driver.Study(
  "benchmarks.aladdin.recipe",
  {
    "candidates": driver.Setup(CANDIDATES, grid.Candidates()),
    "validation": driver.Setup(VALIDATION, grid.SCALES["default"], folder="validation"),
    "smoke": driver.Setup(VALIDATION, grid.SCALES["smoke"], folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
