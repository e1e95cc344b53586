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


@pytest.mark.parametrize("fold", [4, 7])
def test_a_folded_call_is_the_messages_one_by_one(fold: int) -> None:
  """k messages in one call leave the state and the replies of k separate receives, rejections
  (NaN, or the sender's verdict) included; a fold longer than the period returns every global
  update it triggered, in order."""
  import optax

  n, period, size = 3, 2, 10
  server = al.algorithm("aladdin", worker_tx=optax.sgd(0.1), period=period).server(n)
  receive = jax.jit(folded_receive(server, period))
  rng = np.random.default_rng(1)
  messages = rng.normal(size=(fold, size)).astype(np.float32)
  messages[1, 3] = np.nan
  finite = np.ones(fold, bool)
  finite[2] = False
  one_by_one = folded = server.init(jnp.zeros(size, jnp.float32))
  triggers, most = 0, 0
  for worker in (0, 1, 0):
    replies = []
    for row in range(fold):
      row_msg = messages[row] if finite[row] else messages[row] * np.nan
      one_by_one, reply = server.receive(one_by_one, row_msg, worker)
      replies.append(reply)
    folded, count, alphas, params = receive(folded, messages, finite, np.int32(worker))
    jax.tree.map(np.testing.assert_array_equal, folded, one_by_one)
    triggered = [r for r in replies if bool(r.ready)]
    assert int(count) == len(triggered) <= len(alphas)
    for j, reply in enumerate(triggered):
      np.testing.assert_array_equal(params[j], reply.params)
      assert float(alphas[j]) == float(reply.alpha)
    triggers, most = triggers + len(triggered), max(most, len(triggered))
  # Rows 1 (NaN) and 2 (the sender's verdict) are rejected: 5 of 7 accepted trigger 2-3 times.
  assert int(folded.num_rejected) == 6 and int(folded.num_updates) == triggers
  assert (most >= 2) == (fold > 2 * period)
