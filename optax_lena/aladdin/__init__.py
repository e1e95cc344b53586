"""ALADDIN: asymmetric centralized training for distributed deep learning (CIKM 2021).

``from optax_lena import aladdin as al``. Workers push a gradient every iteration and never
wait; a parameter server accumulates the gradients and, once every ``period`` messages of a
worker, makes a lazy global update and replies with the global model, which the worker mixes into
its own (Eq. 3). Pure, jittable building blocks: the server (:func:`parameter_server`, Algorithm
2), the worker's step and merge (:func:`local_step`, :func:`worker_merge`, Algorithm 1) and
the paper's baselines; and one typed, validated description per algorithm (:func:`algorithm`,
:class:`Aladdin`, ...), whose worker program (:class:`WorkerProgram`) and server both engines
run (the simulator and the Ray runtime), with the recommended recipe as defaults.
"""

from optax_lena._src.aladdin.algorithms import (
  ALGORITHMS,
  Aladdin,
  ArSgd,
  Asp,
  Easgd,
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
