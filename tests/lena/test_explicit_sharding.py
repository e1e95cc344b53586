"""The statistics and the ready optimizers under an explicit-axis mesh (sharding in the types).

Parameters sharded on one axis of a 1-D mesh and on both axes of a 2-D mesh; the statistics and
the updates equal a float64 NumPy reference to float32 rounding, and every state leaf keeps its
type (``jax.typeof``: shape, dtype and sharding) through ``init`` and a jitted ``update``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import optax_lena as ol

S = 4
pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")


def _mesh(shape):
  names = ("x", "y")[: len(shape)]
  return jax.make_mesh(shape, names, axis_types=(AxisType.Explicit,) * len(shape))


# (mesh shape, spec of "w" of shape (2, 8, 4), spec of "b" of shape (8,))
LAYOUTS = [((8,), P(None, "x"), P("x")), ((2, 4), P("x", "y"), P("y"))]


def _grads(mesh, w_spec, b_spec):
  rng = np.random.default_rng(0)
  host = {
    "w": rng.normal(size=(S, 2, 8, 4)).astype(np.float32),
    "b": rng.normal(size=(S, 8)).astype(np.float32),
  }
  stacked = {
    "w": jax.device_put(host["w"], NamedSharding(mesh, P(None, *w_spec))),
    "b": jax.device_put(host["b"], NamedSharding(mesh, P(None, *b_spec))),
  }
  return host, stacked


@pytest.mark.parametrize(("shape", "w_spec", "b_spec"), LAYOUTS, ids=["1d", "2d"])
def test_stats_and_lena_under_an_explicit_mesh(shape, w_spec, b_spec):
  mesh = _mesh(shape)
  with jax.set_mesh(mesh):
    host, stacked = _grads(mesh, w_spec, b_spec)
    params = {
      "w": jnp.zeros((2, 8, 4), out_sharding=NamedSharding(mesh, w_spec)),
      "b": jnp.zeros((8,), out_sharding=NamedSharding(mesh, b_spec)),
    }
    mean, stats = jax.jit(ol.stacked_grad_stats)(stacked)
    for key, g in host.items():
      g64 = g.astype(np.float64)
      np.testing.assert_allclose(mean[key], g64.mean(0), rtol=1e-6, atol=1e-7)
      top = np.mean([np.sum(gi * gi) for gi in g64])
      np.testing.assert_allclose(stats.sq_norm_mean[key], top, rtol=1e-5)
      np.testing.assert_allclose(stats.mean_grad_sq_norm[key], np.sum(g64.mean(0) ** 2), rtol=1e-5)
      assert jax.typeof(mean[key]).sharding.spec == jax.typeof(params[key]).sharding.spec

    tx = ol.lena(0.1, num_samples=S)
    state = tx.init(params)
    types = jax.tree.map(jax.typeof, state)
    updates, new_state = jax.jit(lambda m, s, st: tx.update(m, s, params, grad_stats=st))(
      mean, state, stats
    )
    assert jax.tree.map(jax.typeof, new_state) == types
    for key in host:
      assert jax.typeof(updates[key]) == jax.typeof(params[key])

  # The same update without a mesh (Auto, unsharded) agrees to float32 rounding.
  plain_mean, plain_stats = ol.stacked_grad_stats(jax.tree.map(jnp.asarray, host))
  plain_params = jax.tree.map(lambda p: jnp.zeros(p.shape), host)
  plain_params = {k: v[0] for k, v in plain_params.items()}
  plain_tx = ol.lena(0.1, num_samples=S)
  plain_updates, _ = plain_tx.update(
    plain_mean, plain_tx.init(plain_params), plain_params, grad_stats=plain_stats
  )
  for key in host:
    np.testing.assert_allclose(updates[key], plain_updates[key], rtol=1e-6, atol=1e-8)


def test_accumulated_stats_keep_the_gradients_sharding():
  mesh = _mesh((8,))
  with jax.set_mesh(mesh):
    w = jnp.ones((8, 4), out_sharding=NamedSharding(mesh, P("x")))
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(S, 3, 4)).astype(np.float32)

    def loss(p, x):
      return jnp.sum(jnp.tanh(x @ p.T))

    _, mean, stats = jax.jit(lambda p, b: ol.accumulate_grad_stats(loss, p, b))(w, jnp.asarray(xs))
    assert jax.typeof(mean) == jax.typeof(w)
  per_batch = np.stack([np.asarray(jax.grad(loss)(jnp.ones((8, 4)), x), np.float64) for x in xs])
  np.testing.assert_allclose(mean, per_batch.mean(0), rtol=1e-5, atol=1e-6)
  top = np.mean([np.sum(g * g) for g in per_batch])
  np.testing.assert_allclose(stats.sq_norm_mean, top, rtol=1e-5)
