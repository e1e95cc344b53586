"""``serve_many``: ``k`` messages of one worker in one call of ALADDIN's server, with the values
of ``k`` calls of :func:`~optax_lena._src.aladdin.server_step.serve` (the Ray PS shards serve a
worker's folded messages with it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_lena._src.aladdin import checks
from optax_lena._src.aladdin.server_step import (
  GRADS_FIX,
  ServerConfig,
  ServerState,
  all_finite,
  global_step,
  merge_weight,
  run_once_if,
  worker_slot,
  zeros_in_place,
)

PyTree = Any


class FoldCarry(NamedTuple):
  """What :func:`serve_many` carries from one block of ``period`` messages to the next.

  Attributes:
    params: x~.
    opt_state: the state of ``server_tx``.
    grad_sum: g~.
    replies: x~ after each global update so far, every leaf ``[slots, ...]``; None when the
      call holds one block, whose reply is x~ at the end.
    alphas: float32[slots], the merge weight of each global update so far.
    count: c~.
    worker_count: c_i of the sending worker.
    num_replies: n, the global updates so far (int32).
  """

  params: PyTree
  opt_state: optax.OptState
  grad_sum: PyTree
  replies: PyTree | None
  alphas: jax.Array
  count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as ServerState's
  worker_count: jax.Array
  num_replies: jax.Array


class FoldRows(NamedTuple):
  """The ``k`` stacked messages of one :func:`serve_many` call, and what is known of them before
  any pass over them.

  Attributes:
    messages: every leaf ``[k, ...]``.
    accept: bool[k], accepted (finite, from a worker in range).
    triggers: bool[k], the rows that trigger a global update.
  """

  messages: PyTree
  accept: jax.Array
  triggers: jax.Array

  @property
  def position(self) -> np.ndarray:
    """The row numbers ``0 .. k-1`` (a host constant)."""
    return np.arange(self.accept.shape[0])


def stacked_rows(messages: PyTree, params: PyTree) -> int:
  """``k``, the leading axis of every leaf of ``messages``, which must be a stack of ``k >= 1``
  messages like ``params`` (a ValueError naming the stacking otherwise)."""
  shapes = [jnp.shape(m) for m in jax.tree.leaves(messages)]
  k = shapes[0][0] if shapes and shapes[0] else 0
  if k < 1 or any(not s or s[0] != k for s in shapes):
    raise ValueError(
      "serve_many takes k >= 1 messages of one worker stacked on a leading axis of every leaf "
      f"(jax.tree.map(lambda *g: jnp.stack(g), *grads)), got leaves of shapes {shapes}."
    )
  checks.check_like_params(jax.tree.map(lambda m: m[0], messages), params, "messages[i]", GRADS_FIX)
  return k


def add_rows(grad_sum: PyTree, messages: PyTree, rows: Sequence[int], take: jax.Array) -> PyTree:
  """g~ plus the ``rows`` of ``messages`` where ``take``, row by row in order, as separate
  messages would be added; a select rather than adding zeros keeps a rejected row's NaN out of
  g~ and leaves g~'s bits as they are."""
  for row in rows:
    grad_sum = jax.tree.map(
      lambda s, m, row=row: jnp.where(take[row], s + m[row].astype(s.dtype), s),
      grad_sum,
      messages,
    )
  return grad_sum


def serve_block(
  config: ServerConfig, carry: FoldCarry, rows: tuple[int, ...], fold: FoldRows
) -> FoldCarry:
  """The ``rows`` of one block of ``period`` consecutive messages, at most one of which
  triggers: the accepted rows up to the trigger are added to g~ in the global step's own pass,
  g~ restarts from zeros with the accepted rows after it; without a trigger all accepted rows
  are added."""
  position = fold.position
  here = np.isin(position, rows)
  triggers = fold.triggers & here
  triggered = jnp.any(triggers)
  t = jnp.argmax(triggers)  # the trigger row, when there is one
  taken = jnp.sum(fold.accept & here)
  up_to_t = fold.accept & here & (position <= t)
  count_t = carry.count + jnp.sum(up_to_t)
  n = carry.num_replies

  def global_update(params, opt_state, grad_sum, replies):
    # The rows up to the trigger are added in the step's own pass (not a slice of the messages
    # at t, which XLA would copy out before the loop).
    total = add_rows(grad_sum, fold.messages, rows, fold.accept & (position <= t))
    params, opt_state = global_step(config, params, opt_state, total, count_t)
    # Only the sign of a zero may differ from serve's reset, which takes it from the sum just
    # before the trigger.
    zeros = zeros_in_place(grad_sum)
    after_t = fold.accept & (position > t)
    # Rows after the trigger are rare (a rejected message shifts it): no pass over the block's
    # messages without them.
    (grad_sum,) = run_once_if(
      jnp.any(after_t), lambda z: (add_rows(z, fold.messages, rows, after_t),), (zeros,)
    )
    if replies is not None:
      replies = jax.tree.map(
        lambda out, x: jax.lax.dynamic_update_index_in_dim(out, x, n, 0), replies, params
      )
    return params, opt_state, grad_sum, replies

  (grad_sum,) = run_once_if(
    ~triggered, lambda s: (add_rows(s, fold.messages, rows, fold.accept),), (carry.grad_sum,)
  )
  params, opt_state, grad_sum, replies = run_once_if(
    triggered, global_update, (carry.params, carry.opt_state, grad_sum, carry.replies)
  )
  after = (taken - jnp.sum(up_to_t)).astype(jnp.int32)
  weight = merge_weight(config.alpha, count_t, config.num_workers, config.period)
  return FoldCarry(
    params=params,
    opt_state=opt_state,
    grad_sum=grad_sum,
    replies=replies,
    alphas=carry.alphas.at[n].set(jnp.where(triggered, weight, carry.alphas[n])),
    count=jnp.where(triggered, after, carry.count + taken).astype(jnp.int32),
    worker_count=jnp.where(triggered, after, carry.worker_count + taken).astype(jnp.int32),
    num_replies=n + triggered.astype(jnp.int32),
  )


def serve_many(
  config: ServerConfig, state: ServerState, messages: PyTree, worker: Any, accept: Any = None
) -> tuple[ServerState, jax.Array, jax.Array, PyTree]:
  """``k`` messages of one worker in one call, with the values of ``k`` calls of :func:`serve`.

  The sending worker's counter ``c_i`` restarts from 0 at each trigger, so row ``r`` triggers
  when ``c_i`` plus the accepted rows up to ``r`` reaches a multiple of ``period``: the triggers
  are known before any pass over the messages, and any ``period`` consecutive rows hold at most
  one. The rows are therefore served in blocks of ``period`` (:func:`serve_block`), carrying a
  :class:`FoldCarry`; only the sign of a zero in the reset accumulator may differ from ``k``
  calls of :func:`serve`.

  Args:
    config: the server's options.
    state: the :class:`ServerState`.
    messages: ``k >= 1`` messages, every leaf stacked on a leading axis of size ``k``.
    worker: the sending worker (a Python int or an int32 scalar).
    accept: bool[k], the sender's verdict on each message's finiteness (None: the server
      checks each message itself).

  Returns:
    ``(state, n, alphas, replies)``: the new state; ``n`` (int32), the global updates the
    messages triggered; ``alphas`` (float32[ceil(k / period)]), whose first ``n`` are their
    merge weights; ``replies``, every leaf stacked on a leading axis, whose first ``n`` rows are
    x~ after each of them, in order.

  Raises:
    ValueError: ``messages`` is not a stack of ``k >= 1`` messages like the parameters.
    TypeError, IndexError: as :func:`receive`, for ``state`` and ``worker``.
  """
  in_range, index = worker_slot(config, state, worker)
  k = stacked_rows(messages, state.params)
  if accept is None:
    accept = jnp.stack([all_finite(jax.tree.map(lambda m, r=r: m[r], messages)) for r in range(k)])
  accept = jnp.asarray(accept, bool).reshape(k) & in_range
  accepted = jnp.cumsum(accept.astype(jnp.int32))  # accepted rows up to row r, r included
  first = state.worker_counts[index]
  fold = FoldRows(messages, accept, accept & ((first + accepted) % config.period == 0))

  slots = -(-k // config.period)
  carry = FoldCarry(
    params=state.params,
    opt_state=state.opt_state,
    grad_sum=state.grad_sum,
    replies=None
    if slots == 1
    else jax.tree.map(lambda p: jnp.zeros((slots, *jnp.shape(p)), p.dtype), state.params),
    alphas=jnp.zeros([slots], jnp.float32),
    count=state.count,
    worker_count=first,
    num_replies=jnp.zeros([], jnp.int32),
  )
  for block in range(slots):
    rows = tuple(range(block * config.period, min(k, (block + 1) * config.period)))
    carry = serve_block(config, carry, rows, fold)
  replies = carry.replies
  if replies is None:
    replies = jax.tree.map(lambda p: p[None], carry.params)
  new_state = ServerState(
    params=carry.params,
    opt_state=carry.opt_state,
    grad_sum=carry.grad_sum,
    count=carry.count,
    worker_counts=state.worker_counts.at[index].set(carry.worker_count),
    num_rejected=state.num_rejected + (k - jnp.sum(accept)).astype(jnp.int32),
    num_updates=state.num_updates + carry.num_replies,
  )
  return new_state, carry.num_replies, carry.alphas, replies
