"""Where an actor's threads run: XLA's CPU pool and a worker's own cores.

The size of XLA's CPU pool, and a worker's step on cores of its own, claimed by an exclusive
``flock`` on a per-core lock file (``docs/ALADDIN-ray.md``, "Cores"). The lock files live in a
directory of the user's own (mode 0700, checked to be theirs and not a link) and are opened
without following links; any failure to open or lock one means only that the core is not
claimable (logged).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def limit_intra_op_threads(threads: int | None) -> bool:
  """Starts this process's JAX CPU backend with ``threads`` intra-op threads; returns whether it
  did (not: no limit asked, no affinity control, or the backend already started). XLA sizes its
  pool by the CPUs the process may run on when the backend starts (it has no flag for it), so
  it starts while the process is restricted to ``threads`` CPUs; then all get the full set back."""
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


_log = logging.getLogger(__name__)


def make_private_directory(parent: Path | None = None) -> Path:
  """A directory only this user can enter: ``optax_lena-<uid>`` under ``parent`` (default: the
  temp directory), created with mode 0700 if missing.

  Raises:
    PermissionError: what is there is a link, not a directory, another user's, or open to
      others (the message names it and the fix).
    OSError: no temp directory, or the directory cannot be made or read.
  """
  uid = os.getuid()
  path = (parent or Path(tempfile.gettempdir())) / f"optax_lena-{uid}"
  with contextlib.suppress(FileExistsError):  # checked below, like a new one
    os.mkdir(path, 0o700)
  info = os.lstat(path)
  if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o077:
    raise PermissionError(
      f"{path} is not a private directory of uid {uid} (a link, a file, another owner, or open "
      "to others): remove it, or choose another parent directory"
    )
  return path


def private_directory(parent: Path | None = None) -> Path | None:
  """:func:`make_private_directory` for the core locks, or None (logged: steps are not
  pinned) where it cannot be made."""
  try:
    return make_private_directory(parent)
  except OSError as error:
    _log.warning("no directory for core locks (%s): steps are not pinned", error)
    return None


def _open_lock(path: Path) -> int | None:
  """The descriptor of the lock file ``path`` locked exclusively, or None: held by another
  process, or not openable (a link, another user's file, no permission...)."""
  import fcntl  # POSIX only, like the affinity calls

  flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
  try:
    fd = os.open(path, flags, 0o600)
  except OSError as error:
    _log.warning("core lock %s cannot be opened (%s): that core is not claimed", path, error)
    return None
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:  # held by another process (or a file system without flock)
    os.close(fd)
    return None
  return fd


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
  directory = directory or private_directory()
  if directory is None:
    return None
  cpus = sorted(os.sched_getaffinity(0))
  fds: list[int] = []
  cores: list[int] = []
  for cpu in cpus[:-1]:
    if len(cores) == count:
      break
    if (fd := _open_lock(directory / f"core{cpu}.lock")) is not None:
      fds.append(fd)
      cores.append(cpu)
  claim = CoreClaim(tuple(cores), frozenset(cpus) - set(cores), fds)
  if len(cores) < count:
    claim.release()
    return None
  return claim


_held: list[CoreClaim] = []  # this process's claims, alive as long as the process


def pin_step(count: int, others: set[int], directory: Path | None = None) -> CoreClaim | None:
  """Pins this process's step to ``count`` cores of its own (call it on the thread that dispatches
  the step, once JAX's backend has started): XLA's threads on them, ``others`` (Ray's) and the
  caller on the rest (:func:`follow_the_step` moves the caller if it computes the step itself).
  Returns the claim, or None (nothing pinned) if no ``count`` free cores were left."""
  claim = claim_cores(count, directory)
  if claim is None:
    return None
  _held.append(claim)
  place_step(claim.cores, claim.others, others)
  return claim


def place_step(
  step_cpus: Iterable[int], other_cpus: Iterable[int], others: Iterable[int] = ()
) -> None:
  """Puts this process's threads, except ``others`` and the caller, on ``step_cpus``, and
  ``others`` and the caller on ``other_cpus`` (:func:`pin_step` without a claim)."""
  caller = threading.get_native_id()
  set_affinity(thread_ids() - set(others) - {caller}, step_cpus)
  set_affinity(set(others) | {caller}, other_cpus)


def thread_cpu_seconds() -> dict[int, float]:
  """The CPU seconds each thread of this process has run (Linux; empty elsewhere)."""
  spent = {}
  for tid in thread_ids():
    with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that has ended since
      stat = Path(f"/proc/self/task/{tid}/schedstat").read_text()
      spent[tid] = int(stat.split()[0]) / 1e9
  return spent


def follow_the_step(
  claim: CoreClaim, step: Callable[[], Any], calls: int = 10, min_seconds: float = 0.05
) -> bool:
  """Moves the calling thread onto the claimed cores if it computes the step itself (XLA:CPU
  runs a cheap computation inline): runs ``step`` at least ``calls`` times and for at least
  ``min_seconds``, and compares the caller's CPU time with that of the threads on the claimed
  cores. Returns whether the caller moved.
  """
  # The caller's own time comes from its CPU clock: its schedstat is only brought up to date at
  # the scheduler's ticks (every few ms), so a step of microseconds read there looked like no
  # work at all, and the caller stayed off the core whenever no tick fell in the calls.
  caller = threading.get_native_id()
  before, caller_start, start = thread_cpu_seconds(), time.thread_time(), time.perf_counter()
  done = 0
  while done < calls or time.perf_counter() - start < min_seconds:
    step()
    done += 1
  caller_spent = time.thread_time() - caller_start
  spent = {t: s - before.get(t, 0.0) for t, s in thread_cpu_seconds().items()}
  pinned = sum(s for t, s in spent.items() if t != caller and _affinity(t) == set(claim.cores))
  if caller_spent <= pinned:
    return False
  set_affinity([caller], claim.cores)
  return True


def _affinity(tid: int) -> set[int]:
  with contextlib.suppress(OSError):
    return os.sched_getaffinity(tid)
  return set()
