"""Tests of the trainer's batch ramp (examples/lena/ramp.py, ``config.batch_ramp``).

Tiny MNIST-1D runs on 8 simulated CPU devices (see conftest.py). The ramp's compiled steps are
kept per process, so the stopped and the resumed run reuse the uninterrupted run's programs.
"""

import dataclasses
import logging
import math
import re
import sys
from pathlib import Path

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
  sys.path.insert(0, _REPO_ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import optax_lena as ol  # noqa: E402
from examples import input_pipeline, metrics  # noqa: E402
from examples.lena import configs, ramp, train  # noqa: E402


def tiny(cache_dir: str, **changes) -> configs.Config:
  return dataclasses.replace(
    configs.get_config("tiny_test"), cache_dir=cache_dir, log_every=0, **changes
  )


def _leaves(state: train.TrainState) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get((state.params, state.opt_state)))]


def _without_wall_time(records: list[dict]) -> list[dict]:
  return [{k: v for k, v in r.items() if k != "wall_time"} for r in records]


@pytest.mark.parametrize(
  ("spec", "match"),
  [
    ("linear", "Unknown batch_ramp 'linear'; valid forms: 'none', 'steps:U0:S0"),
    ("steps:2:4,8:8", "must start at 0 and increase"),
    ("steps:0:4,8:0", "each entry is UPDATE:S"),
    ("noise:every=0", "needs every >= 1"),
    ("noise:often=3", "keys every, factor, max, growth"),
    ("seesaw:max=x", "max='x' is not a int"),
  ],
)
def test_bad_specs_name_the_valid_forms(spec: str, match: str) -> None:
  with pytest.raises(configs.ConfigError, match=re.escape(match)):
    ramp.parse(spec)


def test_parse() -> None:
  assert ramp.parse("steps:0:2,12:8").steps == ((0, 2), (12, 8))
  noise = ramp.parse("noise:every=5,factor=0.5,max=32,growth=1.5")
  assert (noise.every, noise.factor, noise.max_num_samples, noise.max_growth) == (5, 0.5, 32, 1.5)
  assert ramp.parse("seesaw:max=16").max_num_samples == 16


def test_seesaw_doubles_at_each_halving_of_the_rate() -> None:
  # lr_decay 1/16: the rate halves at 1/4, 2/4 and 3/4 of the run's examples.
  s = [ramp.seesaw_num_samples(2, seen, 400, 1 / 16, 64) for seen in (0, 99, 100, 199, 200, 300)]
  assert s == [2, 2, 4, 4, 8, 16]
  assert ramp.seesaw_num_samples(2, 300, 400, 1 / 16, 8) == 8  # capped: no further doubling


def test_seesaw_rate_factor_is_sqrt2_per_doubling(cache_dir: str) -> None:
  """Seesaw's transformation at 2 S0 gives sqrt(2) times the update of the plain ramp's (linear
  scaling with a constant rate, so the only difference is the factor)."""
  params = {"w": jnp.ones((3,), jnp.float32)}
  grads = jnp.asarray([[0.5, -1.0, 2.0], [1.5, 0.0, -2.0]], jnp.float32)
  mean, stats = ol.stacked_grad_stats({"w": grads})
  out = {}
  for spec in ("seesaw", "steps:0:2"):
    config = tiny(cache_dir, batch_ramp=spec, optimizer="linear_scaling", warmup="none")
    config = dataclasses.replace(config, weight_decay=0.0, momentum=0.0)
    tx = ramp.ramp_optimizer(config, 2, 1, 100)
    updates, _ = tx.update(mean, tx.init(params), params, grad_stats=stats)
    out[spec] = np.asarray(updates["w"], np.float64)
  np.testing.assert_allclose(out["seesaw"], math.sqrt(2) * out["steps:0:2"], rtol=1e-6)


def test_stream_cuts_the_same_examples_at_any_size(cache_dir: str) -> None:
  data = input_pipeline.create_dataset(tiny(cache_dir), 1)
  fixed = input_pipeline.global_batches(data, 40)
  want = np.concatenate([next(fixed)["y"] for _ in range(30)])  # 1200 > 800: two epochs
  stream = ramp.StreamOfExamples(data, 0)
  sizes = [16, 16, 64, 104, 800, 200]
  got = np.concatenate([stream.take(n)["y"] for n in sizes])
  np.testing.assert_array_equal(got, want)
  resumed = ramp.StreamOfExamples(data, 1000)  # mid second epoch
  np.testing.assert_array_equal(resumed.take(200)["y"], want[1000:1200])


def test_constant_ramp_is_bitwise_the_fixed_run(tmp_path: Path, cache_dir: str) -> None:
  """'steps:0:8' runs the ramp's loop at a fixed S: the same run as batch_ramp='none'."""
  runs = {}
  for spec in ("none", "steps:0:8"):
    config = tiny(cache_dir, batch_ramp=spec, num_steps=4, eval_every=2)
    runs[spec] = (_leaves(train.train_and_evaluate(config, tmp_path / spec)), spec)
  for a, b in zip(runs["none"][0], runs["steps:0:8"][0], strict=True):
    assert np.array_equal(a, b)
  fixed = metrics.read_metrics(tmp_path / "none")
  ramped = metrics.read_metrics(tmp_path / "steps:0:8")
  assert [r["iteration"] for r in fixed] == [r["iteration"] for r in ramped] == [2, 4]
  for f, r in zip(fixed, ramped, strict=True):
    assert f["num_samples"] == r["num_samples"] == 8
    assert r["samples_seen"] == 64 * r["iteration"]
    for key in ("train_loss", "eval_loss", "eval_accuracy", "base_steps", "gain_ratio"):
      assert f[key] == r[key], key


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
  )
  with jax.log_compiles(True), caplog.at_level(logging.WARNING, logger="jax"):
    reference = ramp.train_and_evaluate(config, tmp_path / "uninterrupted")
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

  # Stopped mid-ramp (after update 5: its last checkpoint is at 4), then resumed.
  workdir = tmp_path / "stopped"
  ramp.train_and_evaluate(config, workdir, stop_after=5)
  assert max(r["iteration"] for r in metrics.read_metrics(workdir)) == 4
  resumed = ramp.train_and_evaluate(config, workdir)
  for a, b in zip(_leaves(resumed), _leaves(reference), strict=True):
    assert np.array_equal(a, b)
  assert _without_wall_time(metrics.read_metrics(workdir)) == _without_wall_time(records)
