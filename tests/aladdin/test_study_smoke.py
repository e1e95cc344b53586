"""Smoke test of the ALADDIN reproduction study (benchmarks/aladdin/reproduction/main.py).

Runs Table 3 (timing-only, short horizons), Table 2's shape and the ablation on the ``--smoke``
preset (tiny MNIST-1D, 4 workers, one epoch) into a temporary directory, checks the tables and
plots, and that a second invocation skips every finished run and retrains only a removed one.
"""

import json
import re
from pathlib import Path

import pytest

from benchmarks.aladdin.reproduction import main as study


def test_smoke_study_writes_tables_plots_and_resumes(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  out = tmp_path / "study"
  parts = ["table3", "table2", "ablation"]
  argv = ["--smoke", "--out", str(out), "--cache_dir", str(tmp_path / "cache"), "--parts", *parts]
  grid = study.build_grid(study.PRESETS["smoke"], parts)
  assert len(grid) == 5 + 2  # full ALADDIN on HE1 is shared by Table 2 and the ablation

  text = study.main(argv)
  first = capsys.readouterr().out
  assert f"Trained {len(grid)}, skipped 0" in first
  for heading in ("## Table 3", "## Table 2", "## Ablation"):
    assert heading in text
  assert (out / "tables.md").read_text() == text
  # Table 3 has every cell, next to the paper's, e.g. the HE2 row of the published setting.
  he2 = re.search(r"\| HE2 \| (\d+\.\d\d / \d+\.\d\d \| ){5}5\.87 / 5\.41 \|", text)
  assert he2 is not None
  # Table 2: every algorithm on the smoke cluster.
  table2 = text.split("## Table 2")[1].split("## Ablation")[0]
  for label in study.LABELS.values():
    assert re.search(rf"\| HE1 \| {label} \| 0\.\d{{4}} \|", table2), label
  for name in ("speedup_table3.png", "accuracy_vs_time.png"):
    path = out / name
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"
  summary = json.loads((out / "summary.json").read_text())
  assert summary["num_runs"] == len(grid)

  # Resume: remove one run's result; only that one is trained again.
  runs = json.loads((out / "runs.json").read_text())
  del runs[grid[-1].name]
  (out / "runs.json").write_text(json.dumps(runs))
  study.main(argv)
  second = capsys.readouterr().out
  assert f"Trained 1, skipped {len(grid) - 1}" in second
  assert "Table 3: finished earlier, skipped" in second
