"""The wire format: a model, gradient or update as ONE contiguous 1-D buffer, cut into exactly
``num_shards`` slices of (nearly) equal size, one per parameter-server shard (the paper's
memory-wise sharding; ``docs/ALADDIN-ray.md``, "The wire format").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


class FlatLayout:
  """The wire format: a model as one flat vector, and the shards' slices of it.

  ``ravel(tree) -> vector``, ``unravel(vector) -> tree``. The vector has one dtype, the widest
  floating dtype of the leaves (a mixed bf16/float32 model travels and is served in float32;
  ``unravel`` casts every leaf back to its own dtype).

  Args:
    params: the model (a pytree of floating-point arrays), whose structure, shapes and dtypes
      the layout records.
    num_shards: the number of PS shards to cut the vector into (1 to the number of
      parameters).

  Raises:
    ValueError: an empty model, or ``num_shards`` outside 1 to the number of parameters.
    TypeError: a parameter that is not floating point.
  """

  def __init__(self, params: PyTree, num_shards: int):
    leaves, self.treedef = jax.tree.flatten(params)
    if not leaves:
      raise ValueError("The model has no parameters (an empty pytree).")
    self.shapes = [tuple(np.shape(x)) for x in leaves]
    self.dtypes = [np.dtype(getattr(x, "dtype", np.float32)) for x in leaves]
    if not all(np.issubdtype(d, np.floating) for d in self.dtypes):
      raise TypeError(f"Every parameter must be floating point, got dtypes {self.dtypes}.")
    self.dtype = np.dtype(np.result_type(*self.dtypes))
    self.sizes = [math.prod(s) for s in self.shapes]
    self.size = sum(self.sizes)
    if not 1 <= num_shards <= self.size:
      raise ValueError(
        f"ps_shards={num_shards}: a model of {self.size} parameters can be cut into 1 to "
        f"{self.size} shards."
      )
    self.num_shards = num_shards
    self.bounds = [round(k * self.size / num_shards) for k in range(num_shards + 1)]
    self.shard_sizes = [b - a for a, b in zip(self.bounds, self.bounds[1:], strict=False)]

  def ravel(self, tree: PyTree, xp: Any = None) -> Any:
    """The tree as one vector of ``self.dtype`` (traceable; ``xp=np``: in NumPy, on the host)."""
    xp = jnp if xp is None else xp
    return xp.concatenate(
      [xp.ravel(xp.asarray(x)).astype(self.dtype) for x in jax.tree.leaves(tree)]
    )

  def unravel(self, vector: Any, cast: bool = True) -> PyTree:
    """The inverse of :meth:`ravel`, every leaf in its own shape and dtype (traceable; with
    ``cast=False`` in the vector's dtype)."""
    offsets = np.cumsum([0, *self.sizes])
    leaves = [
      vector[a:b].reshape(shape).astype(dtype if cast else vector.dtype)
      for a, b, shape, dtype in zip(offsets, offsets[1:], self.shapes, self.dtypes, strict=False)
    ]
    return jax.tree.unflatten(self.treedef, leaves)

  def per_element(self, per_shard: Any) -> Any:
    """A ``[num_shards]`` vector repeated over each shard's slice (traceable)."""
    return jnp.repeat(per_shard, np.asarray(self.shard_sizes), total_repeat_length=self.size)

  def to_vector(self, tree: PyTree) -> np.ndarray:
    """:meth:`ravel` in NumPy (the driver's and the restarts' copy of a model)."""
    return self.ravel(tree, np)

  def to_tree(self, vector: np.ndarray) -> PyTree:
    """:meth:`unravel` in NumPy."""
    return self.unravel(np.asarray(vector))

  def split(self, vector: np.ndarray) -> list[np.ndarray]:
    """The shards' slices of ``vector`` (its last axis), as views."""
    return [vector[..., a:b] for a, b in zip(self.bounds, self.bounds[1:], strict=False)]

  def join(self, slices: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(s) for s in slices], axis=-1)


@dataclasses.dataclass(frozen=True)
class Rejected:
  """A PS shard's answer to a call it refused as malformed (never applied, counted as one
  malformed message): ``reason`` says why, so that the sender can stop with it."""

  reason: str
