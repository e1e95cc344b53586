"""Shared-memory rings that carry a worker's messages to the PS shards of its node.

A worker's messages to the PS shards on its own node, and their replies, go through a
shared-memory :class:`Ring` of its own in ``/dev/shm``, whose rows a Ray call names by a
:class:`Rows` record (``docs/ALADDIN-ray.md``, "Shared memory on one node", says why and gives
the ring's life cycle).

A shard maps only a regular file of its own user in that directory, never through a symbolic
link: the record comes from another process, and the directory is shared by every local user.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import mmap
import os
import re
import secrets
import stat
import tempfile
import weakref
from typing import Any

import numpy as np

DIRECTORY = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
PREFIX = "optax_lena-aladdin-"
# Beyond this a fold's transfer, not the call, dominates, and Ray already passes large arguments
# through its own shared memory.
MAX_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class Rows:
  """``count`` messages in region ``region`` of the ring at ``path``, the columns
  ``[start, stop)`` of each for one shard, whose replies go to the same region's reply rows."""

  path: str
  shape: tuple[int, int, int, int]  # regions, message rows, reply rows, columns
  dtype: str
  region: int
  count: int
  start: int
  stop: int


class RingError(ValueError):
  """A ring record names a file this shard refuses to map (not another node's ring)."""


def _map(path: str, nbytes: int) -> mmap.mmap:
  """Maps the ring at ``path``, a regular file of this user holding exactly ``nbytes``: raises
  ``FileNotFoundError`` if there is none, :class:`RingError` for anything else there."""
  try:
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
  except OSError as err:
    if os.path.islink(path):
      raise RingError(f"{path} is a symbolic link; a ring is never mapped through one.") from err
    raise
  try:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
      raise RingError(f"{path} is not a regular file.")
    if info.st_uid != os.getuid():
      raise RingError(f"{path} belongs to user {info.st_uid}, not to this run's user.")
    if info.st_size != nbytes:
      raise RingError(
        f"{path} holds {info.st_size} bytes, but the record's shape needs {nbytes}: the record "
        "does not describe this ring."
      )
    return mmap.mmap(fd, nbytes)
  finally:
    os.close(fd)


def _is_index(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _views(buffer: Any, shape: tuple[int, int, int, int], dtype: np.dtype) -> tuple[Any, Any]:
  regions, rows, reply_rows, size = shape
  messages = np.ndarray((regions, rows, size), dtype, buffer=buffer)
  replies = np.ndarray((regions, reply_rows, size), dtype, buffer=buffer, offset=messages.nbytes)
  return messages, replies


def _nbytes(shape: tuple[int, int, int, int], dtype: np.dtype) -> int:
  regions, rows, reply_rows, size = shape
  return regions * (rows + reply_rows) * size * dtype.itemsize


def _remove(path: str) -> None:
  with contextlib.suppress(FileNotFoundError):
    os.unlink(path)


class Ring:
  """Worker ``worker``'s ring of run ``run`` (:func:`run_name`, which the driver removes its
  rings by): ``regions`` regions (calls in flight) of ``rows`` messages and ``reply_rows``
  replies of ``size`` elements of ``dtype``. Raises ``OSError`` where it does not fit in shared
  memory (see :func:`open_ring`)."""

  def __init__(
    self, run: str, worker: int, regions: int, rows: int, reply_rows: int, size: int, dtype: Any
  ):
    self.dtype = np.dtype(dtype)
    self.shape = (regions, rows, reply_rows, size)
    nbytes = _nbytes(self.shape, self.dtype)
    name = f"{PREFIX}{run}-w{worker}-{os.getpid()}-{secrets.token_hex(4)}"
    self.path = os.path.join(DIRECTORY, name)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    self._finalizer = weakref.finalize(self, _remove, self.path)
    try:
      # Reserved now: a full tmpfs refuses it here (ENOSPC) instead of killing the worker with
      # SIGBUS when a page is first written.
      os.posix_fallocate(fd, 0, nbytes)
      self._mmap = mmap.mmap(fd, nbytes)
    except BaseException:
      self._finalizer()
      raise
    finally:
      os.close(fd)
    self.messages, self.replies = _views(self._mmap, self.shape, self.dtype)

  def write(self, region: int, messages: list[np.ndarray]) -> None:
    rows = self.messages[region]
    for row, message in enumerate(messages):
      rows[row] = message

  def rows(self, region: int, count: int, start: int, stop: int) -> Rows:
    """The record a shard reads columns ``[start, stop)`` of a call's messages by."""
    return Rows(self.path, self.shape, self.dtype.str, region, count, start, stop)

  def replies_of(self, rows: Rows, count: int) -> np.ndarray:
    """A copy of the ``count`` replies a shard wrote for the call of ``rows``."""
    return self.replies[rows.region, :count, rows.start : rows.stop].copy()

  def close(self) -> None:
    """Removes the file (the mappings of the shards live on until they close them)."""
    self._finalizer()


def open_ring(
  run: str, worker: int, regions: int, rows: int, reply_rows: int, size: int, dtype: Any
) -> Ring | None:
  """A :class:`Ring`, or None where it would exceed :data:`MAX_BYTES` or shared memory has no
  room for it (then the worker's messages travel in Ray's calls)."""
  if _nbytes((regions, rows, reply_rows, size), np.dtype(dtype)) > MAX_BYTES:
    return None
  try:
    return Ring(run, worker, regions, rows, reply_rows, size, dtype)
  except OSError:
    return None


class Mapped:
  """The rings a shard has mapped, by path; reads a call's messages and writes its replies."""

  def __init__(self, size: int, dtype: Any, max_rows: int):
    self.size, self.dtype, self.max_rows = size, np.dtype(dtype), max_rows
    self._rings: dict[str, tuple[Any, Any]] = {}

  def valid(self, rows: Any) -> bool:
    """Whether ``rows`` names this shard's slice of messages of a ring of this run's shape."""
    shape = getattr(rows, "shape", None)
    if not isinstance(rows, Rows) or not (
      isinstance(shape, tuple) and len(shape) == 4 and all(_is_index(x) and x >= 0 for x in shape)
    ):
      return False
    fields = (rows.region, rows.count, rows.start, rows.stop)
    if not (all(_is_index(x) for x in fields) and isinstance(rows.path, str)):
      return False
    regions, count_max, _, size = shape
    return (
      os.path.dirname(rows.path) == DIRECTORY
      and os.path.basename(rows.path).startswith(PREFIX)
      and rows.dtype == self.dtype.str
      and rows.stop - rows.start == self.size
      and 0 <= rows.start < rows.stop <= size
      and 0 <= rows.region < regions
      and 1 <= rows.count <= min(count_max, self.max_rows)
    )

  def _views(self, rows: Rows) -> tuple[Any, Any]:
    views = self._rings.get(rows.path)
    if views is None:
      try:
        buffer = _map(rows.path, _nbytes(rows.shape, self.dtype))
      except FileNotFoundError as err:
        raise ValueError(
          f"This PS shard finds no shared-memory ring {rows.path}: it runs on another node than "
          "the worker (was it restarted elsewhere?). Run with Config(shared_memory=False) to "
          "send every message through Ray's calls."
        ) from err
      except OSError as err:
        raise ValueError(
          f"This PS shard cannot map the worker's shared-memory ring {rows.path} ({err}). Run "
          "with Config(shared_memory=False) to send every message through Ray's calls."
        ) from err
      views = self._rings[rows.path] = _views(buffer, rows.shape, self.dtype)
    return views

  def read(self, rows: Rows) -> np.ndarray:
    """The shard's columns of the call's messages (a view into the ring)."""
    messages, _ = self._views(rows)
    return messages[rows.region, : rows.count, rows.start : rows.stop]

  def write_replies(self, rows: Rows, replies: np.ndarray) -> None:
    """Writes the shard's columns of the call's replies."""
    _, ring_replies = self._views(rows)
    ring_replies[rows.region, : len(replies), rows.start : rows.stop] = replies


def run_name() -> str:
  """A new run's name: its rings' files start with ``PREFIX + name``."""
  return secrets.token_hex(6)


def remove_rings(run: str) -> list[str]:
  """Removes every ring of run ``run`` on this node (workers killed before they could) and
  returns their paths."""
  paths = glob.glob(os.path.join(DIRECTORY, f"{PREFIX}{run}-*"))
  for path in paths:
    _remove(path)
  return paths


_RING_NAME = re.compile(re.escape(PREFIX) + r"[0-9a-f]+-w\d+-(\d+)-[0-9a-f]+")


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


def sweep_stale() -> list[str]:
  """Removes this user's rings on this node whose worker process no longer exists (a run whose
  driver was killed) and returns their paths; rings of live processes are left alone."""
  removed = []
  for path in glob.glob(os.path.join(DIRECTORY, f"{PREFIX}*")):
    match = _RING_NAME.fullmatch(os.path.basename(path))
    try:
      info = os.lstat(path)
    except FileNotFoundError:
      continue
    if match is None or not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
      continue
    if not _alive(int(match.group(1))):
      _remove(path)
      removed.append(path)
  return removed
