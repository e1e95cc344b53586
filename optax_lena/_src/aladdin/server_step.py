"""Algorithm 2 of ALADDIN for one message: the server's state, its reply and its pure step.

:func:`receive` and :func:`serve` take the server's checked options (a :class:`ServerConfig`),
which :func:`~optax_lena._src.aladdin.server.parameter_server` binds; :mod:`.folding` serves
``k`` messages of one worker in one call with the same pieces.

Ko, Choi, Jei, Lee and Kim, "ALADDIN: Asymmetric Centralized Training for Distributed Deep
Learning", CIKM 2021 (DOI 10.1145/3459637.3482412).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_lena._src.aladdin import checks
from optax_lena._src.precision import accumulation_dtype

PyTree = Any

GRADS_FIX = (
  "Send the gradient of the same parameter pytree the server was initialised with (one leaf per "
  "parameter, same shapes and dtypes)."
)


class ServerState(NamedTuple):
  """State of :func:`parameter_server` (a NamedTuple of arrays: jit, checkpoint and donate it).

  Attributes:
    params: the global model x~.
    opt_state: the state of ``server_tx`` (e.g. the server's momentum buffer).
    grad_sum: the accumulator g~ of the messages received since the last global update (float32
      for floating leaves of lower precision, else the parameter's dtype).
    count: c~, messages accepted since the last global update, from all workers (int32).
    worker_counts: c_i, messages accepted from worker i since its last reply (int32[n]).
    num_rejected: messages rejected so far (non-finite or from an unknown worker; int32).
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
  """A server's answer to one message: the one reply type of every server.

  ALADDIN's, ASP's and EASGD's servers all answer with it, and a worker applies any of them as
  ``worker_merge(x, reply.params, reply.alpha)``.

  Attributes:
    ready: bool scalar: ALADDIN's message triggered a global update (ASP and EASGD: always).
    params: x~ after this message (ALADDIN's: unchanged when not ``ready``).
    alpha: float32 scalar, the merge weight when ``ready`` (ASP and EASGD: 1), else 0.0, so
      that merging a reply that is not ready is the identity.
  """

  ready: jax.Array
  params: PyTree
  alpha: jax.Array


class ServerConfig(NamedTuple):
  """The checked options of one :func:`parameter_server`, bound to the module's functions."""

  num_workers: int
  server_tx: optax.GradientTransformation
  period: int
  normalise: str
  alpha: str | float


def adopt(params: PyTree) -> Reply:
  """The reply of a symmetric server (ASP, EASGD): ready, weight 1, so that
  ``worker_merge(x, reply.params, reply.alpha)`` returns ``params`` exactly."""
  return Reply(ready=jnp.asarray(True), params=params, alpha=jnp.ones([], jnp.float32))


def all_finite(tree: PyTree) -> jax.Array:
  """Whether every element of every leaf of ``tree`` is finite, in one summed pass.

  Each leaf is summed in float32 and the sums are added: the total is NaN or infinite when an
  element is, and a sum is the cheapest pass XLA has over an array (``all(isfinite(x))``
  materialises a bool array). The only false alarm is a total past the float32 range (about
  3.4e38), which the servers reject too.

  Args:
    tree: a pytree of numeric arrays (jittable).

  Returns:
    A bool scalar; True for a tree without leaves.

  Examples:
    >>> import jax.numpy as jnp
    >>> from optax_lena import aladdin as al
    >>> bool(al.all_finite({"w": jnp.ones(3), "b": jnp.zeros(2)}))
    True
    >>> bool(al.all_finite({"w": jnp.array([1.0, jnp.nan]), "b": jnp.zeros(2)}))
    False
  """
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
    # c~ counted before the reset, the triggering message included, so c~ >= 1 here.
    # 1 / sqrt rather than rsqrt, which some backends approximate.
    return 1.0 - 1.0 / jnp.sqrt(jnp.maximum(count, 1).astype(jnp.float32))
  if alpha == "n_pi":
    return jnp.asarray(1.0 - 1.0 / math.sqrt(num_workers * period), jnp.float32)
  return jnp.asarray(alpha, jnp.float32)


def accumulator(param: Any) -> jax.Array:
  """Zeros for g~'s leaf of ``param``: float32 for floating leaves of lower precision (a bf16 or
  f16 running sum loses the small messages); other leaves are summed in their own dtype."""
  floating = jnp.issubdtype(param.dtype, jnp.floating)
  return jnp.zeros(jnp.shape(param), accumulation_dtype(param.dtype) if floating else param.dtype)


def accumulate(grad_sum: PyTree, grads: PyTree) -> PyTree:
  """g~ + g, each message leaf cast to its accumulator's dtype."""
  return jax.tree.map(lambda s, g: s + g.astype(s.dtype), grad_sum, grads)


def init(config: ServerConfig, params: PyTree) -> ServerState:
  """The server's state for the global model ``params``: zero accumulator and counters."""
  return ServerState(
    params=params,
    opt_state=config.server_tx.init(params),
    grad_sum=jax.tree.map(accumulator, params),
    count=jnp.zeros([], jnp.int32),
    worker_counts=jnp.zeros([config.num_workers], jnp.int32),
    num_rejected=jnp.zeros([], jnp.int32),
    num_updates=jnp.zeros([], jnp.int32),
  )


def worker_slot(config: ServerConfig, state: Any, worker: Any) -> tuple[jax.Array, jax.Array]:
  """Checks the state and the worker; returns (worker in range, its clipped int32 index)."""
  if not isinstance(state, ServerState):
    raise TypeError(
      f"state must be the ServerState returned by init or receive, got {type(state).__name__}."
    )
  checks.check_worker(worker, config.num_workers)
  worker = jnp.asarray(worker)
  in_range = (worker >= 0) & (worker < config.num_workers)
  return in_range, jnp.clip(worker, 0, config.num_workers - 1).astype(jnp.int32)


def global_step(
  config: ServerConfig, params: PyTree, opt_state: optax.OptState, total: PyTree, count: Any
) -> tuple[PyTree, optax.OptState]:
  """``x~ <- x~ + server_tx(normalise(g~))``, ``total`` being g~ and ``count`` its c~."""
  denominator = {"sum": None, "mean": count, "mean_of_locals": config.num_workers}
  divisor = denominator[config.normalise]

  def normalised(s, p):
    if divisor is not None:
      s = s / jnp.asarray(divisor, s.dtype)
    return s.astype(p.dtype)

  step = jax.tree.map(normalised, total, params)
  updates, opt_state = config.server_tx.update(step, opt_state, params)
  return optax.apply_updates(params, updates), opt_state


def receive(
  config: ServerConfig, state: ServerState, grads: PyTree, worker: Any, accept: Any = None
) -> tuple[ServerState, Reply]:
  """Algorithm 2 for one message ``grads`` of ``worker`` (see :func:`parameter_server`).

  Raises:
    TypeError: ``state`` is not a :class:`ServerState`, or ``worker`` not an integer scalar.
    IndexError: a concrete ``worker`` outside ``[0, num_workers)``.
    ValueError: ``grads`` differs from the parameters in structure, a shape or a dtype.
  """
  in_range, index = worker_slot(config, state, worker)
  checks.check_like_params(grads, state.params, "grads", GRADS_FIX)
  if accept is None:
    accept = all_finite(grads)
  accept = accept & in_range

  worker_count = state.worker_counts[index] + 1
  count = state.count + 1
  trigger = accept & (worker_count >= config.period)

  def global_update(params, opt_state, grad_sum):
    # The triggering message is added here, in the same pass as the step.
    params, opt_state = global_step(config, params, opt_state, accumulate(grad_sum, grads), count)
    return params, opt_state, zeros_in_place(grad_sum)

  # Zero-or-one-trip loops (run_once_if): a rejected message costs only the finiteness check,
  # an accumulation does not read x~, a trigger adds its message in the step's own pass.
  (grad_sum,) = run_once_if(accept & ~trigger, lambda s: (accumulate(s, grads),), (state.grad_sum,))
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
  weight = merge_weight(config.alpha, count, config.num_workers, config.period)
  return new_state, Reply(trigger, params, jnp.where(trigger, weight, jnp.zeros([], jnp.float32)))


def serve(
  config: ServerConfig, state: ServerState, grads: PyTree, worker: Any, accept: Any = None
) -> tuple[ServerState, jax.Array, jax.Array]:
  """:func:`receive` returning ``(state, ready, alpha)``: the reply's model is ``state.params``
  when ``ready``, so a loop jitted with the state donated never copies x~ for a reply."""
  verdict = None if accept is None else jnp.asarray(accept, bool).reshape(())
  state, reply = receive(config, state, grads, worker, verdict)
  return state, reply.ready, reply.alpha
