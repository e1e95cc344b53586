"""ALADDIN on Ray, one local Ray cluster for the module: security, bad input, accounting, faults,
resume, every algorithm, accelerators.

All tests of this module share one Ray session (start-up costs seconds) and run in one xdist
group, so that two pytest workers never run two of these sessions side by side. The node
advertises 4 (fake) GPUs, so that accelerator requests can be checked on a CPU-only machine.
Every test is bounded by an alarm, and the module checks at the end that no process of its
session is left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import doctest
import functools
import glob
import json
import math
import os
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

import jax  # noqa: E402

from optax_lena import aladdin as al  # noqa: E402
from optax_lena._src.aladdin.ray import bootstrap, channel  # noqa: E402
from optax_lena._src.aladdin.ray.layout import Rejected  # noqa: E402
from optax_lena.aladdin import distributed as ad  # noqa: E402
from tests.aladdin.ray import helpers  # noqa: E402

# One xdist worker runs the whole module: its tests share the module's cluster.
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray_runtime")]

TEST_SECONDS = 300  # alarm per test: a hung Ray call fails the test instead of the CI job


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
  # The actors import the helper module by value: the tests are not on their sys.path.
  ray.cloudpickle.register_pickle_by_value(helpers)
  # A short path: Ray's Unix sockets live under it, and their paths must stay < 108 bytes.
  temp_dir = tempfile.mkdtemp(prefix="ray_", dir="/tmp")
  before = {p.pid for p in helpers.actor_processes()}
  assert ad.connect(num_cpus=2, num_gpus=4, temp_dir=temp_dir)
  try:
    yield (temp_dir, before)
  finally:
    bootstrap.disconnect()
    deadline = time.time() + 30
    while helpers.processes_since(temp_dir, before) and time.time() < deadline:
      time.sleep(0.5)
    left = helpers.processes_since(temp_dir, before)
    helpers.kill_all(left)
    shutil.rmtree(temp_dir, ignore_errors=True)
    assert not left, f"Ray processes left behind: {[p.pid for p in left]}"


def _config(name: str = "aladdin", options: dict[str, Any] | None = None, **kw: Any) -> ad.Config:
  defaults: dict[str, Any] = {"num_workers": 2, "chunk_seconds": 0.3}
  return ad.Config(algorithm=helpers.spec(name, **(options or {})), **{**defaults, **kw})


def test_local_cluster_binds_loopback_only_and_has_no_dashboard(
  cluster: tuple[str, set[int]],
) -> None:
  with ad.Runtime(helpers.make_task(), _config()) as runtime:
    runtime.run(1.0, progress=False)
    # gcs_server, raylet, agents (temp dir in their command line), the actors (retitled
    # ray::WorkerActor / ray::ServerShard) and this driver: every process that serves the session.
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


def test_bad_messages_are_rejected_counted_and_never_applied(
  cluster: tuple[str, set[int]],
) -> None:
  with ad.Runtime(helpers.make_task(), _config()) as runtime:
    shard = runtime.shards[0]
    before = runtime.global_params()
    size = runtime.layout.size
    good = np.ones((1, size), np.float32)
    yes, no = np.ones(1, bool), np.zeros(1, bool)
    replies = ray.get(
      [
        # A worker's verdict, computed in its step on the whole message (the shard trusts it;
        # Config(recheck_messages=True) checks too: test_shard.py).
        shard.receive.remote(0, good * np.nan, no),
        shard.receive.remote(0, good + np.inf, no),
        shard.receive.remote(1, good, no),  # the sender found a NaN in another shard's slice
        shard.receive.remote(0, np.ones((1, size + 1), np.float32), yes),  # wrong size
        shard.receive.remote(0, good.astype(np.float64), yes),  # wrong dtype
        shard.receive.remote(7, good, yes),  # no such worker
        shard.receive.remote(0, np.ones((17, size), np.float32), np.ones(17, bool)),  # > 8 periods
        # Rows of a "ring" that is no worker's: never opened.
        shard.receive.remote(
          0, channel.Rows("/etc/passwd", (1, 1, 1, size), "<f4", 0, 1, 0, size), yes
        ),
      ]
    )
    # The non-finite ones reach the server state, which rejects them; the malformed calls are
    # refused, each as one message whatever it claims to hold, with the reason.
    assert replies[:3] == [None] * 3
    assert all(isinstance(r, Rejected) and r.reason for r in replies[3:]), replies
    stats = runtime.shard_stats()[0]
    assert stats.received == 8
    assert stats.rejected_by_server == 3  # non-finite, or refused by its sender
    assert stats.rejected_malformed == 5  # 5 calls, one of them a fold of 17
    assert stats.global_updates == 0
    jax.tree.map(np.testing.assert_array_equal, runtime.global_params(), before)

  # A worker whose every message is NaN during a run: all rejected and counted, the other
  # worker trains, the global model stays finite.
  with ad.Runtime(helpers.make_task(helpers.poisoned_batches), _config()) as runtime:
    result = runtime.run(2.0, progress=False)
  stats = result.shards[0]
  assert stats.rejected_by_server == result.workers[1].sent[0] > 0
  assert stats.global_updates > 0
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(result.final_params))
  assert result.merges[1] == 0  # the poisoning worker never triggered a global update


def test_every_message_is_received_or_counted_as_rejected_with_exactly_n_shards(
  cluster: tuple[str, set[int]],
) -> None:
  config = _config(num_workers=8, ps_shards=3, slowdown={0: 3.0})
  with ad.Runtime(helpers.make_task(), config) as runtime:
    assert len(runtime.shards) == 3  # exactly as asked (the contiguous buffer cut in three)
    result = runtime.run(3.0, progress=False)
    rings = glob.glob(os.path.join(channel.DIRECTORY, f"{channel.PREFIX}{runtime.run_name}-*"))
  assert all(w.shared_memory for w in result.workers) and len(rings) == 8
  assert not any(os.path.exists(path) for path in rings)  # removed at shutdown
  sent = np.asarray([w.sent for w in result.workers])  # [worker, shard], after the flush
  assert sent.shape == (8, 3) and (sent[:, 0] > 0).all()
  for k, shard in enumerate(result.shards):
    assert shard.received == sent[:, k].sum()
    assert shard.rejected_by_server == shard.rejected_malformed == 0
  # Every worker's messages reach every shard (the shards' counters agree) and each of its
  # iterations sent one message; the replies merged are the shards' global updates.
  np.testing.assert_array_equal(sent, sent[:, :1].repeat(3, axis=1))
  np.testing.assert_array_equal(sent[:, 0], result.iterations)
  assert sum(result.merges) == result.shards[0].global_updates
  assert result.shards[0].calls < result.shards[0].received  # messages were folded
  # 11 actors on 2 CPUs: the shards keep the driver's priority (not Ray's nice 15), the workers
  # give up 5.
  assert {s.nice for s in result.shards} == {os.nice(0)}
  assert {w.nice for w in result.workers} == {min(os.nice(0) + 5, 19)}


def test_killed_worker_restarts_from_the_global_model_while_others_continue(
  cluster: tuple[str, set[int]],
) -> None:
  config = _config(chunk_seconds=0.2)
  with ad.Runtime(helpers.make_task(), config) as runtime:
    kill = helpers.When(
      lambda: runtime.shard_stats()[0].global_updates >= 10,
      lambda: ray.kill(runtime.workers[0], no_restart=False),
    )
    result = runtime.run(8.0, progress=False)
  assert kill.at is not None and kill.error is None
  # The killed process could not remove its shared-memory ring; the driver did, at shutdown.
  assert not glob.glob(os.path.join(channel.DIRECTORY, f"{channel.PREFIX}{runtime.run_name}-*"))
  info0, info1 = result.workers
  assert info0.incarnation == 1  # Ray restarted worker 0 in a new process ...
  assert info0.start_updates >= 10  # ... from the current global model ...
  assert info1.incarnation == 0 and result.iterations[1] > info0.iterations  # ... and 1 went on


def test_killed_shard_restores_its_checkpoint_and_the_run_resumes_afterwards(
  cluster: tuple[str, set[int]], tmp_path: Path
) -> None:
  """Ray restarts a killed shard from its checkpoint and the run goes on; the next run on the
  same checkpoint_dir resumes every shard from one generation (a restart used to leave the
  shards' own update counts with no checkpoint in common), the global model bitwise."""
  config = _config(ps_shards=2, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=5)
  with ad.Runtime(helpers.make_task(), config) as runtime:
    seen: list[ad.ShardStats] = []

    def due() -> bool:
      seen.append(runtime.shard_stats()[0])
      return seen[-1].checkpoints >= 1 and seen[-1].global_updates >= 12

    kill = helpers.When(due, lambda: ray.kill(runtime.shards[0], no_restart=False))
    first = runtime.run(8.0, progress=False)
  stats = first.shards[0]
  assert kill.at is not None and kill.error is None
  assert stats.restarted and not first.shards[1].restarted
  # Restored from a checkpoint saved before the kill, then kept training.
  assert stats.restored_generation >= 1 and 5 <= stats.restored_updates < stats.global_updates
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(first.final_params))
  with ad.Runtime(helpers.make_task(), config) as runtime:
    resumed = runtime.shard_stats()
    params = runtime.global_params()
  generations = {s.restored_generation for s in resumed}
  assert len(generations) == 1 and generations.pop() > stats.restored_generation
  # The stop saved every shard after the last message: the model the run ended with.
  jax.tree.map(np.testing.assert_array_equal, params, first.final_params)
  assert [s.restored_updates for s in resumed] == [s.global_updates for s in first.shards]


def test_a_restart_pauses_the_stall_clock_and_a_hung_worker_is_still_a_stall(
  cluster: tuple[str, set[int]], tmp_path: Path
) -> None:
  """One worker, so that nothing progresses while Ray restarts it: its restart takes the stall
  timeout and 4 s more (JAX's import and compilation aside), and the run goes on. Then the
  worker hangs (no batch comes) while every actor is alive: ClusterLostError within the stall
  timeout and the clock's polling."""
  stall, flag = 4.0, tmp_path / "hang"
  batches = functools.partial(helpers.slow_restart_then_hang, pause=stall + 4, hang_flag=str(flag))
  config = _config(num_workers=1, chunk_seconds=0.2)
  with ad.Runtime(helpers.make_task(batches), config, stall_timeout=stall) as runtime:
    restarted: list[float] = []

    def kill_and_time_the_restart() -> None:
      ray.kill(runtime.workers[0], no_restart=False)
      ray.get(runtime.workers[0].info.remote())  # answered by the new incarnation
      restarted.append(time.time())

    kill = helpers.When(
      lambda: runtime.shard_stats()[0].global_updates >= 5, kill_and_time_the_restart
    )
    first = runtime.run(6.0, progress=False)  # no ClusterLostError
    kill.thread.join(timeout=120)
    assert kill.at is not None and kill.error is None and restarted
    assert restarted[0] - kill.at > stall + 4  # the clock paused for longer than its timeout
    assert first.workers[0].incarnation == 1 and first.workers[0].start_updates >= 5
    flag.touch()
    t0 = time.time()
    with pytest.raises(ad.ClusterLostError, match="no answer, and no worker reported progress"):
      runtime.run(120.0, progress=False)
    assert time.time() - t0 < stall + 20  # the timeout, its polling and a loaded machine


def test_a_run_resumes_after_an_abandoned_run_and_after_a_clean_stop(
  cluster: tuple[str, set[int]], tmp_path: Path
) -> None:
  """What a SIGKILLed driver leaves (its actors killed without a last round, a save maybe cut
  off): the next run resumes every shard from one generation, bitwise, at most one behind the
  newest that a shard finished. A clean stop saves every shard, also when no periodic round is
  due: the run after it resumes from exactly that state. (The SIGKILLs themselves, of drivers,
  workers and shards, are ``test_processes.py``'s slow test.)"""
  ckpt, task = str(tmp_path / "ckpt"), helpers.make_task()
  config = _config(ps_shards=2, checkpoint_dir=ckpt, checkpoint_every=5, slowdown={1: 3.0})
  runtime = ad.Runtime(task, config)
  try:
    runtime.run(2.0, progress=False)
  finally:
    runtime.shutdown(checkpoint=False)  # abandoned
  newest = helpers.newest_complete_generation(ckpt)
  assert newest >= 1  # rounds were saved while it ran
  calm = dataclasses.replace(config, checkpoint_every=10**6)  # no round but the stop's
  with ad.Runtime(task, calm) as runtime:
    (generation,) = {s.restored_generation for s in runtime.shard_stats()}  # one for all
    assert generation >= newest - 1 and all(helpers.restored_bitwise(runtime, ckpt))
    first = runtime.run(2.0, progress=False)
  updates = [s.global_updates for s in first.shards]
  with ad.Runtime(task, calm) as runtime:
    stats = runtime.shard_stats()
    assert all(isinstance(s, ad.ShardStats) and not s.restarted for s in stats)
    assert [s.restored_generation for s in stats] == [generation + 1] * 2  # the stop's round
    assert [s.restored_updates for s in stats] == [s.global_updates for s in stats] == updates
    assert all(s.checkpoints == 0 for s in stats)
    jax.tree.map(np.testing.assert_array_equal, runtime.global_params(), first.final_params)
    infos = runtime.worker_infos()  # the workers start from the resumed global model too
    assert all(isinstance(i, ad.WorkerInfo) and i.start_updates == min(updates) for i in infos)
    assert [i.worker for i in infos] == [0, 1] and all(i.iterations == 0 for i in infos)
    second = runtime.run(1.0, progress=False)
  assert second.shards[0].global_updates > updates[0]
  assert isinstance(second, al.Result)  # the vocabulary the simulator's results share
  # summary() holds the records as plain dicts, field for field, and survives JSON.
  row = second.summary()
  assert json.loads(json.dumps(row))["workers"] == [dataclasses.asdict(w) for w in second.workers]
  assert list(row["shards"][0]) == [f.name for f in dataclasses.fields(ad.ShardStats)]
  assert row["shards"][0]["global_updates"] == second.shards[0].global_updates


def test_deterministic_aladdin_is_the_in_process_algorithm_bit_for_bit(
  cluster: tuple[str, set[int]],
) -> None:
  """Round-robin, each reply merged before its worker's next step: the same messages in the same
  order as a plain loop over the core pieces (spec.worker_step, spec.server, worker_merge)."""
  spec, n, rounds = helpers.spec("aladdin"), 2, 12
  server, step = spec.server(n), jax.jit(spec.worker_step(helpers.loss_fn))
  state = server.init(helpers.init_params())
  models = [helpers.init_params()] * n
  opt = [spec.worker_tx.init(models[0])] * n
  data = [helpers.batches(i, 0) for i in range(n)]
  pending: list[Any] = [None] * n
  merges = [0] * n
  for _ in range(rounds):
    for i in range(n):
      if pending[i] is not None:
        models[i] = al.worker_merge(models[i], pending[i].params, pending[i].alpha)
        pending[i], merges[i] = None, merges[i] + 1
      models[i], opt[i], message, _ = step(models[i], opt[i], next(data[i]))
      state, reply = server.receive(state, message, i)
      pending[i] = reply if bool(reply.ready) else None
  config = ad.Config(algorithm=spec, num_workers=n, deterministic=True)
  with ad.Runtime(helpers.make_task(), config) as runtime:
    result = runtime.run(iterations=rounds, progress=False)
  jax.tree.map(np.testing.assert_array_equal, result.final_params, state.params)
  assert result.iterations == [rounds] * n
  assert [m - (p is not None) for m, p in zip(result.merges, pending, strict=True)] == merges
  assert helpers.held_out_loss(result.final_params) < helpers.held_out_loss(helpers.init_params())


def test_a_new_algorithm_with_a_topology_of_its_own_runs_on_the_runtime(
  cluster: tuple[str, set[int]],
) -> None:
  """``tests/aladdin/test_new_algorithm.py``'s periodic averaging, added through public names
  only (its spec, its averaging actor, its iteration naming ``ad.Rounds``; no shard): the
  deterministic schedule runs its workers together (its barrier) and its global model is the
  float64 NumPy reference's."""
  import optax

  from tests.aladdin import test_new_algorithm as new

  ray.cloudpickle.register_pickle_by_value(new)  # the actors cannot import the test module
  n, rounds, every, lr = 2, 7, 3, 0.05
  with new.periodic_averaging_registered():
    spec = al.algorithm("periodic_averaging", worker_tx=optax.sgd(lr), every=every)
    config = ad.Config(algorithm=spec, num_workers=n, deterministic=True)
    with ad.Runtime(helpers.make_task(), config) as runtime:
      assert runtime.shards == [] and len(runtime.peers) == 1
      result = runtime.run(iterations=rounds, progress=False)
  expected = new.periodic_averaging_reference(
    helpers.batches, helpers.init_params(), n, rounds, every, lr
  )
  for key in expected:
    np.testing.assert_allclose(result.final_params[key], expected[key], rtol=2e-5, atol=1e-6)
  assert result.iterations == [rounds] * n and result.merges == [rounds // every] * n
  assert result.shards == [] and np.abs(expected["w"]).max() > 0.05


def test_the_runtime_docstring_example_runs(cluster: tuple[str, set[int]]) -> None:
  """``ad.Runtime``'s ``Examples:`` section, marked to skip elsewhere (it needs a cluster)."""
  (test,) = [t for t in doctest.DocTestFinder().find(ad.Runtime, globs={}) if t.examples]
  for example in test.examples:
    example.options.pop(doctest.SKIP, None)
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
  runner.run(test)
  assert runner.failures == 0 and runner.tries >= 8


@pytest.mark.parametrize("name", ["ar_sgd", "asp", "easgd", "sgp"])
def test_baselines_run_on_the_same_runtime(cluster: tuple[str, set[int]], name: str) -> None:
  config = _config(name, ps_shards=2, slowdown={1: 2.0})
  with ad.Runtime(helpers.make_task(), config) as runtime:
    result = runtime.run(2.0, progress=False)
    locals_ = [ray.get(w.get_params.remote()) for w in runtime.workers]
  assert min(result.iterations) > 0
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(result.final_params))
  assert helpers.held_out_loss(result.final_params) < helpers.held_out_loss(helpers.init_params())
  assert all(0 < c < 1 for c in result.compute_fraction)
  if name == "ar_sgd":  # a barrier per iteration: the workers stay identical
    assert result.iterations[0] == result.iterations[1]
    jax.tree.map(np.testing.assert_array_equal, locals_[0], locals_[1])
    assert min(result.wait_fraction) > 0
  elif name == "sgp":  # from the second iteration on, one gossip message mixed per iteration
    for iterations, merges in zip(result.iterations, result.merges, strict=True):
      assert iterations - 2 <= merges <= iterations - 1  # the last one may be still awaited
    assert result.shards == []
  else:  # symmetric: every exchange waits for the servers' answer
    assert len(result.shards) == 2 and all(s.rejected_by_server == 0 for s in result.shards)
    tau = 1 if name == "asp" else config.spec.tau
    for iterations, merges in zip(result.iterations, result.merges, strict=True):
      assert merges == iterations // tau
    assert all(s.global_updates == sum(result.merges) for s in result.shards)


@pytest.mark.parametrize("gpus", [1.0, 0.5])
def test_workers_get_the_accelerators_ray_gave_them(
  cluster: tuple[str, set[int]], gpus: float
) -> None:
  """The node advertises 4 fake GPUs: each worker requests its share, Ray sets the worker's
  CUDA_VISIBLE_DEVICES to exactly the devices it gave (JAX, finding no GPU, computes on CPU)."""
  config = _config(num_workers=4 if gpus < 1 else 2, worker_gpus=gpus)
  with ad.Runtime(helpers.make_task(), config) as runtime:
    result = runtime.run(1.0, progress=False)
  ids = [tuple(w.accelerator_ids.get("GPU", [])) for w in result.workers]
  assert all(len(i) == 1 for i in ids), ids
  assert [w.cuda_visible_devices for w in result.workers] == [",".join(i) for i in ids]
  if gpus == 1.0:
    assert len(set(ids)) == len(ids)  # a device each
  else:
    assert len(set(ids)) == len(ids) // 2  # two halves per device
  assert min(result.iterations) > 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_a_pinned_worker_steps_on_its_own_core_and_trains(cluster: tuple[str, set[int]]) -> None:
  """Workers ask for a core of their own; the first gets one (the last core is never claimed).
  The thread that computes its step runs on that core (XLA's, or the main thread, which
  dispatches, where XLA runs a step this cheap inline), its sender thread and Ray's threads on
  the others. If another runtime on this machine holds every free core, it runs unpinned on all
  of them."""
  # A pinned worker steps this tiny model in microseconds, dozens of steps per reply: the tests'
  # learning rate would diverge at that delay (ALADDIN then steps on models dozens of steps
  # old), a tenth of it trains.
  spec = al.algorithm(
    "aladdin", worker_tx=al.local_optimizer(helpers.LR / 10, weight_decay=0.0), period=2
  )
  config = ad.Config(algorithm=spec, num_workers=2, pin_compute=True, intra_op_threads=1)
  with ad.Runtime(helpers.make_task(), config) as runtime:
    pid = runtime.worker_infos()[0].pid
    before = _cpu_ticks(pid)
    result = runtime.run(1.0, progress=False)
    spent = {t: n - before.get(t, 0) for t, n in _cpu_ticks(pid).items()}
    info = runtime.worker_infos()[0]
    threads = {int(t): os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")}
  everything = set(os.sched_getaffinity(0))
  assert min(result.iterations) > 0
  assert helpers.held_out_loss(result.final_params) < helpers.held_out_loss(helpers.init_params())
  # The shards give way to the workers' dispatching threads on the unclaimed cores.
  assert {s.nice for s in result.shards} == {min(os.nice(0) + 10, 19)}
  if info.cores:
    mine = set(info.cores)
    assert len(mine) == 1 and mine < everything
    busiest = max(spent, key=spent.__getitem__)
    assert threads[busiest] == mine, (spent, threads)
    elsewhere = [t for t, cpus in threads.items() if cpus == everything - mine]
    assert len(elsewhere) >= 2, threads  # the sender and Ray's io threads at least
    assert all(cpus in (mine, everything - mine) for cpus in threads.values()), threads
  else:
    assert threads[pid] == everything


def _cpu_ticks(pid: int) -> dict[int, int]:
  """CPU time (clock ticks) each thread of process ``pid`` has spent."""
  ticks = {}
  for tid in os.listdir(f"/proc/{pid}/task"):
    with contextlib.suppress(OSError):  # a thread that has ended since
      stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
      fields = stat.rsplit(")", 1)[1].split()
      ticks[int(tid)] = int(fields[11]) + int(fields[12])  # utime + stime
  return ticks


def test_misuse_is_refused_where_it_is_made() -> None:
  with pytest.raises(ValueError, match="worker_tx"):
    ad.Config(algorithm="aladdin")
  with pytest.raises(ValueError, match="fold=17 exceeds"):  # 8 periods of 2
    ad.Config(algorithm=helpers.spec("aladdin"), fold=17)
  with pytest.raises(ValueError, match="slowdown"):
    ad.Config(algorithm=helpers.spec("sgp"), num_workers=2, slowdown={2: 3.0})
  with pytest.raises(ValueError, match="checkpoint_dir needs"):
    ad.Config(algorithm=helpers.spec("ar_sgd"), checkpoint_dir="x")
  with pytest.raises(ValueError, match="reply_every"):
    ad.Config(algorithm=helpers.spec("aladdin", reply_every=2))
  with pytest.raises(ValueError, match="worker_gpus"):
    ad.Config(algorithm=helpers.spec("aladdin"), worker_gpus=1.5)
  with pytest.raises(ValueError, match="shared_memory must be a bool"):
    ad.Config(algorithm=helpers.spec("aladdin"), shared_memory="no")  # type: ignore[arg-type]
  with pytest.raises(ValueError, match="ps_shards=100"):
    ad.Runtime(helpers.make_task(), ad.Config(algorithm=helpers.spec("aladdin"), ps_shards=100))
  aladdin = helpers.spec("aladdin")
  for name in ("num_workers", "ps_shards", "checkpoint_every", "max_inflight", "fold"):
    with pytest.raises(ValueError, match=rf"{name} must be an int \(e\.g\. 2, not 2\.0\) > 0"):
      ad.Config(algorithm=aladdin, **{name: 2.0})
  for name, value in (("intra_op_threads", 1.0), ("worker_nice", 1.5), ("seed", 0.0)):
    with pytest.raises(ValueError, match=rf"{name} must be"):
      ad.Config(algorithm=aladdin, **{name: value})
  with pytest.raises(ValueError, match=r"seed must be an int >= 0"):
    ad.Config(algorithm=aladdin, seed=-1)
  with pytest.raises(ValueError, match=r"checkpoint_dir must be None .* a non-empty path"):
    ad.Config(algorithm=aladdin, checkpoint_dir="")
  for factor in (math.inf, math.nan, 0.5, True, "2"):
    with pytest.raises(ValueError, match=r"the factor a finite number >= 1 \(e\.g\. 2\.0"):
      ad.Config(algorithm=aladdin, slowdown={0: factor})
  # A relative checkpoint directory is resolved once, on the driver: the actors get its path.
  config = ad.Config(algorithm=aladdin, checkpoint_dir="ckpt", slowdown={1: 2})
  assert config.checkpoint_dir == os.path.join(os.getcwd(), "ckpt")
  assert (
    ray.cloudpickle.loads(ray.cloudpickle.dumps(config)).checkpoint_dir == config.checkpoint_dir
  )
  # The transport plan is computed there too, from the spec (period 2 in helpers.spec).
  assert config.plan == ad.Plan(period=2, max_fold=16, block=8) and config.plan.reply_slots == 8
  assert config.plan.block_sizes() == [1, 2, 4, 6, 8]
  assert ad.Config(algorithm=helpers.spec("sgp")).plan == ad.Plan(period=1, max_fold=1, block=1)
