"""ALADDIN: asymmetric centralized training for distributed deep learning (CIKM 2021).

``from optax_lena import aladdin as al``. Workers push a gradient every iteration and never
wait; a parameter server accumulates the gradients and, once every ``period`` messages of a
worker, makes a lazy global update and replies with the global model, which the worker mixes into
its own (Eq. 3). Pure, jittable building blocks: the server (:func:`parameter_server`, Algorithm
2), the worker's step and merge (:func:`local_step`, :func:`worker_merge`, Algorithm 1),
memory-wise parameter sharding (:func:`shard_params`) and the paper's baselines; and one typed,
validated description per algorithm (:func:`algorithm`, :class:`Aladdin`, ...), shared by the
simulator and the Ray runtime, whose defaults are the recommended recipe.
"""

from optax_lena._src.aladdin.algorithms import (
  ALGORITHMS,
  Aladdin,
  ArSgd,
  Asp,
  Easgd,
  Sgp,
  Spec,
  algorithm,
  register,
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
  parameter_server,
)
from optax_lena._src.aladdin.sharding import (
  ShardedParameterServer,
  ShardedServerState,
  ShardSpec,
  shard_params,
  sharded_parameter_server,
)
from optax_lena._src.aladdin.worker import MESSAGES, local_optimizer, local_step, worker_merge

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
  "ParameterServer",
  "Reply",
  "SGPState",
  "ServerState",
  "Sgp",
  "ShardSpec",
  "ShardedParameterServer",
  "ShardedServerState",
  "Spec",
  "algorithm",
  "all_finite",
  "ar_sgd_mean",
  "asp_server",
  "easgd_server",
  "local_optimizer",
  "local_step",
  "parameter_server",
  "register",
  "sgp",
  "shard_params",
  "sharded_parameter_server",
  "worker_merge",
]
