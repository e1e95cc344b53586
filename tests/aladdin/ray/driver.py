"""Driver scripts the Ray tests run in subprocesses (each needs a Ray session of its own).

``python -m tests.aladdin.ray.driver multinode OUT.npz`` starts a two-node
``ray.cluster_utils.Cluster`` and runs the deterministic schedule twice, on one node, then
across both (PS shards on one node, workers on the other, placed with custom resources), and
saves both global models and the actors' nodes.

``python -m tests.aladdin.ray.driver train TEMP_DIR SECONDS`` starts a local cluster under
``TEMP_DIR`` and prints ``STARTING`` (before the runtime starts), ``RUNNING`` (training) and
``STOPPING`` (training done, shutting down). Exit status 3 with the error on stderr when the
cluster is lost; 130 / 143 once everything is down after SIGINT / SIGTERM, at any moment.

``python -m tests.aladdin.ray.driver resume CKPT TEMP_DIR SECONDS SLOWDOWN RESTART`` trains
ALADDIN (2 workers, 2 shards) with checkpoints in ``CKPT``, worker 1 slower by ``SLOWDOWN``;
``RESTART=1`` has Ray restart shard 1 once a checkpoint exists. It prints ``RESUMED {json}``
(each shard's restored generation and updates, and whether its x~ is, bit for bit, the array
the digest of that generation records), ``PIDS {json}`` (driver, workers, shards), ``RUNNING``,
and ``STOPPED {json}`` after a clean stop.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time

# Nodes started by this process (cluster_utils) advertise and bind 127.0.0.1 only.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from optax_lena.aladdin import distributed as ad

ad.exit_on_stop_signals()  # SIGTERM like Ctrl-C from here on, before anything slow

import numpy as np  # noqa: E402
import ray  # noqa: E402

from tests.aladdin.ray import helpers  # noqa: E402

ray.cloudpickle.register_pickle_by_value(helpers)

ITERATIONS = 6


def _deterministic(**placement: object) -> tuple[dict, list[str], list[str], list[bool]]:
  config = ad.Config(
    algorithm=helpers.spec("aladdin"),
    num_workers=2,
    ps_shards=2,
    deterministic=True,
    **placement,  # type: ignore[arg-type]
  )
  with ad.Runtime(helpers.make_task(), config) as runtime:
    result = runtime.run(iterations=ITERATIONS, progress=False)
    shard_nodes = [s.node_id for s in result.shards]
    worker_nodes = [w.node_id for w in result.workers]
    rings = [w.shared_memory for w in result.workers]
  return result.final_params, shard_nodes, worker_nodes, rings


def _two_nodes(cluster_cls: type, attempts: int = 3) -> tuple:
  """A head node holding the PS resource and a second node holding the workers'. Ray waits a
  fixed 30 s for a raylet to register, which a busy 2-core machine can miss: only that start-up
  time-out is retried, with a fresh cluster."""
  for attempt in range(attempts):
    cluster = cluster_cls()
    try:
      head = cluster.add_node(num_cpus=1, resources={"aladdin_ps": 10}, include_dashboard=False)
      other = cluster.add_node(num_cpus=1, resources={"aladdin_workers": 10})
      return cluster, head, other
    except Exception as error:
      cluster.shutdown()
      if "timed out during startup" not in str(error) or attempt == attempts - 1:
        raise
      print(f"node start-up timed out (attempt {attempt + 1}); retrying", file=sys.stderr)
  raise AssertionError("unreachable")


def _rings_of(run: str) -> list[str]:
  from optax_lena._src.aladdin.ray import channel

  return sorted(glob.glob(os.path.join(channel.DIRECTORY, f"{channel.PREFIX}{run}-*")))


def _wait_dead(pids: list[int], timeout: float = 90.0) -> bool:
  import psutil

  deadline = time.time() + timeout
  while any(psutil.pid_exists(p) for p in pids) and time.time() < deadline:
    time.sleep(0.5)
  return not any(psutil.pid_exists(p) for p in pids)


def _rings_away_from_the_driver(address: str) -> dict[str, object]:
  """Workers and shards on the node that is not the driver's: a driver SIGKILLed while its
  rings exist, then a run whose start-up sweeps the dead run's rings and whose shutdown
  removes its own on that node."""
  away = {"server_resources": {"aladdin_workers": 1}, "worker_resources": {"aladdin_workers": 1}}
  child = subprocess.Popen(
    [sys.executable, "-m", "tests.aladdin.ray.driver", "ringchild", address],
    stdout=subprocess.PIPE,
    text=True,
  )
  assert child.stdout is not None
  line = child.stdout.readline()
  killed_run = line.split()[1] if line.startswith("RUNNING") else ""
  before_kill = _rings_of(killed_run) if killed_run else []
  child.kill()
  child.wait(timeout=60)
  pids = [int(os.path.basename(p).split("-")[-2]) for p in before_kill]
  workers_gone = _wait_dead(pids)
  left_by_kill = _rings_of(killed_run) if killed_run else []
  config = ad.Config(
    algorithm=helpers.spec("aladdin"), num_workers=2, ps_shards=2, deterministic=True, **away
  )
  with ad.Runtime(helpers.make_task(), config) as runtime:
    result = runtime.run(iterations=ITERATIONS, progress=False)
    rings_during = _rings_of(runtime.run_name)
    after_start = _rings_of(killed_run) if killed_run else ["no run"]
  return {
    "killed_run_started": bool(killed_run),
    "rings_before_kill": len(before_kill),
    "killed_workers_gone": workers_gone,
    "rings_left_by_kill": len(left_by_kill),
    "killed_rings_after_next_start": len(after_start),
    "rings_during": len(rings_during),
    "rings_after_shutdown": len(_rings_of(runtime.run_name)),
    "removed_on_nodes": sorted(runtime.rings_removed),
    "away_rings": [w.shared_memory for w in result.workers],
    "away_nodes": sorted({a.node_id for a in [*result.workers, *result.shards]}),
  }


def ring_child(address: str) -> int:
  """The driver that ``_rings_away_from_the_driver`` SIGKILLs once its rings exist."""
  ad.connect(address=address)
  away = {"server_resources": {"aladdin_workers": 1}, "worker_resources": {"aladdin_workers": 1}}
  config = ad.Config(algorithm=helpers.spec("aladdin"), num_workers=2, ps_shards=2, **away)
  runtime = ad.Runtime(helpers.make_task(), config)
  print("RUNNING", runtime.run_name, flush=True)
  runtime.run(300, progress=False)
  return 1


def multinode(out: str) -> None:
  from ray.cluster_utils import Cluster

  cluster, head, other = _two_nodes(Cluster)
  try:
    ad.connect(address=cluster.address)
    # The single-node reference runs in the same cluster with everything on the driver's
    # node: one Ray start-up less than a separate session, the same single-node path.
    single, single_shards, single_workers, single_rings = _deterministic(
      server_resources={"aladdin_ps": 1}, worker_resources={"aladdin_ps": 1}
    )
    multi, shard_nodes, worker_nodes, multi_rings = _deterministic(
      server_resources={"aladdin_ps": 1}, worker_resources={"aladdin_workers": 1}
    )
    away = _rings_away_from_the_driver(cluster.address)
    ray.shutdown()
  finally:
    cluster.shutdown()
  np.savez(
    out,
    **{f"single_{k}": np.asarray(v) for k, v in single.items()},
    **{f"multi_{k}": np.asarray(v) for k, v in multi.items()},
  )
  nodes = {"head": head.node_id, "other": other.node_id}
  rings = {"single_rings": single_rings, "multi_rings": multi_rings}
  nodes["single_nodes"] = sorted(set(single_shards) | set(single_workers))
  placement = {"shard_nodes": shard_nodes, "worker_nodes": worker_nodes}
  print(json.dumps({**nodes, **placement, **rings, "away": away}))


def _runtime(
  config: ad.Config, temp_dir: str, attempts: int = 3, stall_timeout: float = 5
) -> ad.Runtime:
  """Ray waits a fixed 30 s for a new raylet to register, which a loaded 2-core machine can
  miss: only that start-up time-out is retried, after killing what the attempt started."""
  import psutil

  task = helpers.make_task()
  for attempt in range(attempts):
    try:
      return ad.Runtime(task, config, num_cpus=1, temp_dir=temp_dir, stall_timeout=stall_timeout)
    except Exception as error:
      if "timed out during startup" not in str(error) or attempt == attempts - 1:
        raise
      helpers.kill_all(psutil.Process().children(recursive=True))
      print(f"node start-up timed out (attempt {attempt + 1}); retrying", file=sys.stderr)
  raise AssertionError("unreachable")


def train(temp_dir: str, seconds: float) -> int:
  config = ad.Config(algorithm=helpers.spec("aladdin"), num_workers=2, chunk_seconds=0.2)
  print("STARTING", flush=True)
  with _runtime(config, temp_dir) as runtime:
    print("RUNNING", flush=True)
    runtime.run(seconds, progress=False)
    print("STOPPING", flush=True)
  return 0


def slow_stop(temp_dir: str) -> int:
  """SIGTERM to itself while connected, then a clean-up longer than the 3 s after which Ray's
  crash handler would abort the process (what a loaded machine's shutdown can take)."""
  import os
  import signal

  from optax_lena._src.aladdin.ray.signals import StopSignals

  signals = StopSignals()  # before Ray installs its crash handler, as ad.Runtime does
  ad.connect(num_cpus=1, temp_dir=temp_dir)
  try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10.0)
    return 1  # the signal was lost
  except ad.Interrupted as err:
    time.sleep(4.0)
    import ray

    ray.shutdown()
    signals.restore()
    print("stopped after a slow clean-up", file=sys.stderr, flush=True)
    return err.exit_code


def resume(
  checkpoint_dir: str, temp_dir: str, seconds: float, slowdown: float, restart: bool
) -> int:
  config = ad.Config(
    algorithm=helpers.spec("aladdin"),
    num_workers=2,
    ps_shards=2,
    checkpoint_dir=checkpoint_dir,
    checkpoint_every=10,
    chunk_seconds=0.2,
    slowdown={1: slowdown} if slowdown > 1 else {},
  )
  with _runtime(config, temp_dir, stall_timeout=30) as runtime:
    shards = runtime.shard_stats()
    bitwise = helpers.restored_bitwise(runtime, checkpoint_dir)
    restored = [
      {"generation": s.restored_generation, "updates": s.restored_updates, "bitwise": same}
      for s, same in zip(shards, bitwise, strict=True)
    ]
    print("RESUMED", json.dumps(restored), flush=True)
    workers = [w.pid for w in runtime.worker_infos()]
    pids = {"driver": os.getpid(), "workers": workers, "shards": [s.pid for s in shards]}
    print("PIDS", json.dumps(pids), flush=True)
    if restart:
      helpers.When(
        lambda: runtime.shard_stats()[1].checkpoints >= 1,
        lambda: ray.kill(runtime.shards[1], no_restart=False),
      )
    print("RUNNING", flush=True)
    result = runtime.run(seconds, progress=False)
  stopped = [{"updates": s.global_updates, "restarted": s.restarted} for s in result.shards]
  print("STOPPED", json.dumps(stopped), flush=True)
  return 0


def private(seconds: float) -> int:
  """A run as it is started by default (a local node, a checkpoint directory in the home), for
  the two-user test; prints ``SESSION {json}`` (the session directory, the GCS address) once
  the actors are up, ``DONE`` after a clean stop."""
  checkpoints = os.path.join(os.environ["HOME"], "ckpt")
  config = ad.Config(algorithm=helpers.spec("aladdin"), num_workers=1, checkpoint_dir=checkpoints)
  with ad.Runtime(helpers.make_task(), config, num_cpus=1, stall_timeout=60) as runtime:
    node = ray._private.worker._global_node
    where = {"session": node.get_session_dir_path(), "gcs": ray.get_runtime_context().gcs_address}
    print("SESSION", json.dumps(where), flush=True)
    runtime.run(seconds, progress=False)
  print("DONE", flush=True)
  return 0


def main() -> int:
  try:
    if sys.argv[1] == "private":
      return private(float(sys.argv[2]))
    if sys.argv[1] == "resume":
      flags = sys.argv[2:7]
      return resume(flags[0], flags[1], float(flags[2]), float(flags[3]), flags[4] == "1")
    if sys.argv[1] == "slow_stop":
      return slow_stop(sys.argv[2])
    if sys.argv[1] == "ringchild":
      return ring_child(sys.argv[2])
    if sys.argv[1] == "multinode":
      multinode(sys.argv[2])
      return 0
    return train(sys.argv[2], float(sys.argv[3]))
  except ad.ClusterLostError as err:
    print(f"ClusterLostError: {err}", file=sys.stderr, flush=True)
    return 3
  except ad.Interrupted as err:
    print(f"interrupted by signal {err.signum}, shut down at {time.time():.1f}", file=sys.stderr)
    return err.exit_code
  except KeyboardInterrupt:
    print("interrupted, shut down", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
