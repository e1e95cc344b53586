"""The outer-optimizer study (benchmarks/aladdin/outer_optimizer): the delayed Nesterov
transformation against a float64 NumPy replay, the tuning rule, the final grid's order, the
validation split, and the smoke setup's tiny cells with tables, plot and resume."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from benchmarks import driver, paired_intervals
from benchmarks.aladdin import protocol, training
from benchmarks.aladdin.outer_optimizer import grid, report, runner
from benchmarks.aladdin.outer_optimizer.__main__ import STUDY


def _replay(grads: list[dict[str, np.ndarray]], lr: float, beta: float, delay: int) -> list:
  """Delayed Nesterov in float64 NumPy, written from the docstring's definition."""
  m = {k: np.zeros_like(v, np.float64) for k, v in grads[0].items()}
  d = {k: np.zeros_like(v, np.float64) for k, v in grads[0].items()}
  steps = []
  for t, g in enumerate(grads, start=1):
    step = {}
    for k in g:
      d[k] = d[k] + g[k]
      if t % delay == 0:
        m[k] = beta * m[k] + d[k] / delay
        step[k] = -lr * (beta * m[k] + g[k])
        d[k] = np.zeros_like(d[k])
      else:
        step[k] = -lr * g[k]
    steps.append(step)
  return steps


@pytest.mark.parametrize("delay", [1, 3, 8])
def test_delayed_nesterov_matches_a_float64_replay(delay: int) -> None:
  rng = np.random.default_rng(delay)
  shapes = {"w": (3, 2), "b": (2,)}
  grads = [{k: rng.normal(size=s) for k, s in shapes.items()} for _ in range(20)]
  tx = runner.delayed_nesterov(0.7, 0.9, delay)
  params = {k: jnp.zeros(s, jnp.float32) for k, s in shapes.items()}
  state = tx.init(params)
  update = jax.jit(tx.update)
  expected = _replay(grads, 0.7, 0.9, delay)
  for g, want in zip(grads, expected, strict=True):
    step, state = update({k: jnp.asarray(v, jnp.float32) for k, v in g.items()}, state)
    for k in shapes:
      np.testing.assert_allclose(np.asarray(step[k], np.float64), want[k], rtol=2e-5, atol=1e-6)
  assert int(state.num_updates) == len(grads)


def test_delayed_nesterov_with_delay_one_is_optax_nesterov() -> None:
  params = {"w": jnp.zeros(4)}
  ours, theirs = runner.delayed_nesterov(0.7, 0.9, 1), optax.sgd(0.7, momentum=0.9, nesterov=True)
  s1, s2 = ours.init(params), theirs.init(params)
  for t in range(6):
    g = {"w": jnp.arange(4.0) - t}
    u1, s1 = ours.update(g, s1)
    u2, s2 = theirs.update(g, s2)
    np.testing.assert_allclose(u1["w"], u2["w"], rtol=1e-6)


def test_delayed_nesterov_rejects_bad_arguments() -> None:
  with pytest.raises(ValueError, match="delay"):
    runner.delayed_nesterov(0.7, 0.9, 0)
  with pytest.raises(ValueError, match="momentum"):
    runner.delayed_nesterov(0.7, 1.0, 8)


def _fake_runs(scale: grid.Scale, acc: dict[tuple[str, float], float]) -> dict[str, dict]:
  runs = {}
  for cell in grid.tuning_cells(scale):
    runs[cell.name] = {"cell": vars(cell), "test_accuracy": acc[(cell.method, cell.lr)]}
  return runs


def test_choose_rate_takes_the_best_mean_and_the_smaller_rate_on_ties() -> None:
  scale = grid.SCALES["default"]
  acc = {(m, lr): 0.5 for m in grid.METHODS for lr in (*scale.ar_rates, *scale.worker_rates)}
  acc[("ar_sgd", 0.2)] = acc[("ar_sgd", 0.4)] = 0.9  # a tie: the smaller rate wins
  acc[("nesterov", 0.025)] = 0.8
  runs = _fake_runs(scale, acc)
  assert grid.choose_rate(runs, scale, "ar_sgd") == 0.2
  assert grid.choose_rate(runs, scale, "nesterov") == 0.025
  assert grid.choose_rate(runs, scale, "plain") == 0.025  # all equal: the smallest
  del runs["tune/plain/HO/lr0.1/seed101"]
  assert grid.choose_rate(runs, scale, "plain") is None  # not tuned yet


def test_final_grid_goes_seed_by_seed_and_runs_ar_sgd_off_ho_once() -> None:
  scale = grid.SCALES["default"]
  acc = {(m, lr): 0.5 for m in grid.METHODS for lr in (*scale.ar_rates, *scale.worker_rates)}
  cells = grid.final_cells(_fake_runs(scale, acc), scale)
  expected = 10 * (1 + len(grid.VARIANTS) * 3) + 2
  assert len(cells) == expected and len({c.name for c in cells}) == len(cells)
  seeds = [c.seed for c in cells]
  assert seeds == sorted(seeds)
  ar = [(c.cluster, c.seed) for c in cells if c.method == "ar_sgd"]
  assert ("HE1", 0) in ar and ("HE2", 0) in ar and all(c == "HO" for c, s in ar if s > 0)
  assert not grid.final_cells({}, scale)


def test_verdicts_follow_the_preregistered_rule() -> None:
  close = paired_intervals.paired([0.80, 0.81, 0.82, 0.83], [0.805, 0.81, 0.815, 0.83])
  assert close.low >= -report.LEVEL and report.verdict(close, "ar_sgd") == "level or above"
  wide = paired_intervals.paired([0.70, 0.90, 0.75], [0.80, 0.80, 0.80])
  assert wide.low < -report.LEVEL < wide.high
  assert report.verdict(wide, "ar_sgd") == "not shown level"
  far = paired_intervals.paired([0.10, 0.11, 0.12], [0.80, 0.80, 0.81])
  assert report.verdict(far, "ar_sgd") == "behind by over 1 point"
  assert report.verdict(far, "plain") == "behind plain"
  assert report.verdict(wide, "plain") == "not distinguishable"
  ahead = paired_intervals.paired([0.83, 0.84, 0.85], [0.80, 0.80, 0.81])
  assert report.verdict(ahead, "plain") == "beats plain"
  assert report.verdict(paired_intervals.paired([0.8], [0.7]), "plain") == "one seed: no interval"


def test_make_problem_holds_out_validation_examples(tmp_path: Path) -> None:
  preset = protocol.PRESETS["smoke"]
  whole = training.make_problem(preset, 0, tmp_path)
  held = training.make_problem(preset, 0, tmp_path, num_validation=200)
  val = training.make_problem(preset, 0, tmp_path, num_validation=200, evaluate_on="validation")
  assert len(whole.x_train) == 800 and len(whole.x_test) == 200
  np.testing.assert_array_equal(held.x_train, whole.x_train[:600])
  np.testing.assert_array_equal(held.x_test, whole.x_test)
  np.testing.assert_array_equal(val.x_train, whole.x_train[:600])
  np.testing.assert_array_equal(val.x_test, whole.x_train[600:])
  np.testing.assert_array_equal(val.y_test, whole.y_train[600:])
  with pytest.raises(ValueError, match="num_validation"):
    training.make_problem(preset, 0, tmp_path, evaluate_on="validation")


def test_smoke_study_writes_tables_plot_and_resumes(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  argv = ["--setup", "smoke", "--out", str(tmp_path), "--cache_dir", str(tmp_path / "cache")]
  text = driver.main(STUDY, [*argv, "--max_cells", "6"])  # the 5 tuning cells, then a final one
  out = capsys.readouterr().out
  assert "tune/nesterov_gain1/HO/lr0.05/seed100: acc" in out
  assert "final/ar_sgd/HO/lr0.2/seed0: acc" in out and "Ran 6, skipped 0" in out
  assert "5 of 5 tuning cells, 1 final cells" in text and "| HO | AR-SGD | 0.2 | 0." in text
  assert (tmp_path / "tables.md").read_text() == text
  png = tmp_path / "accuracy_vs_time.png"
  runs = json.loads((tmp_path / "runs.json").read_text())
  assert len(runs) == 6 and all(0.0 <= r["test_accuracy"] <= 1.0 for r in runs.values())
  assert all(len(r["curve"]) == 4 for r in runs.values())  # num_evals 3 plus the start
  text = driver.main(STUDY, [*argv, "--max_cells", "1"])  # resumes with the next final cell only
  resumed = capsys.readouterr().out
  assert "final/plain/HO/lr0.05/seed0: acc" in resumed and "Ran 1, skipped 6" in resumed
  assert "| HO | ALADDIN-plain | 0.05 | 0." in text
  assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
  first = png.read_bytes()
  assert driver.main(STUDY, [*argv, "--report_only"]) == text  # byte for byte from runs.json
  assert png.read_bytes() == first and "Ran" not in capsys.readouterr().out
