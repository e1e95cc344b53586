"""Parameters and statistics shared by the misuse tests (test_misuse.py)."""

import jax
import jax.numpy as jnp
import numpy as np

import optax_lena as ol

PARAMS = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}


def stats_for(params, s=8, seed=0):
  """``(mean_grads, GradStats)`` of S random per-worker gradients shaped like ``params``."""
  rng = np.random.RandomState(seed)
  g = jax.tree.map(lambda p: jnp.asarray(rng.randn(s, *p.shape), jnp.float32), params)
  return ol.stacked_grad_stats(g)
