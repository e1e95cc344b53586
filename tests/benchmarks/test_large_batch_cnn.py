"""Smoke test of the CNN large-batch study (benchmarks/large_batch_cnn).

Runs the ``smoke`` setup's grid (tiny MNIST-1D, two epochs) into a temporary directory, checks that
the tables, summary and plots are written, and that a second invocation skips every finished
run and retrains only a run whose results were removed, and that the raw runs are archived
and a report rebuilt from the archive alone gives the same tables.
"""

import json
import re
import shutil
from pathlib import Path

import pytest

from benchmarks import driver
from benchmarks.large_batch_cnn import grid
from benchmarks.large_batch_cnn.__main__ import STUDY


def test_smoke_study_writes_tables_plots_and_resumes(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  out = tmp_path / "study"
  argv = ["--setup", "smoke", "--out", str(out), "--cache_dir", str(tmp_path / "cache")]
  runs = grid.build_grid(*grid.SETUPS["smoke"].resolved())
  # Every table's runs are in the grid; the smoke's Table 3 row is Table 1's LENA run, and the
  # full grid names its other thresholds apart.
  full = {spec.name for spec in grid.build_grid(grid.PRESETS["full"])}
  assert {"lena_s256_state_aware_a1_seed0", "lena_s256_state_aware_seed0"} <= full

  text = driver.main(STUDY, argv)
  first = capsys.readouterr().out
  assert f"Ran {len(runs)}, skipped 0" in first
  for heading in ("Table 1", "Table 2", "Table 3", "Table 4"):
    assert f"## {heading}" in text
  assert (out / "tables.md").read_text() == text
  # Every Table-1 cell of the smoke grid is filled in (no missing runs).
  table1 = text.split("## Table 1")[1].split("## Table 2")[0]
  assert "—" not in table1
  assert re.search(r"\| 8 \| 64 \| LENA \(state_aware\) \| 1 \| 0\.\d{4} \|", table1)
  summary = json.loads((out / "summary.json").read_text())
  assert len(summary["runs"]) == len(runs)
  for name in ("accuracy_vs_iterations_s8.png", "accuracy_vs_scale.png", "lena_warmup_end.png"):
    path = out / name
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"
    assert name in summary["plots"]
  # No checkpoints are kept: results/ stays small.
  assert not list(out.glob("runs/*/checkpoints"))

  # Resume: remove one run's metrics; only that one is trained again.
  (out / "runs" / runs[-1].name / "metrics.jsonl").unlink()
  smoke = STUDY.setups["smoke"]
  driver.run_cells(smoke.grid, smoke.config, driver.Context(out, tmp_path / "cache", "smoke"))
  second = capsys.readouterr().out
  assert f"Ran 1, skipped {len(runs) - 1}" in second
  assert second.count("finished earlier, skipped") == len(runs) - 1

  # The archive alone rebuilds the same tables (what --report_only does from git).
  assert (out / "runs.tar.xz").stat().st_size > 0
  shutil.rmtree(out / "runs")
  assert driver.main(STUDY, [*argv, "--report_only"]) == text
