"""The wire format and the shard's folded receive, in process (no Ray cluster needed)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("ray")

from optax_lena import aladdin as al
from optax_lena._src.aladdin.ray.layout import FlatLayout
from optax_lena._src.aladdin.ray.shard import folded_receive


def _params() -> dict:
  rng = np.random.default_rng(0)
  return {
    "a": rng.normal(size=(3, 5)).astype(np.float32),
    "b": {"c": rng.normal(size=(7,)).astype(np.float32), "d": np.float32(rng.normal())},
  }


@pytest.mark.parametrize("num_shards", [1, 2, 3, 23])
def test_layout_cuts_exactly_n_slices_and_round_trips(num_shards: int) -> None:
  params = _params()
  layout = FlatLayout(params, num_shards)
  vector = layout.to_vector(params)
  slices = layout.split(vector)
  assert len(slices) == num_shards == layout.num_shards
  assert max(layout.shard_sizes) - min(layout.shard_sizes) <= 1  # memory-wise, balanced
  np.testing.assert_array_equal(layout.join(slices), vector)
  jax.tree.map(np.testing.assert_array_equal, layout.to_tree(vector), params)
  jax.tree.map(np.testing.assert_array_equal, jax.jit(layout.unravel)(vector), params)
  np.testing.assert_array_equal(jax.jit(layout.ravel)(params), vector)
  alphas = np.arange(num_shards, dtype=np.float32)
  expected = np.concatenate(
    [np.full(s, a) for s, a in zip(layout.shard_sizes, alphas, strict=True)]
  )
  np.testing.assert_array_equal(layout.per_element(jnp.asarray(alphas)), expected)


def test_layout_refuses_what_it_cannot_cut() -> None:
  with pytest.raises(ValueError, match="ps_shards=24"):
    FlatLayout(_params(), 24)
  with pytest.raises(TypeError, match="floating point"):
    FlatLayout({"i": np.zeros(3, np.int32)}, 1)


def test_a_folded_call_is_the_messages_one_by_one() -> None:
  """k messages in one call leave the state and the reply of k separate receives, rejections
  (NaN, or the sender's verdict) included."""
  import optax

  n, period, size = 3, 4, 10
  server = al.algorithm("aladdin", worker_tx=optax.sgd(0.1), period=period).server(n)
  receive = jax.jit(folded_receive(server))
  rng = np.random.default_rng(1)
  messages = rng.normal(size=(period, size)).astype(np.float32)
  messages[1, 3] = np.nan
  finite = np.asarray([True, True, False, True])
  one_by_one = folded = server.init(jnp.zeros(size, jnp.float32))
  for worker in (0, 1, 0):  # 2 accepted per fold: worker 0 triggers in its second fold
    replies = []
    for row in range(period):
      row_msg = messages[row] if finite[row] else messages[row] * np.nan
      one_by_one, reply = server.receive(one_by_one, row_msg, worker)
      replies.append(reply)
    folded, ready, alpha, params = receive(folded, messages, finite, np.int32(worker))
    jax.tree.map(np.testing.assert_array_equal, folded, one_by_one)
    triggered = [r for r in replies if bool(r.ready)]
    assert bool(ready) == bool(triggered) and len(triggered) <= 1
    if triggered:
      np.testing.assert_array_equal(params, triggered[0].params)
      assert float(alpha) == float(triggered[0].alpha)
  assert int(folded.num_rejected) == 6 and int(folded.num_updates) == 1
