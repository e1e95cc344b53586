"""Where the trainer's arrays live: the device mesh, the state's shardings and host transfers,
the same on one process and on many.

The mesh spans every process's devices (``jax.devices()``): ``num_devices`` data-parallel rows
(axis ``'batch'``) of ``model_parallel`` devices each (axis ``'model'``, only when
``model_parallel > 1``), every process contributing the same number of whole rows, in process
order. So process ``p`` holds the rows ``p * R / P ... (p + 1) * R / P - 1`` of the batch axis,
which is why it reads only those rows of every global batch (``input_pipeline.process_part``).

With ``model_parallel > 1`` every state leaf of two or more axes whose last axis divides by
``model_parallel`` (kernels' output features, and the optimizer's momenta of the same shapes) is
split over ``'model'``; everything else is replicated. The rule reads only shapes, so parameters,
BatchNorm statistics and any optimizer's state get consistent shardings without knowing the
optimizer.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

PyTree = Any
AXIS = "batch"  # the mesh / pmap axis the workers are spread over
MODEL_AXIS = "model"  # the mesh axis the kernels are split over (model_parallel > 1)


def mesh_devices(num_devices: int, model_parallel: int = 1) -> list[jax.Device]:
  """``num_devices x model_parallel`` devices, the same number from every process, in process
  order (on one process: the first local devices)."""
  total, processes = num_devices * model_parallel, jax.process_count()
  if processes == 1:
    return jax.local_devices()[:total]
  per_process = total // processes
  by_process: dict[int, list[jax.Device]] = {}
  for d in jax.devices():
    by_process.setdefault(d.process_index, []).append(d)
  return [d for p in sorted(by_process) for d in by_process[p][:per_process]]


def make_mesh(num_devices: int, model_parallel: int = 1, explicit: bool = False) -> Mesh:
  """The 1-D ``('batch',)`` mesh, or ``('batch', 'model')`` with ``model_parallel > 1``.

  ``explicit``: axes of type ``AxisType.Explicit``, whose arrays carry their sharding in their
  types (``sharding_mode='explicit'``); otherwise ``Auto`` (XLA propagates the shardings).
  """
  devices = mesh_devices(num_devices, model_parallel)
  kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
  if model_parallel == 1 and jax.process_count() == 1:
    return jax.make_mesh((num_devices,), (AXIS,), axis_types=(kind,), devices=devices)
  # Kept in this order (no topology reordering): each process's devices are whole, consecutive
  # rows of the batch axis.
  shape: tuple[int, ...] = (num_devices, model_parallel)
  names: tuple[str, ...] = (AXIS, MODEL_AXIS)
  if model_parallel == 1:
    shape, names = (num_devices,), (AXIS,)
  return Mesh(
    np.asarray(devices, dtype=object).reshape(shape), names, axis_types=(kind,) * len(names)
  )


def leaf_spec(shape: tuple[int, ...], model_parallel: int) -> P:
  """A state leaf's partition: last axis over ``'model'`` for kernels that split evenly."""
  if model_parallel > 1 and len(shape) >= 2 and shape[-1] % model_parallel == 0:
    return P(*([None] * (len(shape) - 1)), MODEL_AXIS)
  return P()


def state_sharding(tree: PyTree, mesh: Mesh) -> PyTree:
  """The sharding of every leaf of a train state (or any tree of its leaves) on ``mesh``."""
  model_parallel = dict(mesh.shape).get(MODEL_AXIS, 1)
  return jax.tree.map(lambda x: NamedSharding(mesh, leaf_spec(np.shape(x), model_parallel)), tree)


def collectives_over_gloo() -> bool:
  """Whether cross-device collectives go over gloo: CPU devices of several processes. Gloo pays
  per buffer of a combined all-reduce, and a failed exchange desynchronises the devices of one
  process (see the step's packing in ``parallel`` and the training loop)."""
  return jax.process_count() > 1 and jax.default_backend() == "cpu"


def put_global(tree: PyTree, shardings: PyTree) -> PyTree:
  """``tree``'s leaves as global arrays with ``shardings`` (a tree or one sharding for all).

  Host values (and single-process arrays) must be the same on every process: each process
  places the shards of its own devices. Global arrays are resharded on the devices.
  """

  def put(x: Any, sharding: NamedSharding) -> jax.Array:
    # Equal, not merely equivalent: an array on the one device of a 1-device mesh is equivalent
    # to it but typed without the mesh, and the step would compile again for its own outputs.
    if isinstance(x, jax.Array) and x.sharding == sharding:
      return x
    if jax.process_count() == 1 or (isinstance(x, jax.Array) and not x.is_fully_addressable):
      return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

  if isinstance(shardings, NamedSharding):
    return jax.tree.map(lambda x: put(x, shardings), tree)
  return jax.tree.map(put, tree, shardings)


def local_to_global(local: PyTree, sharding: NamedSharding) -> PyTree:
  """This process's rows (leading axis) of arrays split over ``sharding``'s batch axis, as the
  global arrays of all processes' rows."""
  if jax.process_count() == 1:  # the same arrays, half the host time of the general path
    return jax.device_put(local, sharding)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), local)


def host_value(tree: PyTree) -> PyTree:
  """NumPy values of ``tree``'s arrays on every process (replicated, sharded or local)."""

  def fetch(x: Any) -> Any:
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
      return np.asarray(jax.device_get(x))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))

  return jax.tree.map(fetch, tree)
