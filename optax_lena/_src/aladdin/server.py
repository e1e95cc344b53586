"""ALADDIN's parameter server (Algorithm 2): lazy global update, PS-triggered local update.

Ko, Choi, Jei, Lee and Kim, "ALADDIN: Asymmetric Centralized Training for Distributed Deep
Learning", CIKM 2021 (DOI 10.1145/3459637.3482412).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_lena._src.aladdin import checks

PyTree = Any

_GRADS_FIX = (
  "Send the gradient of the same parameter pytree the server was initialised with (one leaf per "
  "parameter, same shapes and dtypes)."
)


class ServerState(NamedTuple):
  """State of :func:`parameter_server` (a NamedTuple of arrays: jit, checkpoint and donate it).

  Attributes:
    params: the global model x~.
    opt_state: the state of ``server_tx`` (e.g. the server's momentum buffer).
    grad_sum: the accumulator g~ of the gradients received since the last global update (float32
      for leaves of lower precision, else the parameter's dtype).
    count: c~, gradients accepted since the last global update, from all workers (int32).
    worker_counts: c_i, gradients accepted from worker i since its last reply (int32[n]).
    num_rejected: messages rejected so far (non-finite gradient or unknown worker; int32).
    num_updates: global updates (replies) so far (int32).
  """

  params: PyTree
  opt_state: optax.OptState
  grad_sum: PyTree
  count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as in optax's states
  worker_counts: jax.Array
  num_rejected: jax.Array
  num_updates: jax.Array


class Reply(NamedTuple):
  """A server's answer to one message: the one reply type of every server (ALADDIN's, ASP's,
  EASGD's), applied by the worker as ``worker_merge(x, reply.params, reply.alpha)``.

  Attributes:
    ready: bool scalar: ALADDIN's message triggered a global update (ASP and EASGD: always).
    params: x~ after this message (ALADDIN's: unchanged when not ``ready``).
    alpha: float32 scalar, the merge weight when ``ready`` (ASP and EASGD: 1), else 0.0, so
      that merging a reply that is not ready is the identity.
  """

  ready: jax.Array
  params: PyTree
  alpha: jax.Array


class ParameterServer(NamedTuple):
  """What :func:`parameter_server` returns: its pure, jittable functions (``init``, ``receive``,
  ``serve``, ``serve_many``, described there) and its configuration, kept for inspection."""

  init: Callable[[PyTree], ServerState]
  receive: Callable[[ServerState, PyTree, Any], tuple[ServerState, Reply]]
  num_workers: int
  period: int
  normalise: str
  alpha: str | float
  serve: Callable[..., tuple[ServerState, jax.Array, jax.Array]]
  serve_many: Callable[..., tuple[ServerState, jax.Array, jax.Array, PyTree]]


def adopt(params: PyTree) -> Reply:
  """The reply of a symmetric server (ASP, EASGD): ready, weight 1, so that
  ``worker_merge(x, reply.params, reply.alpha)`` returns ``params`` exactly."""
  return Reply(ready=jnp.asarray(True), params=params, alpha=jnp.ones([], jnp.float32))


def all_finite(tree: PyTree) -> jax.Array:
  """True when every leaf of ``tree`` is finite (bool scalar)."""
  # The sum is NaN or Inf when one element is, and a float sum is the cheapest pass XLA has over
  # an array (all(isfinite(x)) materialises a bool array); the only false alarm is a sum past
  # the float32 range, rejected too.
  sums = [jnp.sum(x, dtype=jnp.float32) for x in jax.tree.leaves(tree)]
  if not sums:
    return jnp.asarray(True)
  return jnp.isfinite(jnp.sum(jnp.stack(sums)))


def run_once_if(flag: jax.Array, fn: Callable[..., tuple], operands: tuple) -> tuple:
  """``fn(*operands)`` when ``flag`` (a bool scalar), else ``operands``, as a loop of zero or
  one iteration: XLA updates loop-carried buffers in place, where XLA:CPU copies the operands
  that ``lax.cond`` passes through (more than twice the cost of a non-triggering message)."""
  cond = lambda carry: carry[0] < flag.astype(jnp.int32)
  body = lambda carry: (carry[0] + 1, *fn(*carry[1:]))
  return tuple(jax.lax.while_loop(cond, body, (jnp.int32(0), *operands))[1:])


def zeros_in_place(tree: PyTree) -> PyTree:
  """Zeros computed from ``tree`` (not ``zeros_like``): a fusion that reads g~ writes them into
  its buffer in place, where a broadcast constant is a new buffer copied into the loop carry."""
  return jax.tree.map(lambda s: jnp.where(jnp.isfinite(s), s * 0, 0).astype(s.dtype), tree)


def merge_weight(alpha: str | float, count: jax.Array, num_workers: int, period: int) -> jax.Array:
  """alpha_i of Algorithm 2 ("count"), Section 3.2 ("n_pi") or a fixed float (float32)."""
  if alpha == "count":
    # c~ counted before the reset, the triggering gradient included, so c~ >= 1 here.
    # 1 / sqrt rather than rsqrt, which some backends approximate.
    return 1.0 - 1.0 / jnp.sqrt(jnp.maximum(count, 1).astype(jnp.float32))
  if alpha == "n_pi":
    return jnp.asarray(1.0 - 1.0 / math.sqrt(num_workers * period), jnp.float32)
  return jnp.asarray(alpha, jnp.float32)


def parameter_server(
  num_workers: int,
  server_tx: optax.GradientTransformation,
  *,
  period: int = 4,
  normalise: str = "mean_of_locals",
  alpha: str | float = "count",
) -> ParameterServer:
  """ALADDIN's parameter server: Algorithm 2 for one gradient message at a time
  (``docs/ALADDIN.md``, section 3, states the update, its choices, ``serve`` and
  ``serve_many``). A message holding a NaN or an Inf (summed in float32, so a sum past 3.4e38
  too) or, traced, from a worker outside ``[0, num_workers)`` is rejected: only ``num_rejected``
  moves and the reply is not ready; a concrete unknown worker raises ``IndexError``.

  Args:
    num_workers: n, the number of workers (indices ``0 .. n-1``).
    server_tx: the Optax transformation applied to ``normalise(g~)`` at each global update
      (``optax.sgd(eta)`` is Algorithm 2's plain step); a schedule counts global updates.
    period: pi >= 1, the server replies to a worker once every ``period`` of its gradients.
    normalise: ``"sum"`` (g~), ``"mean"`` (g~ / c~) or ``"mean_of_locals"`` (g~ / n).
    alpha: ``"count"`` (``1 - 1/sqrt(c~)``), ``"n_pi"`` (``1 - 1/sqrt(n * period)``) or a float
      in [0, 1].

  Returns:
    A :class:`ParameterServer`; in all of its functions ``worker`` is a Python int or an int32
    scalar (traced under ``jit``), and ``accept``, the sender's finiteness verdict on each whole
    message (bool), replaces the server's own pass over it.
  """
  num_workers = checks.check_num_workers(num_workers)
  period = checks.check_period(period)
  normalise = checks.check_normalise(normalise)
  alpha = checks.check_alpha(alpha)
  checks.check_tx(server_tx, "server_tx", "optax.sgd(eta)")

  def accumulator(p: Any) -> jax.Array:
    # float32 for floating leaves of lower precision (bf16/f16 sums lose the small gradients).
    low = jnp.issubdtype(p.dtype, jnp.floating) and jnp.dtype(p.dtype).itemsize < 4
    return jnp.zeros(jnp.shape(p), jnp.float32 if low else p.dtype)

  def init_fn(params: PyTree) -> ServerState:
    return ServerState(
      params=params,
      opt_state=server_tx.init(params),
      grad_sum=jax.tree.map(accumulator, params),
      count=jnp.zeros([], jnp.int32),
      worker_counts=jnp.zeros([num_workers], jnp.int32),
      num_rejected=jnp.zeros([], jnp.int32),
      num_updates=jnp.zeros([], jnp.int32),
    )

  def worker_slot(state: ServerState, worker: Any) -> tuple[jax.Array, jax.Array]:
    """Checks the state and the worker; (worker in range, its clipped index)."""
    if not isinstance(state, ServerState):
      raise TypeError(
        f"state must be the ServerState returned by init or receive, got {type(state).__name__}."
      )
    checks.check_worker(worker, num_workers)
    worker = jnp.asarray(worker)
    in_range = (worker >= 0) & (worker < num_workers)
    return in_range, jnp.clip(worker, 0, num_workers - 1).astype(jnp.int32)

  def server_step(params, opt_state, total, count):
    """x~ <- x~ + server_tx(normalise(g~)), ``count`` the c~ of this global update."""
    denominator = {"sum": None, "mean": count, "mean_of_locals": num_workers}[normalise]

    def normalised(s, p):
      if denominator is not None:
        s = s / jnp.asarray(denominator, s.dtype)
      return s.astype(p.dtype)

    step = jax.tree.map(normalised, total, params)
    updates, opt_state = server_tx.update(step, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  def receive_fn(
    state: ServerState, grads: PyTree, worker: Any, accept: jax.Array | None = None
  ) -> tuple[ServerState, Reply]:
    in_range, index = worker_slot(state, worker)
    checks.check_like_params(grads, state.params, "grads", _GRADS_FIX)
    if accept is None:
      accept = all_finite(grads)
    accept = accept & in_range

    worker_count = state.worker_counts[index] + 1
    count = state.count + 1
    trigger = accept & (worker_count >= period)

    accumulate = lambda grad_sum: jax.tree.map(lambda s, g: s + g.astype(s.dtype), grad_sum, grads)

    def global_update(params, opt_state, grad_sum):
      # The triggering gradient is added here, in the same pass as the step.
      params, opt_state = server_step(params, opt_state, accumulate(grad_sum), count)
      return params, opt_state, zeros_in_place(grad_sum)

    # Zero-or-one-trip loops (run_once_if): a rejected message costs only the finiteness check,
    # an accumulation does not read x~, a trigger adds its gradient in the step's own pass.
    (grad_sum,) = run_once_if(accept & ~trigger, lambda s: (accumulate(s),), (state.grad_sum,))
    params, opt_state, grad_sum = run_once_if(
      trigger, global_update, (state.params, state.opt_state, grad_sum)
    )
    new_worker_count = jnp.where(trigger, 0, jnp.where(accept, worker_count, worker_count - 1))
    new_state = ServerState(
      params=params,
      opt_state=opt_state,
      grad_sum=grad_sum,
      count=jnp.where(trigger, 0, jnp.where(accept, count, state.count)).astype(jnp.int32),
      worker_counts=state.worker_counts.at[index].set(new_worker_count.astype(jnp.int32)),
      num_rejected=state.num_rejected + jnp.where(accept, 0, 1).astype(jnp.int32),
      num_updates=state.num_updates + trigger.astype(jnp.int32),
    )
    weight = merge_weight(alpha, count, num_workers, period)
    return new_state, Reply(trigger, params, jnp.where(trigger, weight, jnp.zeros([], jnp.float32)))

  def serve_fn(state: ServerState, grads: PyTree, worker: Any, accept: Any = None):
    verdict = None if accept is None else jnp.asarray(accept, bool).reshape(())
    state, reply = receive_fn(state, grads, worker, verdict)
    return state, reply.ready, reply.alpha

  def serve_many_fn(state: ServerState, messages: PyTree, worker: Any, accept: Any = None):
    in_range, index = worker_slot(state, worker)
    shapes = [jnp.shape(m) for m in jax.tree.leaves(messages)]
    k = shapes[0][0] if shapes and shapes[0] else 0
    if k < 1 or any(not s or s[0] != k for s in shapes):
      raise ValueError(
        "serve_many takes k >= 1 messages of one worker stacked on a leading axis of every leaf "
        f"(jax.tree.map(lambda *g: jnp.stack(g), *grads)), got leaves of shapes {shapes}."
      )
    checks.check_like_params(
      jax.tree.map(lambda m: m[0], messages), state.params, "messages[i]", _GRADS_FIX
    )
    if accept is None:
      accept = jnp.stack(
        [all_finite(jax.tree.map(lambda m, r=r: m[r], messages)) for r in range(k)]
      )
    accept = jnp.asarray(accept, bool).reshape(k) & in_range
    accepted = jnp.cumsum(accept.astype(jnp.int32))  # accepted rows up to row r, r included
    # c_i restarts from 0 at each trigger, so row r triggers when c_i + accepted[r] reaches a
    # multiple of the period: the triggers are known before any pass over the messages, and any
    # `period` consecutive rows hold at most one.
    first = state.worker_counts[index]
    trig = accept & ((first + accepted) % period == 0)
    position = np.arange(k)

    def add_rows(grad_sum, rows, take):
      # Row by row, in order, as separate messages would be; a select rather than adding zeros
      # keeps a rejected row's NaN out of g~ and leaves g~'s bits as they are.
      for row in rows:
        grad_sum = jax.tree.map(
          lambda s, m, row=row: jnp.where(take[row], s + m[row].astype(s.dtype), s),
          grad_sum,
          messages,
        )
      return grad_sum

    def block_step(carry, rows):
      """The rows of one block of ``period`` messages: at most one of them triggers."""
      params, opt_state, grad_sum, replies, alphas, count, worker_count, n = carry
      here = np.isin(position, rows)
      triggers = trig & here
      triggered = jnp.any(triggers)
      t = jnp.argmax(triggers)  # the trigger row, when there is one
      taken = jnp.sum(accept & here)
      up_to_t = accept & here & (position <= t)
      count_t = count + jnp.sum(up_to_t)

      def global_update(params, opt_state, grad_sum, replies):
        # g~ with the block's rows up to the trigger, added in the step's own pass (not a slice
        # of the messages at t, which XLA would copy out before the loop); then g~ restarts
        # from zeros with the rows after it.
        total = add_rows(grad_sum, rows, accept & (position <= t))
        params, opt_state = server_step(params, opt_state, total, count_t)
        # Only the sign of a zero may differ from serve's reset, which takes it from the sum
        # just before the trigger.
        zeros = zeros_in_place(grad_sum)
        after_t = accept & (position > t)
        # Rows after the trigger are rare (a rejected message shifts it): no pass over the
        # block's messages without them.
        (grad_sum,) = run_once_if(
          jnp.any(after_t), lambda z: (add_rows(z, rows, after_t),), (zeros,)
        )
        if replies is not None:
          replies = jax.tree.map(
            lambda out, x: jax.lax.dynamic_update_index_in_dim(out, x, n, 0), replies, params
          )
        return params, opt_state, grad_sum, replies

      (grad_sum,) = run_once_if(~triggered, lambda s: (add_rows(s, rows, accept),), (grad_sum,))
      params, opt_state, grad_sum, replies = run_once_if(
        triggered, global_update, (params, opt_state, grad_sum, replies)
      )
      after = (taken - jnp.sum(up_to_t)).astype(jnp.int32)
      weight = merge_weight(alpha, count_t, num_workers, period)
      alphas = alphas.at[n].set(jnp.where(triggered, weight, alphas[n]))
      count = jnp.where(triggered, after, count + taken).astype(jnp.int32)
      worker_count = jnp.where(triggered, after, worker_count + taken).astype(jnp.int32)
      n = n + triggered.astype(jnp.int32)
      return params, opt_state, grad_sum, replies, alphas, count, worker_count, n

    slots = -(-k // period)
    carry = (
      state.params,
      state.opt_state,
      state.grad_sum,
      # One block: its reply is x~ after the call (no slots to fill).
      None
      if slots == 1
      else jax.tree.map(lambda p: jnp.zeros((slots, *jnp.shape(p)), p.dtype), state.params),
      jnp.zeros([slots], jnp.float32),
      state.count,
      first,
      jnp.zeros([], jnp.int32),
    )
    for block in range(slots):
      carry = block_step(carry, tuple(range(block * period, min(k, (block + 1) * period))))
    params, opt_state, grad_sum, replies, alphas, count, worker_count, n = carry
    if replies is None:
      replies = jax.tree.map(lambda p: p[None], params)
    new_state = ServerState(
      params=params,
      opt_state=opt_state,
      grad_sum=grad_sum,
      count=count,
      worker_counts=state.worker_counts.at[index].set(worker_count),
      num_rejected=state.num_rejected + (k - jnp.sum(accept)).astype(jnp.int32),
      num_updates=state.num_updates + n,
    )
    return new_state, n, alphas, replies

  return ParameterServer(
    init_fn, receive_fn, num_workers, period, normalise, alpha, serve_fn, serve_many_fn
  )


def folded_receive(server: Any, period: int = 1, recheck: bool = False) -> Callable[..., Any]:
  """``receive(state, messages[k, slice], finite[k], worker) -> (state, n, alphas, params)``:
  the algorithm's server applied to ``k`` messages of one worker in order, with the values of
  ``k`` separate calls (the Ray PS shard's, on its slice). ``finite[i]`` is the sender's verdict
  on the whole message ``i``, so that every shard rejects a message with a NaN in any slice;
  ALADDIN's server trusts it (``recheck``: checks its slices too), the others get a rejected
  message as NaN. ``alphas[:n]`` and ``params[:n]`` are the ``n`` replies, in order; a worker
  triggers at most once every ``period`` of its messages, so ``ceil(k / period)`` slots hold them.
  """
  if isinstance(server, ParameterServer):

    def serve_many(state, messages, finite, worker):
      if recheck:
        finite = finite & jnp.stack([all_finite(m) for m in messages])
      return server.serve_many(state, messages, worker, finite)

    return serve_many

  def receive(state, messages, finite, worker):
    k = messages.shape[0]
    slots = -(-k // period)
    n = jnp.zeros([], jnp.int32)
    alphas = jnp.zeros([slots], jnp.float32)
    params = None
    for row in range(k):
      message = jnp.where(finite[row], messages[row], jnp.asarray(jnp.nan, messages.dtype))
      state, reply = server.receive(state, message, worker)
      if params is None:
        params = jnp.zeros((slots, *reply.params.shape), reply.params.dtype)
      slot = jnp.minimum(n, slots - 1)
      # Written only when the message triggered: no pass over the slots for the others.
      (params,) = run_once_if(
        reply.ready,
        lambda p, x=reply.params, i=slot: (jax.lax.dynamic_update_index_in_dim(p, x, i, 0),),
        (params,),
      )
      alphas = alphas.at[slot].set(jnp.where(reply.ready, reply.alpha, alphas[slot]))
      n = n + reply.ready.astype(jnp.int32)
    return state, n, alphas, params

  return receive
