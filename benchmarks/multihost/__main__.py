"""``python -m benchmarks.multihost``: see the package's docstring."""

from benchmarks import driver
from benchmarks.multihost import allreduce, grid, report, runner

BENCH = driver.Grid(driver.measurement("summary"), runner.run, report.bench_report, driver.Files())
ALLREDUCE = driver.Grid(
  driver.measurement("allreduce"), allreduce.measure, report.allreduce_report, driver.Files()
)
STUDY = driver.Study(
  "benchmarks.multihost",
  {
    "bench": driver.Setup(BENCH, grid.Bench()),
    "per_worker_batch_128": driver.Setup(
      BENCH, grid.Bench(2, 20, 8, 128), folder="per_worker_batch_128"
    ),
    "allreduce": driver.Setup(ALLREDUCE, grid.Allreduce()),
    "bench_smoke": driver.Setup(BENCH, grid.Bench(1, 12, 4), folder=None),
    "allreduce_smoke": driver.Setup(ALLREDUCE, grid.Allreduce(1, 3), folder=None),
  },
)

if __name__ == "__main__":
  driver.main(STUDY)
