"""The baselines study (benchmarks/aladdin/baselines): how each method is built, the per-budget
tuning rule, the grid's order, the decision rule, and the smoke setup's tiny cells with tables,
plot and resume."""

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import driver, paired_intervals
from benchmarks.aladdin.baselines import grid, report, runner
from benchmarks.aladdin.baselines.__main__ import STUDY


def test_methods_keep_the_algorithms_defaults() -> None:
  aladdin = vars(runner.make_algorithm("aladdin", 0.1))
  assert (aladdin["period"], aladdin["alpha"], aladdin["server_tx"]) == (4, 0.5, None)
  easgd = vars(runner.make_algorithm("easgd", 0.1))
  assert (easgd["tau"], easgd["beta"]) == (2, None)  # beta None: the paper's 0.9 / n
  assert vars(runner.make_algorithm("sgp", 0.1))["overlap"] == 1
  with pytest.raises(ValueError, match="unknown method"):
    runner.make_algorithm("diloco", 0.1)


@pytest.mark.parametrize("method, momentum", [("asp_momentum", 0.9), ("asp_plain", 0.0)])
def test_asp_servers_match_a_float64_replay(method: str, momentum: float) -> None:
  tx = vars(runner.make_algorithm(method, 0.05))["server_tx"]
  rng = np.random.default_rng(0)
  grads = [rng.normal(size=3) for _ in range(4)]
  state = tx.init(jnp.zeros(3))
  m = np.zeros(3)
  for g in grads:
    step, state = tx.update(jnp.asarray(g, jnp.float32), state)
    m = momentum * m + g  # optax's heavy ball: the trace of the gradients
    np.testing.assert_allclose(np.asarray(step, np.float64), -0.05 * m, rtol=2e-6, atol=1e-7)


def _fake_runs(scale: grid.Scale, acc: dict[tuple[str, int, float], float]) -> dict[str, dict]:
  return {
    c.name: {"cell": vars(c), "test_accuracy": acc[(c.method, c.epochs, c.lr)]}
    for c in grid.tuning_cells(scale)
  }


def _flat(scale: grid.Scale) -> dict[tuple[str, int, float], float]:
  return {(m, e, lr): 0.5 for m in grid.METHODS for e in scale.budgets for lr in scale.rates[m]}


def test_choose_rate_is_per_budget_with_ties_to_the_smaller_rate() -> None:
  scale = grid.SCALES["default"]
  acc = _flat(scale)
  acc[("ar_sgd", 15, 0.2)] = acc[("ar_sgd", 15, 0.4)] = 0.9  # a tie: the smaller rate wins
  acc[("ar_sgd", 45, 0.8)] = 0.7
  acc[("asp_plain", 45, 0.0125)] = 0.6
  runs = _fake_runs(scale, acc)
  assert grid.choose_rate(runs, scale, "ar_sgd", 15) == 0.2
  assert grid.choose_rate(runs, scale, "ar_sgd", 45) == 0.8
  assert grid.choose_rate(runs, scale, "asp_plain", 45) == 0.0125
  assert grid.choose_rate(runs, scale, "sgp", 15) == 0.025  # all equal: the smallest
  del runs["tune/sgp/HO/15ep/lr0.1/seed101"]
  assert grid.choose_rate(runs, scale, "sgp", 15) is None  # not tuned yet
  assert grid.choose_rate(runs, scale, "sgp", 45) == 0.025


def test_final_grid_goes_budget_then_seed_and_runs_ar_sgd_off_ho_once() -> None:
  scale = grid.SCALES["default"]
  assert len(grid.tuning_cells(scale)) == 120
  cells = grid.final_cells(_fake_runs(scale, _flat(scale)), scale)
  assert len(cells) == 2 * (10 * (1 + 5 * 3) + 2) and len({c.name for c in cells}) == len(cells)
  order = [(c.epochs, c.seed) for c in cells]
  assert order == sorted(order) and order[0] == (15, 0) and order[-1] == (45, 9)
  ar = [(c.cluster, c.seed) for c in cells if c.method == "ar_sgd" and c.epochs == 45]
  assert ("HE1", 0) in ar and ("HE2", 0) in ar and all(c == "HO" for c, s in ar if s > 0)
  assert not grid.final_cells({}, scale)


def test_verdicts_follow_the_preregistered_rule() -> None:
  level = paired_intervals.paired([0.80, 0.81, 0.82, 0.83], [0.805, 0.81, 0.815, 0.83])
  assert report.verdict(level) == ("parity", "not distinguishable")
  ahead = paired_intervals.paired([0.804, 0.815, 0.826], [0.80, 0.81, 0.82])
  assert ahead.low > 0 and ahead.high <= report.PARITY
  assert report.verdict(ahead) == ("parity", "ahead")
  wide = paired_intervals.paired([0.70, 0.90, 0.75], [0.80, 0.80, 0.80])
  assert report.verdict(wide) == ("not parity", "not distinguishable")
  far = paired_intervals.paired([0.10, 0.11, 0.12], [0.80, 0.80, 0.81])
  assert report.verdict(far) == ("not parity", "behind")
  assert report.verdict(paired_intervals.paired([0.8], [0.7]))[0] == "one seed: no interval"


def test_smoke_study_writes_tables_plot_and_resumes(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  argv = ["--setup", "smoke", "--out", str(tmp_path), "--cache_dir", str(tmp_path / "cache")]
  text = driver.main(STUDY, [*argv, "--max_cells", "7"])  # budget 1's 6 tuning cells, a final one
  out = capsys.readouterr().out
  assert "tune/asp_plain/HO/1ep/lr0.05/seed100: acc" in out
  assert "final/ar_sgd/HO/1ep/lr0.05/seed0: acc" in out and "Ran 7, skipped 0" in out
  assert "6 of 12 tuning cells, 1 final cells" in text and "| 1 | HO | AR-SGD | 0.05 | 0." in text
  assert (tmp_path / "tables.md").read_text() == text
  runs = json.loads((tmp_path / "runs.json").read_text())
  assert len(runs) == 7 and all(0.0 <= r["test_accuracy"] <= 1.0 for r in runs.values())
  assert all(len(r["curve"]) == 4 for r in runs.values())  # num_evals 3 plus the start
  assert all(r["train_loss"] > 0 for r in runs.values())  # recorded in every cell
  text = driver.main(STUDY, [*argv, "--max_cells", "1"])  # resumes with the next final cell only
  resumed = capsys.readouterr().out
  assert "final/aladdin/HO/1ep/lr0.05/seed0: acc" in resumed and "Ran 1, skipped 7" in resumed
  assert "| 1 | HO | ALADDIN | 0.05 | 0." in text
  png = tmp_path / "accuracy_vs_time.png"
  assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
  first = png.read_bytes()
  assert driver.main(STUDY, [*argv, "--report_only"]) == text  # byte for byte from runs.json
  assert png.read_bytes() == first and "Ran" not in capsys.readouterr().out
