"""The multi-host benchmarks run end to end (tiny sizes) and report what they measured."""

import json
import math
from pathlib import Path

from benchmarks import driver
from benchmarks.multihost import report, runner
from benchmarks.multihost.__main__ import STUDY


def test_allreduce_bench_times_both_layouts_of_both_messages(tmp_path: Path) -> None:
  text = driver.main(STUDY, ["--setup", "allreduce_smoke", "--out", str(tmp_path)])
  saved = json.loads((tmp_path / "allreduce.json").read_text())
  assert set(saved["ms"]) == {"1x8", "2x4"}
  for by_message in saved["ms"].values():
    assert set(by_message) == {"per_leaf", "packed"}
    assert all(len(v) == 1 and math.isfinite(v[0]) and v[0] > 0 for v in by_message.values())
  assert saved["args"] == {"rounds": 1, "repeats": 3} and saved["machine"]["cpu_cores"] >= 1
  assert "| 2x4 |" in (tmp_path / "allreduce.md").read_text() == text
  assert f"Command: `{saved['recorded']['command']}`" in text


def test_bench_step_time_is_the_median_update_and_the_report_the_side_by_side_ratios(
  tmp_path: Path,
) -> None:
  walls = [0.0, 1.0, 1.5, 2.5, 2.6, 3.6]  # updates 1..5 take 1.0, 0.5, 1.0, 0.1, 1.0 s
  lines = [
    json.dumps({"type": "train", "iteration": i, "wall_time": w}) for i, w in enumerate(walls)
  ]
  (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  assert runner.step_time(tmp_path, skip=2, steps=5) == 1.0  # median of updates 3-5: 1, 0.1, 1
  results = {"1x8": [1.0, 2.0, 4.0], "2x4": [1.5, 2.0, 2.0], "1x4": [0.5, 1.0, 2.0]}
  args = {"rounds": 3, "steps": 5, "skip": 1, "per_worker_batch": 32}
  text = report.bench_table({"step_seconds": results, "args": args})
  assert "1.50, 1.00, 0.50; median 1.00" in text  # 2x4 / 1x8 per round
  assert "| 2x4 | 2 x 4 | 16 |" in text and "| 1.00 |" in text  # ratio of the medians: 2 / 2
  # A measurement made before its command was recorded names the entry of its time.
  assert "`python -m benchmarks.multihost.bench --rounds 3 --steps 5 --skip 1" in text
