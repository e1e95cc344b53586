"""Smoke test of benchmarks/scanned_layers: the grid's phases and its selection rule (on the
selection seed's final validation accuracy, ties to the smaller rate, one rate beyond an edge),
the report's paired intervals and the sentences made of them against float64 NumPy, and a tiny
study that trains through the example trainer, evaluates the test split only for the reported
seeds, reports, resumes and gives the claims page the report's numbers; the committed RESULTS
carries the committed findings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import driver, harness
from benchmarks.scanned_layers import comparisons, grid, report
from benchmarks.scanned_layers.grid import Cell

STUDY_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "scanned_layers"
T_975 = {1: 12.706205, 2: 4.302653}  # Student-t quantiles of printed tables, by dof


def _finish(out: Path, cell: Cell, **numbers: float) -> None:
  """A finished cell as the runner leaves it: its summary, written last."""
  harness.write_json(
    out / "runs" / cell.name / grid.RESULT, {**dataclasses.asdict(cell), **numbers}
  )


def _numpy_interval(a: list[float], b: list[float]) -> tuple[float, float, float]:
  """Mean of a - b and its Student-t 95% interval, in float64."""
  d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  half = T_975[len(d) - 1] * d.std(ddof=1) / np.sqrt(len(d))
  return d.mean(), d.mean() - half, d.mean() + half


def test_selection_on_validation_edges_phases_and_findings(tmp_path: Path) -> None:
  setup = dataclasses.replace(
    grid.SMOKE, rates=(1e-2, 3e-2, 1e-1), below=3e-3, above=3e-1, seeds=(0, 1, 2)
  )
  sweep = grid.cells(setup, tmp_path)
  assert [c.group for c in sweep] == ["select"] * 6 and {c.seed for c in sweep} == {100}
  # Validation accuracies; the decoy test accuracies would choose otherwise, and are not read.
  val = {"lena_slice": (0.5, 0.6, 0.7), "lena_stack": (0.4, 0.8, 0.8)}
  for c in sweep:
    v = val[c.method][setup.rates.index(c.rate)]
    _finish(tmp_path, c, validation_accuracy=v, test_accuracy=1.0 - v)
  with_edges = grid.cells(setup, tmp_path)
  assert with_edges[: len(sweep)] == sweep  # a grid that grows appends
  # Per slice: best at the largest rate -> one rate beyond it; per stack: a tie, the smaller.
  assert with_edges[len(sweep) :] == [Cell("select", "lena_slice", 16, 3e-1, 100)]
  assert grid.chosen_rates(setup, tmp_path)[("lena_stack", 16)] == ([1e-2, 3e-2, 1e-1], 3e-2)
  assert grid.chosen_rates(setup, tmp_path)[("lena_slice", 16)][1] is None
  _finish(tmp_path, with_edges[-1], validation_accuracy=0.7)  # ties with 1e-1: the smaller
  cells = grid.cells(setup, tmp_path)
  assert cells[: len(with_edges)] == with_edges
  rates = {"lena_slice": 1e-1, "lena_stack": 3e-2}
  final = [Cell("final", m, 16, rates[m], seed) for seed in setup.seeds for m in setup.methods]
  log = [Cell("log", m, 16, rates[m], 0) for m in grid.LOG_METHODS]
  assert cells[len(with_edges) :] == final + log
  with pytest.raises(ValueError, match="Unknown method 'sgd'; valid methods: lena_slice"):
    grid.cells(dataclasses.replace(setup, methods=("sgd",)), tmp_path)
  assert report.selection_finding(setup, tmp_path) == (
    "1 of the 2 selections had their best rate at an edge of the grid and ran one rate beyond "
    "it: LENA-AdamW per slice at S = 16 (0.3)."
  )

  # The paired intervals of the report, against float64 NumPy (Student t, n - 1 dof): the
  # accuracies' interval includes 0, the losses' excludes it (per slice lower on every seed).
  acc = {"lena_slice": [0.81, 0.84, 0.80], "lena_stack": [0.80, 0.81, 0.805]}
  loss = {"lena_slice": [0.50, 0.47, 0.52], "lena_stack": [0.55, 0.53, 0.56]}
  for m in setup.methods:
    for i, seed in enumerate(setup.seeds):
      numbers = {"test_accuracy": acc[m][i], "test_loss": loss[m][i], "validation_accuracy": 0.5}
      _finish(tmp_path, Cell("final", m, 16, rates[m], seed), **numbers)
  runs = comparisons.load(setup, tmp_path)
  primary, on_loss, _ = comparisons.comparisons(setup, runs)
  assert (primary.scale, primary.a, primary.b, primary.key, primary.primary) == (
    16,
    "lena_slice",
    "lena_stack",
    "test_accuracy",
    True,
  )
  mean, low, high = _numpy_interval(acc["lena_slice"], acc["lena_stack"])
  p = primary.paired
  assert p is not None and (p.n, p.wins) == (3, 2)
  np.testing.assert_allclose([p.mean, p.low, p.high], [mean, low, high], rtol=1e-6)
  row = next(line for line in report.paired_table([primary]).splitlines() if "primary" in line)
  assert f"| +{100 * mean:.2f} | [{100 * low:+.2f}, {100 * high:+.2f}] | 2/3 |" in row
  assert report.finding(primary) == (
    "Primary, S = 16, LENA-AdamW per slice - LENA-AdamW per stack, test accuracy: "
    f"+{100 * mean:.2f} points, 95% interval [{100 * low:+.2f}, {100 * high:+.2f}] over 3 seeds "
    "(2 of them with A > B); the interval includes 0: no difference detected at n = 3."
  )
  mean, low, high = _numpy_interval(loss["lena_slice"], loss["lena_stack"])
  assert high < 0 and on_loss.key == "test_loss" and not on_loss.primary
  assert report.finding(on_loss).endswith(
    f"the interval excludes 0: LENA-AdamW per slice has a lower loss than LENA-AdamW per stack "
    f"at n = 3, by {-high:.3f} to {-low:.3f}."
  )


def test_tiny_study_tests_once_reports_and_resumes(
  tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
  pytest.importorskip("flax")
  from benchmarks import trainer
  from benchmarks.scanned_layers.__main__ import STUDY
  from examples import analysis

  evaluated: list[tuple[int, str]] = []
  evaluate = trainer.evaluate

  def recording(config, state, split):
    evaluated.append((config.seed, split))
    return evaluate(config, state, split)

  monkeypatch.setattr(trainer, "evaluate", recording)
  out = tmp_path / "out"
  argv = ["--setup", "smoke", "--out", str(out), "--cache_dir", str(tmp_path / "cache")]
  text = driver.main(STUDY, argv)
  setup = grid.SMOKE
  cells = grid.cells(setup, out)
  assert len(cells) == 2 + 2 * len(setup.seeds) + 2
  # The test split: once per reported run, never for the selection seed or the logging reruns.
  assert sorted(evaluated) == sorted((s, "test") for s in setup.seeds for _ in setup.methods)
  for c in cells:
    config = json.loads((out / "runs" / c.name / "config.json").read_text())
    result = grid.read_result(out, c)
    assert config["eval_split"] == "validation" and config["scan_layers"]
    assert config["layer_axes"] == grid.METHODS[c.method].layer_axes
    assert result is not None and ("test_accuracy" in result) == (c.group == "final")
    assert result["updates"] == config["total_steps"] > 0
    assert config["log_every"] == (setup.log_every if c.group == "log" else 0)
  # The report's interval of the test loss (per slice against per stack: their accuracies tie
  # on this tiny run) against float64 NumPy on the runs' own summaries.
  finals = {c: grid.read_result(out, c) or {} for c in cells if c.group == "final"}
  test_loss = {
    m: [r["test_loss"] for c, r in finals.items() if c.method == m] for m in grid.PRIMARY
  }
  mean, low, high = _numpy_interval(*test_loss.values())
  assert f"test loss: {mean:+.3f}, 95% interval [{low:+.3f}, {high:+.3f}] over 2 seeds" in text
  # The claims page's rows, from summary.json alone, are the report's comparisons.
  summary = json.loads((out / "summary.json").read_text())
  rows = comparisons.claims(summary, setup)
  assert [label for label, *_ in rows] == [
    f"LENA-AdamW per slice - LENA-AdamW per stack, {e}, S = 16"
    for e in ("test accuracy", "test loss", "final validation accuracy")
  ]
  assert list(rows[1][1].values()) == test_loss["lena_slice"]
  # The logging reruns changed no number, and give the slices' ratios of a stacked leaf.
  assert text.count("are identical to the reported run's") == 2
  assert "| `blocks/Dense_0/kernel` |" in text
  for name in ("test_accuracy.png", "validation_curves.png", "gain_ratios.png"):
    assert (out / name).read_bytes()[:4] == b"\x89PNG"
  assert (out / "runs.tar.xz").exists()
  # Resuming skips every finished cell; --report_only rebuilds the same files (the plots are
  # drawn once: not again), and nothing evaluates the test split again.
  monkeypatch.setattr(
    analysis, "save_figure", lambda fig, path, dpi=120: analysis.pyplot().close(fig)
  )
  capsys.readouterr()
  assert driver.main(STUDY, argv) == text
  assert f"Ran 0, skipped {len(cells)}" in capsys.readouterr().out
  (out / "tables.md").unlink()
  assert driver.main(STUDY, [*argv, "--report_only"]) == text
  assert (out / "tables.md").read_text() == text + "\n"
  assert json.loads((out / "summary.json").read_text()) == summary
  assert len(evaluated) == 2 * len(setup.seeds)


def test_committed_results_carry_the_computed_findings() -> None:
  """RESULTS.md quotes the findings of the committed tables.md verbatim (which the committed
  tables test rebuilds from the archived runs), so no sentence there says more than the data."""
  tables = (STUDY_DIR / "results" / "tables.md").read_text()
  findings = tables.split("## Findings (computed from the paired intervals)\n\n", 1)[1]
  findings = findings.split("\n\n", 1)[0]
  assert findings.startswith("- Primary, S = 64, ") and "- Primary, S = 256, " in findings
  assert findings in (STUDY_DIR / "RESULTS.md").read_text()
