"""Memory-wise parameter sharding (ALADDIN, Section 3.3)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from optax_lena import aladdin as al

PARAMS = {
  "conv": jnp.arange(2 * 3 * 4, dtype=jnp.float32).reshape(2, 3, 4) / 7.0,  # 96 bytes
  "fc": jnp.linspace(-1.0, 1.0, 50, dtype=jnp.float32).reshape(10, 5),  # 200 bytes
  "half": jnp.linspace(0.0, 1.0, 6).astype(jnp.bfloat16),  # 12 bytes
  "f16": jnp.linspace(0.0, 1.0, 3).astype(jnp.float16).reshape(3, 1),  # 6 bytes
  "scale": jnp.asarray(0.5, jnp.float32),  # a scalar leaf
}


def assert_trees_identical(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(
      np.asarray(x).reshape(-1).view(np.uint8), np.asarray(y).reshape(-1).view(np.uint8)
    )


@pytest.mark.parametrize("max_bytes", [4, 16, 40, 96, 100, 250, 10**6])
def test_split_merge_roundtrip_is_bitwise(max_bytes):
  spec = al.shard_params(PARAMS, max_bytes)
  shards = spec.split(PARAMS)
  assert len(shards) == spec.num_shards
  assert all(0 < b <= max_bytes for b in spec.shard_bytes())
  assert sum(spec.shard_bytes()) == sum(x.nbytes for x in jax.tree.leaves(PARAMS))
  assert_trees_identical(spec.merge(shards), PARAMS)
  assert_trees_identical(jax.jit(lambda t: spec.merge(spec.split(t)))(PARAMS), PARAMS)


def test_large_leaf_split_small_leaves_whole():
  spec = al.shard_params(PARAMS, 100)
  shards = spec.split(PARAMS)
  # fc (200 bytes) is larger than a shard: cut into 1-D slices over several shards.
  fc = sorted(PARAMS).index("fc")  # leaves in the tree's (sorted-key) order
  fc_pieces = [
    (k, p) for k, shard in enumerate(spec.shards) for p in shard if p.leaf == fc and not p.whole
  ]
  assert len({k for k, _ in fc_pieces}) >= 2
  # conv (96 bytes) fits in one shard: kept whole, in its own shape.
  assert (2, 3, 4) in [x.shape for shard in shards for x in shard]
  # conv | f16 + 23 fc elements (f16 did not fit after conv) | 25 fc | 2 fc + half + scale.
  assert spec.shard_bytes() == [96, 98, 100, 24]


def run(server, state, grads_seq, order):
  receive = jax.jit(server.receive)
  replies = []
  for worker, grads in zip(order, grads_seq, strict=True):
    state, reply = receive(state, grads, jnp.int32(worker))
    replies.append(reply)
  return state, replies


@pytest.mark.parametrize("max_bytes", [16, 100, 250])
def test_sharded_servers_equal_unsharded(max_bytes):
  params = {k: v for k, v in PARAMS.items() if v.dtype == jnp.float32}
  rng = np.random.default_rng(0)
  order = [0, 1, 1, 0, 2, 0, 1, 0, 2, 2, 1, 0]
  grads_seq = [
    jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params) for _ in order
  ]
  kwargs = {"period": 2, "normalise": "mean", "alpha": "count"}
  tx = optax.sgd(0.1, momentum=0.9)
  whole = al.parameter_server(3, tx, **kwargs)
  spec = al.shard_params(params, max_bytes)
  sharded = al.sharded_parameter_server(3, tx, spec, **kwargs)
  assert spec.num_shards > 1
  w_state, w_replies = run(whole, whole.init(params), grads_seq, order)
  s_state, s_replies = run(sharded, sharded.init(params), grads_seq, order)
  for wr, sr in zip(w_replies, s_replies, strict=True):
    assert bool(wr.ready) == bool(sr.ready)
    assert float(wr.alpha) == float(sr.alpha)
    # Elementwise operations on the same numbers: bit for bit.
    assert_trees_identical(sr.params, wr.params)
  assert_trees_identical(spec.merge([s.params for s in s_state.shards]), w_state.params)
  for shard in s_state.shards:  # every shard saw every message: equal counters
    assert shard.worker_counts.tolist() == w_state.worker_counts.tolist()
    assert int(shard.count) == int(w_state.count)
    assert int(shard.num_updates) == int(w_state.num_updates) > 0


def test_sharded_nonfinite_rejected_by_every_shard():
  params = {"a": jnp.zeros(8), "b": jnp.zeros(8)}
  spec = al.shard_params(params, 16)
  server = al.sharded_parameter_server(2, optax.sgd(0.1), spec, period=2)
  state = server.init(params)
  bad = {"a": jnp.ones(8), "b": jnp.ones(8).at[7].set(jnp.nan)}  # NaN in the last shard only
  new_state, reply = jax.jit(server.receive)(state, bad, 0)
  assert not bool(reply.ready)
  for before, after in zip(state.shards, new_state.shards, strict=True):
    assert int(after.num_rejected) == 1
    assert after.worker_counts.tolist() == [0, 0]
    np.testing.assert_array_equal(jnp.concatenate(after.grad_sum), jnp.zeros(4))
    del before
