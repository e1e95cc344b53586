"""ALADDIN on Ray with Ray sessions of their own (subprocess drivers): two nodes, a lost
cluster, Ctrl-C. Each subprocess is bounded by a timeout, and no process of its session may
outlive it."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")

import aladdin_ray_helpers as helpers

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("aladdin_ray")]

DRIVER = Path(__file__).resolve().parent / "aladdin_ray_driver.py"
ROOT = DRIVER.parent.parent


@pytest.fixture
def ray_dir() -> Iterator[Path]:
  """A short temp dir: Ray's Unix sockets live under it, and their paths must stay < 108 bytes."""
  path = Path(tempfile.mkdtemp(prefix="ray_", dir="/tmp"))
  _WORKERS_BEFORE[str(path)] = {p.pid for p in helpers.actor_processes()}
  yield path
  shutil.rmtree(path, ignore_errors=True)


_WORKERS_BEFORE: dict[str, set[int]] = {}  # Ray worker pids that existed before each test


def _start_training(temp_dir: Path) -> subprocess.Popen:
  proc = subprocess.Popen(
    [sys.executable, str(DRIVER), "train", str(temp_dir)],
    cwd=ROOT,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  line = ""
  deadline = time.time() + 120
  while "RUNNING" not in line and time.time() < deadline and proc.poll() is None:
    line = proc.stdout.readline()
  if "RUNNING" not in line:
    proc.kill()
    pytest.fail(f"the driver did not start: {proc.communicate(timeout=30)[1][-2000:]}")
  time.sleep(2.0)  # let it train
  return proc


def _assert_no_process_left(temp_dir: Path) -> None:
  before = _WORKERS_BEFORE[str(temp_dir)]
  deadline = time.time() + 20
  while helpers.processes_since(str(temp_dir), before) and time.time() < deadline:
    time.sleep(0.5)
  left = helpers.processes_since(str(temp_dir), before)
  helpers.kill_all(left)
  assert not left, f"Ray processes left behind: {[p.pid for p in left]}"


def test_two_nodes_give_the_single_node_result_with_the_deterministic_schedule(
  tmp_path: Path,
) -> None:
  out = tmp_path / "params.npz"
  done = subprocess.run(
    [sys.executable, str(DRIVER), "multinode", str(out)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=240,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  nodes = json.loads(done.stdout.strip().splitlines()[-1])
  # PS shards on the head node, workers on the other node, as the custom resources ask.
  assert nodes["head"] != nodes["other"]
  assert len(nodes["shard_nodes"]) >= 2 and set(nodes["shard_nodes"]) == {nodes["head"]}
  assert set(nodes["worker_nodes"]) == {nodes["other"]}
  params = np.load(out)
  for name in ("w", "b"):
    single, multi = params[f"single_{name}"], params[f"multi_{name}"]
    assert np.abs(single).max() > 0  # trained
    np.testing.assert_array_equal(multi, single)


def _kill_cluster(driver: subprocess.Popen, temp_dir: Path) -> None:
  """SIGKILLs every process of the driver's Ray cluster, the driver excepted. A raylet may be
  forking a worker at that moment (the child is orphaned, outside the driver's tree), so this
  repeats until none of the session's processes is left."""
  before = _WORKERS_BEFORE[str(temp_dir)]
  for _ in range(20):
    victims = helpers.ray_processes_of(driver.pid) + helpers.processes_since(str(temp_dir), before)
    victims = [p for p in victims if p.pid != driver.pid]
    if not victims:
      return
    helpers.kill_all(victims)
    time.sleep(0.5)


def test_driver_that_loses_its_cluster_gets_a_clear_error(ray_dir: Path) -> None:
  proc = _start_training(ray_dir)
  try:
    _kill_cluster(proc, ray_dir)
    _, err = proc.communicate(timeout=90)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 3, err[-3000:]
  assert "ClusterLostError: Lost the Ray cluster" in err
  assert "cannot be resumed" in err
  _assert_no_process_left(ray_dir)


def test_ctrl_c_shuts_everything_down(ray_dir: Path) -> None:
  proc = _start_training(ray_dir)
  try:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=90)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 130, err[-3000:]
  _assert_no_process_left(ray_dir)


def test_joining_an_unreachable_cluster_fails_fast_with_a_clear_error() -> None:
  import socket

  from optax_lena.aladdin import distributed as ad

  with socket.socket() as s:  # a port nobody listens on
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  t0 = time.time()
  with pytest.raises(ad.ClusterLostError, match="Could not join the Ray cluster"):
    ad.connect(address=f"127.0.0.1:{port}")
  assert time.time() - t0 < 10  # Ray alone retries for minutes


def test_example_command_writes_the_table_json_and_plots(ray_dir: Path) -> None:
  out = ray_dir / "result.json"
  done = subprocess.run(
    [
      sys.executable,
      "-m",
      "examples.aladdin",
      "--algorithm",
      "aladdin",
      "--workers",
      "2",
      "--slowdown",
      "1:3",
      "--time_budget",
      "3",
      "--eval_every",
      "1",
      "--num_samples",
      "1000",
      "--num_cpus",
      "1",
      "--quiet",
      "--data_dir",
      str(ray_dir / "data"),
      "--plot_dir",
      str(ray_dir / "plots"),
      "--json",
      str(out),
      "--ray_temp_dir",
      str(ray_dir),
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=240,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert "samples/s" in done.stdout and "wait % per worker" in done.stdout
  result = json.loads(out.read_text())
  assert result["throughput"] > 0
  assert 0.0 <= result["test_accuracy"] <= 1.0
  assert len(result["wait_fraction"]) == 2
  run = result["runs"]["aladdin"]
  assert run["iterations"][0] > run["iterations"][1] > 0  # worker 1 is 3x slower
  assert sum(run["merges"]) > 0
  for name in ("accuracy_vs_time.png", "iterations.png"):
    assert (ray_dir / "plots" / name).stat().st_size > 1000
  _assert_no_process_left(ray_dir)
