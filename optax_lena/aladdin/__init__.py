"""ALADDIN: asymmetric centralized training for distributed deep learning (CIKM 2021).

``from optax_lena import aladdin as al``: pure, jittable building blocks (the server
:func:`parameter_server`, the worker's :func:`local_step` and :func:`worker_merge`, the paper's
baselines) and one validated spec per algorithm (:func:`algorithm`), which both engines run
(``docs/ALADDIN.md``).
"""

from optax_lena._src.aladdin.algorithms import (
  ALGORITHMS,
  Aladdin,
  ArSgd,
  Asp,
  Easgd,
  Result,
  Sgp,
  Spec,
  Symmetric,
  algorithm,
  register,
  unregister,
)
from optax_lena._src.aladdin.baselines import (
  SGP,
  ASPServer,
  ASPState,
  EASGDServer,
  EASGDState,
  SGPState,
  ar_sgd_mean,
  asp_server,
  easgd_server,
  sgp,
)
from optax_lena._src.aladdin.server import (
  ParameterServer,
  Reply,
  ServerState,
  all_finite,
  folded_receive,
  parameter_server,
)
from optax_lena._src.aladdin.worker import (
  MESSAGES,
  LocalState,
  WorkerProgram,
  local_optimizer,
  local_step,
  worker_merge,
)

__all__ = [
  "ALGORITHMS",
  "MESSAGES",
  "SGP",
  "ASPServer",
  "ASPState",
  "Aladdin",
  "ArSgd",
  "Asp",
  "EASGDServer",
  "EASGDState",
  "Easgd",
  "LocalState",
  "ParameterServer",
  "Reply",
  "Result",
  "SGPState",
  "ServerState",
  "Sgp",
  "Spec",
  "Symmetric",
  "WorkerProgram",
  "algorithm",
  "all_finite",
  "ar_sgd_mean",
  "asp_server",
  "easgd_server",
  "folded_receive",
  "local_optimizer",
  "local_step",
  "parameter_server",
  "register",
  "sgp",
  "unregister",
  "worker_merge",
]

# Removed: the pytree sharding that no engine used. The Ray runtime cuts the model itself.
_REMOVED = {
  name: "memory-wise sharding is a setting of the engines: ad.Config(ps_shards=k) (the Ray "
  "runtime cuts the model into k equal slices, one per PS shard) or sim.make_cluster(..., "
  "num_shards=k) (the simulator's cost model)"
  for name in (
    "ShardSpec",
    "ShardedParameterServer",
    "ShardedServerState",
    "shard_params",
    "sharded_parameter_server",
  )
}


def __getattr__(name: str) -> object:
  if name in _REMOVED:
    raise ImportError(f"optax_lena.aladdin.{name} was removed: {_REMOVED[name]}.")
  raise AttributeError(f"module 'optax_lena.aladdin' has no attribute {name!r}")
