"""ALADDIN on Ray with Ray sessions of their own (subprocess drivers): two nodes, a lost
cluster, SIGINT / SIGTERM at start-up, while training and at shutdown, the example program.
Each subprocess is bounded by a timeout, and no process of its session may outlive it."""

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
from typing import Any

import numpy as np
import pytest

from examples import metrics

pytest.importorskip("ray")

from tests.aladdin.ray import helpers

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[3]
DRIVER = [sys.executable, "-m", "tests.aladdin.ray.driver"]


@pytest.fixture
def ray_dir() -> Iterator[Path]:
  """A short temp dir: Ray's Unix sockets live under it, and their paths must stay < 108 bytes."""
  path = Path(tempfile.mkdtemp(prefix="ray_", dir="/tmp"))
  _WORKERS_BEFORE[str(path)] = {p.pid for p in helpers.actor_processes()}
  yield path
  shutil.rmtree(path, ignore_errors=True)


_WORKERS_BEFORE: dict[str, set[int]] = {}  # Ray worker pids that existed before each test


def _start_training(temp_dir: Path, until: str = "RUNNING", seconds: float = 60.0) -> Any:
  """Starts the training driver and returns once it printed ``until``."""
  proc = subprocess.Popen(
    [*DRIVER, "train", str(temp_dir), str(seconds)],
    cwd=ROOT,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  line = ""
  deadline = time.time() + 300
  while until not in line and time.time() < deadline and proc.poll() is None:
    line = proc.stdout.readline()
  if until not in line:
    proc.kill()
    pytest.fail(f"the driver did not print {until}: {proc.communicate(timeout=30)[1][-2000:]}")
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
    [*DRIVER, "multinode", str(out)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  nodes = json.loads(done.stdout.strip().splitlines()[-1])
  # PS shards on the head node, workers on the other node, as the custom resources ask.
  assert nodes["head"] != nodes["other"]
  assert len(nodes["shard_nodes"]) >= 2 and set(nodes["shard_nodes"]) == {nodes["head"]}
  assert set(nodes["worker_nodes"]) == {nodes["other"]}
  assert nodes["single_nodes"] == [nodes["head"]]  # the reference run: one node
  # On one node the messages go through the workers' shared-memory rings; across nodes, in
  # Ray's calls: the two paths give the same result bit for bit.
  assert nodes["single_rings"] == [True, True] and nodes["multi_rings"] == [False, False]
  # Workers and shards on the node that is not the driver's use rings there. A driver
  # SIGKILLed mid-run leaves none behind once the next run has started (its workers sweep the
  # rings of dead processes), and a clean shutdown removes the run's rings on that node.
  away = nodes["away"]
  assert away["away_nodes"] == [nodes["other"]] and away["away_rings"] == [True, True]
  assert away["killed_run_started"] and away["rings_before_kill"] == 2, away
  assert away["killed_workers_gone"], away
  assert away["killed_rings_after_next_start"] == 0 and away["rings_during"] == 2, away
  assert away["rings_after_shutdown"] == 0 and away["removed_on_nodes"] == [nodes["other"]], away
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
  time.sleep(2.0)  # let it train
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


@pytest.mark.parametrize(
  ("moment", "signum"),
  [
    ("start-up", signal.SIGINT),
    ("training", signal.SIGTERM),
    ("shutdown", signal.SIGINT),
  ],
)
def test_a_stop_signal_at_any_moment_shuts_everything_down(
  ray_dir: Path, moment: str, signum: int
) -> None:
  """The driver's stop signals, at three moments: while Ray and the actors start (right after
  STARTING), while training, and while the runtime shuts down (right after STOPPING of a short
  run). Every time: exit status 128 + signal and no process of the session left."""
  until, seconds = {"start-up": ("STARTING", 60.0), "training": ("RUNNING", 60.0)}.get(
    moment, ("STOPPING", 1.0)
  )
  proc = _start_training(ray_dir, until, seconds)
  if moment == "training":
    time.sleep(2.0)
  try:
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 128 + signum, err[-3000:]
  _assert_no_process_left(ray_dir)


def test_sigterm_leaves_the_clean_up_all_the_time_it_needs(ray_dir: Path) -> None:
  """Ray's C++ crash handler arms a 3 s abort on SIGTERM; the stop disarms it, so a clean-up
  longer than that still ends with exit status 143 (failed under load as SIGABRT)."""
  proc = subprocess.run(
    [*DRIVER, "slow_stop", str(ray_dir)], cwd=ROOT, capture_output=True, text=True, timeout=180
  )
  assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
  assert "stopped after a slow clean-up" in proc.stderr
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
      "sgp",
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
      "--workdir",
      str(ray_dir / "work"),
      "--json",
      str(out),
      "--ray_temp_dir",
      str(ray_dir),
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert "samples/s" in done.stdout and "wait % per worker" in done.stdout
  assert len(done.stderr) < 5000, done.stderr[-3000:]  # no progress bar in a log
  result = json.loads(out.read_text())
  for name in ("aladdin", "sgp"):
    run = result["runs"][name]
    assert run["throughput"] > 0 and 0.0 <= run["test_accuracy"] <= 1.0
    assert len(run["wait_fraction"]) == len(run["compute_fraction"]) == 2
    assert all(0 < c <= 1 for c in run["compute_fraction"])
    assert run["iterations"][0] > run["iterations"][1] > 0 or name == "sgp"  # worker 1 x3
    assert sum(run["merges"]) > 0
    records = metrics.read_metrics(ray_dir / "work" / name)
    assert records and all(0 <= r["eval_accuracy"] <= 1 for r in records)
    assert [r["wall_time"] for r in records] == sorted(r["wall_time"] for r in records)
  for name in ("accuracy_vs_time.png", "iterations.png"):
    assert (ray_dir / "work" / name).stat().st_size > 1000
  _assert_no_process_left(ray_dir)
