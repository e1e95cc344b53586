"""The ALADDIN reproduction study (benchmarks/aladdin/reproduction): the first study's smoke setup
(Table 3 timing-only with short horizons, Table 2's shape and the ablation on a tiny MNIST-1D, 4
workers, one epoch) with its tables, plots and resume; the validation re-choice's grid, rate rule
and ranking, and its smoke setup's tiny cells with tables, plot and resume."""

import json
import re
from pathlib import Path

import pytest

from benchmarks import driver
from benchmarks.aladdin import protocol
from benchmarks.aladdin.reproduction import grid as study
from benchmarks.aladdin.reproduction.__main__ import STUDY

SCALE = study.SCALES["default"]


def _runs(acc: dict) -> dict[str, dict]:
  """Every cell, with accuracy ``acc`` (default 0.5) per AR-SGD rate or option."""
  out = {}
  for spec in study.validation_grid(SCALE):
    key = spec.lr if spec.alg == "ar_sgd" else (spec.normalise, spec.server_tx, spec.alpha)
    out[spec.name] = {"spec": vars(spec), "test_accuracy": acc.get(key, 0.5)}
  return out


def test_grid_is_ar_sgd_then_every_option_on_two_seeds() -> None:
  specs = study.validation_grid(SCALE)
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


def test_validation_smoke_writes_tables_plot_and_resumes(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  argv = ["--setup", "validation_smoke", "--out", str(tmp_path)]
  argv += ["--cache_dir", str(tmp_path / "cache")]
  text = driver.main(STUDY, [*argv, "--max_cells", "2"])
  assert "Ran 2, skipped 0" in capsys.readouterr().out
  assert "2 of 3 cells" in text and "Chosen: 0.2 (grid edge)" in text
  assert (tmp_path / "tables.md").read_text() == text
  runs = json.loads((tmp_path / "runs.json").read_text())
  assert len(runs) == 2 and all(0.0 <= r["test_accuracy"] <= 1.0 for r in runs.values())
  text = driver.main(STUDY, [*argv, "--max_cells", "1"])  # resumes with the last cell only
  assert "Ran 1, skipped 2" in capsys.readouterr().out
  assert "| 2 | " in text and "(Table 2's)" in text and "Not run yet" not in text
  png = tmp_path / "validation.png"
  first = png.read_bytes()
  assert len(first) > 1000 and first[:4] == b"\x89PNG"
  assert driver.main(STUDY, [*argv, "--report_only"]) == text
  assert "Ran" not in capsys.readouterr().out and png.read_bytes() == first


def test_smoke_study_writes_tables_plots_and_resumes(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  out = tmp_path / "study"
  argv = ["--setup", "smoke", "--out", str(out), "--cache_dir", str(tmp_path / "cache")]
  setup = STUDY.setups["smoke"].config
  runs = study.build_grid(protocol.PRESETS["smoke"], setup.parts)
  assert len(runs) == 5 + 2  # full ALADDIN on HE1 is shared by Table 2 and the ablation
  assert study.cells(setup, out) == [driver.Measurement("table3"), *runs]  # no overhead part

  text = driver.main(STUDY, argv)
  assert f"Ran {len(runs) + 1}, skipped 0" in capsys.readouterr().out
  for heading in ("## Table 3", "## Table 2", "## Ablation"):
    assert heading in text
  assert (out / "tables.md").read_text() == text
  # Table 3 has every cell, next to the paper's, e.g. the HE2 row of the published setting.
  he2 = re.search(r"\| HE2 \| (\d+\.\d\d / \d+\.\d\d \| ){5}5\.87 / 5\.41 \|", text)
  assert he2 is not None
  # Table 2: every algorithm on the smoke cluster.
  table2 = text.split("## Table 2")[1].split("## Ablation")[0]
  for label in protocol.LABELS.values():
    assert re.search(rf"\| HE1 \| {label} \| 0\.\d{{4}} \|", table2), label
  for name in ("speedup_table3.png", "accuracy_vs_time.png"):
    path = out / name
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"
  summary = json.loads((out / "summary.json").read_text())
  assert summary["num_runs"] == len(runs)

  # Resume: remove one run's result; only that one is run again.
  stored = json.loads((out / "runs.json").read_text())
  del stored[runs[-1].name]
  (out / "runs.json").write_text(json.dumps(stored))
  driver.main(STUDY, argv)
  second = capsys.readouterr().out
  assert f"Ran 1, skipped {len(runs)}" in second and "table3: finished earlier, skipped" in second
