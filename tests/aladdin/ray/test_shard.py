"""The wire format and the shard's folded receive, in process (no Ray cluster needed)."""

from __future__ import annotations

from typing import Any

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


OPTIONS = [
  {},
  {"normalise": "mean", "alpha": "count", "server_tx": "momentum"},
  {"normalise": "sum", "alpha": 0.0},
]


@pytest.mark.parametrize("recheck", [False, True])
@pytest.mark.parametrize("fold", [3, 4, 7])
@pytest.mark.parametrize("options", range(len(OPTIONS)))
def test_a_folded_call_is_the_messages_one_by_one(fold: int, recheck: bool, options: int) -> None:
  """k messages in one call leave the state and the replies of k separate receives, rejections
  (the sender's verdict on a NaN in this slice or in another shard's) included; a fold longer
  than the period returns every global update it triggered, in order. With ``recheck`` a NaN
  sent with a wrong "finite" verdict is rejected too."""
  import optax

  n, period, size = 3, 2, 10
  kw = dict(OPTIONS[options])
  if kw.get("server_tx") == "momentum":
    kw["server_tx"] = optax.sgd(0.3, momentum=0.9)
  server = al.algorithm("aladdin", worker_tx=optax.sgd(0.1), period=period, **kw).server(n)
  receive = jax.jit(folded_receive(server, period, recheck=recheck))
  rng = np.random.default_rng(1)
  messages = rng.normal(size=(fold, size)).astype(np.float32)
  messages[1, 3] = np.nan
  finite = np.ones(fold, bool)
  finite[1] = recheck  # with recheck: a wrong verdict; else the worker's
  finite[2] = False  # a NaN in another shard's slice
  one_by_one = folded = server.init(jnp.zeros(size, jnp.float32))
  receive_one = jax.jit(server.receive)
  same = np.testing.assert_array_equal
  if "server_tx" in kw:
    # Bitwise up to XLA's fused multiply-adds: the momentum's g + 0.9 t is contracted in one
    # compiled program and not in the other (one rounding instead of two), and the last-bit
    # differences carry into the next steps.
    def same(a, b):
      if np.issubdtype(np.asarray(a).dtype, np.floating):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
      else:
        np.testing.assert_array_equal(a, b)

  triggers, most = 0, 0
  for worker in (0, 1, 0):
    replies = []
    for row in range(fold):
      row_msg = messages[row] if row != 2 else messages[row] * np.nan
      one_by_one, reply = receive_one(one_by_one, row_msg, worker)
      replies.append(reply)
    folded, count, alphas, params = receive(folded, messages, finite, np.int32(worker))
    jax.tree.map(same, folded, one_by_one)
    triggered = [r for r in replies if bool(r.ready)]
    assert int(count) == len(triggered) <= len(alphas)
    for j, reply in enumerate(triggered):
      same(params[j], reply.params)
      assert float(alphas[j]) == float(reply.alpha)
    triggers, most = triggers + len(triggered), max(most, len(triggered))
  # Rows 1 (NaN) and 2 (the sender's verdict) are rejected; 5 of 7 accepted trigger 2-3 times.
  assert int(folded.num_rejected) == 6 and int(folded.num_updates) == triggers > 0
  assert (most >= 2) == (fold > 2 * period)


@pytest.mark.parametrize("recheck", [False, True])
def test_the_shard_applies_its_senders_verdict_or_rechecks(recheck: bool) -> None:
  """Config(recheck_messages=) reaches the shard: without it a message is accepted or rejected
  on its sender's verdict alone (computed in the worker's step on the values it sends); with it
  a NaN sent as "finite" is rejected too."""
  from optax_lena._src.aladdin.ray.shard import ServerShard
  from optax_lena.aladdin import distributed as ad

  spec = al.algorithm("aladdin", worker_tx=al.local_optimizer(0.1))
  config = ad.Config(spec, num_workers=2, recheck_messages=recheck)
  shard = ServerShard(0, np.zeros(10, np.float32), config)
  nan = np.full((1, 10), np.nan, np.float32)
  assert shard.receive(0, nan, np.zeros(1, bool)) is None
  assert shard.receive(0, nan, np.ones(1, bool)) is None
  assert int(shard.state.num_rejected) == 1 + int(recheck)


@pytest.mark.parametrize("through_ring", [False, True])
def test_a_call_longer_than_a_block_is_its_messages_in_separate_calls(through_ring: bool) -> None:
  """A call of up to FOLD_PERIODS periods is applied in blocks of BLOCK_PERIODS (the sizes
  compiled at start-up): the state and the replies, in order, are those of one call per
  message, its messages and replies in the call or in the worker's shared-memory ring."""
  from optax_lena._src.aladdin.ray import channel
  from optax_lena._src.aladdin.ray.plan import BLOCK_PERIODS, FOLD_PERIODS
  from optax_lena._src.aladdin.ray.shard import ServerShard
  from optax_lena.aladdin import distributed as ad

  period, size = 2, 10
  spec = al.algorithm("aladdin", worker_tx=al.local_optimizer(0.1), period=period)
  config = ad.Config(spec, num_workers=2)
  folded, one_by_one = (ServerShard(0, np.zeros(size, np.float32), config) for _ in range(2))
  assert folded.block == BLOCK_PERIODS * period < folded.max_fold == FOLD_PERIODS * period
  k = folded.max_fold
  messages = np.random.default_rng(2).normal(size=(k, size)).astype(np.float32)
  finite = np.ones(k, bool)
  finite[5] = False  # rejected, in the first block
  run = channel.run_name()
  try:
    arg: Any = messages
    if through_ring:
      ring = channel.open_ring(run, 0, 1, k, k // period, size, np.float32)
      assert ring is not None
      ring.write(0, list(messages))
      arg = ring.rows(0, k, 0, size)
    reply = folded.receive(0, arg, finite)
    want = [one_by_one.receive(0, messages[i : i + 1], finite[i : i + 1]) for i in range(k)]
    slices = np.stack([r[0][0] for r in want if r is not None])
    alphas = np.concatenate([r[1] for r in want if r is not None])
    assert len(alphas) > folded.block // period  # replies from both blocks
    np.testing.assert_array_equal(reply[1], alphas)
    got = ring.replies_of(arg, len(alphas)) if through_ring else reply[0]
    assert (reply[0] is None) == through_ring
    np.testing.assert_array_equal(got, slices)
    jax.tree.map(np.testing.assert_array_equal, folded.state, one_by_one.state)
    assert folded.counts.global_updates == one_by_one.counts.global_updates == len(alphas)
  finally:
    channel.remove_rings(run)


def test_planted_or_malformed_calls_count_as_one_malformed_message_and_never_raise(
  tmp_path: Any,
) -> None:
  """What another local user or a broken sender can hand a shard: ring records naming a
  directory, another user's file, a link, a file of another size, or claiming 10**9 messages;
  arrays of the wrong shape, dtype or length; junk. Each call is refused with a reason, counted
  as exactly one received and malformed message, and never applied."""
  import os

  from optax_lena._src.aladdin.ray import channel
  from optax_lena._src.aladdin.ray.layout import Rejected
  from optax_lena._src.aladdin.ray.shard import ServerShard
  from optax_lena.aladdin import distributed as ad

  size = 6
  config = ad.Config(al.algorithm("aladdin", worker_tx=al.local_optimizer(0.1)), num_workers=2)
  shard = ServerShard(0, np.zeros(size, np.float32), config)
  before = np.asarray(shard.state.params).copy()
  run = channel.run_name()
  planted = [os.path.join(channel.DIRECTORY, f"{channel.PREFIX}{run}-w0-{n}") for n in range(4)]
  try:
    os.mkdir(planted[0])  # a directory where a ring should be
    with open(planted[1], "wb") as f:  # a file of another user (when root can hand it over)
      f.write(bytes(4 * size * 3))
    if os.getuid() == 0:
      os.chown(planted[1], 12345, 12345)
    os.symlink("/etc/passwd", planted[2])
    with open(planted[3], "wb") as f:  # the wrong size for the record's shape
      f.write(b"\0")
    yes = np.ones(1, bool)
    calls = [
      *(channel.Rows(p, (1, 2, 1, size), "<f4", 0, 1, 0, size) for p in planted),
      channel.Rows(planted[1], (1, 10**9, 1, size), "<f4", 0, 10**9, 0, size),
      channel.Rows("/etc/passwd", (1, 1, 1, size), "<f4", 0, 1, 0, size),
      (np.ones((3, size + 1), np.float32), np.ones(3, bool)),  # the wrong size
      (np.ones((10**4, size), np.float64), np.ones(10**4, bool)),  # the wrong dtype
      (np.ones((shard.max_fold + 1, size), np.float32), np.ones(shard.max_fold + 1, bool)),
      (np.ones((2, size), np.float32), yes),  # verdicts that do not match
      ("junk", "junk"),
      (object(), None),
    ]
    for n, call in enumerate(calls, start=1):
      messages, finite = call if isinstance(call, tuple) else (call, yes)
      reply = shard.receive(0, messages, finite)
      assert isinstance(reply, Rejected) and reply.reason, (n, reply)
      assert shard.counts.received == shard.counts.rejected_malformed == n, (n, call)
    assert isinstance(shard.receive(7, np.ones((1, size), np.float32), yes), Rejected)  # sender
    assert isinstance(shard.receive(True, np.ones((1, size), np.float32), yes), Rejected)
    assert shard.counts.rejected_malformed == len(calls) + 2 == shard.counts.calls
  finally:
    os.rmdir(planted[0])
    for path in planted[1:]:
      os.unlink(path)
  assert shard.counts.global_updates == 0 and int(shard.state.num_rejected) == 0
  np.testing.assert_array_equal(np.asarray(shard.state.params), before)
