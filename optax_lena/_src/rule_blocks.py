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

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal: A Layer-Wise Adaptive Approach Toward
    Large-Scale DNN Training", WWW 2022.
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

  References:
    Johnson, Agrawal, Gu and Guestrin, "AdaScale SGD: A User-Friendly Algorithm for Distributed
    Training", ICML 2020.
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

  References:
    Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017; the
    square-root rule (``power=0.5``): Malladi et al., "On the SDEs and Scaling Rules for
    Adaptive Gradient Algorithms", NeurIPS 2022.
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
