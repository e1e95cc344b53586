"""ALADDIN: asymmetric centralized training for distributed deep learning (CIKM 2021).

``from optax_lena import aladdin as al``. ALADDIN is a parameter-server algorithm in which no
worker ever waits: each pushes a message after every local step (:func:`local_step`), the
server (:func:`parameter_server`) answers a worker with the global model only once every
``period`` of its messages, and the worker mixes the answer into its own model
(:func:`worker_merge`, the paper's Eq. 3). This module holds these pure, jittable pieces, the
paper's baselines (:func:`ar_sgd_mean`, :func:`asp_server`, :func:`easgd_server`, :func:`sgp`)
and one validated spec per algorithm (:func:`algorithm`), which both engines run: the
deterministic cluster simulator (``optax_lena.aladdin.simulator``) and the Ray runtime
(``optax_lena.aladdin.distributed``). ``docs/ALADDIN.md`` explains the algorithm and the
choices made where the printed paper is ambiguous.

Reference: Ko, Choi, Jei, Lee and Kim, "ALADDIN: Asymmetric Centralized Training for
Distributed Deep Learning", CIKM 2021 (DOI 10.1145/3459637.3482412).
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
