"""benchmarks/reproduce.py: retrained runs compared with the archived ones."""

import json
from pathlib import Path

import pytest

from benchmarks import harness, reproduce


def _run(workdir: Path, accuracies: list[float], wall: float = 1.0) -> None:
  workdir.mkdir(parents=True)
  (workdir / "config.json").write_text(json.dumps({"total_steps": len(accuracies)}))
  records = [
    {"type": "eval", "iteration": i + 1, "eval_loss": 1.0, "eval_accuracy": a, "wall_time": wall}
    for i, a in enumerate(accuracies)
  ]
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_compare_reports_bitwise_runs_and_differences_from_the_archive(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  reference, candidate = tmp_path / "reference", tmp_path / "candidate"
  _run(reference / "runs" / "same", [0.5, 0.7])
  _run(reference / "runs" / "moved", [0.5, 0.7])
  harness.pack_runs(reference)
  for name in ("same", "moved"):  # the study's directory holds only its archive, as in git
    for f in (reference / "runs" / name).iterdir():
      f.unlink()
    (reference / "runs" / name).rmdir()
  (reference / "runs").rmdir()
  _run(candidate / "runs" / "same", [0.5, 0.7], wall=9.0)  # wall times do not count
  _run(candidate / "runs" / "moved", [0.5, 0.75])
  _run(candidate / "runs" / "new", [0.1])  # not in the archive: not compared

  result = reproduce.compare(reference, candidate)
  assert set(result) == {"same", "moved"}
  assert result["same"]["bitwise"] and result["same"]["max_accuracy_diff"] == 0
  assert not result["moved"]["bitwise"]
  assert result["moved"]["max_accuracy_diff"] == pytest.approx(0.05)
  assert result["moved"]["candidate_final"] == 0.75

  reproduce.main([str(reference), str(candidate)])
  assert "| same | True | 0.0000 | 0.7 | 0.7 |" in capsys.readouterr().out
