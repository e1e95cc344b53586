"""Smoke test of benchmarks/critical_batch: the fits on curves whose answer is known, and a tiny
measurement that branches, reports and plots."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

pytest.importorskip("flax")

from benchmarks.critical_batch import grid, report, runner


def test_mccandlish_fit_recovers_a_known_curve() -> None:
  scales = [1, 2, 4, 8, 16, 32]
  s_min, e_min = 12.0, 90.0  # B_crit = 7.5
  updates = [s_min + e_min / b for b in scales]
  fit = runner.fit_mccandlish(scales, updates)
  np.testing.assert_allclose([fit["s_min"], fit["e_min"], fit["b_crit"]], [12, 90, 7.5], 1e-12)
  # (S / S_min - 1)(E / E_min - 1) = 1 at every batch, E = S B.
  for b, s in zip(scales, updates, strict=True):
    np.testing.assert_allclose((s / s_min - 1) * (s * b / e_min - 1), 1.0, rtol=1e-12)
  # Too few batches reached the target: no fit; perfect linear scaling: B_crit infinite.
  assert math.isnan(runner.fit_mccandlish(scales, [10, 5, *[math.nan] * 4])["b_crit"])
  assert math.isinf(runner.fit_mccandlish(scales, [64 / b for b in scales])["b_crit"])


def test_zhang_20_percent_overhead() -> None:
  scales = [1, 2, 4, 8]
  # Linear scaling up to 4, then 1.2x the ideal updates exactly at 8: the answer is 8.
  assert runner.zhang_critical_batch(scales, [80, 40, 20, 12]) == pytest.approx(8.0)
  # 1.1x at 4 and 1.3x at 8: halfway in log B, sqrt(32).
  got = runner.zhang_critical_batch(scales, [80, 40, 22, 13])
  assert got == pytest.approx(math.sqrt(32))
  assert math.isinf(runner.zhang_critical_batch(scales, [80, 40, 20, 10]))


def test_crossing_interpolates_between_evaluations() -> None:
  assert runner.crossing([(2, 1.0), (4, 0.6)], 0.8) == pytest.approx(3.0)
  assert runner.crossing([(1, 0.5)], 0.8) == 1.0
  assert math.isnan(runner.crossing([(1, 1.0), (2, 0.9)], 0.8))


@pytest.mark.parametrize("model", ["cnn", "attention"])
def test_a_tiny_measurement_reports(tmp_path, model) -> None:
  setup = dataclasses.replace(
    grid.quick(model=model), checkpoints=(4,), scales=(1, 2), num_samples_main=2, max_updates=6
  )
  assert setup.optimizer in grid.OPTIMIZERS[model]
  result = runner.measure(setup, tmp_path / "cache")
  assert result["setup"]["model"] == model
  (row,) = result["rows"]
  assert row["checkpoint"] == 4 and row["target"] < row["train_loss"]
  assert len(row["updates"]) == len(setup.scales) and row["estimate_fresh"] > 0
  assert len(row["layer_estimate"]) == len(row["layer_fresh"]) == len(result["layer_names"]) > 1
  assert json.dumps(result, allow_nan=True)
  text = report.table(result)
  assert text.count("\n") == 2 and "B_crit (fit)" in text and "fresh within 2x" in text
  png = report.plot(result, tmp_path / "plot.png")
  assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_attention_model_takes_the_adamw_rules_only() -> None:
  setup = dataclasses.replace(grid.attention(), optimizer="lena")
  with pytest.raises(ValueError, match="lena_adamw"):
    runner.build(setup, "data_cache")
