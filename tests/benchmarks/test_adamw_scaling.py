"""Smoke test of benchmarks/adamw_scaling: a tiny run trains, is finished by the harness's rule,
carries the optax_lena diagnostics, and the report builds; the grid picks the swept rates."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("flax")

from benchmarks import harness
from benchmarks.adamw_scaling import report, study, train


def test_a_tiny_run_trains_and_reports(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # the MNIST-1D cache goes to ./data_cache
  data = train.load_data(1000)
  runs_dir = tmp_path / "out" / "runs"
  runs = [train.Run("lena_sqrt_sa", 16, 0, 3e-3, 1, 1000)]
  harness.run_grid(runs, lambda r, w: train.train(r, w, data), runs_dir, config_of=train.config_of)
  for run in runs:
    workdir = runs_dir / run.name
    assert harness.is_finished(workdir)
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["type"] == "eval" for r in records)
    assert np.isfinite(records[-1]["eval_accuracy"])
    assert records[-1]["base_steps"] == records[-1]["iteration"] * run.scale
  lena = json.loads((runs_dir / runs[0].name / "metrics.jsonl").read_text().splitlines()[-1])
  # Scale k = 16 / 8 = 2: the per-layer multipliers are sqrt(r) * warm-up factor <= sqrt(2).
  assert max(lena["lr_multiplier"].values()) <= np.sqrt(2) + 1e-6
  assert "critical_batch_size" in lena
  report.write_report(tmp_path / "out")
  tables = (tmp_path / "out" / "tables.md").read_text()
  assert "LENA-AdamW p=1/2 + SA warm-up" in tables and "Finished runs: 1" in tables
  assert (tmp_path / "out" / "accuracy_vs_scale.png").stat().st_size > 0


def _fake_finished(runs_dir, run, accuracy):
  workdir = runs_dir / run.name
  workdir.mkdir(parents=True)
  config = train.config_of(run)
  (workdir / "config.json").write_text(json.dumps(config))
  record = {"type": "eval", "iteration": config["total_steps"], "eval_accuracy": accuracy}
  (workdir / "metrics.jsonl").write_text(json.dumps(record) + "\n")


def test_grid_uses_the_best_swept_rates(tmp_path):
  runs_dir = tmp_path / "runs"
  with pytest.raises(SystemExit, match="--phase sweep"):
    study.grid_runs(runs_dir, [0], [8, 32], 2, 1000)
  for run, acc in zip(study.sweep_runs(2, 1000), [0.5, 0.7, 0.6, 0.4], strict=True):
    _fake_finished(runs_dir, run, acc)
  best = study.ADAM_RATES[1]
  grid = study.grid_runs(runs_dir, [0, 1], [8, 32], 2, 1000)
  names = [r.name for r in grid]
  assert len(names) == len(set(names))
  # S = 8: only LAMB's sweep for seed 0, plus AdamW and LAMB for seed 1 (once LAMB is swept).
  assert {r.method for r in grid if r.num_workers == 8 and r.seed == 0} == {"lamb"}
  assert all(r.learning_rate == best for r in grid if r.method != "lamb")
  assert {r.method for r in grid if r.num_workers == 32 and r.seed == 0} == set(train.METHODS)
  assert not any(r.method == "lamb" and r.seed == 1 for r in grid)  # LAMB's sweep not finished
  for run, acc in zip(study.LAMB_RATES, [0.2, 0.1, 0.3, 0.25, 0.15], strict=True):
    _fake_finished(runs_dir, train.Run("lamb", 32, 0, run, 2, 1000, sweep=True), acc)
  grid = study.grid_runs(runs_dir, [1], [32], 2, 1000)
  assert [r.learning_rate for r in grid if r.method == "lamb"] == list(study.LAMB_RATES[1:4])
  assert study.neighbours(study.LAMB_RATES, study.LAMB_RATES[0]) == study.LAMB_RATES[:2]
  # At S >= 128 the sweep goes beyond LAMB_RATES (seed 0's best was their largest there).
  large = [
    r.learning_rate for r in study.grid_runs(runs_dir, [0], [128], 2, 1000) if r.method == "lamb"
  ]
  assert large == [*study.LAMB_RATES, *study.LAMB_LARGE_BATCH_RATES]
  assert min(study.LAMB_LARGE_BATCH_RATES) > max(study.LAMB_RATES)


# The fake runs hold one evaluation each: matplotlib warns about their one-point log-x curves.
@pytest.mark.filterwarnings("ignore:Data has no positive values")
def test_report_flags_edge_rates_and_pairs_seeds(tmp_path):
  runs_dir = tmp_path / "out" / "runs"
  for run, acc in zip(study.sweep_runs(2, 1000), [0.5, 0.7, 0.6, 0.4], strict=True):
    _fake_finished(runs_dir, run, acc)
  for s, accs in ((32, [0.1, 0.2, 0.4, 0.3, 0.2]), (128, [0.1, 0.1, 0.1, 0.1, 0.2, 0.3, 0.4])):
    for lr, acc in zip(study.lamb_rates(s), accs, strict=True):
      _fake_finished(runs_dir, train.Run("lamb", s, 0, lr, 2, 1000, sweep=True), acc)
  for seed, (p1, p_half) in enumerate([(0.5, 0.4), (0.6, 0.4)]):
    _fake_finished(runs_dir, train.Run("lena", 32, seed, 1e-2, 2, 1000), p1)
    _fake_finished(runs_dir, train.Run("lena_sqrt", 32, seed, 1e-2, 2, 1000), p_half)
  report.write_report(tmp_path / "out")
  tables = (tmp_path / "out" / "tables.md").read_text()
  # Paired by seed: differences 0.1 and 0.2, A ahead on both seeds.
  assert "| LENA-AdamW p=1 - LENA-AdamW p=1/2 | +0.150 ± 0.071 (2/2) | — |" in tables
  row = next(
    line
    for line in (tmp_path / "out" / "tables.md").read_text().splitlines()
    if line.startswith("| LAMB")
  )
  assert "0.4000 (1) @ 0.01 |" in row  # S = 32: inside the sweep
  assert "0.4000 (1) @ 1 (edge of the sweep)" in row  # S = 128: the largest rate
