"""ALADDIN and its baselines on Ray: ``from optax_lena.aladdin import distributed as ad``.

Parameter-server shards and workers run as Ray actors, for ALADDIN and every baseline, so that
every comparison is on one engine (``docs/ALADDIN-ray.md``, which opens with an example). Needs
the ``distributed`` extra (``pip install 'optax_lena[distributed]'``: Ray and Orbax); the core
package never imports Ray.
"""

try:
  import ray as _ray  # noqa: F401
except ImportError as _err:  # pragma: no cover - depends on the installation
  raise ImportError(
    "optax_lena.aladdin.distributed needs Ray: pip install 'optax_lena[distributed]'."
  ) from _err

from optax_lena._src.aladdin import algorithms as _algorithms
from optax_lena._src.aladdin.ray import channel, cores
from optax_lena._src.aladdin.ray.bootstrap import connect
from optax_lena._src.aladdin.ray.config import (
  ClusterLostError,
  Config,
  Interrupted,
  Plan,
  RunResult,
  ShardStats,
  Task,
  WorkerInfo,
)
from optax_lena._src.aladdin.ray.driver import Runtime
from optax_lena._src.aladdin.ray.iterations import Iteration, runs  # importing attaches Ray's
from optax_lena._src.aladdin.ray.shard_checkpoints import CheckpointError
from optax_lena._src.aladdin.ray.signals import exit_on_stop_signals

ALGORITHMS: tuple[str, ...] = _algorithms.engine_names("ray")
# ``channel`` (the shared-memory rings) and ``cores`` (core claims and thread placement) are the
# runtime's low-level modules, public for the benchmarks that measure them.

__all__ = [
  "ALGORITHMS",
  "CheckpointError",
  "ClusterLostError",
  "Config",
  "Interrupted",
  "Iteration",
  "Plan",
  "RunResult",
  "Runtime",
  "ShardStats",
  "Task",
  "WorkerInfo",
  "channel",
  "connect",
  "cores",
  "exit_on_stop_signals",
  "runs",
]
