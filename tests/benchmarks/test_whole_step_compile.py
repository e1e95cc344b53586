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


def test_depth_section_compiles_scanned_and_unrolled_models_and_reports(tmp_path):
  """The "compile time against depth" section (benchmarks/overhead/depth.py) at toy depths: the
  scanned models keep their leaf count whatever the depth and their per-slice optimizers have one
  layer per slice; every compiled optimizer gets a positive ratio; the goals, table and plot are
  written, and --report_only writes the same table again from the JSON."""
  pytest.importorskip("flax")
  pytest.importorskip("matplotlib")
  import jax

  from benchmarks.overhead import depth

  scanned = depth.Model("mlp3_scan")
  assert scanned.leaves == 6 and depth.Model("mlp3").leaves == 14  # 4 D + 2 unrolled
  names = ["sgd_momentum", "lena", "lena_per_stack"]

  def ratio_length(name):  # of the GainRatioState in LENA's chain
    state = jax.eval_shape(depth.transformation(scanned, name)[0].init, scanned.params)
    return state.inner_state[2].ratio.shape[0]

  assert (ratio_length("lena"), ratio_length("lena_per_stack")) == (4 * 3 + 2, 6)

  models = ["mlp1_scan", "mlp1", "mlp2_scan", "attention1_scan"]
  args = ["--models", ",".join(models), "--optimizers", ",".join(names)]
  depth.main([*args, "--repeats", "1", "--out", str(tmp_path)])
  record = json.loads((tmp_path / "depth_compile.json").read_text())
  assert [r["model"] for r in record["rows"]] == models
  for row in record["rows"]:
    compiled = [n for n in names if n in row]
    assert compiled == (names if row["scanned"] else names[:-1]), row["model"]
    for name in compiled:
      ratio = row[name]["ratio_vs_sgd_momentum"]
      assert math.isfinite(ratio) and ratio > 0, (row["model"], name, ratio)
  goals = {g["goal"].split(":")[0] for g in record["goals"]}
  assert goals == {"mlp1_scan", "mlp2_scan", "attention1_scan", "mlp"}
  markdown = (tmp_path / "depth_compile.md").read_text()
  assert "| mlp | 2 | scanned | 6 |" in markdown and "(= LENA per slice)" in markdown
  assert "load average" in markdown and "| goal | limit | measured | verdict |" in markdown
  assert (tmp_path / "depth_compile.png").stat().st_size > 1000
  (tmp_path / "depth_compile.md").unlink()
  depth.main(["--report_only", "--out", str(tmp_path)])
  assert (tmp_path / "depth_compile.md").read_text() == markdown
