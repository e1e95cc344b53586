"""The shared-memory ring between a worker and the PS shards on its node (no Ray needed)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import os
import random
import subprocess
import sys
import time
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from optax_lena._src.aladdin.ray import channel
from optax_lena._src.aladdin.ray.layout import FlatLayout
from optax_lena._src.aladdin.ray.outbox import Outbox
from optax_lena._src.aladdin.ray.plan import Plan


@pytest.fixture
def run() -> Any:
  name = channel.run_name()
  yield name
  channel.remove_rings(name)


def test_a_shard_reads_its_columns_and_the_worker_its_replies(run: str) -> None:
  ring = channel.open_ring(run, 3, regions=2, rows=4, reply_rows=2, size=10, dtype=np.float32)
  assert ring is not None and os.stat(ring.path).st_mode & 0o777 == 0o600
  messages = np.random.default_rng(0).normal(size=(3, 10)).astype(np.float32)
  ring.write(1, list(messages))
  rows = ring.rows(1, 3, 4, 7)
  shard = channel.Mapped(size=3, dtype=np.float32, max_rows=4)
  assert shard.valid(rows)
  np.testing.assert_array_equal(shard.read(rows), messages[:, 4:7])
  replies = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
  shard.write_replies(rows, replies)
  np.testing.assert_array_equal(ring.replies_of(rows, 2), replies)
  assert not ring.replies[1][:, :4].any() and not ring.replies[0].any()  # nothing else written
  # Records that do not describe this shard's slice of a ring of this run's shape are refused.
  for bad in (
    dataclasses.replace(rows, path="/etc/passwd"),
    dataclasses.replace(rows, path=os.path.join(channel.DIRECTORY, "other-file")),
    dataclasses.replace(rows, dtype="<f8"),
    dataclasses.replace(rows, stop=8),
    dataclasses.replace(rows, region=2),
    dataclasses.replace(rows, count=0),
    dataclasses.replace(rows, count=5),
    dataclasses.replace(rows, shape=(2, 4)),
    messages,
  ):
    assert not shard.valid(bad)
  ring.close()
  assert not os.path.exists(ring.path)
  with pytest.raises(ValueError, match="shared_memory=False"):
    channel.Mapped(size=3, dtype=np.float32, max_rows=4).read(rows)


def test_rings_are_bounded_and_removed_by_run(run: str) -> None:
  too_big = channel.MAX_BYTES // 4 + 1
  assert channel.open_ring(run, 0, 1, 1, 0, too_big, np.float32) is None
  mine = channel.open_ring(run, 0, 1, 1, 1, 8, np.float32)
  other_run = channel.run_name()
  other = channel.open_ring(other_run, 0, 1, 1, 1, 8, np.float32)
  assert mine is not None and other is not None
  channel.remove_rings(run)
  assert not os.path.exists(mine.path) and os.path.exists(other.path)
  channel.remove_rings(other_run)
  assert not os.path.exists(other.path)


def test_a_shard_maps_only_its_own_regular_ring_files_and_says_why(run: str) -> None:
  ring = channel.open_ring(run, 0, regions=1, rows=2, reply_rows=1, size=6, dtype=np.float32)
  assert ring is not None
  rows = ring.rows(0, 2, 0, 3)
  link = os.path.join(channel.DIRECTORY, f"{channel.PREFIX}{run}-link")
  os.symlink(ring.path, link)
  planted = dataclasses.replace(rows, path=link)
  shard = channel.Mapped(size=3, dtype=np.float32, max_rows=2)
  assert shard.valid(planted)  # its fields are fine: the file is what is refused
  with pytest.raises(channel.RingError, match="symbolic link"):
    shard.read(planted)
  # A record whose shape does not fit the file: the message says so (not "another node").
  wrong = dataclasses.replace(rows, shape=(1, 2, 2, 6))
  with pytest.raises(channel.RingError, match="does not describe this ring") as err:
    shard.read(wrong)
  assert "another node" not in str(err.value)
  if os.getuid() == 0:  # only root can hand a file to another user
    os.chown(ring.path, 12345, -1)
    with pytest.raises(channel.RingError, match="belongs to user 12345"):
      channel.Mapped(size=3, dtype=np.float32, max_rows=2).read(rows)
  # Integer fields must be integers (a float or a bool is refused, not used as an index).
  for field, value in (("region", 0.0), ("count", 2.0), ("start", False), ("stop", 3.0)):
    assert not shard.valid(dataclasses.replace(rows, **{field: value}))
  assert not shard.valid(dataclasses.replace(rows, shape=(1.0, 2, 1, 6)))
  with pytest.raises(ValueError, match="another node"):
    shard.read(dataclasses.replace(rows, path=ring.path + "-gone"))
  os.unlink(link)


def test_stale_rings_of_dead_processes_are_swept(run: str) -> None:
  live = channel.open_ring(run, 0, 1, 1, 1, 8, np.float32)
  assert live is not None
  dead = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpid())"],
    capture_output=True,
    text=True,
    check=True,
  )
  stale = os.path.join(channel.DIRECTORY, f"{channel.PREFIX}{run}-w1-{int(dead.stdout)}-ab12")
  with open(stale, "wb") as f:
    f.write(b"\0" * 64)
  link = os.path.join(channel.DIRECTORY, f"{channel.PREFIX}{run}-w2-{int(dead.stdout)}-cd34")
  os.symlink("/etc/hostname", link)
  try:
    removed = channel.sweep_stale()  # other runs' stale rings on this machine may go too
    assert stale in removed and live.path not in removed and link not in removed
    assert os.path.exists(live.path) and not os.path.exists(stale) and os.path.islink(link)
  finally:
    os.unlink(link)
    live.close()


class _Shard:
  """Stands in for a PS shard actor: ``receive.remote`` answers on a thread of its own, in
  order, after a random delay; every ``period`` messages of a call it replies with the running
  sum of its slices (a global slice) and the count (an alpha)."""

  def __init__(self, start: int, stop: int, period: int, max_fold: int):
    self.size, self.period = stop - start, period
    self.total = np.zeros(self.size, np.float64)
    self.count = 0
    self.rings = channel.Mapped(self.size, np.float32, max_fold)
    self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    self.receive = self

  def remote(self, worker: int, messages: Any, finite: np.ndarray) -> Any:
    future = self.pool.submit(self._receive, messages)
    return type("Ref", (), {"future": lambda _: future})()

  def _receive(self, messages: Any) -> Any:
    time.sleep(random.random() * 2e-3)  # the worker writes on meanwhile
    rows = messages if isinstance(messages, channel.Rows) else None
    block = self.rings.read(rows) if rows is not None else messages
    replies, alphas = [], []
    for message in block:
      self.total += message
      self.count += 1
      if self.count % self.period == 0:
        replies.append(self.total.astype(np.float32))
        alphas.append(float(self.count))
    if not replies:
      return None
    if rows is not None:
      self.rings.write_replies(rows, np.stack(replies))
      return None, np.asarray(alphas)
    return np.stack(replies), np.asarray(alphas)


def _replies(ring: channel.Ring | None, layout: FlatLayout, messages: np.ndarray) -> list[Any]:
  fold, period = 8, 2
  shards = [_Shard(a, b, period, fold) for a, b in itertools.pairwise(layout.bounds)]
  plan = Plan(period=period, max_fold=fold, block=fold)
  outbox = Outbox(0, shards, layout, plan, max_inflight=2, min_fold=2, ring=ring)
  replies = []
  for message in messages:
    outbox.push(message, True)
    time.sleep(random.random() * 3e-4)
    replies += outbox.take()
  outbox.flush()
  replies += outbox.take()
  for shard in shards:
    shard.pool.shutdown()
  return replies


def test_the_outbox_gets_the_same_replies_through_the_ring_as_through_the_calls(
  run: str,
) -> None:
  """Many calls reuse the ring's two regions while the shards read and write them at random
  moments: the replies (values and order) are those of messages sent in the calls."""
  layout = FlatLayout({"a": jnp.zeros(7), "b": jnp.zeros((3, 5))}, num_shards=3)
  messages = np.random.default_rng(1).normal(size=(300, layout.size)).astype(np.float32)
  ring = channel.open_ring(run, 0, 2, 8, 4, layout.size, np.float32)
  through_ring = _replies(ring, layout, messages)
  in_calls = _replies(None, layout, messages)
  # How messages are folded into calls depends on timing; the replies, shard by shard, do not.
  for shard in range(3):
    got, want = (
      [r for call in replies if call[shard] is not None for r in zip(*call[shard], strict=True)]
      for replies in (through_ring, in_calls)
    )
    assert len(got) == len(want) == len(messages) // 2  # a reply every period
    for (g, g_alpha), (w, w_alpha) in zip(got, want, strict=True):
      np.testing.assert_array_equal(g, w)
      assert g_alpha == w_alpha
