"""The recipe study (benchmarks/aladdin/recipe): the validation re-choice's rule, its final grid,
the rate passed to the candidates, and the smoke setup's tiny cells with tables, plot and
resume."""

import json
from pathlib import Path

import optax
import pytest

from benchmarks import driver
from benchmarks.aladdin.recipe import grid as study
from benchmarks.aladdin.recipe import runner
from benchmarks.aladdin.recipe.__main__ import STUDY
from optax_lena import aladdin as al

SCALE = study.SCALES["default"]


def _tuned(acc: dict[tuple[str, float], float]) -> dict[str, dict]:
  """Every tuning cell, with accuracy ``acc`` (default 0.5) for (candidate, rate)."""
  return {
    c.name: {"cell": vars(c), "test_accuracy": acc.get((c.candidate, c.lr), 0.5)}
    for c in study.tuning_cells(SCALE)
  }


def test_the_grid_is_every_candidate_but_ar_sgd_and_the_default_first() -> None:
  assert study.RECIPES[0] == study.DEFAULT == "update_p4_a0.5"
  assert set(study.RECIPES) == set(study.CANDIDATES) - {"ar_sgd"}
  cells = study.tuning_cells(SCALE)
  assert len(cells) == 5 * 2 + 13 * 4 * 2 and len({c.name for c in cells}) == len(cells)
  assert {c.cluster for c in cells} == {"HO"} and {c.seed for c in cells} == {100, 101}


def test_choice_ties_go_to_the_default_then_to_the_smaller_rate() -> None:
  runs = _tuned({("update_p8_a0.5", 0.2): 0.8, (study.DEFAULT, 0.1): 0.8})
  assert study.choose_recipe(runs, SCALE) == (study.DEFAULT, 0.1)
  runs = _tuned({("update_p8_a0.5", 0.2): 0.81, (study.DEFAULT, 0.1): 0.8})
  assert study.choose_recipe(runs, SCALE) == ("update_p8_a0.5", 0.2)
  assert study.choose_rate(_tuned({}), SCALE, "printed") == 0.05  # all equal: the smallest
  del runs["tune/printed/HO/lr0.4/seed101"]
  assert study.choose_recipe(runs, SCALE) is None and study.final_cells(runs, SCALE) == []


def test_final_grid_adds_the_default_only_when_another_recipe_is_chosen() -> None:
  default = study.final_cells(_tuned({(study.DEFAULT, 0.2): 0.9, ("ar_sgd", 0.4): 0.9}), SCALE)
  assert len(default) == 10 * 3 and {c.seed for c in default} == set(range(10))
  assert {(c.candidate, c.lr) for c in default} == {(study.DEFAULT, 0.2), ("ar_sgd", 0.4)}
  assert {c.cluster for c in default if c.candidate == "ar_sgd"} == {"HO"}
  other = study.final_cells(_tuned({("update_p4_a0.3", 0.1): 0.9}), SCALE)
  assert len(other) == 10 * 5
  assert {(c.candidate, c.lr) for c in other if c.candidate != "ar_sgd"} == {
    ("update_p4_a0.3", 0.1),
    (study.DEFAULT, 0.05),
  }


def test_candidates_take_the_workers_rate() -> None:
  printed = vars(runner.make_algorithm("printed", 0.2))
  assert printed["message"] == "gradient"
  server = printed["server_tx"]
  state = server.init(optax.tree_utils.tree_zeros_like(1.0))
  assert float(server.update(1.0, state)[0]) == pytest.approx(-0.2)  # eta = the workers' rate
  momentum = vars(runner.make_algorithm("update_p4_a0.5_server_m0.5", 0.2))["server_tx"]
  assert float(momentum.update(1.0, momentum.init(0.0))[0]) == pytest.approx(-1.0)  # fixed 1.0
  default = vars(runner.make_algorithm(study.DEFAULT, 0.2))
  assert default["server_tx"] is None  # al.Aladdin's default server


def test_smoke_study_writes_tables_plot_and_resumes(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  argv = ["--setup", "smoke", "--out", str(tmp_path), "--cache_dir", str(tmp_path / "cache")]
  text = driver.main(STUDY, [*argv, "--max_cells", "4"])  # the 3 tuning cells, then a final one
  out = capsys.readouterr().out
  assert "tune/update_p8_a0.5/HO/lr0.05/seed100: acc" in out and "Ran 4, skipped 0" in out
  assert "3 of 3 tuning cells, 1 of" in text and "Chosen: " in text
  assert (tmp_path / "tables.md").read_text() == text
  runs = json.loads((tmp_path / "runs.json").read_text())
  assert len(runs) == 4 and all(0.0 <= r["test_accuracy"] <= 1.0 for r in runs.values())
  assert sorted(r["cell"]["group"] for r in runs.values()) == ["final"] + ["tune"] * 3
  text = driver.main(STUDY, [*argv, "--max_cells", "1"])  # resumes with the next final cell only
  assert "Ran 1, skipped 4" in capsys.readouterr().out
  assert "| ar_sgd | HO | 0.05 | 0." in text and "one seed: no interval" in text
  png = tmp_path / "validation.png"
  first = png.read_bytes()
  assert len(first) > 1000 and first[:4] == b"\x89PNG"
  assert driver.main(STUDY, [*argv, "--report_only"]) == text  # byte for byte from runs.json
  assert "Ran" not in capsys.readouterr().out and png.read_bytes() == first


def test_recipe_candidates_build_valid_specs():
  for name in study.CANDIDATES:
    spec = runner.make_algorithm(name)
    spec.check_trainable()
  assert runner.make_algorithm("printed").message == "gradient"
  assert isinstance(runner.make_algorithm("update_p4_a0.5"), al.Aladdin)
