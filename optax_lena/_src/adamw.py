"""Large-batch AdamW: LENA, AdaScale and linear scaling around Adam, on the square-root rule.

**Why a power.** For momentum SGD, an update that averages k times more samples has k times less
gradient variance, and k times the rate keeps the trajectory (linear scaling; the gain ratio r
of AdaScale and LENA estimates that k, the number of single-worker iterations the update is
worth, from the gradients' noise). Adam divides its step by the root of the second-moment
estimate, which shrinks with the variance too, so k times the rate over-steps. Malladi et al.
(NeurIPS 2022) show that Adam and RMSprop follow the same SDE at batch k b when the rate grows
as ``sqrt(k)`` (and ``1 - beta`` by k, eps by ``1 / sqrt(k)``); AdaptDL's scaling for Adam and
LEGW (You et al., 2019) use the same square root. Chaining ``optax.scale_by_adam`` with
``ol.scale_by_lena()`` multiplies Adam's step by r, i.e. linear scaling in disguise; the
optimizers here multiply it by ``r ** power`` with ``power=0.5`` by default: the square-root rule
with AdaScale's global or LENA's per-layer estimate of k in place of S.

**The chain.** ``skip_nonfinite_steps(chain(scale_by_adam(b1, b2, adam_eps),
add_decayed_weights(weight_decay, mask), gain ratio ** power, warm-up, -eta0 * schedule))``,
i.e. ``w <- w - eta_k (m_hat / (sqrt(v_hat) + adam_eps) + lambda w)`` with
``eta_k = r_k ** p * warmup_k * eta0 * schedule``: AdamW (Loshchilov and Hutter, ICLR 2019)
whose rate is scaled per layer. The weight decay is decoupled from the moments and multiplied by
the layer's rate, as ``optax.adamw`` multiplies it by the learning rate. The ratios read the
statistics of the raw gradients (``grad_stats``), never Adam's direction. The state-aware
warm-up's progress still advances by r (single-worker iterations), so ``theta`` keeps its unit.

Only the rate follows the rule: the betas and eps are the user's (as AdaptDL and LEGW do). With
a fixed S, Malladi et al.'s full rule can be applied by hand (``b1 = 1 - S (1 - b1_1)``, etc.).
"""

from __future__ import annotations

import optax

from optax_lena._src import alias, checks, gain_ratio
from optax_lena._src import grouping as grouping_lib
from optax_lena._src import layer_axes as layer_axes_lib


@alias.shared_args
def large_batch_adamw(
  learning_rate: optax.ScalarOrSchedule,
  rule: gain_ratio.GainRatioRule,
  *,
  b1: float = 0.9,
  b2: float = 0.999,
  adam_eps: float = 1e-8,
  weight_decay: float = 1e-4,
  weight_decay_mask: alias.WeightDecayMask = None,
  warmup_threshold: float | None = None,
  warmup_steps: float = 0,
  clock: str = "updates",
  warmup_progress: str = "ratio",
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> optax.GradientTransformationExtraArgs:
  """AdamW whose per-layer rate is scaled by ``rule`` (give it ``power=0.5``) and warmed up.

  Args:
    learning_rate: eta0, AdamW's rate at the reference batch (float or Optax schedule).
    rule: the gain-ratio rule, e.g. ``ol.lena_rule(power=0.5)``.
    {adam}
    weight_decay: lambda, decoupled (AdamW) and multiplied by the layer's rate.
    {weight_decay_mask}
    warmup_threshold: theta of the state-aware warm-up in single-worker iterations, or None.
    warmup_steps: W of the fixed warm-up in base steps, or 0.
    clock: ``"updates"`` or ``"samples"`` for the schedule.
    warmup_progress: the state-aware warm-up's progress rule (``progress=`` of
      :func:`optax_lena.layerwise_warmup`).
    {layer_axes_of_rule}

  Returns:
    An ``optax.GradientTransformationExtraArgs`` taking ``grad_stats=``.

  Raises:
    {construction_errors}

  References:
    Loshchilov and Hutter, "Decoupled Weight Decay Regularization", ICLR 2019 (Algorithm 2,
    AdamW); Malladi, Lyu, Panigrahi and Arora, "On the SDEs and Scaling Rules for Adaptive
    Gradient Algorithms", NeurIPS 2022 (the square-root scaling rule); the
    rules of Ko, Lee and Kim, WWW 2022 (Eqs. 4, 5, 8; warm-up Eqs. 6-7).

  Examples:
    AdaScale's one ratio R on the square-root rule: AdamW's rate times ``sqrt(R)``.

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import optax_lena as ol
    >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    >>> loss_fn = lambda p, x: jnp.mean((x @ p["w"] + p["b"]) ** 2)
    >>> xs = jax.random.normal(jax.random.key(0), (4, 8, 3))  # 4 batches of 8 examples
    >>> per_worker = jax.vmap(jax.grad(loss_fn), (None, 0))(params, xs)  # S = 4 workers
    >>> grads, stats = ol.stacked_grad_stats(per_worker)
    >>> tx = ol.large_batch_adamw(1e-3, ol.adascale_rule(power=0.5), weight_decay=0.05)
    >>> opt_state = tx.init(params)
    >>> updates, opt_state = tx.update(grads, opt_state, params, grad_stats=stats)
    >>> params = optax.apply_updates(params, updates)
    >>> diag = ol.diagnostics(opt_state)
    >>> print(round(float(diag["global_ratio"]), 3))
    1.304
    >>> print([round(float(x), 3) for x in diag["lr_multiplier"]])  # sqrt(R), every layer
    [1.142, 1.142]
  """
  rule = alias.with_layer_axes(rule, layer_axes)
  checks.check_adam_betas(b1, b2)
  checks.check_weight_decay(weight_decay)
  inner: list[optax.GradientTransformation] = [optax.scale_by_adam(b1=b1, b2=b2, eps=adam_eps)]
  if not alias.is_zero(weight_decay):
    inner.append(alias.decayed_weights(weight_decay, weight_decay_mask))
  return alias.gain_ratio_chain(
    inner,
    learning_rate,
    rule,
    warmup_threshold=warmup_threshold,
    warmup_steps=warmup_steps,
    clock=clock,
    warmup_progress=warmup_progress,
  )


@alias.shared_args
def lena_adamw(
  learning_rate: optax.ScalarOrSchedule,
  *,
  b1: float = 0.9,
  b2: float = 0.999,
  adam_eps: float = 1e-8,
  weight_decay: float = 1e-4,
  weight_decay_mask: alias.WeightDecayMask = None,
  power: float = 0.5,
  warmup_threshold: float | None = None,
  eps: float = 1e-6,
  beta: float | None = None,
  grouping: grouping_lib.Grouping = None,
  warmup_steps: float = 0,
  clock: str = "updates",
  num_samples: int | None = None,
  warmup_progress: str = "ratio",
  per_worker_batch_size: int | None = None,
  reference_batch_size: int | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> optax.GradientTransformationExtraArgs:
  """LENA around AdamW: each layer's AdamW rate is multiplied by ``r_k ** power``.

  ``w <- w - r_k ** p * warmup_k * eta0 * schedule(t) * (m_hat / (sqrt(v_hat) + adam_eps) +
  lambda w)`` per layer k (the chain of :func:`large_batch_adamw`), with LENA's per-layer gain
  ratio ``r_k`` and, with ``warmup_threshold``, its state-aware warm-up. Adam's step already
  shrinks with the gradient variance, so ``r_k`` times the rate over-steps; ``power=0.5`` (the
  default) is the square-root rule.

  Args:
    learning_rate: eta0 (float or schedule), tuned at the reference batch.
    {adam}
    weight_decay: lambda, decoupled, multiplied by the layer's rate.
    {weight_decay_mask}
    {power_adamw}
    {reference_batch}
    warmup_threshold: theta of the state-aware warm-up (single-worker iterations), or None.
    eps: stabiliser of the gain ratio (not Adam's: that is ``adam_eps``).
    beta: moving-average weight of the statistics; None means ``min(S / 1000, 1)``.
    grouping: which leaves share a ratio (see :func:`optax_lena.lena`).
    warmup_steps: a fixed warm-up of W base steps instead.
    {adamw_clock}
    {layer_axes}

  Returns:
    An ``optax.GradientTransformationExtraArgs`` taking ``grad_stats=``.

  Raises:
    {construction_errors}

  References:
    Ko, Lee and Kim, "Not All Layers Are Equal: A Layer-Wise Adaptive Approach Toward
    Large-Scale DNN Training", WWW 2022: the per-layer ratio (Eqs. 4, 5 and 8) and the
    state-aware warm-up (Eqs. 6-7, Algorithm 1); Malladi, Lyu, Panigrahi and Arora, "On the SDEs
    and Scaling Rules for Adaptive Gradient Algorithms", NeurIPS 2022 (the square-root rule for
    adaptive optimizers); Loshchilov and Hutter, ICLR 2019 (AdamW). LAMB (You et al., ICLR 2020,
    ``optax.lamb``) is the trust-ratio alternative for Adam.

  Examples:
    The bias's ratio is at the cap S = 4, the kernel's near 1; each layer's rate is multiplied
    by ``sqrt(r_k)`` and by its warm-up factor ``r_k / theta`` after one update:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import optax_lena as ol
    >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    >>> loss_fn = lambda p, x: jnp.mean((x @ p["w"] + p["b"]) ** 2)
    >>> xs = jax.random.normal(jax.random.key(0), (4, 8, 3))  # 4 batches of 8 examples
    >>> per_worker = jax.vmap(jax.grad(loss_fn), (None, 0))(params, xs)  # S = 4 workers
    >>> grads, stats = ol.stacked_grad_stats(per_worker)
    >>> tx = ol.lena_adamw(1e-3, weight_decay=0.05, warmup_threshold=20.0)
    >>> opt_state = tx.init(params)
    >>> updates, opt_state = tx.update(grads, opt_state, params, grad_stats=stats)
    >>> params = optax.apply_updates(params, updates)
    >>> diag = ol.diagnostics(opt_state, params)
    >>> print({name: round(float(r), 3) for name, r in diag["gain_ratio"].items()})
    {'b': 4.0, 'w': 1.221}
    >>> print({name: round(float(x), 3) for name, x in diag["lr_multiplier"].items()})
    {'b': 0.4, 'w': 0.067}
  """
  return alias.with_rule(gain_ratio.lena_rule, large_batch_adamw, locals())


@alias.shared_args
def adascale_adamw(
  learning_rate: optax.ScalarOrSchedule,
  *,
  b1: float = 0.9,
  b2: float = 0.999,
  adam_eps: float = 1e-8,
  weight_decay: float = 1e-4,
  weight_decay_mask: alias.WeightDecayMask = None,
  power: float = 0.5,
  warmup_threshold: float | None = None,
  eps: float = 1e-6,
  beta: float | None = None,
  warmup_steps: float = 0,
  clock: str = "updates",
  num_samples: int | None = None,
  warmup_progress: str = "ratio",
  per_worker_batch_size: int | None = None,
  reference_batch_size: int | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> optax.GradientTransformationExtraArgs:
  """AdaScale around AdamW: AdamW's rate is multiplied by ``R ** power`` (one global ratio).

  Args:
    learning_rate: eta0 (float or schedule), tuned at the reference batch.
    {adam}
    weight_decay: lambda, decoupled, multiplied by the rate.
    {weight_decay_mask}
    {power_adamw}
    {reference_batch}
    warmup_threshold: theta of the state-aware warm-up advancing by R, or None.
    eps: stabiliser of the gain ratio.
    beta: moving-average weight; None means ``min(S / 1000, 1)``.
    warmup_steps: a fixed warm-up of W base steps instead.
    {adamw_clock}
    {layer_axes}

  Returns:
    An ``optax.GradientTransformationExtraArgs`` taking ``grad_stats=``.

  Raises:
    {construction_errors}

  References:
    Johnson, Agrawal, Gu and Guestrin, "AdaScale SGD: A User-Friendly Algorithm for
    Distributed Training", ICML 2020 (the global gain ratio); Malladi, Lyu, Panigrahi and
    Arora, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms", NeurIPS 2022 (the
    square-root rule); Loshchilov and Hutter, ICLR 2019 (AdamW).

  Examples:
    One ratio R for the whole model; AdamW's rate is multiplied by ``sqrt(R)``:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import optax_lena as ol
    >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    >>> loss_fn = lambda p, x: jnp.mean((x @ p["w"] + p["b"]) ** 2)
    >>> xs = jax.random.normal(jax.random.key(0), (4, 8, 3))  # 4 batches of 8 examples
    >>> per_worker = jax.vmap(jax.grad(loss_fn), (None, 0))(params, xs)  # S = 4 workers
    >>> grads, stats = ol.stacked_grad_stats(per_worker)
    >>> tx = ol.adascale_adamw(1e-3, weight_decay=0.05)
    >>> opt_state = tx.init(params)
    >>> updates, opt_state = tx.update(grads, opt_state, params, grad_stats=stats)
    >>> params = optax.apply_updates(params, updates)
    >>> diag = ol.diagnostics(opt_state)
    >>> print(round(float(diag["global_ratio"]), 3))
    1.304
    >>> print([round(float(x), 3) for x in diag["lr_multiplier"]])  # sqrt(R), every layer
    [1.142, 1.142]
  """
  return alias.with_rule(gain_ratio.adascale_rule, large_batch_adamw, locals())


@alias.shared_args
def linear_scaling_adamw(
  learning_rate: optax.ScalarOrSchedule,
  *,
  b1: float = 0.9,
  b2: float = 0.999,
  adam_eps: float = 1e-8,
  weight_decay: float = 1e-4,
  weight_decay_mask: alias.WeightDecayMask = None,
  power: float = 0.5,
  warmup_steps: float = 0,
  warmup_threshold: float | None = None,
  clock: str = "updates",
  num_samples: int | None = None,
  warmup_progress: str = "ratio",
  per_worker_batch_size: int | None = None,
  reference_batch_size: int | None = None,
  layer_axes: layer_axes_lib.LayerAxes = None,
) -> optax.GradientTransformationExtraArgs:
  """AdamW at ``S ** power`` times its rate: the square-root LSW baseline (``power=0.5``).

  Args:
    learning_rate: eta0 (float or schedule), tuned at the reference batch.
    {adam}
    weight_decay: lambda, decoupled, multiplied by the rate.
    {weight_decay_mask}
    {power_adamw}
    {reference_batch}
    warmup_steps: W of the fixed linear warm-up in base steps.
    warmup_threshold: a state-aware warm-up instead (progress advances by S each update).
    {adamw_clock}
    {layer_axes}

  Returns:
    An ``optax.GradientTransformationExtraArgs`` taking ``grad_stats=``.

  Raises:
    {construction_errors}

  References:
    Malladi, Lyu, Panigrahi and Arora, "On the SDEs and Scaling Rules for Adaptive Gradient
    Algorithms", NeurIPS 2022 (the square-root rule; this optimizer scales the rate only,
    not the betas and eps); You et al., "Large-Batch Training for LSTM and Beyond"
    (LEGW), SC 2019; Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour",
    2017 (the warm-up).

  Examples:
    At S = 4 the rate is ``sqrt(4) = 2`` times AdamW's, without warm-up:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import optax_lena as ol
    >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    >>> loss_fn = lambda p, x: jnp.mean((x @ p["w"] + p["b"]) ** 2)
    >>> xs = jax.random.normal(jax.random.key(0), (4, 8, 3))  # 4 batches of 8 examples
    >>> per_worker = jax.vmap(jax.grad(loss_fn), (None, 0))(params, xs)  # S = 4 workers
    >>> grads, stats = ol.stacked_grad_stats(per_worker)
    >>> tx = ol.linear_scaling_adamw(1e-3, weight_decay=0.05)
    >>> opt_state = tx.init(params)
    >>> updates, opt_state = tx.update(grads, opt_state, params, grad_stats=stats)
    >>> params = optax.apply_updates(params, updates)
    >>> print(ol.diagnostics(opt_state)["lr_multiplier"])
    [2. 2.]
  """
  return alias.with_rule(gain_ratio.linear_scaling_rule, large_batch_adamw, locals())
