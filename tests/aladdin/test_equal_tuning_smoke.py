"""Smoke test of the second ALADDIN study (benchmarks/aladdin/equal_tuning/main.py) and of the
recipe measurement's candidates: tiny cells, tables, plot, resume."""

import json
from pathlib import Path

import pytest

from benchmarks.aladdin.equal_tuning import main as equal_tuning
from benchmarks.aladdin.recipe import main as recipe
from optax_lena import aladdin as al


def test_grid_is_unique_and_starts_with_the_common_learning_rate():
  cells = equal_tuning.grid(equal_tuning.SCALES["default"])
  names = [c.name for c in cells]
  assert len(names) == len(set(names))
  assert {c.group for c in cells[:45]} == {"equal"} and {c.lr for c in cells[:45]} == {0.1}
  assert {c.alg for c in cells if c.group == "ablation"} == {"L1", "L2", "full"}
  # Every (row set, algorithm, cluster, seed) of the design is in the grid.
  assert sum(c.group == "equal" and c.epochs == 45 for c in cells) == 45
  assert sum(c.group == "paper" for c in cells) == 90


def test_paper_schedule_warms_up_and_decays():
  schedule = equal_tuning.paper_schedule(0.08, steps_per_epoch=10, epochs=15)  # 12 + 90 steps
  assert float(schedule(0)) == 0.0 and float(schedule(6)) == pytest.approx(0.04)
  assert float(schedule(50)) == pytest.approx(0.08)
  assert float(schedule(95)) == pytest.approx(0.008)


def test_recipe_candidates_build_valid_specs():
  for name in recipe.CANDIDATES:
    spec = recipe.make_algorithm(name)
    spec.check_trainable()
  assert recipe.make_algorithm("printed").message == "gradient"
  assert isinstance(recipe.make_algorithm("update_p4_a0.5"), al.Aladdin)


def test_smoke_study_writes_tables_plot_and_resumes(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  argv = ["--smoke", "--out", str(tmp_path), "--cache_dir", str(tmp_path / "cache")]
  text = equal_tuning.main([*argv, "--max_cells", "1"])
  assert "Trained 1, skipped 0" in capsys.readouterr().out
  assert "| HE1 | ALADDIN | 0." in text and "1 of 18 cells finished" in text
  assert (tmp_path / "tables.md").read_text() == text
  png = tmp_path / "accuracy_vs_time.png"
  assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
  runs = json.loads((tmp_path / "runs.json").read_text())
  assert list(runs) == ["equal/aladdin/HE1/1ep/lr0.05/seed0"]
  equal_tuning.main([*argv, "--report_only"])
  assert "Trained" not in capsys.readouterr().out
  text = equal_tuning.main([*argv, "--max_cells", "1"])  # resumes with the next cell only
  resumed = capsys.readouterr().out
  assert "[2/18] equal/ar_sgd/HE1" in resumed and "Trained 1, skipped 1" in resumed
  assert (
    "| HE1 | AR-SGD | 0." in text and len(json.loads((tmp_path / "runs.json").read_text())) == 2
  )
