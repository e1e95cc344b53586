"""ALADDIN and its baselines on Ray: ``from optax_lena.aladdin import distributed as ad``.

Parameter-server shards (memory-wise sharding, one Ray actor per shard) and workers run as Ray
actors; ALADDIN workers push every gradient to every shard without waiting and merge the
server's ``(x~, alpha)`` whenever a reply has arrived. The same runtime runs AR-SGD (a barrier
per iteration), ASP and EASGD (symmetric waits), so that every comparison is on one engine.

Needs the ``distributed`` extra (``pip install 'optax_lena[distributed]'``, which adds Ray);
the core package never imports Ray. A local run binds every Ray service to 127.0.0.1 and
starts no dashboard or job-submission API; ``address=`` joins an existing cluster (see
``docs/ALADDIN-ray.md`` for its TLS and token settings).

Example::

  task = ad.Task(loss_fn, params, batches, local_tx=al.local_optimizer(0.05),
                 server_tx=optax.sgd(0.05), batch_size=32)
  with ad.Runtime(task, ad.Config(algorithm="aladdin", num_workers=4)) as rt:
    result = rt.run(time_budget=30.0, eval_fn=accuracy)
  print(result.throughput, result.wait_fraction)
"""

from optax_lena._src.aladdin.ray_runtime import (
  ALGORITHMS,
  ClusterLostError,
  Config,
  RunResult,
  Runtime,
  Task,
  connect,
)

__all__ = [
  "ALGORITHMS",
  "ClusterLostError",
  "Config",
  "RunResult",
  "Runtime",
  "Task",
  "connect",
]
