"""Tests of the trainer's batch schedule (examples/lena/batch_schedule.py, ``config.batch_ramp``)
and of the one loop running it (examples/lena/train.py).

Tiny MNIST-1D runs on 8 simulated CPU devices (see conftest.py). The compiled steps are kept per
process, so a resumed run reuses the uninterrupted run's programs.
"""

import dataclasses
import logging
import math
import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optax_lena as ol
from examples import metrics, optimizers
from examples.lena import batch_schedule, configs, train
from examples.lena.batch_schedule import Fixed, NoiseRamp, Plan, Progress, Seesaw, Steps


def tiny(cache_dir: str = "unused", **changes) -> configs.Config:
  return dataclasses.replace(
    configs.get_config("tiny_test"), cache_dir=cache_dir, log_every=0, **changes
  )


def _leaves(state: train.TrainState) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get((state.params, state.opt_state)))]


def _without_wall_time(records: list[dict]) -> list[dict]:
  return [{k: v for k, v in r.items() if k != "wall_time"} for r in records]


# ----------------------------------------------------------------------------------------------
# The records and their rules
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  ("spec", "match"),
  [
    ("linear", "Unknown batch_ramp 'linear'; valid forms: 'none', 'steps:U0:S0"),
    ("none:8", "Unknown batch_ramp 'none:8'"),
    ("steps:2:4,8:8", "must start at 0 and increase"),
    ("steps:0:4,8:0", "each entry is UPDATE:S"),
    ("noise:every=0", "needs every >= 1"),
    ("noise:often=3", "keys every, factor, max, growth"),
    ("seesaw:max=x", "max='x' is not a int"),
  ],
)
def test_bad_specs_name_the_valid_forms(spec: str, match: str) -> None:
  with pytest.raises(configs.ConfigError, match=re.escape(match)):
    batch_schedule.from_config(tiny(batch_ramp=spec))


def test_specs_parse_into_records() -> None:
  assert batch_schedule.from_config(tiny()) == Fixed(8)
  assert batch_schedule.from_config(tiny(global_batch_size=128)) == Fixed(16)
  assert batch_schedule.from_config(tiny(batch_ramp="steps:0:2,12:8")) == Steps(((0, 2), (12, 8)))
  noise = batch_schedule.from_config(
    tiny(batch_ramp="noise:every=5,factor=0.5,max=32,growth=1.5", batch_scale=4)
  )
  assert noise == NoiseRamp(4, every=5, factor=0.5, max_num_samples=32, max_growth=1.5)
  assert batch_schedule.from_config(tiny(batch_ramp="seesaw:max=16")) == Seesaw(8, 0.01, 16)
  with pytest.raises(configs.ConfigError, match=r"needs a decaying rate: lr_decay in \(0, 1\)"):
    batch_schedule.from_config(tiny(batch_ramp="seesaw", lr_decay=1.0))


def test_seesaw_doubles_at_each_halving_of_the_rate() -> None:
  # lr_decay 1/16: the rate halves at 1/4, 2/4 and 3/4 of the run's examples.
  seesaw, plan = Seesaw(2, 1 / 16), Plan(400, 0, 50, 1, 64, None)
  s = [
    seesaw.next_num_samples(Progress(0, seen, 2), plan, lambda: None)
    for seen in (0, 99, 100, 199, 200, 300)
  ]
  assert s == [2, 2, 4, 4, 8, 16]
  capped = dataclasses.replace(plan, max_num_samples=8)  # no further doubling
  assert seesaw.next_num_samples(Progress(0, 300, 8), capped, lambda: None) == 8


def test_steps_and_fixed_s_and_the_plans() -> None:
  steps = Steps(((0, 2), (3, 8)))
  plan = Plan(1600, 0, 200, 2, 8, None)
  sizes = [steps.next_num_samples(Progress(u, 0, 2), plan, lambda: None) for u in range(5)]
  assert sizes == [2, 2, 2, 8, 8]
  config = tiny(num_steps=0, num_epochs=2, eval_every=0, batch_ramp="steps:0:2,3:8")
  assert steps.plan(config, 800, 2) == Plan(1600, 0, 200, 2, 8, None)  # examples, in base steps
  # A fixed S runs whole updates: 800 / 64 = 12.5 per epoch, 25 updates, evaluations every 12.
  assert Fixed(8).plan(config, 800, 8) == Plan(25 * 64, 12, 25 * 8, 8, 8, 25)


def test_a_ramp_names_the_nearest_valid_s_and_its_optimizer() -> None:
  config = tiny(batch_ramp="steps:0:8,4:12,6:28")
  with pytest.raises(configs.ConfigError, match=r"S=12 is not a multiple of the 8 .* use S=16"):
    batch_schedule.from_config(config).plan(config, 800, 8)
  with pytest.raises(configs.ConfigError, match=r"exceeds the 800 training examples"):
    Steps(((0, 8), (2, 104))).plan(config, 800, 8)
  for name in ("sgd", "lars"):
    with pytest.raises(configs.ConfigError, match=r"sample clock.*use one of linear_scaling"):
      train.validate_config(tiny(batch_ramp="noise", optimizer=name))


def test_seesaw_rate_factor_is_sqrt2_per_doubling() -> None:
  """Seesaw's transformation at 2 S0 gives sqrt(2) times the update of a step ramp's (linear
  scaling with a constant rate, so the only difference is the factor)."""
  params = {"w": jnp.ones((3,), jnp.float32)}
  grads = jnp.asarray([[0.5, -1.0, 2.0], [1.5, 0.0, -2.0]], jnp.float32)
  mean, stats = ol.stacked_grad_stats({"w": grads})
  out = {}
  plan = Plan(800, 0, 100, 1, 16, None)
  for spec in ("seesaw", "steps:0:1"):
    config = tiny(batch_ramp=spec, optimizer="linear_scaling", warmup="none", batch_scale=1)
    config = dataclasses.replace(config, weight_decay=0.0, momentum=0.0)
    hp = train.scheduled_hyperparams(config, 2, batch_schedule.from_config(config), plan)
    tx = optimizers.build(config.optimizer, hp)
    updates, _ = tx.update(mean, tx.init(params), params, grad_stats=stats)
    out[spec] = np.asarray(updates["w"], np.float64)
  np.testing.assert_allclose(out["seesaw"], math.sqrt(2) * out["steps:0:1"], rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# The one loop
# ----------------------------------------------------------------------------------------------


def test_constant_ramp_is_bitwise_the_fixed_run(tmp_path: Path, cache_dir: str) -> None:
  """'steps:0:8' runs a ramp at a fixed S: the same run as batch_ramp='none'."""
  runs = {}
  for spec in ("none", "steps:0:8"):
    config = tiny(cache_dir, batch_ramp=spec, num_steps=4, eval_every=2)
    runs[spec] = _leaves(train.train_and_evaluate(config, tmp_path / spec))
  for a, b in zip(runs["none"], runs["steps:0:8"], strict=True):
    assert np.array_equal(a, b)
  fixed = metrics.read_metrics(tmp_path / "none")
  ramped = metrics.read_metrics(tmp_path / "steps:0:8")
  assert [r["iteration"] for r in fixed] == [r["iteration"] for r in ramped] == [2, 4]
  assert _without_wall_time(fixed) == _without_wall_time(ramped)
  assert [r["samples_seen"] for r in ramped] == [128, 256]


def test_noise_ramp_grows_compiles_once_per_s_and_resumes_bitwise(
  tmp_path: Path, cache_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
  config = tiny(
    cache_dir,
    batch_ramp="noise:every=2,factor=2",
    batch_scale=4,
    num_steps=12,  # 12 x 4 x 8 = 384 examples
    eval_every=2,
    checkpoint_every=2,
    keep_checkpoints=10,
  )
  with jax.log_compiles(True), caplog.at_level(logging.WARNING, logger="jax"):
    reference = train.train_and_evaluate(config, tmp_path / "uninterrupted")
  records = metrics.read_metrics(tmp_path / "uninterrupted")
  sizes = [r["num_samples"] for r in records]
  assert sizes == sorted(sizes) and len(set(sizes)) >= 2, sizes  # grows, never shrinks
  assert all(s % 4 == 0 and s <= 2 * p for s, p in zip(sizes[1:], sizes, strict=False))
  compiled = [m for m in caplog.messages if re.match(r"Compiling jit\(local_step\)", m)]
  assert len(compiled) == len(set(sizes)), compiled  # once per distinct S, not per update
  seen = [r["samples_seen"] for r in records]
  # One record per 2 updates of a fixed S each: the examples seen add up S x 8 per update.
  assert seen == list(np.cumsum([2 * s * 8 for s in sizes]))
  assert seen[-1] >= 384 > seen[-2]
  assert all(r["critical_batch_size"] is None or r["critical_batch_size"] > 0 for r in records)
  assert int(reference.step) == 2 * len(records)

  # Killed mid-ramp after its checkpoint at update 4: what it left on disk, resumed.
  workdir = tmp_path / "killed"
  shutil.copytree(tmp_path / "uninterrupted", workdir)
  for step in (p for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()):
    if int(step.name) > 4:
      shutil.rmtree(step)
  with caplog.at_level(logging.INFO, logger="examples.lena.train"):
    resumed = train.train_and_evaluate(config, workdir)
  assert any(re.match(r"Resumed from checkpoint at step 4 .*S=\d+", m) for m in caplog.messages)
  for a, b in zip(_leaves(resumed), _leaves(reference), strict=True):
    assert np.array_equal(a, b)
  assert _without_wall_time(metrics.read_metrics(workdir)) == _without_wall_time(records)
