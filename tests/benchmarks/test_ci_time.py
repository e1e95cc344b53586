"""benchmarks/ci_time: the plugin times every test; the report matches tests by name."""

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.ci_time import grid, report, runner

HERE = Path(runner.__file__).resolve().parent


def test_plugin_records_wall_and_cpu_of_every_test(tmp_path: Path) -> None:
  (tmp_path / "test_toy.py").write_text(
    "import time\n"
    "def test_busy():\n"
    "  t = time.process_time()\n"
    "  while time.process_time() - t < 0.2:\n"
    "    pass\n"
    "def test_sleep():\n"
    "  time.sleep(0.2)\n"
  )
  out = tmp_path / "times"
  env = dict(os.environ, CI_TIME_OUT=str(out), PYTHONPATH=str(HERE))
  env.pop("PYTEST_XDIST_WORKER", None)  # set when this test runs in an xdist worker
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "pytest_times", "-p", "no:cacheprovider"]
  subprocess.run([*cmd, "test_toy.py"], cwd=tmp_path, env=env, check=True, capture_output=True)
  records = runner.load_records(out)
  assert set(records) == {"test_toy.py::test_busy", "test_toy.py::test_sleep"}
  busy, sleep = records["test_toy.py::test_busy"], records["test_toy.py::test_sleep"]
  assert busy["cpu"] >= 0.19 and busy["wall"] >= 0.19
  assert sleep["wall"] >= 0.19 and sleep["cpu"] < 0.1  # sleeping costs wall time, not CPU
  line = json.loads((out / "main.jsonl").read_text().splitlines()[0])
  assert set(line) == {"nodeid", "wall", "cpu"}


def _r(cpu: float) -> dict[str, float]:
  return {"cpu": cpu, "wall": 2 * cpu}


def test_tests_are_matched_by_name_across_moved_files_and_grouped_by_origin() -> None:
  baseline = {
    "tests/test_aladdin_server.py::test_a": _r(1.0),  # moved and renamed
    "tests/test_x.py::test_same[1]": _r(2.0),
    "tests/test_y.py::test_same[1]": _r(3.0),  # one name in two files
    "tests/test_gone.py::test_old": _r(4.0),
  }
  current = {
    "tests/aladdin/test_server.py::test_a": _r(0.5),
    "tests/lena/test_y.py::test_same[1]": _r(2.5),
    "tests/lena/test_x.py::test_same[1]": _r(1.5),
    "tests/aladdin/test_new.py::test_b": _r(7.0),
    "tests/examples/test_multihost.py::test_c": _r(8.0),
    "tests/benchmarks/test_harness.py::test_d": _r(9.0),
  }
  matched = grid.match(baseline, current)
  assert matched == {
    "tests/aladdin/test_server.py::test_a": "tests/test_aladdin_server.py::test_a",
    "tests/lena/test_x.py::test_same[1]": "tests/test_x.py::test_same[1]",
    "tests/lena/test_y.py::test_same[1]": "tests/test_y.py::test_same[1]",
  }
  data = {
    "baseline": "b",
    "current": "c",
    "runs": {},
    "tests": {"baseline": baseline, "current": current},
  }
  summary = report.summarise(data)
  assert summary["matched"]["baseline"] == {"tests": 3, "cpu_s": 6.0, "wall_s": 12.0}
  assert summary["matched"]["current"] == {"tests": 3, "cpu_s": 4.5, "wall_s": 9.0}
  assert summary["baseline_unmatched"]["cpu_s"] == 4.0
  assert summary["new_by_origin"] == {
    "ALADDIN rebuilt and its recipe": {"tests": 1, "cpu_s": 7.0, "wall_s": 14.0},
    "experiment kit": {"tests": 1, "cpu_s": 9.0, "wall_s": 18.0},
    "multi-host trainer": {"tests": 1, "cpu_s": 8.0, "wall_s": 16.0},
  }
  text = report.tables(summary)
  assert "new: experiment kit | 1 | 9 | 18 |" in text
