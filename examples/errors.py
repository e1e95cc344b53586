"""The error of a configuration that cannot run, shared by the kit and the programs.

The kit's modules (datasets, checkpoints, metrics) raise it for what a user set or left behind
(an unknown split, a damaged checkpoint or ``config.json``); the trainer raises it for its own
settings and re-exports it as ``examples.lena.ConfigError``. The command line prints its message
and exits, without a traceback.
"""

from __future__ import annotations


class ConfigError(ValueError):
  """A configuration that cannot run; the message says what to change."""
