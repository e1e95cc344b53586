"""The runtime's side of the seam: :class:`RuntimeCluster`, what the driver gives an
algorithm's iteration (``seam.Driver``) to start its peers and read the global model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from optax_lena._src.aladdin.ray import bootstrap
from optax_lena._src.aladdin.ray.config import Config
from optax_lena._src.aladdin.ray.layout import FlatLayout
from optax_lena._src.aladdin.ray.shard import ServerShard

PyTree = Any


class RuntimeCluster:
  """The :class:`~optax_lena._src.aladdin.ray.seam.Driver` of one run.

  Args:
    config: the run's config.
    layout: the model's flat layout.
    init_params: the initial model (the shards' first x~).
    get: the runtime's ``get(refs, timeout)`` (signals and stalls noticed while it waits).
    threads: XLA's intra-op threads of every actor (None: XLA's default).
    shard_nice: the shards' ``os.nice``.
    resume: the checkpoint generation each shard resumes from (None: a fresh run).
  """

  def __init__(
    self,
    config: Config,
    layout: FlatLayout,
    init_params: PyTree,
    get: Callable[[Any, float | None], Any],
    threads: int | None,
    shard_nice: int,
    resume: list[int] | None = None,
  ):
    self.config, self.layout = config, layout
    self._init_params, self._get = init_params, get
    self._threads, self._shard_nice, self._resume = threads, shard_nice, resume
    self._workers: list[Any] = []
    self._shards: list[Any] = []
    self._peers: list[Any] = []
    self.started: list[Any] = []  # every actor started for the peers, killed at shutdown

  @property
  def workers(self) -> list[Any]:
    return self._workers

  @property
  def shards(self) -> list[Any]:
    return self._shards

  @property
  def peers(self) -> list[Any]:
    return self._peers

  def set_peers(self, peers: list[Any]) -> None:
    self._peers = list(peers)

  def set_workers(self, workers: list[Any]) -> None:
    self._workers = list(workers)

  def start_shards(self) -> list[Any]:
    import ray

    if self._shards:
      return self._shards
    shard_cls = ray.remote(ServerShard).options(**bootstrap.actor_options(self.config, "server"))
    params = self.layout.to_vector(self._init_params)
    none: list[int | None] = [None] * self.config.ps_shards
    resume = none if self._resume is None else list(self._resume)
    self._shards = [
      shard_cls.remote(k, part, self.config, self._threads, self._shard_nice, resume[k])
      for k, part in enumerate(self.layout.split(params))
    ]
    self.started += self._shards
    return self._shards

  def start_meeting(self, cls: type, *args: Any) -> Any:
    import ray

    options = bootstrap.actor_options(self.config, "server")
    options |= {"max_restarts": 0, "max_task_retries": 0, "max_concurrency": 1000}
    actor: Any = ray.remote(cls).options(**options).remote(*args)
    self.started.append(actor)
    return actor

  def get(self, refs: Any, timeout: float | None = None) -> Any:
    return self._get(refs, timeout)

  def shard_params(self, timeout: float | None = None) -> PyTree:
    replies = self._get([s.params.remote() for s in self._shards], timeout)
    return self.layout.to_tree(self.layout.join([p for p, _ in replies]))

  def worker_params(
    self, timeout: float | None = None, workers: Sequence[int] | None = None
  ) -> list[PyTree]:
    chosen = range(len(self._workers)) if workers is None else workers
    return self._get([self._workers[i].get_params.remote() for i in chosen], timeout)
