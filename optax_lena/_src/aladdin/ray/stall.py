"""When the driver counts its cluster as lost: no progress for the stall timeout, not counting
the time Ray spends restarting one of the run's actors (``docs/ALADDIN-ray.md``, "Faults and
security").

A restarted actor is a new process that imports JAX, compiles and restores its checkpoint before
any worker can progress again; on a loaded machine that outlasts any short timeout. Ray's actor
table says which actors are being (re)created; the clock pauses while one of the run's actors is,
for at most ``restart_timeout`` seconds in a row (an actor that never comes back is a stall).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

# The states of an actor being created or re-created, in Ray's actor table.
_STARTING = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "RESTARTING")
# Seconds without progress before the actor table is read (a read is a GCS call of ~1 ms).
_POLL_AFTER = 1.0


def _actor_id(actor: Any) -> str | None:
  with contextlib.suppress(AttributeError):
    return actor._actor_id.hex()
  return None


def starting_actors(actors: list[Any]) -> set[str]:
  """The ids of ``actors`` that Ray is creating or restarting now (empty if the table cannot
  be read: the clock then runs, and a lost cluster is reported as before)."""
  from ray._private import state  # Ray's own reader of the GCS actor table

  ids = {i for i in map(_actor_id, actors) if i}
  found: set[str] = set()
  with contextlib.suppress(Exception):
    for name in _STARTING:
      found |= ids & set(state.actors(actor_state_name=name))
  return found


class StallClock:
  """Seconds without progress, paused while one of ``actors()`` is (re)started.

  Args:
    actors: returns the run's actor handles (read at every poll: restarts change nothing).
    reachable: whether the cluster's GCS answers (the table is read only then).
    restart_timeout: the longest a pause lasts while the same actors keep starting.
  """

  def __init__(
    self,
    actors: Callable[[], list[Any]],
    reachable: Callable[[], bool],
    restart_timeout: float,
  ):
    self.actors, self.reachable, self.restart_timeout = actors, reachable, restart_timeout
    self.last = time.monotonic()
    self.starting_since: float | None = None  # when the current run of restarts began
    self.last_poll = 0.0

  def progress(self) -> None:
    """Something came back: the clock starts again."""
    self.last = time.monotonic()

  def restarting_for(self) -> float:
    """Seconds the current run of restarts has lasted (0: none)."""
    return 0.0 if self.starting_since is None else time.monotonic() - self.starting_since

  def stalled_for(self) -> float:
    """Seconds without progress, restarts not counted."""
    now = time.monotonic()
    if now - self.last >= _POLL_AFTER and now - self.last_poll >= _POLL_AFTER:
      self.last_poll = now
      if not (self.reachable() and starting_actors(self.actors())):
        self.starting_since = None
      else:
        self.starting_since = self.starting_since or now
        if now - self.starting_since < self.restart_timeout:
          self.last = now
    return now - self.last
