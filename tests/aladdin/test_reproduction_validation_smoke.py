"""Smoke test of the reproduction's choices on validation
(benchmarks/aladdin/reproduction/validation.py): the grid, the rate rule, the ranking, and tiny
cells with tables, plot and resume."""

import json
from pathlib import Path

import pytest

from benchmarks.aladdin.reproduction import validation as study

SCALE = study.SCALES["default"]


def _runs(acc: dict) -> dict[str, dict]:
  """Every cell, with accuracy ``acc`` (default 0.5) per AR-SGD rate or option."""
  out = {}
  for spec in study.cells(SCALE):
    key = spec.lr if spec.alg == "ar_sgd" else (spec.normalise, spec.server_tx, spec.alpha)
    out[spec.name] = {"spec": vars(spec), "test_accuracy": acc.get(key, 0.5)}
  return out


def test_grid_is_ar_sgd_then_every_option_on_two_seeds() -> None:
  specs = study.cells(SCALE)
  assert len(specs) == 3 * 2 + 18 * 2 and len({s.name for s in specs}) == len(specs)
  assert {s.seed for s in specs} == {100, 101} and {s.part for s in specs} == {"validation"}
  assert {s.cluster for s in specs if s.alg == "ar_sgd"} == {"HO"}
  assert {s.cluster for s in specs if s.alg == "aladdin"} == {"HE1"}
  assert study.TABLE2 in study.OPTIONS and len(set(study.OPTIONS)) == 18


def test_rate_rule_and_ranking() -> None:
  runs = _runs({0.2: 0.8, 0.4: 0.8, ("sum", "sgd", 0.5): 0.7, study.TABLE2: 0.6})
  assert study.choose_ar_rate(runs, SCALE) == 0.2  # a tie: the smaller rate
  ranking = study.option_ranking(runs, SCALE)
  assert [o for o, _ in ranking[:2]] == [("sum", "sgd", 0.5), study.TABLE2]
  assert ranking[2][0] == study.OPTIONS[0]  # ties keep the grid's order
  del runs[next(iter(runs))]
  assert study.choose_ar_rate(runs, SCALE) is None


def test_smoke_study_writes_tables_plot_and_resumes(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  argv = ["--smoke", "--out", str(tmp_path), "--cache_dir", str(tmp_path / "cache")]
  text = study.main([*argv, "--max_cells", "2"])
  assert "Trained 2, skipped 0" in capsys.readouterr().out
  assert "2 of 3 cells" in text and "Chosen: 0.2 (grid edge)" in text
  assert (tmp_path / "tables.md").read_text() == text
  runs = json.loads((tmp_path / "runs.json").read_text())
  assert len(runs) == 2 and all(0.0 <= r["test_accuracy"] <= 1.0 for r in runs.values())
  text = study.main([*argv, "--max_cells", "1"])  # resumes with the last cell only
  assert "Trained 1, skipped 2" in capsys.readouterr().out
  assert "| 2 | " in text and "(Table 2's)" in text and "Not run yet" not in text
  png = tmp_path / "validation.png"
  first = png.read_bytes()
  assert len(first) > 1000 and first[:4] == b"\x89PNG"
  assert study.main([*argv, "--report_only"]) == text
  assert "Trained" not in capsys.readouterr().out and png.read_bytes() == first
