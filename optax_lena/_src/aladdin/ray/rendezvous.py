"""The blocking meeting points of the baselines, asyncio Ray actors: AR-SGD's barrier
(:class:`Reducer`) and SGP's gossip mailbox (:class:`Mailbox`).

Both are the same thing: a slot per key that waits until its expected parts have arrived.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np


class _Slots:
  """``key -> parts``; :meth:`wait` returns once ``expected`` parts are in, then ``fn(parts)``,
  computed once; the slot is dropped when ``expected`` callers have been served."""

  def __init__(self, expected: int):
    self.expected = expected
    self.slots: dict[Any, dict[str, Any]] = {}

  def _slot(self, key: Any) -> dict[str, Any]:
    return self.slots.setdefault(key, {"parts": {}, "event": asyncio.Event(), "served": 0})

  def put(self, key: Any, part: int, value: Any) -> None:
    slot = self._slot(key)
    slot["parts"][part] = value
    if len(slot["parts"]) == self.expected:
      slot["event"].set()

  async def wait(self, key: Any, fn: Any) -> Any:
    slot = self._slot(key)
    await slot["event"].wait()
    if "result" not in slot:
      slot["result"] = fn([slot["parts"][p] for p in sorted(slot["parts"])])
    slot["served"] += 1
    if slot["served"] == self.expected:
      del self.slots[key]
    return slot["result"]


def total(parts: list[np.ndarray]) -> np.ndarray:
  """The sum of the workers' slices, in worker-index order (so that it does not depend on the
  arrival order), in JAX's reduction (the simulator sums the same way inside its step)."""
  import jax.numpy as jnp

  return np.asarray(jnp.sum(jnp.stack([np.asarray(p) for p in parts]), axis=0))


class Reducer:
  """AR-SGD's barrier on one shard: the sum of the n workers' slices of one iteration (the
  workers divide it by n in their step: the AR-SGD program's ``apply``)."""

  def __init__(self, num_workers: int):
    self.slots = _Slots(num_workers)

  async def reduce(self, step: int, worker: int, grads: np.ndarray) -> np.ndarray:
    """Waits until the n workers sent their slices for ``step``; returns their sum."""
    self.slots.put(step, int(worker), grads)
    return await self.slots.wait(step, total)


class Mailbox:
  """SGP's messages: ``post`` one to ``(node, round)``, ``take`` waits until it is there."""

  def __init__(self) -> None:
    self.slots = _Slots(1)

  def post(self, node: int, step: int, message: Any) -> None:
    self.slots.put((int(node), int(step)), 0, message)

  async def take(self, node: int, step: int) -> Any:
    return await self.slots.wait((int(node), int(step)), lambda parts: parts[0])
