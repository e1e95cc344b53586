"""A tiny ALADDIN task for the Ray tests, and helpers to find a Ray session's processes.

Everything here is importable by the Ray actors (module-level, picklable by reference) and by the
driver scripts the tests run in subprocesses.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np

DIM = 8
BATCH = 16


def loss_fn(params: dict[str, Any], batch: tuple[Any, Any]) -> Any:
  """Least squares of a linear model (compiles in well under a second)."""
  import jax.numpy as jnp

  x, y = batch
  return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def batches(worker: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Worker ``worker``'s endless, seeded mini-batches of a noiseless linear problem."""
  rng = np.random.default_rng([seed, worker])
  w = (np.arange(DIM, dtype=np.float32)[:, None] + 1) / DIM
  while True:
    x = rng.normal(size=(BATCH, DIM)).astype(np.float32)
    yield x, x @ w + 0.5


def init_params() -> dict[str, np.ndarray]:
  """Zero parameters of the linear model."""
  return {"w": np.zeros((DIM, 1), np.float32), "b": np.zeros((1,), np.float32)}


def poisoned_batches(worker: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Fault injection from the task's side: worker 1's batches are NaN, so every message it
  computes is non-finite; the other workers' are :func:`batches`."""
  for x, y in batches(worker, seed):
    yield (x * np.nan, y) if worker == 1 else (x, y)


def slow_restart_then_hang(
  worker: int, seed: int, *, pause: float, hang_flag: str
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Fault injection from the task's side: :func:`batches`, except that a worker restarted by
  Ray (the seed of its first restart, ``seed % 1000 == 17``) takes ``pause`` seconds more to
  start, and that while the file ``hang_flag`` exists no batch comes (a hung worker)."""
  import time

  if seed % 1000 == 17:
    time.sleep(pause)
  for batch in batches(worker, seed):
    while os.path.exists(hang_flag):
      time.sleep(0.5)
    yield batch


LR = 0.02  # momentum 0.9 on this problem: stable with the replies' delay on a loaded machine


def make_task(batches_fn: Any = None) -> Any:
  """The ``ad.Task`` of the tests."""
  from optax_lena.aladdin import distributed as ad

  return ad.Task(loss_fn, init_params(), batches_fn or batches, batch_size=BATCH)


def spec(name: str = "aladdin", **options: Any) -> Any:
  """The algorithm's spec with the tests' optimizers (ALADDIN: period 2, the recipe otherwise)."""
  import optax

  from optax_lena import aladdin as al

  if name == "asp":
    return al.algorithm("asp", server_tx=optax.sgd(LR), **options)
  if name == "aladdin":
    options.setdefault("period", 2)
  return al.algorithm(name, worker_tx=al.local_optimizer(LR, weight_decay=0.0), **options)


def held_out_loss(params: Any) -> float:
  """The loss on a held-out batch."""
  return float(loss_fn(params, next(batches(99, 99))))


def restored_bitwise(runtime: Any, checkpoint_dir: str) -> list[bool]:
  """Per shard of a runtime that resumed: whether its x~ is, bit for bit, the array that the
  digest of the generation it restored records (True for a shard that restored none)."""
  import hashlib

  from optax_lena._src import checkpoint_digest as digest
  from optax_lena._src.aladdin.ray import shard_checkpoints

  vector = runtime.layout.to_vector(runtime.global_params())
  same = []
  for stats, part in zip(runtime.shard_stats(), runtime.layout.split(vector), strict=True):
    if stats.restored_generation < 0:
      same.append(True)
      continue
    step = shard_checkpoints.shard_dir(checkpoint_dir, stats.shard) / str(stats.restored_generation)
    record, _ = digest.check_files(step)
    leaves = record["leaves"] if record else []
    saved = next((leaf["sha256"] for leaf in leaves if leaf["path"] == "state/params"), None)
    same.append(hashlib.sha256(np.ascontiguousarray(part).tobytes()).hexdigest() == saved)
  return same


def newest_complete_generation(checkpoint_dir: str) -> int:
  """The newest generation that some shard finished saving (a digest), -1 if none."""
  from pathlib import Path

  from optax_lena._src import checkpoint_digest as digest

  done = [
    int(p.name)
    for p in Path(checkpoint_dir).glob("shard_*/*")
    if p.name.isdigit() and (p / digest.DIGEST).exists()
  ]
  return max(done, default=-1)


def session_processes(marker: str) -> list[Any]:
  """Live processes whose command line mentions ``marker`` (a Ray temp dir is in every Ray
  process's command line: gcs_server, raylet, agents, workers)."""
  import psutil

  found = []
  for proc in psutil.process_iter(["pid", "cmdline"]):
    with contextlib.suppress(psutil.Error):
      if proc.pid != os.getpid() and marker in " ".join(proc.info["cmdline"] or []):
        found.append(proc)
  return found


def actor_processes() -> list[Any]:
  """Live Ray worker processes: they retitle themselves ``ray::<Class>`` (``ray::IDLE`` when
  idle), so their command line no longer shows the session's temp dir."""
  import psutil

  found = []
  for proc in psutil.process_iter(["pid", "cmdline"]):
    with contextlib.suppress(psutil.Error, IndexError, TypeError):
      if proc.info["cmdline"][0].startswith("ray::"):
        found.append(proc)
  return found


def _of_another_session(proc: Any, marker: str) -> bool:
  """A ``ray::`` process whose raylet is alive and not of this session: another Ray session on
  the same machine (other tests, other users) started it. The raylet is the one named by a
  worker's ``RAY_RAYLET_PID``, or the parent of an agent (``ray::DashboardAgent``, ...)."""
  import psutil

  pids = []
  with contextlib.suppress(psutil.Error, KeyError, ValueError):
    pids.append(int(proc.environ()["RAY_RAYLET_PID"]))
  with contextlib.suppress(psutil.Error):
    pids.append(proc.ppid())
  for pid in pids:
    with contextlib.suppress(psutil.Error):
      command = " ".join(psutil.Process(pid).cmdline())
      if "raylet" in command:
        return marker not in command
  return False


def processes_since(marker: str, before: set[int]) -> list[Any]:
  """The session's processes (``marker`` in the command line) and every Ray worker process that
  did not exist in ``before`` (pids of :func:`actor_processes` taken earlier), except those of
  another live Ray session."""
  new_workers = [
    p for p in actor_processes() if p.pid not in before and not _of_another_session(p, marker)
  ]
  return session_processes(marker) + new_workers


def processes_of_user(uid: int) -> list[Any]:
  """Every live process of ``uid`` (a test's own unprivileged user)."""
  import psutil

  found = []
  for proc in psutil.process_iter(["uids"]):
    with contextlib.suppress(psutil.Error, TypeError):
      if proc.info["uids"].real == uid:
        found.append(proc)
  return found


def ray_processes_of(root_pid: int) -> list[Any]:
  """The descendants of ``root_pid`` (a driver that started a local Ray cluster)."""
  import psutil

  with contextlib.suppress(psutil.Error):
    return psutil.Process(root_pid).children(recursive=True)
  return []


def listening_addresses(processes: list[Any]) -> list[tuple[str, int, str]]:
  """``(ip, port, process name)`` of every listening TCP socket of ``processes``."""
  import psutil

  out = []
  for proc in processes:
    with contextlib.suppress(psutil.Error):
      for conn in proc.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN:
          out.append((conn.laddr.ip, conn.laddr.port, proc.name()))
  return out


def is_loopback(ip: str) -> bool:
  """127.0.0.0/8, ::1 or an IPv4-mapped loopback address."""
  address = ipaddress.ip_address(ip.split("%")[0])
  mapped = getattr(address, "ipv4_mapped", None)
  return address.is_loopback or (mapped is not None and mapped.is_loopback)


def kill_all(processes: list[Any]) -> None:
  """SIGKILL every process of the list (the ones a test started; never matched by name)."""
  for proc in processes:
    with contextlib.suppress(Exception):
      os.kill(proc.pid, signal.SIGKILL)


# Unprivileged local users of the security tests (root hands them directories; no account
# needed).
RUNNER_UID, OTHER_UID = 50001, 50002


def run_as(uid: int, code: str, home: str, timeout: float = 600.0, **popen: Any) -> Any:
  """Starts ``code`` in a fresh interpreter as the unprivileged user ``uid`` (needs root) and
  returns the ``subprocess.Popen``: the system interpreter of this Python's version (this one
  may live where other users cannot read), this environment's packages and the repository on
  its ``PYTHONPATH``, ``home`` as its ``HOME``."""
  import shutil
  import subprocess
  import sys
  import sysconfig

  version = f"python{sys.version_info.major}.{sys.version_info.minor}"
  python = shutil.which(version, path="/usr/bin:/bin:/usr/local/bin") or sys.executable
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  paths = {
    os.path.dirname(root),
    sysconfig.get_paths()["purelib"],
    sysconfig.get_paths()["platlib"],
  }
  env = {"PATH": "/usr/bin:/bin", "HOME": home, "PYTHONPATH": ":".join(sorted(paths))}

  def demote() -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)

  return subprocess.Popen([python, "-c", code], env=env, preexec_fn=demote, text=True, **popen)


class When:
  """Fault injection from the test's side: a thread that runs ``action()`` once, as soon as
  ``condition()`` holds (polled every 0.1 s), and records when (``at``)."""

  def __init__(self, condition: Any, action: Any, timeout: float = 90.0):
    import threading
    import time

    self.at: float | None = None
    self.error: BaseException | None = None

    def watch() -> None:
      deadline = time.time() + timeout
      while time.time() < deadline:
        try:
          if condition():
            self.at = time.time()
            action()
            return
        except Exception as err:  # reported by the test
          self.error = err
          return
        time.sleep(0.1)

    self.thread = threading.Thread(target=watch, daemon=True)
    self.thread.start()
