"""The baselines of the ALADDIN paper in the same pure, jittable terms as its server: AR-SGD's
all-reduce mean, the ASP (Hogwild) and EASGD servers, and SGP's push-sum gossip.

Every server answers with the one :class:`~optax_lena._src.aladdin.server_step.Reply` type,
which a worker applies with ``worker_merge``; computations on lower-precision floats are made in
float32 (:func:`~optax_lena._src.precision.accumulation_dtype`) and cast back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_lena._src.aladdin import checks
from optax_lena._src.aladdin.server_step import Reply, adopt, all_finite
from optax_lena._src.precision import accumulation_dtype

PyTree = Any


def ar_sgd_mean(grads: Sequence[PyTree] | PyTree, *, stacked: bool = False) -> PyTree:
  """AR-SGD's all-reduce: the mean of the n workers' gradients of one iteration.

  In AR-SGD (synchronous all-reduce SGD) every worker computes a gradient on its own mini-batch,
  waits for the others at a barrier, and all of them take the same optimizer step on the mean
  gradient, so the n models stay identical. Inside ``pmap`` or ``shard_map`` the same mean is
  ``jax.lax.pmean``; this function computes it for gradients gathered in one place, as the
  simulator does.

  Args:
    grads: a sequence of n gradient trees of one structure, or (``stacked=True``) one tree whose
      leaves have a leading worker axis of size n.
    stacked: whether ``grads`` is stacked.

  Returns:
    The mean gradient tree, every leaf in its own dtype (lower-precision floats are averaged in
    float32 and cast back).

  Raises:
    TypeError: ``grads`` is not a non-empty list or tuple (and ``stacked`` is False).
    ValueError: the workers' trees differ in structure.

  References:
    Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017
    (synchronous data-parallel SGD); the AR-SGD baseline of Ko, Choi, Jei, Lee and Kim,
    "ALADDIN: Asymmetric Centralized Training for Distributed Deep Learning", CIKM 2021.

  Examples:
    >>> import jax.numpy as jnp
    >>> from optax_lena import aladdin as al
    >>> grads = [{"w": jnp.array([1.0, 2.0])}, {"w": jnp.array([3.0, 6.0])}]
    >>> al.ar_sgd_mean(grads)["w"].tolist()
    [2.0, 4.0]
    >>> al.ar_sgd_mean({"w": jnp.array([[1.0, 2.0], [3.0, 6.0]])}, stacked=True)["w"].tolist()
    [2.0, 4.0]
  """
  mean = lambda x: jnp.mean(x.astype(accumulation_dtype(x.dtype)), axis=0).astype(x.dtype)
  if stacked:
    return jax.tree.map(mean, grads)
  if not isinstance(grads, list | tuple) or not grads:
    raise TypeError(
      "grads must be a non-empty list of per-worker gradient trees, or pass stacked=True for "
      "one tree with a leading worker axis."
    )
  structure: Any = jax.tree.structure(grads[0])  # Any: PyTreeDef's stubs lack comparisons
  for k, g in enumerate(grads):
    if jax.tree.structure(g) != structure:
      raise ValueError(
        f"Worker {k}'s gradient tree {jax.tree.structure(g)} differs from worker 0's "
        f"{structure}: every worker must send the gradient of the same parameter pytree."
      )
  return jax.tree.map(lambda *xs: mean(jnp.stack(xs)), *grads)


class ASPState(NamedTuple):
  """State of :func:`asp_server`.

  Attributes:
    params: the global model x~.
    opt_state: the state of ``server_tx``.
    num_rejected: messages with a non-finite gradient (ignored; int32).
    num_updates: steps applied (int32).
  """

  params: PyTree
  opt_state: optax.OptState
  num_rejected: jax.Array
  num_updates: jax.Array


class ASPServer(NamedTuple):
  """What :func:`asp_server` returns.

  Attributes:
    init: ``init(params) -> ASPState``.
    receive: ``receive(state, grads, worker=0) -> (state, Reply)``: one step on ``grads``; the
      reply adopts the new x~.
  """

  init: Callable[[PyTree], ASPState]
  receive: Callable[[ASPState, PyTree, Any], tuple[ASPState, Reply]]


def asp_server(server_tx: optax.GradientTransformation) -> ASPServer:
  """ASP (asynchronous parallel SGD, Hogwild through a server): a step on every gradient.

  A worker sends the gradient at its model and waits; the server applies it at once,
  ``x~ <- x~ + server_tx(g)`` (``optax.sgd(eta)``: ``x~ - eta g``), and the worker adopts the new
  x~ (the reply's weight is 1). ``server_tx`` is the only optimizer: the workers have none. A
  gradient holding a NaN or an Inf is ignored (``num_rejected`` + 1, x~ and the optimizer state
  unchanged).

  Args:
    server_tx: the Optax transformation applied to every gradient.

  Returns:
    An :class:`ASPServer`, whose ``receive`` ignores ``worker``.

  Raises:
    TypeError: ``server_tx`` is not an Optax transformation.
    ValueError: at a call, ``grads`` differs from x~ in structure, a shape or a dtype.

  References:
    Recht, Re, Wright and Niu, "Hogwild!: A Lock-Free Approach to Parallelizing Stochastic
    Gradient Descent", NeurIPS 2011, Algorithm 1 (here through a server, as in the ASP baseline
    of Ko et al., CIKM 2021).

  Examples:
    >>> import jax.numpy as jnp
    >>> import optax
    >>> from optax_lena import aladdin as al
    >>> server = al.asp_server(optax.sgd(0.5))
    >>> state = server.init({"w": jnp.ones(2)})
    >>> state, reply = server.receive(state, {"w": jnp.array([1.0, -2.0])}, 0)
    >>> reply.params["w"].tolist(), float(reply.alpha), int(state.num_updates)
    ([0.5, 2.0], 1.0, 1)
  """
  checks.check_tx(server_tx, "server_tx", "optax.sgd(eta)")

  def init_fn(params: PyTree) -> ASPState:
    zero = jnp.zeros([], jnp.int32)
    return ASPState(params, server_tx.init(params), zero, zero)

  def receive_fn(state: ASPState, grads: PyTree, worker: Any = 0) -> tuple[ASPState, Reply]:
    del worker
    checks.check_like_params(
      grads, state.params, "grads", "Send the gradient of the server's parameter pytree."
    )
    finite = all_finite(grads)
    updates, opt_state = server_tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)

    keep = lambda new, old: jnp.where(finite, new, old)
    state = ASPState(
      params=jax.tree.map(keep, params, state.params),
      opt_state=jax.tree.map(keep, opt_state, state.opt_state),
      num_rejected=state.num_rejected + jnp.where(finite, 0, 1).astype(jnp.int32),
      num_updates=state.num_updates + finite.astype(jnp.int32),
    )
    return state, adopt(state.params)

  return ASPServer(init_fn, receive_fn)


class EASGDState(NamedTuple):
  """State of :func:`easgd_server`.

  Attributes:
    params: the center variable x~.
    num_exchanges: exchanges so far (int32).
  """

  params: PyTree
  num_exchanges: jax.Array


class EASGDServer(NamedTuple):
  """What :func:`easgd_server` returns.

  Attributes:
    init: ``init(params) -> EASGDState``: the center starts at ``params``.
    exchange: ``exchange(state, local_params, worker) -> (state, new_local_params)``: one
      elastic exchange.
    num_workers: n.
    beta: the moving rate.
    tau: local steps between a worker's exchanges (kept for the caller; the server does not
      count them).
    receive: ``receive(state, local_params, worker) -> (state, Reply)``: ``exchange`` with the
      new local model as a reply of weight 1.
  """

  init: Callable[[PyTree], EASGDState]
  exchange: Callable[[EASGDState, PyTree, Any], tuple[EASGDState, PyTree]]
  num_workers: int
  beta: float
  tau: int
  receive: Callable[[EASGDState, PyTree, Any], tuple[EASGDState, Reply]]


def easgd_server(num_workers: int, *, beta: float | None = None, tau: int = 2) -> EASGDServer:
  """Asynchronous EASGD's server: the elastic exchange of a worker's model with the center.

  Every ``tau`` local steps a worker sends its model x_i and waits; with ``d = x_i - x~`` the
  exchange moves both towards each other, ``x_i <- x_i - beta d`` and ``x~ <- x~ + beta d``,
  and the worker adopts its new model (the reply's weight is 1). Leaf dtypes are kept; the
  arithmetic is in float32 or wider.

  Args:
    num_workers: n.
    beta: the moving rate in (0, 1]; None for 0.9 / n (the paper's choice, ``n beta = 0.9``).
    tau: the communication period in local steps (>= 1), kept on the server for the caller.

  Returns:
    An :class:`EASGDServer`.

  Raises:
    TypeError: ``num_workers`` is not an int; at a call, ``worker`` is not an integer scalar.
    ValueError: ``num_workers`` or ``tau`` is below 1, or ``beta`` is outside (0, 1]; at a call,
      ``local_params`` differs from the center in structure, a shape or a dtype.
    IndexError: at a call, a concrete ``worker`` outside ``[0, num_workers)``.

  References:
    Zhang, Choromanska and LeCun, "Deep learning with Elastic Averaging SGD", NeurIPS 2015,
    Algorithm 1 (asynchronous EASGD; its moving rate alpha is ``beta`` here).

  Examples:
    >>> import jax.numpy as jnp
    >>> from optax_lena import aladdin as al
    >>> server = al.easgd_server(2, beta=0.25)
    >>> state = server.init({"w": jnp.zeros(2)})
    >>> state, reply = server.receive(state, {"w": jnp.array([4.0, -4.0])}, 1)
    >>> reply.params["w"].tolist(), state.params["w"].tolist()  # d = (4, -4), beta d = (1, -1)
    ([3.0, -3.0], [1.0, -1.0])
  """
  num_workers = checks.check_num_workers(num_workers)
  checks.check_positive_int(tau, "tau", "local steps between exchanges")
  beta = 0.9 / num_workers if beta is None else beta
  checks.check_beta(beta)
  beta = float(beta)

  def init_fn(params: PyTree) -> EASGDState:
    return EASGDState(params, jnp.zeros([], jnp.int32))

  def exchange_fn(
    state: EASGDState, local_params: PyTree, worker: Any
  ) -> tuple[EASGDState, PyTree]:
    checks.check_worker(worker, num_workers)
    checks.check_like_params(
      local_params, state.params, "local_params", "Exchange the worker's whole parameter pytree."
    )

    def step(x, c):
      dtype = accumulation_dtype(x.dtype)
      d = jnp.asarray(beta, dtype) * (x.astype(dtype) - c.astype(dtype))
      return (x.astype(dtype) - d).astype(x.dtype), (c.astype(dtype) + d).astype(c.dtype)

    leaves_x, treedef = jax.tree.flatten(local_params)
    pairs = [step(x, c) for x, c in zip(leaves_x, jax.tree.leaves(state.params), strict=True)]
    new_local = jax.tree.unflatten(treedef, [p[0] for p in pairs])
    center = jax.tree.unflatten(treedef, [p[1] for p in pairs])
    return EASGDState(center, state.num_exchanges + 1), new_local

  def receive_fn(state: EASGDState, local_params: PyTree, worker: Any) -> tuple[EASGDState, Reply]:
    state, new_local = exchange_fn(state, local_params, worker)
    return state, adopt(new_local)

  return EASGDServer(init_fn, exchange_fn, num_workers, beta, tau, receive_fn)


class SGPState(NamedTuple):
  """State of the n nodes of :func:`sgp`, stacked on a leading node axis.

  Attributes:
    numerators: the push-sum numerators x_i (a tree, leaves ``[n, ...]``).
    weights: the push-sum weights w_i (float32 ``[n]``); the model of node i is x_i / w_i.
    in_flight_numerators: with 1-overlap, the messages sent in the previous round, indexed by
      the node that will mix them (zeros when nothing is in flight).
    in_flight_weights: their weights (float32 ``[n]``).
    step: the gossip round k (int32), which selects the peer.
  """

  numerators: PyTree
  weights: jax.Array
  in_flight_numerators: PyTree
  in_flight_weights: jax.Array
  step: jax.Array


class SGP(NamedTuple):
  """What :func:`sgp` returns: SGP's push-sum pieces, per node and for the whole cluster.

  Attributes:
    num_workers: n.
    overlap: 0 or 1, rounds a message stays in flight.
    num_peers: m, the hops ``2^0 .. 2^(m-1)`` of the exponential graph.
    init: ``init(params) -> SGPState``: every node at ``params`` with weight 1.
    peer: ``peer(node, step)``: the node that ``node`` sends to in round ``step``.
    send: ``send(x, w) -> ((x_kept, w_kept), (x_msg, w_msg))``: halves ``(x, w)``.
    mix: ``mix(x, w, x_msg, w_msg) -> (x, w)``: adds a received message.
    debias: ``debias(x, w)``: the model ``x / w`` (leaf dtypes kept).
    debiased: ``debiased(state)``: every node's model, stacked.
    apply_updates: ``apply_updates(state, stacked_updates) -> state``: every node's local step,
      applied to its numerator.
    gossip: ``gossip(state) -> state``: one synchronous round of every node (``step`` + 1).
  """

  num_workers: int
  overlap: int
  num_peers: int
  init: Callable[[PyTree], SGPState]
  peer: Callable[[Any, Any], Any]
  send: Callable[[PyTree, Any], tuple[tuple[PyTree, jax.Array], tuple[PyTree, jax.Array]]]
  mix: Callable[[PyTree, Any, PyTree, Any], tuple[PyTree, jax.Array]]
  debias: Callable[[PyTree, Any], PyTree]
  debiased: Callable[[SGPState], PyTree]
  apply_updates: Callable[[SGPState, PyTree], SGPState]
  gossip: Callable[[SGPState], SGPState]


def sgp(num_workers: int, *, overlap: int = 1) -> SGP:
  """Stochastic gradient push (SGP): push-sum gossip on a directed exponential graph.

  Node i holds a push-sum numerator x_i and weight w_i and trains the de-biased model
  ``z_i = x_i / w_i``: its gradient is taken at z_i and its optimizer's update is applied to
  x_i. In round k it keeps half of ``(x_i, w_i)``, pushes the other half to its one peer
  ``(i + 2^(k mod m)) mod n``, ``m = floor(log2(n - 1)) + 1``, and adds what it receives (with
  ``overlap=1``, what was sent to it the round before, so communication overlaps a step). Halving
  is exact in floating point, so the sums of the numerators and of the weights, messages in
  flight included, never change. The engines drive the per-node pieces message by message; the
  whole-cluster pieces run synchronous rounds on a stacked :class:`SGPState`.

  Args:
    num_workers: n >= 1.
    overlap: 0 (a node mixes this round's messages) or 1 (the previous round's; the paper's
      1-overlap).

  Returns:
    An :class:`SGP` of pure, jittable functions.

  Raises:
    TypeError: ``num_workers`` is not an int.
    ValueError: ``num_workers`` is below 1 or ``overlap`` is not 0 or 1.

  References:
    Assran, Loizou, Ballas and Rabbat, "Stochastic Gradient Push for Distributed Deep
    Learning", ICML 2019: Algorithm 1 (SGP) and its overlap variant, on the directed
    exponential graph of its experiments.

  Examples:
    >>> import jax.numpy as jnp
    >>> from optax_lena import aladdin as al
    >>> gossip = al.sgp(4, overlap=0)
    >>> [gossip.peer(0, k) for k in range(3)]  # hops 1, 2, 1, ...
    [1, 2, 1]
    >>> state = gossip.init({"w": jnp.zeros(1)})
    >>> state = gossip.apply_updates(state, {"w": jnp.arange(4.0)[:, None]})  # node i at i
    >>> for _ in range(2):
    ...   state = gossip.gossip(state)
    >>> gossip.debiased(state)["w"].ravel().tolist()  # 4 nodes: exact average in 2 rounds
    [1.5, 1.5, 1.5, 1.5]
  """
  num_workers = checks.check_num_workers(num_workers)
  if overlap not in (0, 1):
    raise ValueError(
      f"overlap must be 0 or 1 (rounds a message may stay in flight), got {overlap}."
    )
  num_peers = max(1, (num_workers - 1).bit_length())  # floor(log2(n - 1)) + 1 for n >= 2

  def peer(node: Any, step: Any) -> Any:
    if isinstance(node, jax.core.Tracer) or isinstance(step, jax.core.Tracer):
      hop = jnp.left_shift(jnp.int32(1), jnp.asarray(step, jnp.int32) % num_peers)
      return (jnp.asarray(node, jnp.int32) + hop) % num_workers
    return (int(node) + 2 ** (int(step) % num_peers)) % num_workers

  def send(numerator: PyTree, weight: Any):
    # Halving is exact in floating point (an exponent change), so kept + message == whole.
    half = jax.tree.map(lambda x: x * jnp.asarray(0.5, x.dtype), numerator)
    w = jnp.asarray(weight, jnp.float32) * 0.5
    return (half, w), (half, w)

  def mix(numerator: PyTree, weight: Any, msg_numerator: PyTree, msg_weight: Any):
    total = jnp.asarray(weight, jnp.float32) + jnp.asarray(msg_weight, jnp.float32)
    return jax.tree.map(jnp.add, numerator, msg_numerator), total

  def debias(numerator: PyTree, weight: Any) -> PyTree:
    def one(x):
      dtype = accumulation_dtype(x.dtype)
      w = jnp.asarray(weight, dtype).reshape(jnp.shape(weight) + (1,) * (x.ndim - jnp.ndim(weight)))
      return (x.astype(dtype) / w).astype(x.dtype)

    return jax.tree.map(one, numerator)

  def init(params: PyTree) -> SGPState:
    stacked = jax.tree.map(lambda p: jnp.broadcast_to(p, (num_workers, *jnp.shape(p))), params)
    return SGPState(
      numerators=jax.tree.map(jnp.array, stacked),
      weights=jnp.ones([num_workers], jnp.float32),
      in_flight_numerators=jax.tree.map(jnp.zeros_like, stacked),
      in_flight_weights=jnp.zeros([num_workers], jnp.float32),
      step=jnp.zeros([], jnp.int32),
    )

  def debiased(state: SGPState) -> PyTree:
    return debias(state.numerators, state.weights)

  def apply_updates(state: SGPState, stacked_updates: PyTree) -> SGPState:
    return state._replace(numerators=optax.apply_updates(state.numerators, stacked_updates))

  def gossip(state: SGPState) -> SGPState:
    hop = jnp.left_shift(jnp.int32(1), state.step % num_peers)
    (kept_x, kept_w), message = send(state.numerators, state.weights)
    # Node i sends to i + hop, so node j receives what node j - hop sent: a roll by hop.
    arrived = jax.tree.map(lambda m: jnp.roll(m, hop, axis=0), message)
    held = (state.in_flight_numerators, state.in_flight_weights)
    mixed, (flight_x, flight_w) = (arrived, held) if overlap == 0 else (held, arrived)
    x, w = mix(kept_x, kept_w, *mixed)
    return SGPState(x, w, flight_x, flight_w, state.step + 1)

  return SGP(
    num_workers, overlap, num_peers, init, peer, send, mix, debias, debiased, apply_updates, gossip
  )
