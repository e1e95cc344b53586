"""Driver scripts the Ray tests run in subprocesses (each needs a Ray session of its own).

``python tests/aladdin_ray_driver.py multinode OUT.npz`` runs the deterministic schedule on one
node, then on a two-node ``ray.cluster_utils.Cluster`` (PS shards on one node, workers on the
other, placed with custom resources), and saves both global models and the actors' nodes.

``python tests/aladdin_ray_driver.py train TEMP_DIR`` starts a local cluster under ``TEMP_DIR``,
prints ``RUNNING`` once training has started and trains for a minute; exit status 3 with the
error on stderr when the cluster is lost, 130 after a clean shutdown on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# Nodes started by this process (cluster_utils) advertise and bind 127.0.0.1 only.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import aladdin_ray_helpers as helpers
import numpy as np
import ray

from optax_lena.aladdin import distributed as ad

ray.cloudpickle.register_pickle_by_value(helpers)

ITERATIONS = 6


def _deterministic(**placement: object) -> tuple[dict, list[str], list[str]]:
  config = ad.Config(
    algorithm="aladdin", num_workers=2, period=2, ps_shards=2, deterministic=True, **placement
  )
  with ad.Runtime(helpers.make_task(), config) as runtime:
    result = runtime.run(iterations=ITERATIONS, progress=False)
    shard_nodes = [s["node_id"] for s in result.shards]
    worker_nodes = [w["node_id"] for w in result.workers]
  return result.final_params, shard_nodes, worker_nodes


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


def multinode(out: str) -> None:
  from ray.cluster_utils import Cluster

  ad.connect(num_cpus=1)
  single, _, _ = _deterministic()
  ray.shutdown()

  cluster, head, other = _two_nodes(Cluster)
  try:
    ad.connect(address=cluster.address)
    multi, shard_nodes, worker_nodes = _deterministic(
      server_resources={"aladdin_ps": 1}, worker_resources={"aladdin_workers": 1}
    )
    ray.shutdown()
  finally:
    cluster.shutdown()
  np.savez(
    out,
    **{f"single_{k}": np.asarray(v) for k, v in single.items()},
    **{f"multi_{k}": np.asarray(v) for k, v in multi.items()},
  )
  print(
    json.dumps(
      {
        "head": head.node_id,
        "other": other.node_id,
        "shard_nodes": shard_nodes,
        "worker_nodes": worker_nodes,
      }
    )
  )


def train(temp_dir: str) -> int:
  config = ad.Config(algorithm="aladdin", num_workers=2, period=2, chunk_seconds=0.2)
  runtime = ad.Runtime(helpers.make_task(), config, num_cpus=1, temp_dir=temp_dir, stall_timeout=5)
  try:
    print("RUNNING", flush=True)
    runtime.run(60.0, progress=False)
  except ad.ClusterLostError as err:
    print(f"ClusterLostError: {err}", file=sys.stderr, flush=True)
    return 3
  except KeyboardInterrupt:
    runtime.shutdown()
    print("interrupted, shut down", file=sys.stderr, flush=True)
    return 130
  finally:
    if ray.is_initialized():
      t0 = time.time()
      runtime.shutdown(checkpoint=False)
      print(f"shutdown took {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
  return 0


if __name__ == "__main__":
  if sys.argv[1] == "multinode":
    multinode(sys.argv[2])
  else:
    sys.exit(train(sys.argv[2]))
