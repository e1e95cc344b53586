"""Tests of the LENA trainer (examples/lena/train.py) and its demo (examples/lena/demo.py).

Tiny MNIST-1D runs on 8 simulated CPU devices (see conftest.py); CIFAR runs on
`tfds.testing.mock_data`. The full optimizer x parallel-mode grid is marked slow; the default
selection still runs every optimizer and every parallel mode.
"""

import dataclasses
import json
import logging
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

# `examples` is a top-level package of the repository, not part of the installed distribution.
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
  sys.path.insert(0, _REPO_ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from examples import (  # noqa: E402
  checkpoints,
  input_pipeline,
  metrics,
  optimizers,
  training_stream,
)
from examples.lena import configs, train  # noqa: E402
from examples.lena import main as cli  # noqa: E402
from examples.lena import parallel as parallel_lib  # noqa: E402


def tiny(cache_dir: str, **changes) -> configs.Config:
  """The tiny test configuration with ``changes``."""
  return dataclasses.replace(configs.get_config("tiny_test"), cache_dir=cache_dir, **changes)


def _params(state: train.TrainState) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state.params))]


# ----------------------------------------------------------------------------------------------
# Every optimizer and parallel mode trains
# ----------------------------------------------------------------------------------------------

# Each optimizer once and each parallel mode at least twice; LENA in all three modes is in
# test_parallel_modes_agree. The rest of the grid is slow only because every run compiles.
_FAST = {
  ("sgd", "pmap"),
  ("linear_scaling", "gspmd"),
  ("adascale", "shard_map"),
  ("lars", "shard_map"),
  ("lamb", "pmap"),
  ("lena", "gspmd"),
}
# On one device (S = 8 by accumulation): a 1-device mesh is where the first step's state was
# typed without the mesh (so the step compiled twice) and where pmap's copy kept its device axis.
_ONE_DEVICE = {("lamb", "pmap"), ("adascale", "shard_map")}
_GRID = [
  pytest.param(o, p, marks=() if (o, p) in _FAST else pytest.mark.slow)
  for o in optimizers.names()
  for p in parallel_lib.STRATEGIES
]


@pytest.mark.parametrize(("optimizer", "parallel"), _GRID)
def test_smoke(
  optimizer: str, parallel: str, tmp_path: Path, cache_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
  num_devices = 1 if (optimizer, parallel) in _ONE_DEVICE else 0
  config = tiny(
    cache_dir,
    optimizer=optimizer,
    parallel=parallel,
    num_steps=4,
    eval_every=2,
    num_devices=num_devices,
  )
  with jax.log_compiles(True), caplog.at_level(logging.WARNING, logger="jax"):
    state = train.train_and_evaluate(config, tmp_path)
  assert int(state.step) == 4
  if parallel != "pmap":  # (pmap does not log its compilations)
    steps = [r for r in caplog.messages if re.match(r"Compiling jit\((local_)?step\)", r)]
    assert len(steps) == 1, "the train step compiled more than once: " + str(len(steps))
  assert all(np.isfinite(p).all() for p in _params(state))
  evals = metrics.read_metrics(tmp_path, "eval")
  assert [r["iteration"] for r in evals] == [2, 4]
  for r in evals:
    assert 0.0 <= r["eval_accuracy"] <= 1.0 and math.isfinite(r["eval_loss"])
    assert math.isfinite(r["train_loss"]) and r["base_steps"] == 8 * r["iteration"]
    assert r["eval_split"] == "test" and r["wall_time"] > 0
    if optimizers.get(optimizer).diagnostics:
      # Per-layer diagnostics keyed by layer name.
      paths = jax.tree_util.tree_flatten_with_path(state.params)[0]
      layers = {jax.tree_util.keystr(p, simple=True, separator="/") for p, _ in paths}
      assert set(r["lr_multiplier"]) == layers
      assert all(1.0 <= v <= 8.0 for v in r["gain_ratio"].values())
      assert "warmup_end_step" in r
    else:
      assert "lr_multiplier" not in r
  saved = json.loads((tmp_path / "config.json").read_text())
  assert saved["optimizer"] == optimizer and saved["layout"]["num_samples"] == 8


def test_parallel_modes_agree(tmp_path: Path, cache_dir: str) -> None:
  """shard_map, pmap and GSPMD give the same LENA run with micro-batches (S = 8 x 2)."""
  params, evals = {}, {}
  for parallel in parallel_lib.STRATEGIES:
    config = tiny(
      cache_dir,
      optimizer="lena",
      parallel=parallel,
      batch_scale=16,
      num_devices=8,
      micro_batches=2,
      num_steps=3,
      eval_every=3,
      log_every=0,
    )
    state = train.train_and_evaluate(config, tmp_path / parallel)
    params[parallel] = _params(state)
    evals[parallel] = metrics.read_metrics(tmp_path / parallel)[-1]
    layout = json.loads((tmp_path / parallel / "config.json").read_text())["layout"]
    assert layout["num_samples"] == 16 and layout["global_batch"] == 128
  for parallel in ("pmap", "gspmd"):
    for a, b in zip(params["shard_map"], params[parallel], strict=True):
      # pmap and shard_map run the same per-device program; GSPMD reduces in another order.
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    for layer, v in evals["shard_map"]["gain_ratio"].items():
      np.testing.assert_allclose(evals[parallel]["gain_ratio"][layer], v, rtol=1e-4)


def test_resnet18_on_mock_cifar10(tmp_path: Path) -> None:
  tfds = pytest.importorskip("tensorflow_datasets")
  config = dataclasses.replace(
    configs.get_config("cifar10_resnet18"),
    width=4,
    per_worker_batch=4,
    batch_scale=8,
    num_devices=2,
    micro_batches=4,
    num_steps=2,
    eval_every=2,
    eval_batch_size=32,
    log_every=0,
    checkpoint_every=0,
    progress_bar=False,
    rng_impl="rbg",
  )
  with tfds.testing.mock_data(num_examples=64):
    state = train.train_and_evaluate(config, tmp_path)
  assert int(state.step) == 2
  (rec,) = metrics.read_metrics(tmp_path)
  assert 0.0 <= rec["eval_accuracy"] <= 1.0 and math.isfinite(rec["train_loss"])
  assert len(rec["lr_multiplier"]) == 62  # one per ResNet-18 parameter leaf
  stats = jax.tree.leaves(jax.device_get(state.batch_stats))
  assert len(stats) == 40 and all(np.isfinite(s).all() for s in stats)
  # Training moved the running means away from their initial zeros.
  assert any(np.abs(s).max() > 0 for s in jax.tree.leaves(state.batch_stats["stem_norm"]))


class _CountingData:
  """Epochs of 10 examples, labelled 100 * epoch + index, in two chunks of 3 and 7."""

  num_train = 10

  def epoch_examples(self, epoch: int, part: input_pipeline.StreamPart | None = None):
    order = np.random.default_rng(epoch).permutation(10) + 100 * epoch
    if part is not None:  # one process's share, as the datasets select it
      order = order[part.keep(epoch * 10 + np.arange(10))]
    yield order[:3], order[:3]
    yield order[3:], order[3:]


def test_global_batches_straddle_epochs_and_resume_anywhere() -> None:
  data = _CountingData()
  stream = training_stream.global_batches(data, 4)
  batches = [next(stream)["y"] for _ in range(8)]
  # Nothing dropped at epoch ends: the batches tile epoch 0, 1, 2, ... in order.
  expected = np.concatenate([np.random.default_rng(e).permutation(10) + 100 * e for e in range(4)])[
    :32
  ]
  np.testing.assert_array_equal(np.concatenate(batches), expected)
  for start in range(8):  # resuming at update `start` continues the same sequence
    resumed = training_stream.global_batches(data, 4, start)
    for want in batches[start:]:
      np.testing.assert_array_equal(next(resumed)["y"], want)
  # Batches of any size (a batch ramp's) cut the same stream, also resumed at any example.
  sizes = [2, 6, 4, 10, 8]
  ramp = training_stream.ExampleStream(data)
  np.testing.assert_array_equal(np.concatenate([ramp.take(n)["y"] for n in sizes]), expected[:30])
  resumed_ramp = training_stream.ExampleStream(data, 13)  # mid second epoch
  np.testing.assert_array_equal(resumed_ramp.take(12)["y"], expected[13:25])


@pytest.mark.parametrize("processes", [2, 4])
def test_process_parts_tile_every_global_batch(processes: int) -> None:
  """Each process takes only its block of rows; together they are the single-process batches,
  also when resuming anywhere (the stream does not depend on the number of processes), with
  batches of one size (each process reads only its examples) or of changing sizes."""
  data = _CountingData()
  single = training_stream.global_batches(data, 4)
  batches = [next(single)["y"] for _ in range(8)]
  for start in range(8):
    parts = [training_stream.global_batches(data, 4, start, p, processes) for p in range(processes)]
    for want in batches[start:]:
      got = [next(stream)["y"] for stream in parts]
      assert all(len(g) == 4 // processes for g in got)
      np.testing.assert_array_equal(np.concatenate(got), want)
  whole = np.concatenate([np.random.default_rng(e).permutation(10) + 100 * e for e in range(6)])
  for start in (0, 4, 12):
    ramps = [
      training_stream.ExampleStream(data, start, process_index=p, process_count=processes)
      for p in range(processes)
    ]
    at = start
    for n in (4, 8, 4, 12):
      np.testing.assert_array_equal(
        np.concatenate([r.take(n)["y"] for r in ramps]), whole[at : at + n]
      )
      at += n
  with pytest.raises(ValueError, match="does not split over 3"):
    next(training_stream.global_batches(data, 4, 0, 0, 3))
  with pytest.raises(ValueError, match="cuts global batches of 4 examples, not 8"):
    training_stream.ExampleStream(data, process_index=0, process_count=2, batch_size=4).take(8)


# ----------------------------------------------------------------------------------------------
# Batch layout and error messages
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  ("changes", "devices", "expected"),
  [
    ({"batch_scale": 32}, 8, (8, 4)),
    ({"batch_scale": 1}, 8, (1, 1)),
    ({"batch_scale": 12}, 8, (6, 2)),  # the largest divisor of S that fits
    ({"batch_scale": 16, "micro_batches": 8}, 8, (2, 8)),
    ({"global_batch_size": 512, "per_worker_batch": 32}, 8, (8, 2)),
    ({"batch_scale": 7}, 1, (1, 7)),
  ],
)
def test_batch_layout(changes: dict, devices: int, expected: tuple) -> None:
  layout = parallel_lib.batch_layout(dataclasses.replace(configs.Config(), **changes), devices)
  assert (layout.num_devices, layout.micro_batches) == expected
  assert layout.global_batch == layout.num_samples * layout.per_worker_batch


def test_indivisible_batch_message() -> None:
  config = configs.Config(per_worker_batch=32, batch_scale=12, num_devices=8)
  with pytest.raises(ValueError, match="Global batch 384") as info:
    parallel_lib.batch_layout(config, 8)
  msg = str(info.value)
  assert "8 devices x 1 micro-batches" in msg and "batch_scale=8" in msg
  assert "num_devices" in msg and "micro_batches" in msg
  with pytest.raises(ValueError, match=r"not a multiple of per_worker_batch 32"):
    parallel_lib.batch_layout(configs.Config(per_worker_batch=32, global_batch_size=1000), 8)
  with pytest.raises(ValueError, match="only 8 devices"):
    parallel_lib.batch_layout(configs.Config(num_devices=16), 8)


@pytest.mark.parametrize(
  ("key", "value", "valid"),
  [
    ("optimizer", "adam", "sgd, linear_scaling, adascale, lena, lars, lamb"),
    ("parallel", "pjit", "shard_map, pmap, gspmd"),
    ("dataset", "imagenet", "mnist1d, cifar10, cifar100"),
    ("model", "vgg", "cnn1d, resnet18"),
    ("warmup", "cosine", "default, none, fixed, state_aware"),
  ],
)
def test_unknown_names(key: str, value: str, valid: str, tmp_path: Path) -> None:
  config = dataclasses.replace(configs.Config(), **{key: value})
  with pytest.raises(ValueError, match=f"Unknown {key} '{value}'.*{valid}"):
    train.train_and_evaluate(config, tmp_path)


def test_state_aware_warmup_needs_statistics() -> None:
  config = configs.Config(optimizer="lars", warmup="state_aware")
  with pytest.raises(ValueError, match=r"state_aware.*lars"):
    train.create_optimizer(config, 8, 10)


def test_missing_cifar_message(tmp_path: Path) -> None:
  pytest.importorskip("tensorflow_datasets")
  config = dataclasses.replace(
    configs.get_config("cifar10_resnet18"), data_dir=str(tmp_path / "nothing")
  )
  with pytest.raises(FileNotFoundError, match="tfds build cifar10"):
    train.train_and_evaluate(config, tmp_path / "run")


def test_cli_parsing_and_errors(capsys: pytest.CaptureFixture) -> None:
  config, workdir, _ = cli.parse_args(
    [
      "--config",
      "default",
      "--set",
      "optimizer=lena",
      "--set",
      "batch_scale=16",
      "--set",
      "learning_rate=0.2",
      "--set",
      "progress_bar=false",
      "--workdir",
      "runs/x",
    ]
  )
  assert (config.optimizer, config.batch_scale, config.learning_rate) == ("lena", 16, 0.2)
  assert config.progress_bar is False and workdir == "runs/x"
  for bad, expected in [
    ("batch_scale=abc", "expected int"),
    ("nope=1", "Unknown config key"),
    ("batch_scale", "key=value"),
  ]:
    with pytest.raises(SystemExit):
      cli.parse_args(["--set", bad, "--workdir", "x"])
    assert expected in capsys.readouterr().err
  with pytest.raises(SystemExit):
    cli.parse_args(["--config", "imagenet", "--workdir", "x"])
  err = capsys.readouterr().err
  assert "Unknown config 'imagenet'" in err
  assert all(name in err for name in ("cifar10_resnet18", "default", "tiny_test"))
  # Configuration errors end the CLI with the message, not a traceback.
  with pytest.raises(SystemExit, match="valid optimizers"):
    cli.main(["--set", "optimizer=adam", "--workdir", "x"])


# ----------------------------------------------------------------------------------------------
# Checkpoint / resume
# ----------------------------------------------------------------------------------------------


def _finished_checkpoints(workdir: Path) -> list[int]:
  """Steps of finished checkpoints: orbax writes to a temporary name and renames, then the
  trainer writes the digest (atomically)."""
  d = workdir / "checkpoints"
  if not d.exists():
    return []
  return sorted(
    int(p.name) for p in d.iterdir() if p.name.isdigit() and (p / checkpoints.DIGEST).exists()
  )


def test_kill_and_resume_is_bitwise_identical(tmp_path: Path, cache_dir: str) -> None:
  total = 300
  args = [
    "--config",
    "tiny_test",
    "--set",
    f"cache_dir={cache_dir}",
    "--set",
    f"num_steps={total}",
    "--set",
    "checkpoint_every=20",
    "--set",
    "eval_every=100",
    "--set",
    "log_every=0",
  ]
  workdir = tmp_path / "killed"
  cmd = [sys.executable, "-m", "examples.main", *args, "--workdir", str(workdir)]
  log = tmp_path / "first.log"
  with log.open("w") as f:
    proc = subprocess.Popen(cmd, cwd=_REPO_ROOT, stdout=f, stderr=subprocess.STDOUT)
  try:
    deadline = time.monotonic() + 300
    while not _finished_checkpoints(workdir):
      assert proc.poll() is None, f"training exited early:\n{log.read_text()[-3000:]}"
      assert time.monotonic() < deadline, "no checkpoint within 300 s"
      time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # a crash: no cleanup, no final checkpoint
  finally:
    proc.kill()
    proc.wait()
  assert proc.returncode == -signal.SIGKILL
  killed_at = max(_finished_checkpoints(workdir))
  assert killed_at < total, "the run finished before it was killed; raise num_steps"

  resumed = subprocess.run(cmd, cwd=_REPO_ROOT, capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Resumed from checkpoint at step" in resumed.stderr
  resumed_from = int(resumed.stderr.split("Resumed from checkpoint at step ")[1].split()[0])
  assert resumed_from == killed_at  # the newest finished checkpoint, digest and all

  # The uninterrupted run, in this process (same 8 CPU devices, same compiled programs).
  config, _, _ = cli.parse_args([*args, "--workdir", "unused"])
  reference = train.train_and_evaluate(config, tmp_path / "uninterrupted")

  final = checkpoints.restore_checkpoint(workdir)
  assert int(final["state"]["step"]) == total == int(reference.step)
  got = jax.tree.leaves(final["state"]["params"])
  want = jax.tree.leaves(jax.device_get(reference.params))
  assert len(got) == len(want) == 8
  for a, b in zip(got, want, strict=True):
    assert np.array_equal(np.asarray(a), np.asarray(b))
  # Metrics after the resume point were rewritten, not duplicated.
  iterations = [r["iteration"] for r in metrics.read_metrics(workdir)]
  assert iterations == [100, 200, 300]


# ----------------------------------------------------------------------------------------------
# Demo
# ----------------------------------------------------------------------------------------------


def test_demo_quick_writes_table_and_plots(tmp_path: Path, cache_dir: str) -> None:
  from examples.lena import demo

  out = demo.main(quick=True, workdir=tmp_path / "demo", cache_dir=cache_dir)
  assert [r["method"] for r in out["rows"]] == ["SGD 1 worker", "LSW", "AdaScale", "LENA"]
  assert out["rows"][0]["S"] == 1 and all(r["S"] == 8 for r in out["rows"][1:])
  for r in out["rows"]:
    assert 0.0 <= r["final_accuracy"] <= 1.0
    assert len(r["iterations_to_target"]) == 2
    assert all(it is None or it > 0 for it in r["iterations_to_target"])
  assert "| LENA |" in out["table"] and "iterations to" in out["table"]
  names = sorted(p.name for p in out["plots"])
  assert names == ["accuracy.png", "lr_multipliers.png", "warmup_end.png"]
  for p in out["plots"]:
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
  assert (tmp_path / "demo" / "table.md").exists()


def test_iterations_to_target() -> None:
  from examples.lena import demo

  records = [{"iteration": i, "eval_accuracy": a} for i, a in [(2, 0.5), (4, 0.9), (6, 0.95)]]
  assert demo.iterations_to_target(records, 0.9) == 4
  assert demo.iterations_to_target(records, 0.99) is None
