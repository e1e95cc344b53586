"""A small attention model for MNIST-1D sequences (the study's offline task).

Each MNIST-1D example is a length-40 signal; the model cuts it into patches (tokens), embeds
them with a learned position embedding and runs pre-LayerNorm transformer blocks (multi-head
self-attention and an MLP), then mean-pools the tokens into the 10 class logits. Small enough to
train dozens of runs on two CPU cores, but with the leaf types of a transformer (attention
projections, MLP kernels, LayerNorm scales, biases, embeddings) whose gradient noise differs.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class Block(nn.Module):
  """Pre-LayerNorm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

  num_heads: int
  mlp_dim: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    y = nn.LayerNorm()(x)
    x = x + nn.MultiHeadDotProductAttention(num_heads=self.num_heads)(y, y)
    y = nn.LayerNorm()(x)
    y = nn.Dense(self.mlp_dim)(y)
    return x + nn.Dense(x.shape[-1])(nn.gelu(y))


class PatchTransformer(nn.Module):
  """Patches of ``patch`` samples -> ``depth`` blocks of width ``dim`` -> mean pool -> logits."""

  num_classes: int = 10
  patch: int = 4
  dim: int = 24
  depth: int = 1
  num_heads: int = 2
  mlp_dim: int = 48

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    tokens = x.reshape(*x.shape[:-1], x.shape[-1] // self.patch, self.patch)
    h = nn.Dense(self.dim, name="embed")(tokens)
    position = self.param("position", nn.initializers.normal(0.02), h.shape[-2:])
    h = h + position
    for _ in range(self.depth):
      h = Block(self.num_heads, self.mlp_dim)(h)
    h = nn.LayerNorm()(h)
    return nn.Dense(self.num_classes, name="head")(jnp.mean(h, axis=-2))


def decay_mask(params):
  """Weight decay on kernels only (not biases, LayerNorm scales or the position embedding)."""
  return jax.tree_util.tree_map_with_path(
    lambda path, _: getattr(path[-1], "key", "") == "kernel", params
  )
