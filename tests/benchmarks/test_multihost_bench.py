"""The multi-host benchmarks run end to end (tiny sizes) and report what they measured."""

import argparse
import json
import math
from pathlib import Path

from benchmarks.multihost import allreduce, bench


def test_allreduce_bench_times_both_layouts_of_both_messages(tmp_path: Path) -> None:
  results = allreduce.main(["--rounds", "1", "--repeats", "3", "--out", str(tmp_path)])
  assert set(results) == {"1x8", "2x4"}
  for by_message in results.values():
    assert set(by_message) == {"per_leaf", "packed"}
    assert all(len(v) == 1 and math.isfinite(v[0]) and v[0] > 0 for v in by_message.values())
  saved = json.loads((tmp_path / "allreduce.json").read_text())
  assert saved["ms"] == results and saved["machine"]["cpu_cores"] >= 1
  assert "| 2x4 |" in (tmp_path / "allreduce.md").read_text()


def test_bench_step_time_is_the_median_update_and_the_report_the_side_by_side_ratios(
  tmp_path: Path,
) -> None:
  walls = [0.0, 1.0, 1.5, 2.5, 2.6, 3.6]  # updates 1..5 take 1.0, 0.5, 1.0, 0.1, 1.0 s
  lines = [
    json.dumps({"type": "train", "iteration": i, "wall_time": w}) for i, w in enumerate(walls)
  ]
  (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  assert bench.step_time(tmp_path, skip=2, steps=5) == 1.0  # median of updates 3-5: 1.0, 0.1, 1.0
  results = {"1x8": [1.0, 2.0, 4.0], "2x4": [1.5, 2.0, 2.0], "1x4": [0.5, 1.0, 2.0]}
  args = argparse.Namespace(rounds=3, steps=5, skip=1, per_worker_batch=32)
  text = bench.report(results, args)
  assert "1.50, 1.00, 0.50; median 1.00" in text  # 2x4 / 1x8 per round
  assert "| 2x4 | 2 x 4 | 16 |" in text and "| 1.00 |" in text  # ratio of the medians: 2 / 2
