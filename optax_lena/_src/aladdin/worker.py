"""ALADDIN's worker (Algorithm 1): local self-update and the PS-triggered merge (Eq. 3); and
:class:`WorkerProgram`, any algorithm's worker side as pure functions that every engine runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optax_lena._src.aladdin import checks
from optax_lena._src.precision import accumulation_dtype

PyTree = Any


def worker_merge(params: PyTree, global_params: PyTree, alpha: Any) -> PyTree:
  """Eq. 3 of ALADDIN, the PS-triggered local update: ``x_i <- (1 - alpha) x_i + alpha x~``.

  A worker applies it to each reply of the server as soon as the reply has arrived, between two
  of its own steps (Algorithm 1, line 4); its optimizer state (momentum) is not touched.
  Computed in float32 (or the leaf's dtype when wider) and cast back to each leaf's dtype:
  ``alpha = 0`` returns ``params`` and ``alpha = 1`` ``global_params`` exactly (for finite
  values), so merging a reply that is not ready (weight 0) is harmless and every symmetric
  server's reply (weight 1) is adopted exactly. Under ``jit`` XLA may fuse a multiply-add,
  which can change the last bit.

  Args:
    params: the worker's local model x_i.
    global_params: the global model x~ from the server's reply (same structure and shapes; its
      dtypes may differ).
    alpha: the merge weight alpha_i in [0, 1] (a scalar, possibly traced), or a tree like
      ``params`` of weights broadcastable to each leaf (one weight per server shard).

  Returns:
    The merged model, with the structure, shapes and dtypes of ``params``.

  Raises:
    ValueError: ``global_params`` differs from ``params`` in structure or in a leaf's shape.

  References:
    Ko, Choi, Jei, Lee and Kim, "ALADDIN: Asymmetric Centralized Training for Distributed Deep
    Learning", CIKM 2021: Eq. 3 and Algorithm 1.

  Examples:
    >>> import jax.numpy as jnp
    >>> from optax_lena import aladdin as al
    >>> local = {"w": jnp.array([1.0, 3.0])}
    >>> al.worker_merge(local, {"w": jnp.array([3.0, 3.0])}, 0.25)["w"].tolist()
    [1.5, 3.0]
    >>> al.worker_merge({"w": jnp.ones(2, jnp.bfloat16)}, {"w": jnp.zeros(2)}, 0.5)["w"].dtype
    dtype(bfloat16)
  """
  structure: Any = jax.tree.structure(params)  # Any: PyTreeDef's stubs lack comparisons
  if structure != jax.tree.structure(global_params):
    raise ValueError(
      f"The tree structure of global_params does not match params: "
      f"{jax.tree.structure(global_params)} vs {jax.tree.structure(params)}. Pass the reply's "
      "params (the server's model, initialised with these parameters)."
    )

  per_leaf: Any = jax.tree.structure(alpha) == structure
  alphas = jax.tree.leaves(alpha) if per_leaf else [alpha] * structure.num_leaves

  def merge(x, g, alpha):
    if jnp.shape(x) != jnp.shape(g):
      raise ValueError(
        f"global_params has a leaf of shape {jnp.shape(g)} where params has {jnp.shape(x)}; "
        "pass the reply of the server that was initialised with these parameters."
      )
    dtype = accumulation_dtype(x.dtype)
    a = jnp.asarray(alpha, dtype)
    return ((1 - a) * x.astype(dtype) + a * g.astype(dtype)).astype(x.dtype)

  pairs = zip(jax.tree.leaves(params), jax.tree.leaves(global_params), alphas, strict=True)
  return jax.tree.unflatten(structure, [merge(x, g, a) for x, g, a in pairs])


def local_optimizer(
  learning_rate: optax.ScalarOrSchedule,
  *,
  momentum: float = 0.9,
  weight_decay: float = 1e-4,
  nesterov: bool = False,
) -> optax.GradientTransformation:
  """The paper's local optimizer: momentum SGD 0.9 with weight decay 1e-4.

  PyTorch's semantics: the decay ``weight_decay * x`` is added to the gradient before the
  momentum, ``m <- momentum m + g + weight_decay x`` and ``x <- x - learning_rate m``. The paper
  trains every algorithm's workers with it (AR-SGD, EASGD and SGP as well as ALADDIN).

  Args:
    learning_rate: eta, a float or an Optax schedule.
    momentum: momentum coefficient (0.9 in the paper).
    weight_decay: L2 coefficient added to the gradient (1e-4 in the paper).
    nesterov: Nesterov momentum (not used by the paper).

  Returns:
    An Optax ``GradientTransformation``: ``optax.chain(optax.add_decayed_weights(weight_decay),
    optax.sgd(learning_rate, momentum=momentum, nesterov=nesterov))``.

  References:
    Ko, Choi, Jei, Lee and Kim, "ALADDIN: Asymmetric Centralized Training for Distributed Deep
    Learning", CIKM 2021, Section 5 (the experimental setup).

  Examples:
    >>> import jax.numpy as jnp
    >>> from optax_lena import aladdin as al
    >>> tx = al.local_optimizer(1.0, weight_decay=0.5)
    >>> params = {"w": jnp.ones(1)}
    >>> updates, _ = tx.update({"w": jnp.zeros(1)}, tx.init(params), params)
    >>> updates["w"].tolist()  # -learning_rate * (g + weight_decay * w)
    [-0.5]
  """
  return optax.chain(
    optax.add_decayed_weights(weight_decay),
    optax.sgd(learning_rate, momentum=momentum, nesterov=nesterov),
  )


#: What an ALADDIN worker may send: its own displacement (the recipe) or its gradient.
MESSAGES = ("update", "gradient")


def check_message(message: Any) -> str:
  """``message`` is ``"update"`` or ``"gradient"`` (an error that names both otherwise)."""
  if message not in MESSAGES:
    raise ValueError(
      f"message must be 'update' (the worker sends its own displacement x_before - x_after, "
      f"momentum and weight decay included; serve it with server_tx=optax.sgd(1.0)) or "
      f"'gradient' (the raw mini-batch gradient, Algorithm 1 as printed; serve it with "
      f"server_tx=optax.sgd(eta)), got {message!r}."
    )
  return message


def local_step(
  loss_fn: Callable[..., Any],
  tx: optax.GradientTransformation,
  *,
  message: str = "update",
  has_aux: bool = False,
) -> Callable[[PyTree, optax.OptState, Any], tuple[PyTree, optax.OptState, PyTree, Any]]:
  """The worker's iteration of ALADDIN's Algorithm 1 (lines 1-3): gradient, local step, message.

  The step computes the mini-batch gradient ``g`` at the worker's model, takes its own
  optimizer step ``x_i <- x_i + tx(g)`` (the *local self-update*) and returns the message the
  worker pushes to the server without waiting for an answer:

  * ``"update"`` (the recommended recipe): the worker's own displacement ``x_before - x_after``
    (momentum and weight decay included, computed as the difference so that rounding is
    included too). Served with ``server_tx=optax.sgd(1.0)`` and ``normalise="mean_of_locals"``,
    x~ stays the average of the local models between merges, whatever ``tx``.
  * ``"gradient"`` (Algorithm 1 as printed): ``g`` itself, at the parameters before the step.
    With a momentum ``tx`` the server's model then drifts from the workers' average.

  With plain-SGD workers and ``optax.sgd(eta)`` on the server the two messages give the same
  algorithm.

  Args:
    loss_fn: ``loss_fn(params, batch) -> loss`` (a scalar; with ``has_aux``, ``(loss, aux)``).
    tx: the local optimizer, any Optax transformation (the paper's: :func:`local_optimizer`).
    message: ``"update"`` or ``"gradient"``.
    has_aux: whether ``loss_fn`` returns ``(loss, aux)``; ``loss`` is then that pair.

  Returns:
    A pure, jittable ``step(params, opt_state, batch) -> (params, opt_state, message, loss)``.

  Raises:
    TypeError: ``loss_fn`` is not callable or ``tx`` is not an Optax transformation.
    ValueError: ``message`` is not ``"update"`` or ``"gradient"``.

  References:
    Ko, Choi, Jei, Lee and Kim, "ALADDIN: Asymmetric Centralized Training for Distributed Deep
    Learning", CIKM 2021: Algorithm 1, lines 1-3 (the ``"gradient"`` message).

  Examples:
    >>> import jax.numpy as jnp
    >>> import optax
    >>> from optax_lena import aladdin as al
    >>> loss_fn = lambda params, batch: jnp.mean((batch[0] @ params["w"] - batch[1]) ** 2)
    >>> batch = (jnp.eye(2), jnp.array([1.0, 2.0]))
    >>> params, tx = {"w": jnp.zeros(2)}, optax.sgd(0.5)
    >>> step = al.local_step(loss_fn, tx)
    >>> params, opt_state, message, loss = step(params, tx.init(params), batch)
    >>> params["w"].tolist(), message["w"].tolist(), float(loss)
    ([0.5, 1.0], [-0.5, -1.0], 2.5)
    >>> gradient_step = al.local_step(loss_fn, tx, message="gradient")
    >>> gradient_step({"w": jnp.zeros(2)}, tx.init(params), batch)[2]["w"].tolist()
    [-1.0, -2.0]
  """
  if not callable(loss_fn):
    raise TypeError(f"loss_fn must be callable as loss_fn(params, batch), got {loss_fn!r}.")
  checks.check_tx(tx, "tx", "al.local_optimizer(0.1)")
  send_update = check_message(message) == "update"
  value_and_grad = jax.value_and_grad(loss_fn, has_aux=has_aux)

  def step(params, opt_state, batch):
    loss, grads = value_and_grad(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    if send_update:
      # The displacement actually taken (not -updates): x_before - x_after, so that the server's
      # sum of messages is exactly what the local models moved, rounding included.
      return new_params, opt_state, jax.tree.map(jnp.subtract, params, new_params), loss
    return new_params, opt_state, grads, loss

  return step


class LocalState(NamedTuple):
  """A worker's local state in a :class:`WorkerProgram` (every algorithm's but SGP's).

  Attributes:
    params: the worker's model.
    opt_state: its optimizer's state (``()`` for ASP's workers, which have none).
  """

  params: PyTree
  opt_state: optax.OptState


class WorkerProgram(NamedTuple):
  """The worker side of one algorithm as pure, jittable functions, which both engines run.

  ``spec.program(loss_fn, n)`` builds it; the engines keep only the driving, the timing and the
  transport.

  Attributes:
    init: ``init(params) -> state``, the local state of a worker starting from ``params``.
    step: ``step(state, batch) -> (state, message, loss)``: one local iteration and what the
      worker sends.
    apply: ``apply(state, reply) -> state``: what comes back (a server's :class:`Reply`, merged
      by Eq. 3; AR-SGD's sum of the gradients, stepped on; SGP's peer message, mixed).
    params: ``params(state)``: the worker's model to evaluate (SGP: de-biased).
  """

  init: Callable[[PyTree], Any]
  step: Callable[[Any, Any], tuple[Any, PyTree, Any]]
  apply: Callable[[Any, Any], Any]
  params: Callable[[Any], PyTree]


def merge_reply(state: LocalState, reply: Any) -> LocalState:
  """Eq. 3 with a server's reply (weight 1 for ASP's and EASGD's: the worker adopts it)."""
  return state._replace(params=worker_merge(state.params, reply.params, reply.alpha))


def stepping_program(
  step: Callable[..., tuple[PyTree, Any, PyTree, Any]],
  tx: optax.GradientTransformation | None,
  apply: Callable[[Any, Any], Any] = merge_reply,
) -> WorkerProgram:
  """The program of a worker with a :class:`LocalState`, ``step(params, opt_state, batch) ->
  (params, opt_state, message, loss)`` (e.g. :func:`local_step`) and ``tx`` its optimizer."""

  def init(params: PyTree) -> LocalState:
    return LocalState(params, tx.init(params) if tx is not None else ())

  def step_fn(state: LocalState, batch: Any) -> tuple[LocalState, PyTree, Any]:
    params, opt_state, message, loss = step(state.params, state.opt_state, batch)
    return LocalState(params, opt_state), message, loss

  return WorkerProgram(init, step_fn, apply, lambda state: state.params)
