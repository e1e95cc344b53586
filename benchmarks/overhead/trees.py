"""Parameter trees the sections time: ResNet-18's, a transformer's, any number of leaves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import optax_lena as ol
from benchmarks.overhead.common import NUM_WORKERS

PyTree = Any


# ----------------------------------------------------------------------------------------------
# Parameter trees.


def resnet18_shapes(width: int = 64, num_classes: int = 10) -> PyTree:
  """Parameter shapes of examples/models.ResNet18 (62 leaves, 11.2M parameters at width 64)."""
  from examples.models import ResNet18

  model = ResNet18(num_classes=num_classes, width=width)
  x = jnp.zeros((1, 32, 32, 3), jnp.float32)
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x, train=False))["params"]


def transformer_shapes(
  num_layers: int, d_model: int, vocab: int = 8192, scanned: bool = False
) -> PyTree:
  """A GPT-style decoder tree: 12 leaves per block (many small leaves, repeated shapes).

  ``scanned``: the blocks' parameters stacked on a leading layer axis under ``blocks`` (as
  ``nn.scan`` keeps them): 12 stacked leaves whatever the depth; its layer axes are
  :func:`scanned_layer_axes`'s.
  """
  d = d_model
  block = {
    "ln1": {"scale": (d,), "bias": (d,)},
    "attn": {
      "qkv": {"kernel": (d, 3 * d), "bias": (3 * d,)},
      "out": {"kernel": (d, d), "bias": (d,)},
    },
    "ln2": {"scale": (d,), "bias": (d,)},
    "mlp": {
      "fc1": {"kernel": (d, 4 * d), "bias": (4 * d,)},
      "fc2": {"kernel": (4 * d, d), "bias": (d,)},
    },
  }
  if scanned:
    is_shape = lambda x: isinstance(x, tuple) and all(isinstance(n, int) for n in x)
    tree = {"blocks": jax.tree.map(lambda s: (num_layers, *s), block, is_leaf=is_shape)}
  else:
    tree = {f"block_{i:04d}": block for i in range(num_layers)}
  tree["embed"] = {"tokens": (vocab, d), "positions": (512, d)}
  tree["ln_f"] = {"scale": (d,), "bias": (d,)}
  return jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s, jnp.float32), tree, is_leaf=lambda x: isinstance(x, tuple)
  )


def scanned_mlp_shapes(depth: int, width: int) -> PyTree:
  """A LayerNorm MLP's parameters with its ``depth`` blocks stacked (as ``nn.scan`` keeps them,
  see ``depth.layernorm_mlp``): 4 stacked leaves under ``blocks`` and a Dense head."""
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  blocks = {
    "Dense_0": {"kernel": f32(depth, width, width), "bias": f32(depth, width)},
    "LayerNorm_0": {"scale": f32(depth, width), "bias": f32(depth, width)},
  }
  return {"blocks": blocks, "head": {"kernel": f32(width, 10), "bias": f32(10)}}


def scanned_layer_axes(path: tuple[str, ...], leaf: Any) -> int | None:
  """``layer_axes`` of the scanned trees here: axis 0 under ``blocks``, none elsewhere."""
  del leaf
  return 0 if path[0] == "blocks" else None


def leaves_tree(num_leaves: int, d_model: int = 16) -> PyTree:
  """A transformer-shaped tree with exactly ``num_leaves`` leaves (for the compile-time sweep)."""
  tree = transformer_shapes(max(num_leaves // 12, 1), d_model, vocab=64)
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  flat = flat[:num_leaves]
  while len(flat) < num_leaves:  # pad with biases
    flat.append(
      (
        (jax.tree_util.DictKey(f"extra_{len(flat)}"),),
        jax.ShapeDtypeStruct((d_model,), jnp.float32),
      )
    )
  return {jax.tree_util.keystr(path): leaf for path, leaf in flat}


def tree_info(shapes: PyTree) -> dict[str, int]:
  leaves = jax.tree.leaves(shapes)
  return {"leaves": len(leaves), "params": int(sum(np.prod(x.shape) for x in leaves))}


def materialize(shapes: PyTree, seed: int = 0, scale: float = 0.01, lead: Sequence[int] = ()):
  """Random float32 arrays for ``shapes`` (with optional leading axes), made on the host."""
  rng = np.random.default_rng(seed)

  def normal(x):
    return jnp.asarray(scale * rng.standard_normal((*lead, *x.shape), np.float32))

  return jax.tree.map(normal, shapes)


def grad_stats_for(
  grads: PyTree, num_samples: int = NUM_WORKERS, layer_axes: Any = None
) -> ol.GradStats:
  """Plausible statistics for ``grads`` (top = 3 x bot): per-leaf float32 scalars, or per-slice
  vectors for the leaves that ``layer_axes`` (a callable, as :func:`scanned_layer_axes`) gives
  a layer axis."""

  def bot_of(path, g):
    axis = None
    if layer_axes is not None:
      axis = layer_axes(tuple(str(getattr(k, "key", k)) for k in path), g)
    return jnp.sum(jnp.square(g), axis=tuple(d for d in range(g.ndim) if d != axis))

  bot = jax.tree_util.tree_map_with_path(bot_of, grads)
  top = jax.tree.map(lambda b: 3.0 * b, bot)
  return ol.GradStats(top, num_samples, bot)
