"""The baselines of the ALADDIN paper (Section 4) in the same pure, jittable terms: AR-SGD, ASP
(Hogwild), EASGD and SGP (``docs/ALADDIN.md``, section 4)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_lena._src.aladdin import checks
from optax_lena._src.aladdin.server import Reply, adopt, all_finite

PyTree = Any


def _compute_dtype(dtype: Any) -> Any:
  return jnp.promote_types(dtype, jnp.float32)


def ar_sgd_mean(grads: Sequence[PyTree] | PyTree, *, stacked: bool = False) -> PyTree:
  """AR-SGD's all-reduce: the mean of the n workers' gradients of one iteration, on which every
  worker then takes the same ``tx`` step (``jax.lax.pmean`` inside ``pmap``/``shard_map``).

  Args:
    grads: a sequence of n gradient trees, or (``stacked=True``) one tree whose leaves have a
      leading worker axis of size n.
    stacked: whether ``grads`` is stacked.

  Returns:
    The mean gradient tree (float32 accumulation for lower-precision leaves, cast back).
  """

  mean = lambda x: jnp.mean(x.astype(_compute_dtype(x.dtype)), axis=0).astype(x.dtype)
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
  """ASP (Hogwild) server: ``init(params)``, ``receive(state, grads, worker) -> (state, Reply)``."""

  init: Callable[[PyTree], ASPState]
  receive: Callable[[ASPState, PyTree, Any], tuple[ASPState, Reply]]


def asp_server(server_tx: optax.GradientTransformation) -> ASPServer:
  """ASP / Hogwild: the server steps at once on every gradient, ``x~ <- x~ + server_tx(g)``, and
  the waiting worker adopts x~ (``server_tx`` is the only optimizer). A gradient with a NaN or an
  Inf is ignored (``num_rejected`` + 1, x~ unchanged).

  Args:
    server_tx: the Optax transformation applied to every gradient.

  Returns:
    An :class:`ASPServer`, whose reply adopts the new x~ (``worker`` is not used).

  References:
    Recht et al., Hogwild!, NeurIPS 2011.
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
  """State of :func:`easgd_server`: the center variable x~ and the number of exchanges."""

  params: PyTree
  num_exchanges: jax.Array


class EASGDServer(NamedTuple):
  """EASGD server: ``init(params)``, ``receive(state, local_params, worker) -> (state, Reply)``
  (``exchange``: the same, returning the new local model itself)."""

  init: Callable[[PyTree], EASGDState]
  exchange: Callable[[EASGDState, PyTree, Any], tuple[EASGDState, PyTree]]
  num_workers: int
  beta: float
  tau: int
  receive: Callable[[EASGDState, PyTree, Any], tuple[EASGDState, Reply]]


def easgd_server(num_workers: int, *, beta: float | None = None, tau: int = 2) -> EASGDServer:
  """Asynchronous EASGD's elastic exchange, every ``tau`` local steps of a worker: with
  ``d = x_i - x~``, ``x_i <- x_i - beta d`` and ``x~ <- x~ + beta d``.

  Args:
    num_workers: n.
    beta: the moving rate in (0, 1]; None for 0.9 / n (the paper's).
    tau: the communication period in local steps (>= 1); kept on the server for the caller.

  Returns:
    An :class:`EASGDServer`, whose reply adopts the worker's new local model (leaf dtypes are
    kept; the computation is in float32 or wider).

  References:
    Zhang, Choromanska and LeCun, "Deep learning with Elastic Averaging SGD", NeurIPS 2015.
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
      dtype = _compute_dtype(x.dtype)
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
  """Stochastic gradient push over a directed exponential graph (see :func:`sgp`)."""

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

  Node i trains the de-biased model ``x_i / w_i``; in round k it keeps half of ``(x_i, w_i)`` and
  pushes half to ``(i + 2^(k mod m)) mod n``, ``m = floor(log2(n - 1)) + 1``, and mixes what it
  receives (with ``overlap=1``, what was sent to it the round before).

  Per-node pieces: ``peer(node, step)``, ``send(x, w) -> ((x_kept, w_kept), (x_msg, w_msg))``,
  ``mix(x, w, x_msg, w_msg)``, ``debias(x, w)``. Whole-cluster pieces on a stacked
  :class:`SGPState`: ``init(params)``, ``debiased(state)``, ``apply_updates(state,
  stacked_updates)``, ``gossip(state)`` (one synchronous round; ``step`` + 1).

  Args:
    num_workers: n >= 1.
    overlap: 0 (a node mixes this round's messages) or 1 (the previous round's; the paper).

  References:
    Assran, Loizou, Ballas and Rabbat, "Stochastic Gradient Push for Distributed Deep
    Learning", ICML 2019.
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
      dtype = _compute_dtype(x.dtype)
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
