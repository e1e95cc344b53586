"""ALADDIN and its baselines on Ray: ``from optax_lena.aladdin import distributed as ad``.

Parameter-server shards and workers run as Ray actors, for ALADDIN and every baseline, so that
every comparison is on one engine (``docs/ALADDIN-ray.md``, which opens with an example). Needs
the ``distributed`` extra (``pip install 'optax_lena[distributed]'``: Ray and Orbax); the core
package never imports Ray.

The entry point is :class:`Runtime` (with a :class:`Task` and a :class:`Config`). A new
algorithm runs on Ray through the seam: an :class:`Iteration` subclass attached with
:func:`runs`, given a :class:`Driver` on the driver and :class:`Links` and a :class:`Local`
in each worker, naming its scheduler (:class:`AsyncChunks` or :class:`Rounds`) and returning
:class:`Stats` (``docs/ALADDIN-ray.md``, "Adding an algorithm").
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
from optax_lena._src.aladdin.ray.config import Config, Task
from optax_lena._src.aladdin.ray.driver import Runtime
from optax_lena._src.aladdin.ray.errors import CheckpointError, ClusterLostError, Interrupted
from optax_lena._src.aladdin.ray.layout import FlatLayout
from optax_lena._src.aladdin.ray.plan import Plan
from optax_lena._src.aladdin.ray.records import RunResult, ShardStats, Stats, WorkerInfo
from optax_lena._src.aladdin.ray.schedulers import AsyncChunks, Rounds
from optax_lena._src.aladdin.ray.seam import Driver, Iteration, Links, Local, runs
from optax_lena._src.aladdin.ray.signals import exit_on_stop_signals

#: The algorithms the Ray runtime runs: those with a Ray iteration when this module is imported
#: (``al.algorithm(name)`` for each; one attached later with :func:`runs` runs too).
ALGORITHMS: tuple[str, ...] = _algorithms.engine_names("ray")
# ``channel`` (the shared-memory rings) and ``cores`` (core claims and thread placement) are the
# runtime's low-level modules, public for the benchmarks that measure them.

__all__ = [
  "ALGORITHMS",
  "AsyncChunks",
  "CheckpointError",
  "ClusterLostError",
  "Config",
  "Driver",
  "FlatLayout",
  "Interrupted",
  "Iteration",
  "Links",
  "Local",
  "Plan",
  "Rounds",
  "RunResult",
  "Runtime",
  "ShardStats",
  "Stats",
  "Task",
  "WorkerInfo",
  "channel",
  "connect",
  "cores",
  "exit_on_stop_signals",
  "runs",
]
