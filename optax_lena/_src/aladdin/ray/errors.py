"""The errors of the Ray runtime, raised on the driver where the user can act on them."""

from __future__ import annotations


class ClusterLostError(RuntimeError):
  """Raised when the driver has lost its Ray cluster.

  The cluster's GCS does not accept connections, or no worker made progress for the runtime's
  ``stall_timeout`` seconds while no actor was being restarted."""


class CheckpointError(ValueError):
  """The shards' checkpoints cannot be resumed; the message names the directory to delete."""


class Interrupted(KeyboardInterrupt):
  """The run was stopped by SIGINT (Ctrl-C) or SIGTERM; everything has been shut down.

  Args:
    signum: the signal received.

  A program exits with :attr:`exit_code` (130 or 143), as a shell does for these signals.
  """

  def __init__(self, signum: int):
    super().__init__(f"stopped by signal {signum}")
    self.signum = signum

  @property
  def exit_code(self) -> int:
    """``128 + signum``."""
    return 128 + self.signum
