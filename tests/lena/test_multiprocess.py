"""Multi-process data parallelism on the CPU: 2 JAX processes x 2 simulated devices = 4 workers.

The children (``tests/lena/multiprocess_worker.py``) join with ``jax.distributed.initialize`` over a
free localhost port, use gloo cross-process collectives and compute, under
``jax.jit(jax.shard_map(...))`` over a global mesh, ``ol.all_reduce_grad_stats`` and one
``ol.lena`` update. Their results must equal a single-process reference on the same 4 per-worker
gradients: NumPy float64 for the statistics, ``ol.stacked_grad_stats`` + ``ol.lena`` for the
update.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_PATH = Path(__file__).resolve().with_name("multiprocess_worker.py")
NUM_PROCESSES = 2
DEVICES_PER_PROCESS = 2
NUM_WORKERS = NUM_PROCESSES * DEVICES_PER_PROCESS
TIMEOUT_S = 240
# float32 results from differently ordered reductions agree to a few ulp (observed <= 4e-7
# relative); an error of 3e-6 in one statistic is caught. The absolute tolerance scales with the
# leaf's largest entry so that tiny entries of a leaf do not need ulp-exact agreement.
RTOL = 1e-6

if str(REPO_ROOT) not in sys.path:  # `pytest` (unlike `python -m pytest`) does not add the cwd
  sys.path.insert(0, str(REPO_ROOT))


def _load_worker_module():
  spec = importlib.util.spec_from_file_location("multiprocess_worker", WORKER_PATH)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


worker = _load_worker_module()

# Messages of a jax build without CPU cross-process collectives: the only reason to skip.
_UNSUPPORTED = (
  "has no attribute 'make_gloo_tcp_collectives'",  # jaxlib built without gloo
  "Multiprocess computations aren't implemented on the CPU backend",  # jax < 0.4.27
)
_PORT_IN_USE = ("address already in use", "failed to bind", "errno 98")


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _child_env() -> dict[str, str]:
  env = dict(os.environ)
  env["JAX_PLATFORMS"] = "cpu"
  flags = [
    f
    for f in env.get("XLA_FLAGS", "").split()
    if not f.startswith("--xla_force_host_platform_device_count")
  ]
  flags.append(f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS}")
  env["XLA_FLAGS"] = " ".join(flags)
  env.pop("JAX_NUM_CPU_DEVICES", None)  # would override the XLA flag
  for var in ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy"):
    # gRPC (the coordination service) would route 127.0.0.1 through a proxy.
    env.pop(var, None)
    env.pop(var.upper(), None)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
  env["PYTHONUNBUFFERED"] = "1"
  return env


def _launch_once(out_dir: Path, deadline: float) -> tuple[list[int | None], list[str]]:
  """Start all children; wait until all exit, one fails, or ``deadline``. Kill leftovers."""
  coordinator = f"127.0.0.1:{_free_port()}"
  env = _child_env()
  logs, procs = [], []
  try:
    for pid in range(NUM_PROCESSES):
      log = open(out_dir / f"process_{pid}.log", "w+")  # noqa: SIM115 (closed below)
      logs.append(log)
      cmd = [
        sys.executable,
        str(WORKER_PATH),
        f"--coordinator={coordinator}",
        f"--num-processes={NUM_PROCESSES}",
        f"--process-id={pid}",
        f"--out-dir={out_dir}",
        f"--timeout={max(10, int(deadline - time.monotonic()) - 5)}",
      ]
      procs.append(
        subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
      )
    while time.monotonic() < deadline:
      codes = [p.poll() for p in procs]
      if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
        break
      time.sleep(0.05)
  finally:
    for p in procs:  # a failed peer would leave the others waiting on the coordinator
      if p.poll() is None:
        p.kill()
    for p in procs:
      with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=30)
  codes = [p.returncode for p in procs]
  outputs = []
  for log in logs:
    log.seek(0)
    outputs.append(log.read())
    log.close()
  return codes, outputs


def _run_children(out_dir: Path) -> list[dict[str, np.ndarray]]:
  start = time.monotonic()
  deadline = start + TIMEOUT_S
  for attempt in range(3):
    codes, outputs = _launch_once(out_dir, deadline)
    text = "\n".join(
      f"----- process {i} (exit code {c}) -----\n{o}"
      for i, (c, o) in enumerate(zip(codes, outputs, strict=True))
    )
    if all(c == 0 for c in codes):
      break
    if any(m.lower() in text.lower() for m in _PORT_IN_USE) and attempt < 2:
      continue  # lost the race for the free port; try another one
    if any(m in text for m in _UNSUPPORTED):
      pytest.skip(f"this jax build lacks CPU multi-process collectives:\n{text}")
    pytest.fail(
      f"multi-process children failed after {time.monotonic() - start:.0f} s (timeout "
      f"{TIMEOUT_S} s; exit codes {codes}; -9 = killed by the test):\n{text}"
    )
  return [dict(np.load(out_dir / f"process_{pid}.npz")) for pid in range(NUM_PROCESSES)]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict[str, np.ndarray]]:
  return _run_children(tmp_path_factory.mktemp("multiprocess"))


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
  return _reference()


def _reference() -> dict[str, np.ndarray]:
  """Single-process results on the same 4 per-worker gradients (parent's CPU)."""
  import jax
  import optax

  import optax_lena as ol

  stacked = worker.stacked_worker_grads(NUM_WORKERS)
  params = worker.make_params()
  ref = {}

  # NumPy float64 statistics.
  g64 = {k: v.astype(np.float64) for k, v in stacked.items()}
  mean64 = {k: v.mean(axis=0) for k, v in g64.items()}
  ref.update(worker.flatten("np_mean_grads", mean64))
  ref.update(
    worker.flatten(
      "np_sq_norm_mean",
      {k: np.mean(np.sum(v.reshape(NUM_WORKERS, -1) ** 2, axis=1)) for k, v in g64.items()},
    )
  )
  ref.update(worker.flatten("np_mean_grad_sq_norm", {k: np.sum(v**2) for k, v in mean64.items()}))
  ref["np_sq_norm_sum"] = sum(np.sum(v**2) for v in g64.values())
  ref.update(worker.flatten("np_grad_sum", {k: v.sum(axis=0) for k, v in g64.items()}))

  # Library single-process path (jitted, like the children's step).
  tx = ol.lena(
    worker.LEARNING_RATE,
    momentum=worker.MOMENTUM,
    weight_decay=worker.WEIGHT_DECAY,
    warmup_threshold=worker.WARMUP_THRESHOLD,
  )

  @jax.jit
  def step(stacked_grads, p):
    mean_grads, stats = ol.stacked_grad_stats(stacked_grads)
    updates, _ = tx.update(mean_grads, tx.init(p), p, grad_stats=stats)
    out = {
      "mean_grads": mean_grads,
      "sq_norm_mean": stats.sq_norm_mean,
      "mean_grad_sq_norm": stats.mean_grad_sq_norm,
      "updates": updates,
      "new_params": optax.apply_updates(p, updates),
    }
    return out, stats.num_samples

  lib, num_samples = step(stacked, params)
  ref["num_samples"] = np.asarray(num_samples)
  for name, tree in lib.items():
    ref.update({k: np.asarray(v) for k, v in worker.flatten(name, tree).items()})
  return ref


def _keys(d: dict, prefix: str) -> list[str]:
  return sorted(k for k in d if k == prefix or k.startswith(prefix + "."))


def _assert_tree_close(actual: dict, expected: dict, prefix: str, expected_prefix=None):
  expected_prefix = expected_prefix or prefix
  a_keys = _keys(actual, prefix)
  e_keys = _keys(expected, expected_prefix)
  assert [k[len(prefix) :] for k in a_keys] == [k[len(expected_prefix) :] for k in e_keys]
  assert a_keys, f"no results named {prefix!r}"
  for a, e in zip(a_keys, e_keys, strict=True):
    assert actual[a].shape == np.shape(expected[e]), (a, actual[a].shape, np.shape(expected[e]))
    atol = RTOL * float(np.max(np.abs(expected[e]), initial=0.0))
    np.testing.assert_allclose(actual[a], expected[e], rtol=RTOL, atol=atol, err_msg=a)


def test_processes_agree(results):
  first, *others = results
  for other in others:
    assert sorted(other) == sorted(first)
    for k in first:
      np.testing.assert_array_equal(other[k], first[k], err_msg=k)


def test_plain_jax_collectives(results, reference):
  """Harness sanity: psum over a mesh spanning both processes sees all 4 workers."""
  r = results[0]
  assert int(r["plain_axis_size"]) == NUM_WORKERS
  _assert_tree_close(r, reference, "plain_sq_norm_sum", "np_sq_norm_sum")
  _assert_tree_close(r, reference, "plain_grad_sum", "np_grad_sum")


def test_grad_stats_match_reference(results, reference):
  r = results[0]
  assert int(r["num_samples"]) == NUM_WORKERS
  assert int(reference["num_samples"]) == NUM_WORKERS
  for name in ("mean_grads", "sq_norm_mean", "mean_grad_sq_norm"):
    _assert_tree_close(r, reference, name, "np_" + name)  # float64 NumPy
    _assert_tree_close(r, reference, name)  # ol.stacked_grad_stats


def test_lena_update_matches_single_process(results, reference):
  r = results[0]
  _assert_tree_close(r, reference, "updates")
  _assert_tree_close(r, reference, "new_params")
  for k in _keys(r, "updates"):
    assert np.all(np.isfinite(r[k])), k
    assert np.any(r[k] != 0), f"{k}: update is identically zero"
