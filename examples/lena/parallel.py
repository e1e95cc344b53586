"""How one update's S per-worker gradients are spread over devices: batch layout and strategies.

One update averages S = devices x micro-batches per-worker gradients. Every strategy runs the
trainer's ``worker`` function (one worker's micro-batches -> gradients, their statistics and
auxiliary outputs), combines the workers' results and calls the trainer's ``update``. They
differ only in how the devices are used:

* :class:`ShardMap`: ``jax.shard_map`` over the mesh axis ``'batch'``; gradients and their
  statistics are combined with ``ol.all_reduce_grad_stats``.
* :class:`Pmap`: the same per-device body under ``jax.pmap``.
* :class:`Gspmd`: plain ``jit``; the workers are a ``vmap`` whose axis is sharded over the
  devices, combined with ``ol.stacked_grad_stats`` (XLA inserts the all-reduces).
* :class:`PerWorkerVmap`: GSPMD's step with every per-worker micro-batch its own ``vmap`` entry
  (no sequential micro-batches): the deep-network study's per-worker loop.

The three give the same parameters (pmap and shard_map bitwise on CPU, GSPMD to float rounding).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import flax.jax_utils
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import optax_lena as ol
from examples.lena.configs import Config, ConfigError

PyTree = Any
Batch = dict[str, np.ndarray]
AXIS = "batch"  # the mesh / pmap axis the workers are spread over
# worker(state, micro_batches) -> (grads, stats, aux): one worker's K micro-batches ([K, b, ...]
# leaves); aux (metrics, BatchNorm statistics) is averaged over the workers.
WorkerFn = Callable[[Any, Batch], tuple[PyTree, ol.GradStats, PyTree]]
# update(state, grads, stats, aux) -> (new state, metrics), from the combined gradients.
UpdateFn = Callable[[Any, PyTree, ol.GradStats, PyTree], tuple[Any, dict[str, jax.Array]]]


@dataclasses.dataclass(frozen=True)
class BatchLayout:
  """How one update's global batch is split: devices x micro-batches x per-worker batch."""

  per_worker_batch: int
  num_devices: int
  micro_batches: int

  @property
  def num_samples(self) -> int:
    """S, the number of per-worker gradients one update averages."""
    return self.num_devices * self.micro_batches

  @property
  def global_batch(self) -> int:
    return self.num_samples * self.per_worker_batch


def batch_layout(config: Config, local_device_count: int) -> BatchLayout:
  """Splits the global batch into devices x micro-batches x per-worker batch.

  Args:
    config: uses ``per_worker_batch``, ``batch_scale`` or ``global_batch_size``,
      ``num_devices`` and ``micro_batches`` (0 = automatic).
    local_device_count: devices available.

  Returns:
    The layout.

  Raises:
    ConfigError: if the numbers do not multiply up (the message says what to change).
  """
  b = config.per_worker_batch
  if b < 1:
    raise ConfigError(f"per_worker_batch must be positive, got {b}.")
  if config.global_batch_size > 0:
    global_batch = config.global_batch_size
    if global_batch % b:
      raise ConfigError(
        f"global_batch_size {global_batch} is not a multiple of per_worker_batch {b}; "
        f"use e.g. global_batch_size={max(1, global_batch // b) * b}."
      )
    s = global_batch // b
  else:
    s = config.batch_scale
    if s < 1:
      raise ConfigError(f"batch_scale must be positive, got {s}.")
    global_batch = s * b
  if config.num_devices > local_device_count:
    raise ConfigError(
      f"num_devices={config.num_devices} but only {local_device_count} local devices are "
      "available (on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N simulates "
      "N devices)."
    )
  devices, micro = config.num_devices, config.micro_batches
  if devices <= 0 and micro > 0 and s % micro == 0 and s // micro <= local_device_count:
    devices = s // micro
  elif devices <= 0:
    # The largest divisor of S that fits: all devices when S is a multiple of their count.
    devices = max(d for d in range(1, min(s, local_device_count) + 1) if s % d == 0)
  if micro <= 0:
    micro = max(1, s // devices)
  if devices * micro != s:
    raise ConfigError(
      f"Global batch {global_batch} (per_worker_batch {b} x S={s} per-worker batches) is "
      f"not divisible across {devices} devices x {micro} micro-batches "
      f"(= {devices * micro * b} examples per update). Make batch_scale a multiple of "
      f"num_devices (e.g. batch_scale={max(1, s // devices) * devices} or "
      f"{(s // devices + 1) * devices}), or set num_devices "
      f"and micro_batches so that num_devices x micro_batches = {s} (micro_batches=0 picks "
      "S / num_devices)."
    )
  return BatchLayout(per_worker_batch=b, num_devices=devices, micro_batches=micro)


class Strategy:
  """A parallel path: the compiled step and how states and batches are laid out for it.

  States live "on the mesh" (replicated over ``mesh``) between steps that the host inspects
  (evaluation, checkpoints); :meth:`to_device` / :meth:`from_device` convert to and from the
  layout the step wants.
  """

  name: ClassVar[str]

  def __init__(self, layout: BatchLayout, worker: WorkerFn, update: UpdateFn):
    self.layout = layout
    self.devices = jax.local_devices()[: layout.num_devices]
    self.mesh = jax.make_mesh(
      (layout.num_devices,), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,), devices=self.devices
    )
    self.step = self.compile(worker, update)

  def compile(self, worker: WorkerFn, update: UpdateFn) -> Callable[[Any, Batch], Any]:
    """``step(state, batch) -> (state, metrics)``, donating the state."""
    raise NotImplementedError

  def on_mesh(self, tree: PyTree) -> PyTree:
    """``tree`` replicated on the mesh (checkpoints and evaluation use this layout)."""
    return jax.device_put(tree, NamedSharding(self.mesh, P()))

  def to_device(self, state: PyTree) -> PyTree:
    """The step's state layout (replicated on the mesh unless a strategy says otherwise)."""
    return self.on_mesh(state)

  def from_device(self, state: PyTree) -> PyTree:
    """The step's state back in the mesh-replicated layout of :meth:`on_mesh`."""
    return self.on_mesh(state)

  def split(self, batch: Batch) -> Batch:
    """A global batch ``[G, ...]`` as ``[devices, K, per_worker_batch, ...]``."""
    lay = self.layout
    return {
      k: v.reshape(lay.num_devices, lay.micro_batches, lay.per_worker_batch, *v.shape[1:])
      for k, v in batch.items()
    }

  def shard_batch(self, batch: Batch) -> Batch:
    """A global batch in the step's input layout (split, the device axis sharded)."""
    return self.shard(self.split(batch))

  def shard(self, batch: Batch) -> Batch:
    """Puts ``batch`` on the mesh, its leading axis split over the devices (also how
    evaluation batches are placed, whatever the strategy)."""
    return jax.device_put(batch, NamedSharding(self.mesh, P(AXIS)))


def _per_device_step(worker: WorkerFn, update: UpdateFn) -> Callable[[Any, Batch], Any]:
  """The body every device runs under ``pmap`` or ``shard_map`` (batch: ``[K, b, ...]``)."""

  def step(state: Any, micro_batches: Batch) -> Any:
    grads, stats, aux = worker(state, micro_batches)
    # Replaces lax.pmean(grads): also all-reduces the per-layer squared norms, S = devices x K.
    grads, stats = ol.all_reduce_grad_stats(grads, AXIS, local_stats=stats)
    # Metrics, and BatchNorm statistics: every device normalised with its own micro-batches
    # (as PyTorch DDP does); keep one copy of the running averages by averaging them.
    return update(state, grads, stats, jax.lax.pmean(aux, AXIS))

  return step


class ShardMap(Strategy):
  """``jax.shard_map`` over the devices' mesh axis ``'batch'``."""

  name = "shard_map"

  def compile(self, worker: WorkerFn, update: UpdateFn) -> Callable[[Any, Batch], Any]:
    body = _per_device_step(worker, update)

    def local_step(state: Any, batch: Batch) -> Any:
      # The device's block of the [devices, K, b, ...] batch is [1, K, b, ...].
      return body(state, jax.tree.map(lambda x: x[0], batch))

    # check_vma=False lets pmap and shard_map share one step body. With JAX's replication
    # checking on, the body would have to differentiate w.r.t.
    # jax.lax.pcast(params, AXIS, to="varying"): jax.grad of replicated params returns
    # gradients already summed over devices (ol.all_reduce_grad_stats rejects those).
    # All outputs are replicated by construction (pmean).
    return jax.jit(
      jax.shard_map(
        local_step, mesh=self.mesh, in_specs=(P(), P(AXIS)), out_specs=(P(), P()), check_vma=False
      ),
      donate_argnums=(0,),
    )


class Pmap(Strategy):
  """``jax.pmap``: one copy of the state per device."""

  name = "pmap"

  def compile(self, worker: WorkerFn, update: UpdateFn) -> Callable[[Any, Batch], Any]:
    body = _per_device_step(worker, update)
    return jax.pmap(body, axis_name=AXIS, devices=self.devices, donate_argnums=(0,))

  def to_device(self, state: PyTree) -> PyTree:
    return flax.jax_utils.replicate(state, devices=self.devices)

  def from_device(self, state: PyTree) -> PyTree:
    return self.on_mesh(flax.jax_utils.unreplicate(state))

  def shard_batch(self, batch: Batch) -> Batch:
    return self.split(batch)  # pmap splits the leading axis over its devices


class Gspmd(Strategy):
  """Plain ``jit``: a ``vmap`` over the workers, its axis sharded over the devices."""

  name = "gspmd"

  def compile(self, worker: WorkerFn, update: UpdateFn) -> Callable[[Any, Batch], Any]:
    workers = NamedSharding(self.mesh, P(AXIS))

    def step(state: Any, batch: Batch) -> Any:
      # Keeps XLA from replicating the vmap: the worker axis stays split over the devices.
      batch = jax.lax.with_sharding_constraint(batch, workers)
      grads, stats, aux = jax.vmap(lambda b: worker(state, b))(batch)
      grads, stats = ol.stacked_grad_stats(grads, stacked_stats=stats)
      return update(state, grads, stats, jax.tree.map(lambda x: jnp.mean(x, axis=0), aux))

    return jax.jit(step, out_shardings=NamedSharding(self.mesh, P()), donate_argnums=(0,))


class PerWorkerVmap(Gspmd):
  """All S per-worker micro-batches side by side in one ``vmap``, its axis sharded over the
  devices.

  The other strategies run a device's K micro-batches one after the other (a ``lax.scan``); here
  the step is ``Gspmd``'s on a ``[S, 1, per_worker_batch, ...]`` batch, so the workers' forward
  and backward passes are one batched computation (what the deep-network study's own loop did:
  ``benchmarks/large_batch_resnet``; on a loaded 2-core CPU it was not faster than the scan,
  see that study's RESULTS.md). Each worker still normalises with its own BatchNorm batch and the
  running statistics are the workers' mean, as in every strategy; the gradients and statistics
  are those of S workers (``ol.stacked_grad_stats``), equal to the other strategies' up to float
  rounding.
  """

  name = "vmap"

  def shard_batch(self, batch: Batch) -> Batch:
    lay = self.layout
    return self.shard(
      {
        k: v.reshape(lay.num_samples, 1, lay.per_worker_batch, *v.shape[1:])
        for k, v in batch.items()
      }
    )


STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (ShardMap, Pmap, Gspmd, PerWorkerVmap)}


def create(name: str, layout: BatchLayout, worker: WorkerFn, update: UpdateFn) -> Strategy:
  """The strategy ``name`` (``config.parallel``) on ``layout.num_devices`` devices."""
  if name not in STRATEGIES:
    raise ConfigError(f"Unknown parallel {name!r}; valid parallels: {', '.join(STRATEGIES)}.")
  return STRATEGIES[name](layout, worker, update)
