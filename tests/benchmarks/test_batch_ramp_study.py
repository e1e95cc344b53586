"""Smoke test of benchmarks/batch_ramp: the schedule, the crossing and the paired comparisons
against float64 NumPy, and the smoke setup's tiny study that trains every arm, resumes and
reports (the committed tables: ``tests/benchmarks/test_committed_tables.py``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flax")

from benchmarks import driver
from benchmarks.batch_ramp import grid as study
from benchmarks.batch_ramp import report
from benchmarks.batch_ramp.__main__ import STUDY
from benchmarks.paired_intervals import t_quantile


def _entries(spec: str) -> list[tuple[int, int]]:
  return [(int(u), int(s)) for u, s in (e.split(":") for e in spec[len("steps:") :].split(","))]


@pytest.mark.parametrize(
  ("small", "large", "fractions", "batches"),
  [(2, 16, (0.25, 0.5, 0.75), 6562.5), (1, 4, (0.25, 0.5, 0.75), 100.0), (3, 6, (0.1, 0.9), 77)],
)
def test_step_schedule_doubles_when_the_examples_reach_each_fraction(
  small: int, large: int, fractions: tuple[float, ...], batches: float
) -> None:
  entries = _entries(study.step_schedule(small, large, fractions, batches))
  assert entries[0] == (0, small)
  sizes = [s for _, s in entries]
  assert sizes == [small * 2**i for i in range(len(sizes))] and sizes[-1] <= large < 2 * sizes[-1]
  # Replay the updates in float64: S doubles at the first update whose examples before it reach
  # the fraction, never earlier.
  firsts = np.array([u for u, _ in entries], np.int64)
  per_update = np.concatenate(
    [np.full(b - a, s, np.float64) for (a, s), b in zip(entries[:-1], firsts[1:], strict=True)]
  )
  before = np.concatenate([[0.0], np.cumsum(per_update)])
  for (u, _), f in zip(entries[1:], fractions, strict=False):
    assert before[u] >= f * batches - 1e-9 > before[u - 1]


def test_crossing_interpolates_between_evaluations() -> None:
  evals = [(10, 0.5), (20, 0.9), (30, 0.95)]
  assert study.crossing(evals, 0.7) == pytest.approx(15.0)
  assert study.crossing(evals, 0.4) == 10.0  # reached at the first evaluation
  assert study.crossing(evals, 0.9) == 20.0
  assert study.crossing(evals, 0.96) is None


def _fake_result(rng: np.random.Generator, seeds: list[int]) -> dict:
  runs = {}
  for arm in study.ARMS:
    for seed in seeds:
      runs[f"{arm}_seed{seed}"] = {
        "arm": arm,
        "seed": seed,
        "test_accuracy": float(rng.uniform(0.8, 0.95)),
        "updates": int(rng.integers(100, 3000)),
        # small never misses; large misses on seed 0 (left out of its pairs)
        "updates_to_target": None
        if (arm == "large" and seed == 0)
        else float(rng.uniform(50, 900)),
        "seconds_per_sample": float(rng.uniform(1e-4, 2e-4)),
        # [update, examples seen, S, accuracy, wall]: 6 epochs of 800 examples
        "evals": [
          [10 * i, 800 * i, 2, 0.5, float(w)]
          for i, w in enumerate(np.cumsum(rng.uniform(0.05, 0.2, 6)), 1)
        ],
      }
  return {"runs": runs}


def _interval(d: np.ndarray) -> tuple[float, float, float]:
  n = len(d)
  half = t_quantile(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)
  return d.mean(), d.mean() - half, d.mean() + half


def test_comparisons_pair_by_seed_against_numpy() -> None:
  seeds = [0, 1, 2, 3, 4]
  result = _fake_result(np.random.default_rng(3), seeds)
  get = lambda arm, key, ss=seeds: np.array(
    [result["runs"][f"{arm}_seed{s}"][key] for s in ss], np.float64
  )
  steady = lambda arm: np.array(
    [
      np.median(np.diff([e[4] for e in result["runs"][f"{arm}_seed{s}"]["evals"]])) / 800
      for s in seeds
    ]
  )
  comp = report.comparisons(result)
  assert list(comp) == ["large", "steps", "noise", "seesaw"]
  for arm, c in comp.items():
    checks = {
      "test_accuracy": get(arm, "test_accuracy") - get("small", "test_accuracy"),
      "updates_saved": 1.0 - get(arm, "updates") / get("small", "updates"),
      "seconds_per_sample": get(arm, "seconds_per_sample") - get("small", "seconds_per_sample"),
      "steady_seconds_per_sample": steady(arm) - steady("small"),
    }
    reached = seeds[1:] if arm == "large" else seeds
    checks["target_updates_saved"] = 1.0 - get(arm, "updates_to_target", reached) / get(
      "small", "updates_to_target", reached
    )
    if arm != "large":
      checks["vs_large"] = get(arm, "test_accuracy") - get("large", "test_accuracy")
    for key, d in checks.items():
      p = c[key]
      assert p is not None and p.n == len(d), (arm, key)
      np.testing.assert_allclose([p.mean, p.low, p.high], _interval(d), rtol=1e-12)
  assert comp["large"]["vs_large"] is None


def test_tiny_study_trains_every_arm_resumes_and_reports(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  out = tmp_path / "out"
  argv = ["--setup", "smoke", "--out", str(out), "--cache_dir", str(tmp_path / "cache")]
  arms = len(study.ARMS)
  context = driver.Context(out, tmp_path / "cache", "smoke")
  driver.run_cells(
    STUDY.setups["smoke"].grid, study.SMOKE, context, limit=arms
  )  # seed 0, every arm
  runs = json.loads((out / "summary.json").read_text())["runs"]
  setup = study.SMOKE
  assert sorted(runs) == sorted(f"{a}_seed0" for a in study.ARMS)
  budget = setup.num_epochs * runs["small_seed0"]["num_train"]
  b = runs["small_seed0"]["per_worker_batch"]
  for r in runs.values():
    # Equal examples: every run ends at the first update that reaches the budget.
    assert budget <= r["samples"] < budget + setup.large * b, r["arm"]
    assert 0.0 <= r["test_accuracy"] <= 1.0 and r["seconds_per_sample"] > 0
  sizes = {arm: [c[2] for c in runs[f"{arm}_seed0"]["evals"]] for arm in study.ARMS}
  assert set(sizes["small"]) == {setup.small} and set(sizes["large"]) == {setup.large}
  assert sizes["steps"][-1] == sizes["seesaw"][-1] == setup.large
  assert (
    runs["large_seed0"]["updates"] < runs["steps_seed0"]["updates"] < runs["small_seed0"]["updates"]
  )
  # Resuming keeps the finished runs and trains the next one only.
  capsys.readouterr()
  text = driver.main(STUDY, [*argv, "--max_cells", "1"])
  assert f"Ran 1, skipped {arms}" in capsys.readouterr().out
  again = json.loads((out / "summary.json").read_text())
  assert sorted(again["runs"]) == sorted([*runs, "small_seed1"])
  assert all(again["runs"][k] == v for k, v in runs.items())
  with pytest.raises(ValueError, match=r"another setup \(.*num_epochs"):
    driver.run_cells(STUDY.setups["smoke"].grid, study.Setup(), driver.Context(out, out, "x"))
  # --report_only rebuilds the same table and the plots from the JSON alone.
  assert "| steps |" in text and "test acc >= small - 1 point" in text
  table = (out / "table.md").read_text()
  (out / "table.md").unlink()
  assert driver.main(STUDY, [*argv, "--report_only"]) == text
  assert (out / "table.md").read_text() == table == text + "\n"
  for name in ("accuracy_vs_updates.png", "batch_vs_examples.png", "paired.png"):
    assert (out / name).read_bytes()[:4] == b"\x89PNG"
