"""Smoke test of benchmarks/adamw_scaling: a tiny run trains through the example trainer and its
registry, is finished by the harness's rule, carries the optax_lena diagnostics, the validation
accuracy and the critical batch, and the report builds; the grid picks the swept rates; the arms'
optimizers against float64 NumPy."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

pytest.importorskip("flax")

import optax

from benchmarks import driver, harness
from benchmarks.adamw_scaling import grid as study
from benchmarks.adamw_scaling import report, runner
from benchmarks.adamw_scaling.__main__ import STUDY
from benchmarks.adamw_scaling.grid import Run
from examples import optimizers


def test_a_tiny_run_trains_and_reports(tmp_path):
  out = tmp_path / "out"
  run = Run("lena_sqrt_sa", 16, 0, 3e-3, 1, 1000)
  context = driver.Context(out, tmp_path / "cache", "smoke")
  runner.run(run, study.SMOKE, context)
  workdir = out / "runs" / run.name
  assert harness.is_finished(workdir)
  config = json.loads((workdir / "config.json").read_text())
  assert config["optimizer"] == "adamw_scaling.lena_sqrt_sa" and config["parallel"] == "vmap"
  assert {k: config[k] for k in runner.study_fields(run)} == runner.study_fields(run)
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert all(r["type"] == "eval" for r in records)
  every = max(1, config["total_steps"] // study.NUM_EVALS)  # 6 updates: every one
  assert [r["iteration"] for r in records] == list(range(every, config["total_steps"] + 1, every))
  assert records[-1]["base_steps"] == records[-1]["iteration"] * run.scale
  last = records[-1]
  assert np.isfinite(last["eval_accuracy"]) and 0.0 <= last["val_accuracy"] <= 1.0
  # Scale k = 16 / 8 = 2: the per-layer multipliers are sqrt(r) * warm-up factor <= sqrt(2).
  assert max(last["lr_multiplier"].values()) <= np.sqrt(2) + 1e-6
  assert "critical_batch_size" in last and "expected_speedup_2x" in last
  text = report.report(study.SMOKE, out).text
  assert "LENA-AdamW p=1/2 + SA warm-up" in text and "Finished runs: 1" in text
  assert (out / "accuracy_vs_scale.png").stat().st_size > 0


def _fake_finished(runs_dir, run, accuracy):
  workdir = runs_dir / run.name
  workdir.mkdir(parents=True)
  config = runner.study_fields(run)
  (workdir / "config.json").write_text(json.dumps(config))
  record = {"type": "eval", "iteration": config["total_steps"], "eval_accuracy": accuracy}
  (workdir / "metrics.jsonl").write_text(json.dumps(record) + "\n")


def test_grid_uses_the_best_swept_rates(tmp_path):
  runs_dir = tmp_path / "runs"
  with pytest.raises(ValueError, match="sweep has not finished"):
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
  assert {r.method for r in grid if r.num_workers == 32 and r.seed == 0} == set(study.GRID_METHODS)
  assert not any(r.method == "lamb" and r.seed == 1 for r in grid)  # LAMB's sweep not finished
  for run, acc in zip(study.LAMB_RATES, [0.2, 0.1, 0.3, 0.25, 0.15], strict=True):
    _fake_finished(runs_dir, Run("lamb", 32, 0, run, 2, 1000, sweep=True), acc)
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
      _fake_finished(runs_dir, Run("lamb", s, 0, lr, 2, 1000, sweep=True), acc)
  for seed, (p1, p_half) in enumerate([(0.5, 0.4), (0.6, 0.4)]):
    _fake_finished(runs_dir, Run("lena", 32, seed, 1e-2, 2, 1000), p1)
    _fake_finished(runs_dir, Run("lena_sqrt", 32, seed, 1e-2, 2, 1000), p_half)
  tables = report.report(study.Setup(), tmp_path / "out").text
  # Paired by seed: differences 0.1 and 0.2, A ahead on both seeds.
  assert "| LENA-AdamW p=1 - LENA-AdamW p=1/2 | +0.150 ± 0.071 (2/2) | — |" in tables
  row = next(line for line in tables.splitlines() if line.startswith("| LAMB"))
  assert "0.4000 (1) @ 0.01 |" in row  # S = 32: inside the sweep
  assert "0.4000 (1) @ 1 (edge of the sweep)" in row  # S = 128: the largest rate


def _adamw_reference(grads, w, *, rate, k, warmup, total, b1, b2, eps, decay):
  """Float64 NumPy AdamW (decoupled decay on the kernel, the study's warm-up and sample-clock
  cosine schedule): the parameters after each of ``grads``."""
  m = {n: np.zeros_like(v) for n, v in w.items()}
  v2 = {n: np.zeros_like(v) for n, v in w.items()}
  out = []
  for t, g in enumerate(grads, start=1):
    step = min((t - 1) * k, total)
    cosine = 0.99 * 0.5 * (1 + math.cos(math.pi * step / total)) + 0.01
    eta = rate * min(t * k / warmup, 1.0) * cosine
    for n in w:
      m[n] = b1 * m[n] + (1 - b1) * g[n]
      v2[n] = b2 * v2[n] + (1 - b2) * g[n] ** 2
      m_hat, v_hat = m[n] / (1 - b1**t), v2[n] / (1 - b2**t)
      u = m_hat / (np.sqrt(v_hat) + eps) + (decay * w[n] if n == "kernel" else 0.0)
      w = {**w, n: w[n] - eta * u}
    out.append(w)
  return out


def _hyperparams(run: Run, num_train: int) -> optimizers.Hyperparams:
  """What the trainer hands the arms' registry entries for ``run`` (``runner.trainer_config``)."""
  return optimizers.Hyperparams(
    learning_rate=run.learning_rate,
    num_samples=run.num_workers,
    total_steps=run.epochs * (num_train // run.global_batch),
    momentum=study.B1,
    weight_decay=study.WEIGHT_DECAY,
    per_worker_batch_size=study.PER_WORKER_BATCH,
    reference_batch_size=study.REFERENCE_BATCH,
  )


@pytest.mark.parametrize(
  "method, s, rate",
  [("adamw", 32, 3e-2), ("adamw", 8, 1e-2), ("malladi", 32, 1e-2), ("malladi_b2", 128, 1e-2)],
)
def test_tuned_adamw_and_malladi_match_numpy(method, s, rate):
  """Plain AdamW at its own rate (no multiplier) and Malladi et al.'s rule (rate x sqrt(k),
  1 - b1 and 1 - b2 times k, eps / sqrt(k); b1 kept in the variant) against float64 NumPy, as
  the registry builds them for the trainer."""
  import jax
  import jax.numpy as jnp

  import optax_lena as ol

  run = Run(method, s, 0, rate, 8, 10_000, sweep=method == "adamw")
  num_train = 8000
  k = run.scale
  total = runner.total_base_steps(run, num_train)
  warmup = max(1, round(study.WARMUP_FRACTION * total))
  if method == "adamw":
    kw = {"rate": rate, "b1": 0.9, "b2": 0.999, "eps": 1e-8}
  else:
    b1 = 1 - k * 0.1 if method == "malladi" else 0.9
    kw = {"rate": rate * math.sqrt(k), "b1": b1, "b2": 1 - k * 0.001, "eps": 1e-8 / math.sqrt(k)}
  rng = np.random.default_rng(0)
  w0 = {"kernel": rng.normal(size=(3, 2)), "bias": rng.normal(size=(2,))}
  stacked = [{n: rng.normal(size=(s, *v.shape)) for n, v in w0.items()} for _ in range(3)]
  expected = _adamw_reference(
    [{n: g.mean(axis=0) for n, g in st.items()} for st in stacked],
    w0,
    k=k,
    warmup=warmup,
    total=total,
    decay=study.WEIGHT_DECAY,
    **kw,
  )
  with optimizers.registered(*runner.ENTRIES):
    entry = optimizers.get(runner.registry_name(method))
    hp = dataclasses.replace(_hyperparams(run, num_train), warmup=entry.paper_warmup)
    tx = optimizers.build(entry.name, hp)
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), w0)
  state = tx.init(params)
  for st, want in zip(stacked, expected, strict=True):
    grads, stats = ol.stacked_grad_stats(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), st))
    updates, state = tx.update(grads, state, params, grad_stats=stats)
    params = optax.apply_updates(params, updates)
    for n in w0:
      np.testing.assert_allclose(np.asarray(params[n]), want[n], rtol=1e-5, atol=1e-6)


def test_malladi_rule_is_undefined_beyond_k_10():
  hp = _hyperparams(Run("malladi", 128, 0, 1e-2, 8, 10_000), 8000)
  with pytest.raises(ValueError, match="k \\(1 - b1\\) < 1"):
    runner.make_optimizer("malladi", hp)


def test_selection_picks_the_best_validation_rate_and_extends_an_edge():
  rates = study.SELECTION_RATES
  assert study.pick({1e-3: 0.5, 1e-2: 0.7, 3e-2: 0.7}) == 1e-2  # a tie goes to the smaller rate
  assert study.edge_step(rates, 1e-1) == 3e-1 and study.edge_step(rates, 1e-3) == 3e-4
  assert study.edge_step(rates, 1e-2) is None
  inside = {1e-3: 0.1, 3e-3: 0.3, 1e-2: 0.6, 3e-2: 0.5, 1e-1: 0.2}
  assert study.selection(lambda s, lr, seed: inside[lr], 32) == (list(rates), 1e-2)
  edge = {1e-3: 0.1, 3e-3: 0.2, 1e-2: 0.3, 3e-2: 0.4, 1e-1: 0.5}
  assert study.selection(lambda s, lr, seed: edge.get(lr), 32) == ([*rates, 3e-1], None)
  # One step beyond the edge, once: the extended sweep's best is chosen even at its new edge.
  edge[3e-1] = 0.6
  assert study.selection(lambda s, lr, seed: edge[lr], 32) == ([*rates, 3e-1], 3e-1)
  # The mean over the seeds decides.
  by_seed = {(1e-2, 100): 0.9, (1e-2, 101): 0.1, (3e-3, 100): 0.45, (3e-3, 101): 0.45}
  two = study.selection(
    lambda s, lr, seed: by_seed.get((lr, seed), 0.0), 32, rates, seeds=(100, 101)
  )
  assert two[1] == 1e-2  # 0.5 > 0.45
  by_seed[(3e-3, 101)] = 0.6
  assert (
    study.selection(lambda s, lr, seed: by_seed.get((lr, seed), 0.0), 32, rates, (100, 101))[1]
    == 3e-3
  )


def _fake_with_val(runs_dir, run, test_acc, val_acc):
  workdir = runs_dir / run.name
  workdir.mkdir(parents=True)
  config = runner.study_fields(run)
  (workdir / "config.json").write_text(json.dumps(config))
  record = {
    "type": "eval",
    "iteration": config["total_steps"],
    "eval_accuracy": test_acc,
    "val_accuracy": val_acc,
  }
  (workdir / "metrics.jsonl").write_text(json.dumps(record) + "\n")


@pytest.mark.filterwarnings("ignore:Data has no positive values")
def test_final_runs_and_report_use_the_validation_choice(tmp_path):
  out = tmp_path / "out"
  runs_dir = out / "runs"
  for run, acc in zip(study.sweep_runs(2, 1000), [0.5, 0.7, 0.6, 0.4], strict=True):
    _fake_finished(runs_dir, run, acc)  # base rate 3e-3
  assert study.selection_runs(runs_dir, [32], 2, 1000)  # nothing finished: the sweeps
  # Validation prefers 3e-2; the test accuracy of the selection seed (which must not count)
  # prefers 1e-3.
  for lr, val in zip(study.SELECTION_RATES, [0.2, 0.3, 0.4, 0.6, 0.5], strict=True):
    for seed in study.CHECK_SEEDS:
      run = Run("adamw", 32, seed, lr, 2, 1000, sweep=True)
      _fake_with_val(runs_dir, run, 0.9 if lr == 1e-3 else 0.1, val)
  finals = study.final_runs(runs_dir, [32], 2, 1000, malladi_variant=False)
  assert [(r.method, r.learning_rate) for r in finals[:5]] == [("malladi", 3e-3)] * 5
  adamw = [r for r in finals if r.method == "adamw"]
  assert {r.learning_rate for r in adamw} == {3e-2}
  assert sorted(r.seed for r in adamw) == list(study.FINAL_SEEDS)
  assert not any(r.method == "lamb" for r in finals)  # LAMB's selection has not run
  for seed in study.FINAL_SEEDS[:2]:
    _fake_with_val(runs_dir, Run("adamw", 32, seed, 3e-2, 2, 1000, sweep=True), 0.5, 0.0)
    _fake_finished(runs_dir, Run("lena", 32, seed, 3e-3, 2, 1000), 0.6 + 0.1 * seed)
  files = driver.rebuild(STUDY.setups["default"], study.Setup(), out).files
  summary = json.loads(files["summary.json"])
  assert summary["cells"]["adamw/S32"] == {
    "final_accuracy": [0.5, 0.5],
    "seeds": [0, 1],
    "iterations_to_target": summary["cells"]["adamw/S32"]["iterations_to_target"],
    "learning_rate": 3e-2,
  }
  assert summary["selection"]["adamw/seeds 100/S32"]["chosen"] == 3e-2
  tables = files["tables.md"]
  # LENA - AdamW: +0.1 and +0.2 on seeds 0 and 1.
  p = report.paired_intervals.paired([0.6, 0.7], [0.5, 0.5])
  row = f"| LENA-AdamW p=1 | 32 | {' | '.join(map(str, p.row('', 4)[1:]))} | not distinguishable |"
  assert row in tables
  assert (out / "paired_vs_tuned_adamw.png").stat().st_size > 0
