"""ALADDIN on Ray, one local Ray cluster for the module: security, bad input, faults, resume.

All tests of this module share one Ray session (start-up costs seconds) and run in one xdist
group, so that two pytest workers never run two of these sessions side by side. Every test is
bounded by an alarm, and the module checks at the end that no process of its session is left.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

ray = pytest.importorskip("ray")

import aladdin_ray_helpers as helpers  # noqa: E402
import jax  # noqa: E402

from optax_lena.aladdin import distributed as ad  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("aladdin_ray")]

TEST_SECONDS = 120  # alarm per test: a hung Ray call fails the test instead of the CI job


@pytest.fixture(autouse=True)
def _alarm() -> Iterator[None]:
  def on_alarm(signum: int, frame: Any) -> None:
    raise TimeoutError(f"test exceeded {TEST_SECONDS} s")

  previous = signal.signal(signal.SIGALRM, on_alarm)
  signal.alarm(TEST_SECONDS)
  try:
    yield
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, set[int]]]:
  """A local Ray cluster started the way the runtime starts it; yields its temp dir and the Ray
  worker processes that existed before it (so that its own can be told apart)."""
  # The actors import this helper module by value: tests/ is not on their sys.path.
  ray.cloudpickle.register_pickle_by_value(helpers)
  # A short path: Ray's Unix sockets live under it, and their paths must stay < 108 bytes.
  temp_dir = tempfile.mkdtemp(prefix="ray_", dir="/tmp")
  before = {p.pid for p in helpers.actor_processes()}
  assert ad.connect(num_cpus=2, temp_dir=temp_dir)
  try:
    yield (temp_dir, before)
  finally:
    ray.shutdown()
    deadline = time.time() + 30
    while helpers.processes_since(temp_dir, before) and time.time() < deadline:
      time.sleep(0.5)
    left = helpers.processes_since(temp_dir, before)
    helpers.kill_all(left)
    shutil.rmtree(temp_dir, ignore_errors=True)
    assert not left, f"Ray processes left behind: {[p.pid for p in left]}"


def _config(**kw: Any) -> ad.Config:
  defaults = {"algorithm": "aladdin", "num_workers": 2, "period": 2, "chunk_seconds": 0.3}
  return ad.Config(**{**defaults, **kw})


def test_local_cluster_binds_loopback_only_and_has_no_dashboard(
  cluster: tuple[str, set[int]],
) -> None:
  with ad.Runtime(helpers.make_task(), _config()) as runtime:
    runtime.run(1.0, progress=False)
    # gcs_server, raylet, agents (temp dir in their command line), the actors (retitled
    # ray::Worker / ray::ServerShard) and this driver: every process that serves the session.
    processes = [*helpers.processes_since(*cluster), psutil.Process()]
    actors = [p for p in processes if p.cmdline()[0].startswith("ray::")]
    addresses = helpers.listening_addresses(processes)
    actor_addresses = helpers.listening_addresses(actors)
    heads = [p for p in processes if "dashboard/dashboard.py" in " ".join(p.cmdline())]
    head_commands = [" ".join(p.cmdline()) for p in heads]
    head_addresses = helpers.listening_addresses(heads)
  # gcs_server, raylet and the actors' core workers all listen; none on a non-loopback address.
  assert len(actors) >= 3 and len(actor_addresses) >= 3, (actors, actor_addresses)
  assert len(addresses) >= 6, addresses
  exposed = [a for a in addresses if not helpers.is_loopback(a[0])]
  assert not exposed, f"listening beyond loopback: {exposed}"
  # Ray keeps a dashboard head process for usage statistics even without the dashboard: it must
  # load no other module (no job-submission API, which runs code for anyone who reaches it) and
  # serve nothing.
  assert all("--modules-to-load=UsageStatsHead" in c for c in head_commands), head_commands
  assert not any("JobHead" in c for c in head_commands)
  assert not head_addresses, head_addresses
  assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")


def test_bad_gradients_are_rejected_counted_and_never_applied(
  cluster: tuple[str, set[int]],
) -> None:
  with ad.Runtime(helpers.make_task(), _config()) as runtime:
    shard = runtime.shards[0]
    before = runtime.global_params()
    good = jax.tree.map(np.ones_like, helpers.init_params())
    nan = jax.tree.map(lambda g: g * np.nan, good)
    inf = jax.tree.map(lambda g: g + np.inf, good)
    wrong_tree = {"w": good["w"]}
    wrong_shape = {"w": np.ones((3, 1), np.float32), "b": good["b"]}
    replies = ray.get(
      [
        shard.push.remote(0, nan, True),
        shard.push.remote(0, inf, True),
        shard.push.remote(1, good, False),  # the sender found a non-finite value elsewhere
        shard.push.remote(0, wrong_tree, True),
        shard.push.remote(0, wrong_shape, True),
        shard.push.remote(7, good, True),  # no such worker
      ]
    )
    assert replies == [None] * 6
    stats = runtime.shard_stats()[0]
    # non-finite (3) or unknown worker (1): the server's own count; wrong tree or shape: 2
    assert stats["rejected_by_server"] == 4
    assert stats["rejected_bad_tree"] == 2
    assert stats["global_updates"] == 0
    after = runtime.global_params()
    jax.tree.map(np.testing.assert_array_equal, after, before)

    # A worker that keeps sending NaN gradients during a run: every one is rejected and counted,
    # the other worker trains, and the global model stays finite.
    ray.get(runtime.workers[1].set_corrupt.remote("nan"))
    result = runtime.run(2.0, progress=False)
  stats = result.shards[0]
  assert stats["rejected_by_server"] - 4 >= result.iterations[1] > 0
  assert stats["global_updates"] > 0
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(result.final_params))
  assert result.merges[1] == 0  # the poisoning worker never triggered a global update


def test_killed_worker_restarts_from_the_global_model_while_others_continue(
  cluster: tuple[str, set[int]],
) -> None:
  events: list[tuple[float, int, int]] = []  # (time, worker, incarnation) of finished chunks
  killed: dict[str, float] = {}

  def on_chunk(runtime: Any, stats: dict[str, Any]) -> None:
    now = time.time()
    events.append((now, stats["worker"], stats["incarnation"]))
    if "at" not in killed and stats["worker"] == 0 and stats["iterations"] > 0:
      killed["at"] = now
      ray.kill(runtime.workers[0], no_restart=False)

  with ad.Runtime(helpers.make_task(), _config(chunk_seconds=0.2)) as runtime:
    result = runtime.run(8.0, progress=False, on_chunk=on_chunk)
  assert "at" in killed
  first_back = min(t for t, w, inc in events if w == 0 and inc == 1)
  # Ray restarted worker 0 (a new incarnation in a new process) ...
  info0 = result.workers[0]
  assert info0["incarnation"] == 1
  # ... which started from the current global model, not the initial parameters ...
  assert info0["start_updates"] > 0
  # ... while worker 1 kept finishing chunks during the restart.
  assert any(killed["at"] < t < first_back for t, w, _ in events if w == 1)
  assert result.workers[1]["incarnation"] == 0


def test_killed_shard_restores_its_checkpoint_and_the_run_continues(
  cluster: tuple[str, set[int]], tmp_path: Path
) -> None:
  killed: dict[str, int] = {}

  def on_chunk(runtime: Any, stats: dict[str, Any]) -> None:
    if "updates" not in killed:
      updates = runtime.shard_stats()[0]["global_updates"]
      if updates >= 12:
        killed["updates"] = updates
        ray.kill(runtime.shards[0], no_restart=False)

  config = _config(checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=5)
  with ad.Runtime(helpers.make_task(), config) as runtime:
    result = runtime.run(8.0, progress=False, on_chunk=on_chunk)
  stats = result.shards[0]
  assert "updates" in killed
  assert stats["restarted"]
  # Restored from the last checkpoint before the kill (every 5 updates), then kept training.
  assert 5 <= stats["restored_updates"] <= killed["updates"]
  assert stats["restored_updates"] % 5 == 0
  assert stats["global_updates"] > stats["restored_updates"]
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(result.final_params))


def test_stopped_run_resumes_from_its_checkpoint(cluster: str, tmp_path: Path) -> None:
  config = _config(checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=1000)
  with ad.Runtime(helpers.make_task(), config) as runtime:
    first = runtime.run(2.0, progress=False)
  # The clean stop saved every shard, although no periodic checkpoint was due.
  updates = first.shards[0]["global_updates"]
  assert updates > 0
  with ad.Runtime(helpers.make_task(), config) as runtime:
    resumed = runtime.global_params()
    stats = runtime.shard_stats()[0]
    assert stats["restored_updates"] == updates
    jax.tree.map(np.testing.assert_array_equal, resumed, first.final_params)
    # The workers start from the resumed global model too.
    infos = ray.get([w.info.remote() for w in runtime.workers])
    assert all(i["start_updates"] == updates for i in infos)
    second = runtime.run(1.0, progress=False)
  assert second.shards[0]["global_updates"] > updates


@pytest.mark.parametrize("algorithm", ["ar_sgd", "asp", "easgd"])
def test_baselines_run_on_the_same_runtime(cluster: tuple[str, set[int]], algorithm: str) -> None:
  config = _config(algorithm=algorithm, ps_shards=2, slowdown={1: 2.0})
  with ad.Runtime(helpers.make_task(), config) as runtime:
    result = runtime.run(1.5, progress=False)
    locals_ = [ray.get(w.get_params.remote()) for w in runtime.workers]
  assert min(result.iterations) > 0
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(result.final_params))
  loss0 = float(helpers.loss_fn(helpers.init_params(), next(helpers.batches(9, 9))))
  assert float(helpers.loss_fn(result.final_params, next(helpers.batches(9, 9)))) < loss0
  if algorithm == "ar_sgd":  # a barrier per iteration: the workers stay identical
    assert result.iterations[0] == result.iterations[1]
    jax.tree.map(np.testing.assert_array_equal, locals_[0], locals_[1])
    assert min(result.wait_fraction) > 0
  else:  # symmetric: every message waits for the server's answer
    assert len(result.shards) >= 2 and all(s["rejected_by_server"] == 0 for s in result.shards)
    tau = 1 if algorithm == "asp" else config.easgd_tau
    for iterations, merges in zip(result.iterations, result.merges, strict=True):
      assert merges == iterations // tau
    assert sum(s["global_updates"] for s in result.shards) == len(result.shards) * sum(
      result.merges
    )
