"""The three gain-ratio rules as Optax building blocks: LENA's, AdaScale's and linear scaling's.

Each is :func:`optax_lena.scale_by_gain_ratio` of its rule (:mod:`optax_lena._src.gain_ratio`):
it multiplies each layer's update by the rule's ratio, without the base rate and without
warm-up, for chains of one's own (the ready optimizers in ``alias.py`` and ``adamw.py`` chain
them with a warm-up and the rate).
"""

from __future__ import annotations

import optax

from optax_lena._src import grouping as grouping_lib
from optax_lena._src import layer_axes as layer_axes_lib
from optax_lena._src.gain_ratio import (
  adascale_rule,
  lena_rule,
  linear_scaling_rule,
  scale_by_gain_ratio,
)


def scale_by_lena(
  *,
  beta: float | None = None,
  eps: float = 1e-6,
  grouping: grouping_lib.Grouping = None,
  num_samples: int | None = None,
  power: float = 1.0,
  per_worker_batch_size: int | None = None,
  reference_batch_size: int | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> optax.GradientTransformationExtraArgs:
  """LENA's layer-wise gain ratio (Eqs. 4, 5, 8).

  For every layer k: ``A_k <- beta top_k + (1-beta) A_k``, ``D_k <- beta bot_k + (1-beta) D_k``
  and the update is multiplied by ``r_k ** p`` with ``r_k = clip((A_k + eps) / (D_k + eps), 1,
  S)`` (p = 1: the paper).

  Args:
    beta: moving-average weight; ``None`` means ``min(S / 1000, 1)``.
    eps: stabiliser of the ratio (1e-6 in the paper); ``0`` makes the ratio exactly invariant
      to the scale of the gradients.
    grouping: ``None`` (one ratio per leaf), ``"module"``, a label pytree or a callable
      ``(path, leaf) -> label``.
    num_samples: the S that the statistics must have (checked at trace time), or ``None``.
    power: p; the update is multiplied by ``r ** p`` (0.5: the square-root rule for
      Adam-type optimizers).
    per_worker_batch_size: b (with ``reference_batch_size``).
    reference_batch_size: b0, the batch ``learning_rate`` was tuned at; the cap becomes
      ``k = S b / b0``.
    layer_axes: where each parameter stacks its layers: ``None`` (one layer per leaf), a
      pytree of ``int | None`` shaped like the parameters (or a prefix of it) or a callable
      ``(path, leaf) -> int | None``; each slice is a layer of its own (its own ratio), as in
      the unrolled model. Give the statistics the same ``layer_axes``.

  Returns:
    An ``optax.GradientTransformationExtraArgs``; call
    ``update(updates, state, params, grad_stats=stats)``.

  Raises:
    ValueError: at construction, for an argument outside its domain or an unknown
      ``grouping``; at ``init``, for a ``grouping`` or ``layer_axes`` that does not fit the
      parameters; at ``update``, without ``grad_stats`` or with statistics of another S than
      ``num_samples``.
    TypeError: ``grad_stats`` that is not a :class:`optax_lena.GradStats`.

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal: A Layer-Wise Adaptive Approach Toward
    Large-Scale DNN Training", WWW 2022: Eq. 4 (the statistics it reads), Eq. 8 (their moving
    averages), Eq. 5 (the layer's ratio, without the base rate).

  Examples:
    With statistics made by hand and ``eps=0``, each leaf's ratio is ``A_k / D_k`` clipped to
    ``[1, S]``: the bias's 8 / 2 is at the cap S = 4, the kernel's is 10 / 4.

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import optax_lena as ol
    >>> gbar = {"b": jnp.ones(2), "w": jnp.ones((2, 2))}  # ||gbar||^2: 2 and 4
    >>> stats = ol.GradStats(  # mean_i ||g_i||^2 of S = 4 per-worker gradients, ||gbar||^2
    ...   {"b": jnp.float32(8.0), "w": jnp.float32(10.0)}, 4,
    ...   {"b": jnp.float32(2.0), "w": jnp.float32(4.0)},
    ... )
    >>> tx = optax.chain(ol.scale_by_lena(eps=0.0), optax.scale_by_learning_rate(0.1))
    >>> updates, state = tx.update(gbar, tx.init(gbar), grad_stats=stats)
    >>> print(state[0].ratio)
    [4.  2.5]
    >>> print(updates["b"], updates["w"][0])
    [-0.4 -0.4] [-0.25 -0.25]
  """
  return scale_by_gain_ratio(
    lena_rule(
      beta=beta,
      eps=eps,
      grouping=grouping,
      num_samples=num_samples,
      power=power,
      per_worker_batch_size=per_worker_batch_size,
      reference_batch_size=reference_batch_size,
      layer_axes=layer_axes,
    )
  )


def scale_by_adascale(
  *,
  beta: float | None = None,
  eps: float = 1e-6,
  num_samples: int | None = None,
  power: float = 1.0,
  per_worker_batch_size: int | None = None,
  reference_batch_size: int | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> optax.GradientTransformationExtraArgs:
  """AdaScale's global gain ratio ``R = (sum_k A_k + eps) / (sum_k D_k + eps)``, in [1, S].

  Args:
    beta: moving-average weight; ``None`` means ``min(S / 1000, 1)``.
    eps: stabiliser of the ratio.
    num_samples: the S that the statistics must have, or ``None``.
    power: p; the update is multiplied by ``r ** p`` (0.5: the square-root rule for
      Adam-type optimizers).
    per_worker_batch_size: b (with ``reference_batch_size``).
    reference_batch_size: b0, the batch ``learning_rate`` was tuned at; the cap becomes
      ``k = S b / b0``.
    layer_axes: where each parameter stacks its layers: ``None`` (one layer per leaf), a
      pytree of ``int | None`` shaped like the parameters (or a prefix of it) or a callable
      ``(path, leaf) -> int | None``; each slice is a layer of its own (its own ratio), as in
      the unrolled model. Give the statistics the same ``layer_axes``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` taking ``grad_stats=``.

  Raises:
    ValueError: at construction, for an argument outside its domain; at ``init``, for a
      ``layer_axes`` that does not fit the parameters; at ``update``, without ``grad_stats`` or
      with statistics of another S than ``num_samples``.
    TypeError: ``grad_stats`` that is not a :class:`optax_lena.GradStats`.

  References:
    Johnson, Agrawal, Gu and Guestrin, "AdaScale SGD: A User-Friendly Algorithm for Distributed
    Training", ICML 2020; in the notation of Ko, Lee and Kim, WWW 2022, Eqs. 4, 5 and 8 with
    one group for the whole model.

  Examples:
    The same statistics as in :func:`scale_by_lena`, summed over the layers: one ratio,
    ``R = (8 + 10) / (2 + 4)``, for every leaf.

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import optax_lena as ol
    >>> gbar = {"b": jnp.ones(2), "w": jnp.ones((2, 2))}  # ||gbar||^2: 2 and 4
    >>> stats = ol.GradStats(  # mean_i ||g_i||^2 of S = 4 per-worker gradients, ||gbar||^2
    ...   {"b": jnp.float32(8.0), "w": jnp.float32(10.0)}, 4,
    ...   {"b": jnp.float32(2.0), "w": jnp.float32(4.0)},
    ... )
    >>> rule = ol.scale_by_adascale(beta=1.0, eps=0.0)  # beta = 1: this update's statistics
    >>> tx = optax.chain(rule, optax.scale_by_learning_rate(0.1))
    >>> updates, state = tx.update(gbar, tx.init(gbar), grad_stats=stats)
    >>> print(state[0].global_ratio, state[0].ratio)
    3.0 [3. 3.]
  """
  return scale_by_gain_ratio(
    adascale_rule(
      beta=beta,
      eps=eps,
      num_samples=num_samples,
      power=power,
      per_worker_batch_size=per_worker_batch_size,
      reference_batch_size=reference_batch_size,
      layer_axes=layer_axes,
    )
  )


def scale_by_linear_scaling(
  *,
  num_samples: int | None = None,
  power: float = 1.0,
  per_worker_batch_size: int | None = None,
  reference_batch_size: int | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> optax.GradientTransformationExtraArgs:
  """Linear scaling: multiplies every update by S (by ``S ** p`` with ``power=p``).

  The statistics' moving averages are still tracked (a few scalars per leaf) so that
  :func:`optax_lena.diagnostics` can report gradient noise scales for this baseline too.

  Args:
    num_samples: the S that the statistics must have, or ``None``.
    power: p; the update is multiplied by ``r ** p`` (0.5: the square-root rule for
      Adam-type optimizers).
    per_worker_batch_size: b (with ``reference_batch_size``).
    reference_batch_size: b0, the batch ``learning_rate`` was tuned at; the factor becomes
      ``k = S b / b0``.
    layer_axes: where each parameter stacks its layers: ``None`` (one layer per leaf), a
      pytree of ``int | None`` shaped like the parameters (or a prefix of it) or a callable
      ``(path, leaf) -> int | None``; each slice is a layer of its own (its own ratio), as in
      the unrolled model. Give the statistics the same ``layer_axes``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` taking ``grad_stats=``.

  Raises:
    ValueError: at construction, for an argument outside its domain; at ``init``, for a
      ``layer_axes`` that does not fit the parameters; at ``update``, without ``grad_stats`` or
      with statistics of another S than ``num_samples``.
    TypeError: ``grad_stats`` that is not a :class:`optax_lena.GradStats`.

  References:
    Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017; the
    square-root rule (``power=0.5``): Malladi et al., "On the SDEs and Scaling Rules for
    Adaptive Gradient Algorithms", NeurIPS 2022.

  Examples:
    S = 4 per-worker gradients: on the square-root rule the updates are doubled.

    >>> import jax.numpy as jnp
    >>> import optax_lena as ol
    >>> gbar = {"w": jnp.ones(3)}
    >>> stats = ol.GradStats({"w": jnp.float32(6.0)}, 4, {"w": jnp.float32(3.0)})
    >>> tx = ol.scale_by_linear_scaling(power=0.5)
    >>> updates, state = tx.update(gbar, tx.init(gbar), grad_stats=stats)
    >>> print(state.ratio, updates["w"])
    [4.] [2. 2. 2.]
  """
  return scale_by_gain_ratio(
    linear_scaling_rule(
      num_samples=num_samples,
      power=power,
      per_worker_batch_size=per_worker_batch_size,
      reference_batch_size=reference_batch_size,
      layer_axes=layer_axes,
    )
  )
