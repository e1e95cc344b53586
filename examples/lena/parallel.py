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

The mesh, the state's shardings and the host transfers are ``mesh``'s: on several processes the
mesh spans all their devices and :meth:`Strategy.shard_batch` receives this process's rows of the
global batch; with ``model_parallel > 1`` the kernels are split over the mesh axis ``'model'``
(shard_map is then manual over ``'batch'`` only, so the statistics are reduced over the data axis
and XLA adds the model-axis sums). pmap is single-process and unsharded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import flax.jax_utils
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import optax_lena as ol
from examples.lena import mesh as mesh_lib
from examples.lena.configs import Config, ConfigError
from examples.lena.mesh import AXIS

PyTree = Any
Batch = dict[str, np.ndarray]
SHARDING_MODES = ("auto", "explicit")
# worker(state, micro_batches) -> (grads, stats, aux): one worker's K micro-batches ([K, b, ...]
# leaves); aux (metrics, BatchNorm statistics) is averaged over the workers.
WorkerFn = Callable[[Any, Batch], tuple[PyTree, ol.GradStats, PyTree]]
# update(state, grads, stats, aux) -> (new state, metrics), from the combined gradients.
UpdateFn = Callable[[Any, PyTree, ol.GradStats, PyTree], tuple[Any, dict[str, jax.Array]]]


@dataclasses.dataclass(frozen=True)
class BatchLayout:
  """How one update's global batch is split: devices x micro-batches x per-worker batch."""

  per_worker_batch: int
  num_devices: int  # data-parallel devices (rows of the mesh), over all processes
  micro_batches: int
  model_parallel: int = 1  # devices per row, over which the kernels are split

  @property
  def num_samples(self) -> int:
    """S, the number of per-worker gradients one update averages."""
    return self.num_devices * self.micro_batches

  @property
  def global_batch(self) -> int:
    return self.num_samples * self.per_worker_batch


def num_samples(config: Config) -> int:
  """S of ``config``: ``batch_scale``, or ``global_batch_size / per_worker_batch`` when set.

  Raises:
    ConfigError: a batch that is not positive or not whole per-worker batches.
  """
  b = config.per_worker_batch
  if b < 1:
    raise ConfigError(f"per_worker_batch must be positive, got {b}.")
  if config.global_batch_size > 0:
    if config.global_batch_size % b:
      raise ConfigError(
        f"global_batch_size {config.global_batch_size} is not a multiple of per_worker_batch "
        f"{b}; use e.g. global_batch_size={max(1, config.global_batch_size // b) * b}."
      )
    return config.global_batch_size // b
  if config.batch_scale < 1:
    raise ConfigError(f"batch_scale must be positive, got {config.batch_scale}.")
  return config.batch_scale


def batch_layout(config: Config, device_count: int, process_count: int = 1) -> BatchLayout:
  """Splits the global batch into devices x micro-batches x per-worker batch.

  Args:
    config: uses ``per_worker_batch``, ``batch_scale`` or ``global_batch_size``,
      ``num_devices`` and ``micro_batches`` (0 = automatic) and ``model_parallel``.
    device_count: devices available, over all processes.
    process_count: processes; each holds the same number of the data-parallel devices.

  Returns:
    The layout.

  Raises:
    ConfigError: if the numbers do not multiply up (the message says what to change).
  """
  b, s = config.per_worker_batch, num_samples(config)
  global_batch = s * b
  mp, procs = config.model_parallel, process_count
  if (device_count // procs) % mp:
    raise ConfigError(
      f"model_parallel={mp} does not divide the {device_count // procs} devices of each "
      f"process; use a divisor of {device_count // procs}."
    )
  rows = device_count // mp  # data-parallel devices available
  if config.num_devices > rows:
    raise ConfigError(
      f"num_devices={config.num_devices} x model_parallel={mp} but only {device_count} devices "
      "are available (on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N simulates "
      "N devices per process)."
    )
  devices, micro = config.num_devices, config.micro_batches
  if devices <= 0 and micro > 0 and s % micro == 0 and s // micro <= rows:
    devices = s // micro
  elif devices <= 0:
    # The largest divisor of S that fits (and splits over the processes): all devices when S
    # is a multiple of their count.
    fits = [d for d in range(1, min(s, rows) + 1) if s % d == 0 and d % procs == 0]
    if not fits:
      raise ConfigError(
        f"S={s} per-worker batches cannot be spread over {procs} processes: make batch_scale "
        f"a multiple of {procs}."
      )
    devices = max(fits)
  if devices % procs:
    raise ConfigError(
      f"num_devices={devices} does not split over {procs} processes (each needs the same "
      f"number of devices): use a multiple of {procs}."
    )
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
  return BatchLayout(
    per_worker_batch=b, num_devices=devices, micro_batches=micro, model_parallel=mp
  )


def describe_placement(layout: BatchLayout) -> str:
  """`` on P processes`` / `` x M model-parallel devices`` for the run's log line."""
  text = f" on {jax.process_count()} processes" if jax.process_count() > 1 else ""
  if layout.model_parallel > 1:
    text += f", kernels split over {layout.model_parallel} devices per worker"
  return text


class Strategy:
  """A parallel path: the compiled step and how states and batches are laid out for it.

  States live "on the mesh" (replicated over ``mesh``, kernels split over its ``'model'`` axis
  with ``model_parallel > 1``) between steps that the host inspects (evaluation, checkpoints);
  :meth:`to_device` / :meth:`from_device` convert to and from the layout the step wants.
  ``layer_axes`` (the optimizer's) go to the statistics functions that combine the workers'.
  """

  name: ClassVar[str]
  # Whether the strategy runs on a mesh of explicit axes (sharding_mode='explicit').
  supports_explicit: ClassVar[bool] = False

  def __init__(
    self,
    layout: BatchLayout,
    worker: WorkerFn,
    update: UpdateFn,
    sharding_mode: str = "auto",
    layer_axes: Any = None,
  ):
    if sharding_mode not in SHARDING_MODES:
      raise ConfigError(
        f"Unknown sharding_mode {sharding_mode!r}; valid sharding_modes: "
        f"{', '.join(SHARDING_MODES)}."
      )
    self.explicit = sharding_mode == "explicit"
    if self.explicit and not (self.supports_explicit and layout.model_parallel == 1):
      raise ConfigError(
        "sharding_mode='explicit' runs the jit (GSPMD) path with replicated parameters: use "
        "parallel='gspmd' or 'vmap' with model_parallel=1, or sharding_mode='auto'."
      )
    self.layout = layout
    self.layer_axes = layer_axes
    self.mesh = mesh_lib.make_mesh(layout.num_devices, layout.model_parallel, self.explicit)
    self.devices = list(self.mesh.devices.flat)
    # The workers of this process's devices (all of them on one process).
    self.local_workers = layout.num_devices // jax.process_count()
    self.step = self.compile(worker, update)

  def compile(self, worker: WorkerFn, update: UpdateFn) -> Callable[[Any, Batch], Any]:
    """``step(state, batch) -> (state, metrics)``, donating the state."""
    raise NotImplementedError

  def on_mesh(self, tree: PyTree) -> PyTree:
    """``tree`` on the mesh (checkpoints and evaluation use this layout): replicated, or its
    kernels split over ``'model'`` (:func:`mesh.state_sharding`)."""
    if self.layout.model_parallel == 1:
      return mesh_lib.put_global(tree, NamedSharding(self.mesh, P()))
    return mesh_lib.put_global(tree, mesh_lib.state_sharding(tree, self.mesh))

  def constrain(self, outputs: tuple[PyTree, PyTree]) -> tuple[PyTree, PyTree]:
    """Inside a step: the new state in :meth:`on_mesh`'s layout, the metrics replicated."""
    state, step_metrics = outputs
    return jax.lax.with_sharding_constraint(
      (state, step_metrics),
      (mesh_lib.state_sharding(state, self.mesh), NamedSharding(self.mesh, P())),
    )

  def to_device(self, state: PyTree) -> PyTree:
    """The step's state layout (replicated on the mesh unless a strategy says otherwise)."""
    return self.on_mesh(state)

  def from_device(self, state: PyTree) -> PyTree:
    """The step's state back in the mesh-replicated layout of :meth:`on_mesh`."""
    return self.on_mesh(state)

  def split(self, batch: Batch) -> Batch:
    """This process's rows of a global batch as ``[local workers, K, per_worker_batch, ...]``
    (on one process: the global batch ``[G, ...]`` as ``[devices, K, b, ...]``)."""
    lay = self.layout
    return {
      k: v.reshape(self.local_workers, lay.micro_batches, lay.per_worker_batch, *v.shape[1:])
      for k, v in batch.items()
    }

  def shard_batch(self, batch: Batch) -> Batch:
    """This process's rows of a global batch in the step's input layout (split, the device
    axis sharded over all processes' devices)."""
    return self.shard_local(self.split(batch))

  def shard_local(self, batch: Batch) -> Batch:
    """The global arrays whose leading axis, split over the devices, holds every process's
    ``batch`` (this process's rows)."""
    return mesh_lib.local_to_global(batch, NamedSharding(self.mesh, P(AXIS)))

  def shard(self, batch: Batch) -> Batch:
    """Puts ``batch`` (the same on every process) on the mesh, its leading axis split over the
    devices (how evaluation batches are placed, whatever the strategy)."""
    return mesh_lib.put_global(batch, NamedSharding(self.mesh, P(AXIS)))


def _per_device_step(
  worker: WorkerFn, update: UpdateFn, packed: bool = False, layer_axes: Any = None
) -> Callable[[Any, Batch], Any]:
  """The body every device runs under ``pmap`` or ``shard_map`` (batch: ``[K, b, ...]``);
  ``packed``: all-reduce one flat buffer instead of one per leaf; ``layer_axes``: the
  optimizer's, for per-slice statistics."""

  def step(state: Any, micro_batches: Batch) -> Any:
    grads, stats, aux = worker(state, micro_batches)
    # Replaces lax.pmean(grads): also all-reduces the per-layer squared norms, S = devices x K.
    # Metrics, and BatchNorm statistics: every device normalised with its own micro-batches
    # (as PyTorch DDP does); keep one copy of the running averages by averaging them.
    grads, stats, aux = ol.all_reduce_grad_stats(
      grads, AXIS, local_stats=stats, packed=packed, aux=aux, layer_axes=layer_axes
    )
    return update(state, grads, stats, aux)

  return step


class ShardMap(Strategy):
  """``jax.shard_map`` over the devices' mesh axis ``'batch'``."""

  name = "shard_map"

  def compile(self, worker: WorkerFn, update: UpdateFn) -> Callable[[Any, Batch], Any]:
    # CPU devices of several processes reduce over gloo, which makes one exchange per buffer of
    # a combined all-reduce: one flat buffer instead of one per leaf is 6x faster for the
    # default CNN (benchmarks/multihost). Not with kernels split over 'model' (the buffer would
    # gather them), nor on one process, where the step stays exactly as it was.
    packed = mesh_lib.collectives_over_gloo() and self.layout.model_parallel == 1
    body = _per_device_step(worker, update, packed, self.layer_axes)

    def local_step(state: Any, batch: Batch) -> Any:
      # The device's block of the [devices, K, b, ...] batch is [1, K, b, ...].
      return body(state, jax.tree.map(lambda x: x[0], batch))

    # check_vma=False lets pmap and shard_map share one step body. With JAX's replication
    # checking on, the body would have to differentiate w.r.t.
    # jax.lax.pcast(params, AXIS, to="varying"): jax.grad of replicated params returns
    # gradients already summed over devices (ol.all_reduce_grad_stats rejects those).
    # All outputs are replicated over 'batch' by construction (pmean).
    if self.layout.model_parallel == 1:
      return jax.jit(
        jax.shard_map(
          local_step, mesh=self.mesh, in_specs=(P(), P(AXIS)), out_specs=(P(), P()), check_vma=False
        ),
        donate_argnums=(0,),
      )
    # Manual over 'batch' only: the kernels stay split over the automatic 'model' axis, the
    # collectives above reduce over the data axis and XLA adds the model-axis partial sums.
    mapped = jax.shard_map(
      local_step,
      mesh=self.mesh,
      in_specs=(P(), P(AXIS)),
      out_specs=(P(), P()),
      axis_names={AXIS},
      check_vma=False,
    )
    return jax.jit(lambda state, batch: self.constrain(mapped(state, batch)), donate_argnums=(0,))


class Pmap(Strategy):
  """``jax.pmap``: one copy of the state per device."""

  name = "pmap"

  def __init__(
    self,
    layout: BatchLayout,
    worker: WorkerFn,
    update: UpdateFn,
    sharding_mode: str = "auto",
    layer_axes: Any = None,
  ):
    if jax.process_count() > 1 or layout.model_parallel > 1:
      raise ConfigError(
        "parallel='pmap' runs on one process with replicated parameters; use "
        "parallel=shard_map or gspmd for several processes or model_parallel > 1."
      )
    super().__init__(layout, worker, update, sharding_mode, layer_axes)

  def compile(self, worker: WorkerFn, update: UpdateFn) -> Callable[[Any, Batch], Any]:
    body = _per_device_step(worker, update, layer_axes=self.layer_axes)
    return jax.pmap(body, axis_name=AXIS, devices=self.devices, donate_argnums=(0,))

  def to_device(self, state: PyTree) -> PyTree:
    return flax.jax_utils.replicate(state, devices=self.devices)

  def from_device(self, state: PyTree) -> PyTree:
    # Device 0's copy; not flax.jax_utils.unreplicate, which on a single device keeps the
    # leading axis of length 1 (it takes that output for a fully replicated one).
    return self.on_mesh(jax.tree.map(lambda x: x.addressable_data(0).reshape(x.shape[1:]), state))

  def shard_batch(self, batch: Batch) -> Batch:
    return self.split(batch)  # pmap splits the leading axis over its devices


class Gspmd(Strategy):
  """Plain ``jit``: a ``vmap`` over the workers, its axis sharded over the devices."""

  name = "gspmd"

  supports_explicit = True

  def compile(self, worker: WorkerFn, update: UpdateFn) -> Callable[[Any, Batch], Any]:
    workers = NamedSharding(self.mesh, P(AXIS))

    def step(state: Any, batch: Batch) -> Any:
      # Keeps XLA from replicating the vmap: the worker axis stays split over the devices. On
      # an explicit mesh that split is the batch's type already (shard_batch put it there).
      if not self.explicit:
        batch = jax.lax.with_sharding_constraint(batch, workers)
      workers_fn = lambda state, batch: jax.vmap(lambda b: worker(state, b))(batch)
      if self.explicit:
        # The model's layers run with XLA's propagation (Flax's conv batching rule folds the
        # vmapped worker axis into the conv batch, a reshape that explicit types do not yet
        # allow across a sharded axis); their outputs come back typed, the worker axis over
        # 'batch', and everything after (statistics, optimizer, reductions) is explicit.
        workers_fn = jax.sharding.auto_axes(workers_fn, axes=AXIS, out_sharding=P(AXIS))
      grads, stats, aux = workers_fn(state, batch)
      grads, stats = ol.stacked_grad_stats(grads, stacked_stats=stats, layer_axes=self.layer_axes)
      return update(state, grads, stats, jax.tree.map(lambda x: jnp.mean(x, axis=0), aux))

    if self.explicit:
      # Under the mesh its explicit axes are the types of the traced arrays: the worker axis
      # typed 'batch', the parameters, statistics and updates replicated (the reductions over
      # the worker axis are the all-reduces).
      jitted = jax.jit(step, donate_argnums=(0,))

      def explicit_step(state: Any, batch: Batch) -> Any:
        with jax.set_mesh(self.mesh):
          return jitted(state, batch)

      return explicit_step
    if self.layout.model_parallel == 1:
      return jax.jit(step, out_shardings=NamedSharding(self.mesh, P()), donate_argnums=(0,))
    return jax.jit(lambda state, batch: self.constrain(step(state, batch)), donate_argnums=(0,))


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
    local_samples = self.local_workers * lay.micro_batches  # this process's workers
    return self.shard_local(
      {k: v.reshape(local_samples, 1, lay.per_worker_batch, *v.shape[1:]) for k, v in batch.items()}
    )


STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (ShardMap, Pmap, Gspmd, PerWorkerVmap)}


def create(
  name: str,
  layout: BatchLayout,
  worker: WorkerFn,
  update: UpdateFn,
  sharding_mode: str = "auto",
  layer_axes: Any = None,
) -> Strategy:
  """The strategy ``name`` (``config.parallel``) on ``layout.num_devices`` devices, its mesh's
  axes ``Auto`` or ``Explicit`` (``config.sharding_mode``; explicit for gspmd and vmap); the
  workers' statistics combined per slice of the stacked parameters with ``layer_axes`` (the
  optimizer's; None: per leaf)."""
  if name not in STRATEGIES:
    raise ConfigError(f"Unknown parallel {name!r}; valid parallels: {', '.join(STRATEGIES)}.")
  return STRATEGIES[name](layout, worker, update, sharding_mode, layer_axes)
