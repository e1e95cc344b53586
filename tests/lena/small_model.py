"""A small two-layer model whose per-worker gradients depend on the parameters, and bitwise
tree comparisons: what test_reliability.py and test_scale_and_purity.py share."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

S = 4  # workers of the small runs
NUM_DEVICES = 8  # tests/conftest.py
THETA = 20.0  # state-aware theta: warm-ups span ~5-8 updates of the small runs
SCHEDULE = optax.exponential_decay(0.05, transition_steps=10, decay_rate=0.5)


def small_params(dtype=jnp.float32):
  rng = np.random.RandomState(0)
  return {
    "dense": {
      "kernel": jnp.asarray(rng.randn(3, 4) * 0.5, dtype),
      "bias": jnp.asarray(rng.randn(4) * 0.1, dtype),
    },
    "out": {
      "kernel": jnp.asarray(rng.randn(4, 2) * 0.5, dtype),
      "bias": jnp.asarray(rng.randn(2) * 0.1, dtype),
    },
  }


def small_loss(params, x, y):
  h = jnp.tanh(x @ params["dense"]["kernel"] + params["dense"]["bias"])
  return jnp.mean((h @ params["out"]["kernel"] + params["out"]["bias"] - y) ** 2)


def worker_batches(rng, steps, s=S, batch=6):
  x = rng.randn(steps, s, batch, 3).astype(np.float32)
  y = (np.sin(x.sum(-1, keepdims=True)) + 0.3 * rng.randn(steps, s, batch, 1)).astype(np.float32)
  return np.concatenate([y, -y], -1), x


def tree_bits(tree):
  """Leaves as integer bit patterns: array_equal on them is a bitwise comparison."""

  def bits(x):
    x = np.asarray(x)
    if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
      return x.view(np.dtype(f"u{x.dtype.itemsize}"))
    return x

  return [bits(x) for x in jax.tree.leaves(tree)]


def assert_trees_bitwise_equal(a, b, what=""):
  assert jax.tree.structure(a) == jax.tree.structure(b), what
  for x, y in zip(tree_bits(a), tree_bits(b), strict=True):
    np.testing.assert_array_equal(x, y, err_msg=what)


def stacked_grads(params, seed, s=S, scale=1.0):
  rng = np.random.RandomState(seed)
  return jax.tree.map(
    lambda p: jnp.asarray(scale * (0.2 + rng.randn(s, *p.shape)), p.dtype), params
  )
