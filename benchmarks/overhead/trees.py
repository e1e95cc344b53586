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


def transformer_shapes(num_layers: int, d_model: int, vocab: int = 8192) -> PyTree:
  """A GPT-style decoder tree: 12 leaves per block (many small leaves, repeated shapes)."""
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
  tree = {f"block_{i:04d}": block for i in range(num_layers)}
  tree["embed"] = {"tokens": (vocab, d), "positions": (512, d)}
  tree["ln_f"] = {"scale": (d,), "bias": (d,)}
  return jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s, jnp.float32), tree, is_leaf=lambda x: isinstance(x, tuple)
  )


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


def grad_stats_for(grads: PyTree, num_samples: int = NUM_WORKERS) -> ol.GradStats:
  """Plausible statistics for ``grads`` (top = 3 x bot): per-leaf float32 scalars."""
  bot = jax.tree.map(lambda g: jnp.sum(jnp.square(g)), grads)
  top = jax.tree.map(lambda b: 3.0 * b, bot)
  return ol.GradStats(top, num_samples, bot)
