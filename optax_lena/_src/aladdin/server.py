"""ALADDIN's parameter server (Algorithm 2): lazy global update, PS-triggered local update.

:func:`parameter_server` checks its options and binds them to the pure functions of
:mod:`.server_step` (one message) and :mod:`.folding` (``k`` messages of one worker);
:func:`folded_receive` serves a worker's folded messages with any server.

Ko, Choi, Jei, Lee and Kim, "ALADDIN: Asymmetric Centralized Training for Distributed Deep
Learning", CIKM 2021 (DOI 10.1145/3459637.3482412).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_lena._src.aladdin import checks
from optax_lena._src.aladdin.folding import serve_many
from optax_lena._src.aladdin.server_step import (
  Reply,
  ServerConfig,
  ServerState,
  all_finite,
  init,
  receive,
  run_once_if,
  serve,
)

PyTree = Any


class ParameterServer(NamedTuple):
  """What :func:`parameter_server` returns: its pure, jittable functions and its options.

  In every function ``worker`` is a Python int or an int32 scalar (traced under ``jit``), and
  ``accept``, when given, is the sender's verdict on the finiteness of each whole message
  (bool), which replaces the server's own pass over it.

  Attributes:
    init: ``init(params) -> ServerState``: x~ = ``params``, zero accumulator and counters.
    receive: ``receive(state, grads, worker, accept=None) -> (state, Reply)``: Algorithm 2 for
      one message.
    num_workers: n.
    period: pi.
    normalise: ``"sum"``, ``"mean"`` or ``"mean_of_locals"``.
    alpha: ``"count"``, ``"n_pi"`` or a float.
    serve: ``serve(state, grads, worker, accept=None) -> (state, ready, alpha)``: ``receive``
      for a server loop jitted with the state donated; the reply's model is ``state.params``
      when ``ready``, so no message pays a copy of x~.
    serve_many: ``serve_many(state, messages, worker, accept=None) -> (state, n, alphas,
      replies)``: ``k`` messages of one worker, every leaf stacked on a leading axis of size
      ``k`` (``accept``: bool[k]), with the values of ``k`` calls of ``serve`` in order (only the
      sign of a zero in the reset accumulator may differ); its ``n`` global updates are
      ``alphas[:n]`` and ``replies[:n]`` (x~ after each, every leaf stacked), in order.
  """

  init: Callable[[PyTree], ServerState]
  receive: Callable[[ServerState, PyTree, Any], tuple[ServerState, Reply]]
  num_workers: int
  period: int
  normalise: str
  alpha: str | float
  serve: Callable[..., tuple[ServerState, jax.Array, jax.Array]]
  serve_many: Callable[..., tuple[ServerState, jax.Array, jax.Array, PyTree]]


def parameter_server(
  num_workers: int,
  server_tx: optax.GradientTransformation,
  *,
  period: int = 4,
  normalise: str = "mean_of_locals",
  alpha: str | float = "count",
) -> ParameterServer:
  """ALADDIN's parameter server: Algorithm 2, one worker message at a time.

  The server holds the global model x~, an accumulator g~ of the messages received since its
  last global update, their count c~ (all workers) and, per worker i, the count c_i of its
  messages since its last reply. On a message g_i from worker i:

  1. ``c~ += 1``, ``c_i += 1``, ``g~ += g_i``;
  2. if ``c_i >= period`` (the *lazy global update* and the *PS-triggered local update*):
     ``x~ <- x~ + server_tx(normalise(g~))``, the reply to worker i is ``(x~, alpha_i)``, and
     ``g~ <- 0``, ``c~ <- 0``, ``c_i <- 0`` (the other workers' counts go on).

  The worker merges the reply by Eq. 3 (:func:`worker_merge`) and never waits for it. The
  printed Algorithm 2 adds g_i only while ``c_i < period``, which drops one message in
  ``period``; here the triggering message is accumulated too. A message holding a NaN or an Inf
  (summed in float32, so a sum past 3.4e38 too) or, traced, from a worker outside
  ``[0, num_workers)`` is rejected: the state stays as if it had never been sent except
  ``num_rejected``, and the reply is not ready. Floating leaves of lower precision than float32
  are accumulated in float32.

  The defaults are the printed algorithm's. The recommended recipe, the defaults of
  :class:`Aladdin`, sends each worker's own displacement instead of its gradient
  (``al.local_step(..., message="update")``) and serves it with ``server_tx=optax.sgd(1.0)``,
  ``normalise="mean_of_locals"`` and ``alpha=0.5``: x~ then stays the average of the local
  models between merges (the paper's Lemma 1), whatever the workers' optimizer.

  Args:
    num_workers: n, the number of workers (indices ``0 .. n-1``).
    server_tx: the Optax transformation applied to ``normalise(g~)`` at each global update
      (its schedule counts global updates): ``optax.sgd(eta)`` is Algorithm 2's plain step
      ``x~ <- x~ - eta normalise(g~)`` for gradient messages; ``optax.sgd(1.0)`` averages
      update messages.
    period: pi >= 1: the server replies to a worker once every ``period`` of its messages (the
      paper: 4).
    normalise: ``"mean_of_locals"`` (g~ / n: every local model moves by each of its own
      messages, so the average of the n local models moves by g~ / n), ``"mean"`` (g~ / c~, the
      printed factor) or ``"sum"`` (g~, every message at full weight, like ASP).
    alpha: the merge weight alpha_i of a reply: ``"count"`` (``1 - 1/sqrt(c~)``, Algorithm 2,
      c~ counted before the reset with the triggering message), ``"n_pi"`` (``1 - 1/sqrt(n *
      period)``, Section 3.2 and the paper's experiments) or a float in [0, 1] (0: the worker
      keeps its model; 1: it adopts x~). With ``period=1`` and ``"count"``, alpha is always 0.

  Returns:
    A :class:`ParameterServer` of pure, jittable functions: ``init(params) -> ServerState``;
    ``receive(state, grads, worker, accept=None) -> (state, Reply)``; ``serve``, the same step
    returning ``(state, ready, alpha)`` for a loop jitted with the state donated; and
    ``serve_many``, ``k`` messages of one worker stacked on a leading axis in one call, with
    the values of ``k`` calls of ``serve`` (the Ray PS shards use it for a worker's folded
    messages). ``worker`` is a Python int or an int32 scalar (traced under ``jit``); ``accept``
    is the sender's verdict on a message's finiteness, which replaces the server's own check.

  Raises:
    TypeError: ``num_workers`` or ``period`` is not an int, ``alpha`` is neither a str nor a
      number, or ``server_tx`` is not an Optax transformation; at a call, ``state`` is not a
      :class:`ServerState` or ``worker`` not an integer scalar.
    ValueError: ``num_workers`` or ``period`` is below 1, ``normalise`` or a str ``alpha`` is
      not one of the options, or a float ``alpha`` is outside [0, 1]; at a call, a message's
      structure, shapes or dtypes differ from the parameters' (for ``serve_many``: or the
      messages are not stacked on a leading axis).
    IndexError: at a call, a concrete ``worker`` outside ``[0, num_workers)``.

  References:
    Ko, Choi, Jei, Lee and Kim, "ALADDIN: Asymmetric Centralized Training for Distributed Deep
    Learning", CIKM 2021: Algorithm 2; Section 3.2 for ``alpha="n_pi"``.

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> from optax_lena import aladdin as al
    >>> server = al.parameter_server(2, optax.sgd(1.0), period=2, normalise="sum", alpha=0.5)
    >>> receive = jax.jit(server.receive)  # one compilation serves every worker
    >>> state = server.init({"w": jnp.zeros(2)})
    >>> state, reply = receive(state, {"w": jnp.array([1.0, 2.0])}, 0)
    >>> bool(reply.ready), int(state.count), state.worker_counts.tolist()
    (False, 1, [1, 0])
    >>> state, reply = receive(state, {"w": jnp.array([0.5, 0.5])}, 1)
    >>> state, reply = receive(state, {"w": jnp.array([3.0, 4.0])}, 0)  # c_0 reaches 2
    >>> bool(reply.ready), reply.params["w"].tolist(), float(reply.alpha)
    (True, [-4.5, -6.5], 0.5)
    >>> int(state.count), state.worker_counts.tolist()  # worker 1's count goes on
    (0, [0, 1])

    The worker merges the reply by Eq. 3:

    >>> al.worker_merge({"w": jnp.array([1.0, 1.0])}, reply.params, reply.alpha)["w"].tolist()
    [-1.75, -2.75]
  """
  num_workers = checks.check_num_workers(num_workers)
  period = checks.check_period(period)
  normalise = checks.check_normalise(normalise)
  alpha = checks.check_alpha(alpha)
  checks.check_tx(server_tx, "server_tx", "optax.sgd(eta)")
  config = ServerConfig(num_workers, server_tx, period, normalise, alpha)
  return ParameterServer(
    init=functools.partial(init, config),
    receive=functools.partial(receive, config),
    num_workers=num_workers,
    period=period,
    normalise=normalise,
    alpha=alpha,
    serve=functools.partial(serve, config),
    serve_many=functools.partial(serve_many, config),
  )


def folded_receive(server: Any, period: int = 1, recheck: bool = False) -> Callable[..., Any]:
  """Any server applied to ``k`` messages of one worker in one call (the Ray PS shard's).

  The returned ``receive(state, messages, finite, worker) -> (state, n, alphas, params)`` gives
  the values of ``k`` separate calls of ``server.receive`` in order, on flat messages (the Ray
  shard's slice of each message). ``finite[i]`` is the sender's verdict on the whole message
  ``i``, so that every shard rejects a message with a NaN in any slice: ALADDIN's server (a
  :class:`ParameterServer`, through its ``serve_many``) trusts it, and the other servers are
  given a rejected message as NaN, which they reject.

  Args:
    server: a server with ``receive(state, message, worker) -> (state, Reply)``, e.g. a
      :class:`ParameterServer` or an :class:`ASPServer`, on flat (1-D) parameters.
    period: the fewest messages of one worker between two of its replies (the server's
      ``period``; 1 for a server that replies to every message): ``ceil(k / period)`` slots
      then hold every reply of a call.
    recheck: a :class:`ParameterServer` checks the finiteness of its slices too, besides the
      sender's verdict.

  Returns:
    The jittable ``receive(state, messages, finite, worker)``: ``messages`` ``[k, size]``,
    ``finite`` bool[k], ``worker`` an int32 scalar; it returns the new state, ``n`` (int32) the
    replies the messages triggered, and ``alphas`` (float32[ceil(k / period)]) and ``params``
    (``[ceil(k / period), size]``) whose first ``n`` rows are those replies, in order.

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> from optax_lena import aladdin as al
    >>> server = al.parameter_server(2, optax.sgd(1.0), period=2, normalise="sum")
    >>> receive = jax.jit(al.folded_receive(server, period=2))
    >>> messages = jnp.array([[1.0, 1.0], [jnp.nan, 0.0], [2.0, 2.0]])
    >>> finite = jnp.array([True, False, True])
    >>> state, n, alphas, params = receive(server.init(jnp.zeros(2)), messages, finite, 0)
    >>> int(n), params[0].tolist(), int(state.num_rejected)
    (1, [-3.0, -3.0], 1)
  """
  if isinstance(server, ParameterServer):

    def fold_served(state, messages, finite, worker):
      if recheck:
        finite = finite & jnp.stack([all_finite(m) for m in messages])
      return server.serve_many(state, messages, worker, finite)

    return fold_served

  def fold_received(state, messages, finite, worker):
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

  return fold_received
