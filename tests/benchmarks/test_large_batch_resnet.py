"""Smoke test of the ResNet1D large-batch study (benchmarks/large_batch_resnet), and of the
trainer strategy it trains with (``parallel='vmap'``, one vmap over the per-worker batches).

Trains two of the ``smoke`` setup's Table-1 runs (the single worker and LENA with the
``relative_to_max`` warm-up; tiny MNIST-1D, a width-2 ResNet1D, two epochs) into a
temporary directory, checks the tables, summary, plots and per-layer records, that a second
invocation skips every finished run, and that the archive alone rebuilds the same tables.
"""

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from benchmarks import driver
from benchmarks.large_batch_resnet import grid
from benchmarks.large_batch_resnet.__main__ import STUDY
from examples import lena, metrics


def test_smoke_study_writes_tables_plots_and_resumes(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  out = tmp_path / "study"
  argv = ["--setup", "smoke", "--set", "groups=table1", "--only", "sgd", "lena_relmax"]
  argv += ["--out", str(out), "--cache_dir", str(tmp_path)]
  text = driver.main(STUDY, argv)
  first = capsys.readouterr().out
  runs = grid.build_grid(grid.PRESETS["smoke"], out, ["table1"])
  runs = [sp for sp in runs if sp.name.startswith(("sgd", "lena_relmax"))]
  assert len(runs) == 2 and first.count("after ") == len(runs)
  for heading in ("Table 1", "Table 2", "Per-layer warm-up end", "LARS / LAMB", "Longer budget"):
    assert f"## {heading}" in text
  assert (out / "tables.md").read_text() == text + "\n"
  table1 = text.split("## Table 1")[1].split("## Table 2")[0]
  assert "LENA, warm-up relative_to_max (state_aware) | 1 | 0." in table1
  workdir = out / "runs" / runs[-1].name
  config = json.loads((workdir / "config.json").read_text())
  assert config["parallel"] == "vmap" and config["optimizer"] == "lena_relmax"
  # Every run makes whole updates per epoch: 480 examples // (4 x 4) = 30 per epoch, 2 epochs.
  assert config["total_steps"] == 60
  evals = metrics.read_metrics(workdir, "eval")
  assert len(evals[-1]["warmup_end_step"]) == 62  # one per ResNet1D leaf
  logged = [r for r in metrics.read_metrics(workdir, None) if r.get("gain_ratio")]
  assert len(logged) >= 5 and len(logged[0]["gain_ratio"]) == 62
  summary = json.loads((out / "summary.json").read_text())
  assert len(summary["runs"]) == len(runs)
  for name in ("accuracy_vs_iterations_s4.png", "accuracy_vs_scale.png"):
    assert (out / name).read_bytes()[:4] == b"\x89PNG" and name in summary["plots"]

  smoke = STUDY.setups["smoke"]
  config = driver.override(smoke.config, ["groups=table1"])
  context = driver.Context(out, tmp_path, "smoke")
  assert driver.run_cells(smoke.grid, config, context, only=["sgd", "lena_relmax"]) == (0, 2)
  shutil.rmtree(out / "runs")  # what git holds: the archive
  assert driver.main(STUDY, [*argv, "--report_only"]) == text


def test_per_worker_vmap_strategy_matches_sequential_micro_batches(tmp_path: Path) -> None:
  """The study's strategy (every per-worker batch its own vmap entry, its own BatchNorm batch)
  trains the same ResNet1D as shard_map's sequential micro-batches, to float rounding."""
  base = dataclasses.replace(
    lena.get_config("mnist1d_resnet1d"),
    cache_dir=str(tmp_path),
    mnist1d_num_samples=400,
    width=2,
    per_worker_batch=4,
    batch_scale=4,
    num_devices=2,
    optimizer="lena",
    num_steps=3,
    eval_every=3,
    progress_bar=False,
    rng_impl="rbg",
  )
  states = {
    parallel: lena.train_and_evaluate(
      dataclasses.replace(base, parallel=parallel), tmp_path / parallel
    )
    for parallel in ("vmap", "shard_map")
  }
  vmap, scan = (jax.device_get(states[k]) for k in ("vmap", "shard_map"))
  for tree in ("params", "batch_stats"):
    got, want = jax.tree.leaves(getattr(vmap, tree)), jax.tree.leaves(getattr(scan, tree))
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)
  evals = {k: metrics.read_metrics(tmp_path / k, "eval")[-1] for k in states}
  assert evals["vmap"]["eval_accuracy"] == pytest.approx(
    evals["shard_map"]["eval_accuracy"], abs=0.01
  )


# ------------------------------------------------------------------------------------------------
# The equal-tuning setup
# ------------------------------------------------------------------------------------------------


def test_equal_tuning_selection_rule() -> None:
  """Best validation accuracy, ties to the smaller rate, nothing until every rate finished."""
  assert grid.choose([0.1, 1.0, 10.0], [0.5, 0.7, 0.6]) == 1.0
  assert grid.choose([10.0, 1.0, 0.1], [0.7, 0.7, 0.2]) == 1.0
  assert grid.choose([0.1, 1.0], [0.5, None]) is None
  for m in grid.METHODS:  # the pre-registered grid: 5 rates, half a decade apart
    ratios = [b / a for a, b in zip(m.rates, m.rates[1:], strict=False)]
    assert len(m.rates) == 5 and all(2.9 < r < 3.5 for r in ratios), m.key


def test_equal_tuning_smoke_trains_selects_and_resumes(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  out = tmp_path / "equal"
  argv = ["--setup", "equal_tuning_smoke", "--out", str(out), "--cache_dir", str(tmp_path)]
  text = driver.main(STUDY, argv)
  setup = grid.EQUAL_TUNING["smoke"]
  sweep = sum(len(m.rates) for m in setup.methods)
  runs = sweep + len(setup.methods) * len(setup.final_seeds)
  assert capsys.readouterr().out.count("after ") == runs
  summary = json.loads((out / "summary.json").read_text())
  for m in setup.methods:
    s = summary["methods"][m.key]
    val = {float(r): v for r, v in s["sweep_validation_accuracy"].items()}
    assert s["chosen_rate"] == grid.choose(list(val), list(val.values()))
    assert sorted(s["final"], key=int) == [str(sd) for sd in setup.final_seeds]
    spec = grid.spec_of(m, setup, s["chosen_rate"], 0)
    config = json.loads((out / "runs" / spec.name / "config.json").read_text())
    assert config["parallel"] == "shard_map" and config["learning_rate"] == s["chosen_rate"]
    evals = metrics.read_metrics(out / "runs" / spec.name, "eval")
    assert s["final"]["0"]["test_accuracy"] == evals[-1]["eval_accuracy"]
    assert evals[-1]["eval_split"] == "test"
  assert "LENA (SA) - LARS (fixed), S = 4, equal tuning | 1 |" in text
  assert (out / "equal_tuning.png").read_bytes()[:4] == b"\x89PNG"
  smoke = STUDY.setups["equal_tuning_smoke"]
  context = driver.Context(out, tmp_path, "equal_tuning_smoke")
  assert driver.run_cells(smoke.grid, smoke.config, context) == (0, runs)  # nothing to train
  shutil.rmtree(out / "runs")  # what git holds: the archive
  assert driver.main(STUDY, [*argv, "--report_only"]) == text
