"""Where an actor's threads run: the size of XLA's CPU pool, and a worker's step on cores of its
own.

A worker's step is a hand-off between two threads (Python dispatches, XLA's thread computes,
Python picks the result up). Left to the OS on a node without spare cores, those threads move
between cores, each wake-up may land on a core that the worker's own sender thread, Ray's threads
or a PS shard holds, and a step takes longer than the same step in a plain loop. Pinned, the
step's threads share a core that nothing else of the runtime runs on, and everything else runs
on the other cores (measured in ``benchmarks/aladdin/RESULTS-ray.md``).

Which cores a worker takes is decided on its node, without the driver: a worker claims a free
core by taking an exclusive ``flock`` on a per-core lock file, which the OS releases when the
process ends (a crash or a restart included), so two pinned workers of any runtime on one machine
never share a core, and the last core of the node is never claimed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path


def limit_intra_op_threads(threads: int | None) -> bool:
  """Starts this process's JAX CPU backend with ``threads`` intra-op threads; returns whether it
  did (False: no limit asked, no affinity control, or the backend already started).

  XLA sizes its CPU thread pool by the CPUs this process may run on when the backend starts, and
  has no flag for it. Where actors outnumber cores, a pool per actor only adds hand-offs between
  threads that wait for a core (a small step costs more CPU and takes longer), so the backend is
  started while the process is restricted to ``threads`` CPUs, then every thread of the process
  gets the full set back: the pool keeps its size and the OS still places its threads freely.
  """
  if threads is None or not hasattr(os, "sched_setaffinity"):
    return False
  from jax._src import xla_bridge

  full = os.sched_getaffinity(0)
  if threads >= len(full) or xla_bridge.backends_are_initialized():
    return False
  os.sched_setaffinity(0, set(sorted(full)[:threads]))
  try:
    xla_bridge.backends()
  finally:
    set_affinity(thread_ids(), full)
  return True


def thread_ids() -> set[int]:
  """The native ids of this process's threads (Linux; empty elsewhere)."""
  with contextlib.suppress(OSError):
    return {int(tid) for tid in os.listdir("/proc/self/task")}
  return set()


def set_affinity(tids: Iterable[int], cpus: Iterable[int]) -> None:
  """Puts the threads ``tids`` of this process on ``cpus`` (those that have ended are skipped)."""
  cpus = set(cpus)
  for tid in tids:
    with contextlib.suppress(OSError):  # a thread that has ended since
      os.sched_setaffinity(tid, cpus)


def _lock_directory() -> Path:
  return Path(tempfile.gettempdir())


@dataclasses.dataclass
class CoreClaim:
  """Cores held by this process (``cores``) until :meth:`release` or the process ends;
  ``others``: the rest of the cores the process may run on."""

  cores: tuple[int, ...]
  others: frozenset[int]
  _fds: list[int] = dataclasses.field(default_factory=list, repr=False)

  def release(self) -> None:
    for fd in self._fds:
      os.close(fd)  # closing the descriptor drops its flock
    self._fds.clear()


def claim_cores(count: int, directory: Path | None = None) -> CoreClaim | None:
  """Claims ``count`` cores of this process's affinity that no other process on the machine
  holds, never the last one; None (nothing held) if there are not that many free."""
  if count < 1 or not hasattr(os, "sched_getaffinity"):
    return None
  import fcntl  # POSIX only, like the affinity calls

  cpus = sorted(os.sched_getaffinity(0))
  directory = directory or _lock_directory()
  fds: list[int] = []
  cores: list[int] = []
  for cpu in cpus[:-1]:
    if len(cores) == count:
      break
    path = directory / f"optax_lena-{os.getuid()}-core{cpu}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by another process
      os.close(fd)
      continue
    fds.append(fd)
    cores.append(cpu)
  claim = CoreClaim(tuple(cores), frozenset(cpus) - set(cores), fds)
  if len(cores) < count:
    claim.release()
    return None
  return claim


_held: list[CoreClaim] = []  # this process's claims, alive as long as the process


def pin_step(count: int, others: set[int], directory: Path | None = None) -> CoreClaim | None:
  """Pins this process's step to ``count`` cores of its own.

  Call it on the thread that dispatches the step, after the JAX backend has started: that thread
  and every thread not in ``others`` (XLA's, started with the backend) run on the claimed cores
  from then on, the threads in ``others`` (Ray's, started before) on the remaining ones; a thread
  started later inherits its creator's cores (:func:`run_on` moves it). Returns the claim, None
  (nothing pinned) if no ``count`` free cores were left.
  """
  claim = claim_cores(count, directory)
  if claim is None:
    return None
  _held.append(claim)
  step_threads = thread_ids() - set(others)
  step_threads.add(threading.get_native_id())
  set_affinity(step_threads, claim.cores)
  set_affinity(set(others) - step_threads, claim.others)
  return claim


def run_on(cpus: Iterable[int] | None) -> None:
  """Moves the calling thread to ``cpus`` (None: leaves it where it is)."""
  if cpus is not None:
    set_affinity([threading.get_native_id()], cpus)
