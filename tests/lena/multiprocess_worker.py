"""Child program for ``tests/lena/test_multiprocess.py``.

One of ``--num-processes`` JAX processes on the CPU, joined with ``jax.distributed.initialize``
(gloo cross-process collectives). Every process owns 2 simulated CPU devices, which the parent
requests through ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` in this program's
environment (it has to be set before jax is imported, so this file does not set it itself).

All global devices form a 1-D mesh with axis ``'workers'``; device ``k`` of the mesh holds the
per-worker gradient ``make_worker_grads(k)``. Under ``jax.jit(jax.shard_map(...))`` the program
computes

* a plain-JAX check of the harness: ``psum`` of per-device squared norms and of the gradients;
* ``ol.all_reduce_grad_stats`` over ``'workers'`` and one ``ol.lena`` update of replicated params,

fetches the (replicated) results, checks that all local shards of every result agree and writes
them to ``<out_dir>/process_<id>.npz``. The parent compares the files with each other and with a
single-process reference built from the same :func:`make_worker_grads` / :func:`make_params`.

Run as a script (``python tests/lena/multiprocess_worker.py --help``); the parent imports it
only for the data generators and constants, which must not import jax at module level.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import traceback

import numpy as np

AXIS = "workers"
SEED = 20240611
LEARNING_RATE = 0.1
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
WARMUP_THRESHOLD = 10.0
# Leaves of different ranks (matrix, vector, scalar) to exercise the per-leaf statistics.
SHAPES = {"w": (3, 4), "b": (4,), "s": ()}


def make_worker_grads(worker: int) -> dict[str, np.ndarray]:
  """Gradient of mesh worker ``worker`` (float32, deterministic)."""
  rng = np.random.default_rng([SEED, 1, worker])
  # A shared component keeps ||mean g||^2 away from zero (no cancellation in the reference).
  base = np.random.default_rng([SEED, 2])
  return {
    k: (base.normal(size=s) + 0.5 * rng.normal(size=s)).astype(np.float32)
    for k, s in SHAPES.items()
  }


def make_params() -> dict[str, np.ndarray]:
  """Replicated parameters (float32, deterministic)."""
  rng = np.random.default_rng([SEED, 3])
  return {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}


def stacked_worker_grads(num_workers: int) -> dict[str, np.ndarray]:
  """All per-worker gradients stacked along a leading worker axis."""
  grads = [make_worker_grads(k) for k in range(num_workers)]
  return {k: np.stack([g[k] for g in grads]) for k in SHAPES}


def flatten(prefix: str, tree) -> dict[str, np.ndarray]:
  """``{'<prefix>.<key path>': leaf}`` for the leaves of a (nested) dict/tuple tree."""
  import jax

  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    key = jax.tree_util.keystr(path, simple=True, separator=".")
    out[f"{prefix}.{key}" if key else prefix] = leaf
  return out


def _local_value(x) -> np.ndarray:
  """Host copy of a replicated global array; asserts that its local shards agree."""
  shards = [np.asarray(s.data) for s in x.addressable_shards]
  for s in shards[1:]:
    np.testing.assert_array_equal(s, shards[0], err_msg="local replicas disagree")
  return shards[0]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--coordinator", required=True, help="host:port of process 0")
  parser.add_argument("--num-processes", type=int, required=True)
  parser.add_argument("--process-id", type=int, required=True)
  parser.add_argument("--out-dir", required=True)
  parser.add_argument("--timeout", type=int, default=180, help="self-destruct after seconds")
  parser.add_argument("--no-library", action="store_true", help="only the plain-JAX check")
  args = parser.parse_args(argv)

  # Never hang forever: dump all stacks to stderr and exit if still running after --timeout.
  faulthandler.dump_traceback_later(args.timeout, exit=True)

  import jax

  # gloo is the default CPU cross-process collective implementation in recent jax; set it
  # explicitly so the test does not depend on that default.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
    coordinator_address=args.coordinator,
    num_processes=args.num_processes,
    process_id=args.process_id,
    initialization_timeout=min(120, args.timeout),
  )

  import jax.numpy as jnp
  from jax.experimental import multihost_utils
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  if args.no_library:
    ol = None
  else:
    import optax

    import optax_lena as ol

  assert jax.process_index() == args.process_id, (jax.process_index(), args.process_id)
  assert jax.process_count() == args.num_processes
  devices = jax.devices()
  num_workers = len(devices)
  assert jax.local_device_count() * args.num_processes == num_workers, (
    jax.local_device_count(),
    num_workers,
  )
  mesh = Mesh(np.array(devices), (AXIS,))
  worker_of = {d: i for i, d in enumerate(mesh.devices.flat)}

  # Per-worker gradients, stacked along a leading axis sharded over 'workers': every device
  # receives only its own worker's gradient (built locally from the worker index).
  grad_sharding = NamedSharding(mesh, P(AXIS))
  local_devices = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
  local_grads = {d: make_worker_grads(worker_of[d]) for d in local_devices}
  grads = {
    k: jax.make_array_from_single_device_arrays(
      (num_workers, *s),
      grad_sharding,
      [jax.device_put(local_grads[d][k][None], d) for d in local_devices],
    )
    for k, s in SHAPES.items()
  }
  params_np = make_params()
  replicated = NamedSharding(mesh, P())
  params = {
    k: jax.make_array_from_callback(v.shape, replicated, lambda idx, v=v: v[idx])
    for k, v in params_np.items()
  }

  def per_device(g, p):
    g = jax.tree.map(lambda x: x[0], g)  # this worker's gradient
    local_sq = sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(g))
    out = {
      "plain_sq_norm_sum": jax.lax.psum(local_sq, AXIS),
      "plain_grad_sum": jax.lax.psum(g, AXIS),
      "plain_axis_size": jax.lax.psum(1, AXIS),
    }
    if ol is not None:
      mean_grads, stats = ol.all_reduce_grad_stats(g, AXIS)
      tx = ol.lena(
        LEARNING_RATE,
        momentum=MOMENTUM,
        weight_decay=WEIGHT_DECAY,
        warmup_threshold=WARMUP_THRESHOLD,
      )
      state = tx.init(p)
      updates, _ = tx.update(mean_grads, state, p, grad_stats=stats)
      out.update(
        mean_grads=mean_grads,
        sq_norm_mean=stats.sq_norm_mean,
        mean_grad_sq_norm=stats.mean_grad_sq_norm,
        num_samples=jnp.asarray(stats.num_samples),
        updates=updates,
        new_params=optax.apply_updates(p, updates),
      )
    return out

  step = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(AXIS), P()), out_specs=P()))
  results = step(grads, params)
  flat = {
    k: _local_value(v) for name, tree in results.items() for k, v in flatten(name, tree).items()
  }
  # Agreement across processes (a collective: every process must reach it).
  multihost_utils.assert_equal(flat, "processes computed different results")

  os.makedirs(args.out_dir, exist_ok=True)
  path = os.path.join(args.out_dir, f"process_{args.process_id}.npz")
  np.savez(path + ".tmp.npz", **flat)
  os.replace(path + ".tmp.npz", path)
  print(f"process {args.process_id}: wrote {sorted(flat)} to {path}", file=sys.stderr)
  faulthandler.cancel_dump_traceback_later()
  jax.distributed.shutdown()
  return 0


if __name__ == "__main__":
  try:
    code = main()
  except BaseException:
    # Exit at once: a normal exit would run jax.distributed's shutdown barrier and wait for
    # the peers (which are stuck waiting for this process) until their timeouts expire.
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)
  sys.exit(code)
