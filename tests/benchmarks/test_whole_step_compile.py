"""The whole-step compile benchmark (benchmarks/overhead/whole_step_compile.py) still runs.

A one-layer MLP, one compile per optimizer: the numbers mean nothing at this size; the test
checks that every optimizer gets a row entry with a positive finite ratio and that the table,
JSON and plot are written.
"""

import json
import math

import pytest

from benchmarks.overhead import whole_step_compile


def test_every_optimizer_compiles_and_is_reported(tmp_path):
  pytest.importorskip("flax")
  pytest.importorskip("matplotlib")
  whole_step_compile.main(["--models", "mlp1", "--repeats", "1", "--out", str(tmp_path)])
  result = json.loads((tmp_path / "whole_step_compile.json").read_text())
  (row,) = result["rows"]
  assert (row["model"], row["leaves"]) == ("mlp1", 6)  # 4 D + 2 leaves
  for name in whole_step_compile.ORDER:
    ratio = row[name]["ratio_vs_sgd_momentum"]
    assert math.isfinite(ratio) and ratio > 0, (name, ratio)
    assert row[name]["kernels"] >= row[name]["distinct_kernels"] >= 1
  assert row["sgd_momentum"]["ratio_vs_sgd_momentum"] == 1.0
  markdown = (tmp_path / "whole_step_compile.md").read_text()
  assert "| mlp1 | 6 |" in markdown
  for name in whole_step_compile.ORDER[1:]:
    assert f"{whole_step_compile.LABELS[name]} / SGD-m" in markdown
  assert "load average" in markdown
  assert (tmp_path / "whole_step_compile.png").stat().st_size > 0
