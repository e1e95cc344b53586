"""Independent float64 NumPy reference of LENA (docs/LENA.md, steps 1-6) and its baselines.

Written from the specification only, never from the library's code, so that `test_numerics.py`
can check the float32 JAX library against it. Everything is float64 and deliberately plain:
readability over speed, the layers here are small.

Conventions (from docs/LENA.md and the test brief):

* ``t`` is the 1-based update index: ``t = 1`` at the first update.
* Statistics per layer k (Eq. 4): ``top_k = mean_i ||g_ik||^2`` and ``bot_k = ||mean_i g_ik||^2``.
* EMAs (Eq. 8) start at 0 with weight ``beta`` (default ``min(S / 1000, 1)``).
* Layer-wise ratio ``r = clip((A + eps) / (D + eps), 1, S)``; with ``groups`` A, D, r (and the
  warm-up progress) are per group, built from the sums of the member layers' ``top`` / ``bot``.
* Global AdaScale ratio ``R = clip((sum_k A_k + eps) / (sum_k D_k + eps), 1, S)``, always
  computed.
* Scaling rules: ``'linear_scaling'`` (ratio S), ``'adascale'`` (ratio R), ``'lena'`` (ratio r
  per layer or group).
* Warm-ups: ``'none'``; ``'fixed'`` (factor ``min(t * S / W, 1)``, W in base steps);
  ``'state_aware'`` (``P += ratio`` first, then factor ``P / theta`` if ``P <= theta`` else 1).
  The warm-up end step of a layer (state-aware warm-up only, LENA.md step 5) is the 1-based index
  of the first update whose factor is 1; -1 until then and always -1 for the other warm-ups, whose
  progress is reported as 0 (the library's convention for ``ol.diagnostics``).
* Learning rate ``eta_k = ratio_k * lr0 * schedule(clock) * factor_k``; the schedule is a
  multiplier on ``lr0`` evaluated at ``t - 1`` (clock ``'updates'``, the Optax count convention)
  or at ``(t - 1) * S`` (clock ``'samples'``, base steps seen before this update).
* Update (PyTorch momentum SGD, coupled weight decay): ``d = gbar + wd * w``, ``m = mu * m + d``,
  ``w = w - eta_k * m`` (with ``nesterov``: ``w = w - eta_k * (d + mu * m)``, PyTorch's Nesterov
  step); a layer excluded by ``decay_mask`` has ``d = gbar``.
* Power p: the rate multiplier is ``ratio ** p`` (the ratio itself in ``[1, k]``); the
  state-aware progress still advances by the ratio.
* Reference batch b0 (with per-worker batch b): the scale ``k = S b / b0`` replaces S as the
  ratio's cap, linear scaling's ratio, the base steps of the fixed warm-up (``t * k``) and the
  sample clock (``(t - 1) * k``). The statistics stay those of the S gradients; the ratio's
  numerator is the expected squared norm of a batch-b0 gradient,
  ``A_ref = ((k - 1) A + (S - k) D) / (S - 1)`` (from ``E||g_b||^2 = |G|^2 + tr / b``), and
  ``r = clip((A_ref + eps) / (D + eps), 1, k)``.
* Inner update ``'adamw'``: ``m = b1 m + (1 - b1) gbar``, ``v = b2 v + (1 - b2) gbar^2``,
  ``d = m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + adam_eps) + wd * w`` (decoupled decay),
  ``w = w - eta_k * d``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

RULES = ("linear_scaling", "adascale", "lena")
WARMUPS = ("none", "fixed", "state_aware")
CLOCKS = ("updates", "samples")


@dataclass(frozen=True)
class StepRecord:
  """Everything the reference knows after one update (per-layer arrays: one entry per layer)."""

  step: int  # 1-based update index t
  num_samples: int  # S
  beta: float  # EMA weight actually used
  learning_rate: float  # lr0 * schedule(clock), before ratio and warm-up
  mean_grad: list[np.ndarray]  # gbar_k
  sq_norm_mean: np.ndarray  # top_k = mean_i ||g_ik||^2
  mean_grad_sq_norm: np.ndarray  # bot_k = ||gbar_k||^2
  lena_ratio: np.ndarray  # clipped per-layer (or per-group) ratio r_k, whatever the rule
  gain_ratio: np.ndarray  # ratio the rule applies: S (linear), R (adascale) or r_k (lena)
  global_ratio: float  # clipped AdaScale ratio R
  warmup_progress: np.ndarray  # P_k (state-aware), 0 for the other warm-ups
  warmup_factor: np.ndarray  # factor in (0, 1]
  lr_multiplier: np.ndarray  # gain_ratio ** power * warmup_factor
  warmup_end_step: np.ndarray  # state-aware: first update whose factor is 1; else -1
  params: list[np.ndarray]  # parameters after the update


class ReferenceOptimizer:
  """Float64 reference of the ablation grid {linear, adascale, lena} x {none, fixed, state_aware}.

  Args:
    rule: ``'linear_scaling'``, ``'adascale'`` or ``'lena'``.
    warmup: ``'none'``, ``'fixed'`` or ``'state_aware'``.
    lr0: base learning rate eta0.
    momentum: mu.
    weight_decay: lambda (coupled, PyTorch style).
    eps: added to numerator and denominator of the ratios.
    beta: EMA weight; ``None`` means ``min(S / 1000, 1)``.
    warmup_threshold: theta, in single-worker iterations (state-aware warm-up).
    warmup_steps: W, in base steps (fixed warm-up).
    groups: one hashable group id per layer; layers sharing an id share A, D, r and the progress.
      ``None`` means one group per layer.
    schedule: multiplier on ``lr0`` as a function of the clock; ``None`` means constant 1.
    clock: ``'updates'`` (schedule(t - 1)) or ``'samples'`` (schedule((t - 1) * S)).
    decay_mask: one bool per layer, False for the layers that get no weight decay; ``None``
      means every layer is decayed.
    power: p of the rate multiplier ``ratio ** p``.
    per_worker_batch_size: b (with ``reference_batch_size``).
    reference_batch_size: b0, the batch the rate was tuned at; ``None`` means b.
    inner: ``'sgd'`` (momentum SGD, coupled decay) or ``'adamw'``.
    b1: Adam's first-moment decay.
    b2: Adam's second-moment decay.
    adam_eps: Adam's eps.
    nesterov: Nesterov momentum (``'sgd'`` only).
  """

  def __init__(
    self,
    rule: str,
    warmup: str = "none",
    lr0: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    eps: float = 1e-6,
    beta: float | None = None,
    warmup_threshold: float | None = None,
    warmup_steps: int | None = None,
    groups: Sequence[Hashable] | None = None,
    schedule: Callable[[float], float] | None = None,
    clock: str = "updates",
    decay_mask: Sequence[bool] | None = None,
    power: float = 1.0,
    per_worker_batch_size: int | None = None,
    reference_batch_size: int | None = None,
    inner: str = "sgd",
    b1: float = 0.9,
    b2: float = 0.999,
    adam_eps: float = 1e-8,
    nesterov: bool = False,
  ) -> None:
    if rule not in RULES:
      raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if warmup not in WARMUPS:
      raise ValueError(f"warmup must be one of {WARMUPS}, got {warmup!r}")
    if clock not in CLOCKS:
      raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    if warmup == "fixed" and not (warmup_steps and warmup_steps > 0):
      raise ValueError("warmup='fixed' needs warmup_steps > 0")
    if warmup == "state_aware" and not (warmup_threshold and warmup_threshold > 0):
      raise ValueError("warmup='state_aware' needs warmup_threshold > 0")
    self.rule = rule
    self.warmup = warmup
    self.lr0 = float(lr0)
    self.momentum = float(momentum)
    self.weight_decay = float(weight_decay)
    self.eps = float(eps)
    self.beta = beta
    self.warmup_threshold = warmup_threshold
    self.warmup_steps = warmup_steps
    self.groups = None if groups is None else list(groups)
    self.schedule = schedule
    self.clock = clock
    self.decay_mask = None if decay_mask is None else [bool(x) for x in decay_mask]
    if inner not in ("sgd", "adamw"):
      raise ValueError(f"inner must be 'sgd' or 'adamw', got {inner!r}")
    self.power = float(power)
    self.batch = per_worker_batch_size
    self.reference_batch = reference_batch_size
    self.inner = inner
    self.b1, self.b2, self.adam_eps = float(b1), float(b2), float(adam_eps)
    self.nesterov = bool(nesterov)
    self._v: list[np.ndarray] | None = None
    # State, created at the first step once the number of layers is known.
    self.t = 0
    self.history: list[StepRecord] = []
    self._group_of: np.ndarray | None = None  # layer index -> group index
    self._num_groups = 0
    self._a_ema: np.ndarray | None = None
    self._d_ema: np.ndarray | None = None
    self._progress: np.ndarray | None = None
    self._end: np.ndarray | None = None
    self._m: list[np.ndarray] | None = None

  @property
  def last(self) -> StepRecord:
    return self.history[-1]

  def _init_state(self, params: list[np.ndarray]) -> None:
    num_layers = len(params)
    labels = list(range(num_layers)) if self.groups is None else self.groups
    if len(labels) != num_layers:
      raise ValueError(f"groups has {len(labels)} entries for {num_layers} layers")
    ids: dict[Hashable, int] = {}
    self._group_of = np.array([ids.setdefault(lab, len(ids)) for lab in labels])
    self._num_groups = len(ids)
    self._a_ema = np.zeros(self._num_groups)
    self._d_ema = np.zeros(self._num_groups)
    self._progress = np.zeros(self._num_groups)
    self._end = np.full(self._num_groups, -1, dtype=np.int64)
    self._m = [np.zeros(np.shape(w), dtype=np.float64) for w in params]
    self._v = [np.zeros(np.shape(w), dtype=np.float64) for w in params]

  def step(
    self, params: Sequence[np.ndarray], per_worker_grads: Sequence[np.ndarray]
  ) -> list[np.ndarray]:
    """One update. ``per_worker_grads[k]`` has shape ``[S, *params[k].shape]``."""
    params = [np.asarray(w, dtype=np.float64) for w in params]
    grads = [np.asarray(g, dtype=np.float64) for g in per_worker_grads]
    if len(params) != len(grads):
      raise ValueError("params and per_worker_grads must have one entry per layer")
    S = grads[0].shape[0]
    for w, g in zip(params, grads, strict=True):
      if g.shape != (S, *w.shape):
        raise ValueError(f"gradient shape {g.shape} does not match [S={S}, *{w.shape}]")
    if self._m is None:
      self._init_state(params)
    assert self._group_of is not None and self._m is not None
    assert self._a_ema is not None and self._d_ema is not None
    assert self._progress is not None and self._end is not None
    self.t += 1
    t = self.t
    gof = self._group_of

    # Step 1 (Eq. 4): per-layer statistics of the S per-worker gradients.
    gbar = [g.mean(axis=0) for g in grads]
    top = np.array([np.mean(np.sum(g.reshape(S, -1) ** 2, axis=1)) for g in grads])
    bot = np.array([np.sum(gb**2) for gb in gbar])
    # Groups use the sums of their members' statistics.
    top_g = np.bincount(gof, weights=top, minlength=self._num_groups)
    bot_g = np.bincount(gof, weights=bot, minlength=self._num_groups)

    # The scale: S, or the number of reference batches in the global batch.
    k = S if self.reference_batch is None else S * self.batch / self.reference_batch

    # Step 2 (Eq. 8): EMAs from 0.
    beta = min(S / 1000.0, 1.0) if self.beta is None else float(self.beta)
    self._a_ema = beta * top_g + (1.0 - beta) * self._a_ema
    self._d_ema = beta * bot_g + (1.0 - beta) * self._d_ema
    if k == S or S == 1:
      a_ref = self._a_ema
    else:
      a_ref = ((k - 1) * self._a_ema + (S - k) * self._d_ema) / (S - 1)

    # Step 3: clipped ratios, layer-wise and the global AdaScale one.
    with np.errstate(divide="ignore"):  # eps = 0 with D = 0 gives inf, clipped to S
      r_g = np.clip((a_ref + self.eps) / (self._d_ema + self.eps), 1.0, k)
      total = (a_ref.sum() + self.eps) / (self._d_ema.sum() + self.eps)
      R = float(np.clip(total, 1.0, k))
    if self.rule == "linear_scaling":
      ratio_g = np.full(self._num_groups, float(k))
    elif self.rule == "adascale":
      ratio_g = np.full(self._num_groups, R)
    else:
      ratio_g = r_g

    # Step 5: warm-up (advance first, then scale, so no update has rate 0).
    if self.warmup == "none":
      factor_g = np.ones(self._num_groups)
      progress_g = np.zeros(self._num_groups)
    elif self.warmup == "fixed":
      assert self.warmup_steps is not None
      base_steps = t * k
      factor_g = np.full(self._num_groups, min(base_steps / self.warmup_steps, 1.0))
      progress_g = np.zeros(self._num_groups)
    else:
      assert self.warmup_threshold is not None
      theta = float(self.warmup_threshold)
      self._progress = self._progress + ratio_g
      factor_g = np.where(self._progress <= theta, self._progress / theta, 1.0)
      progress_g = self._progress.copy()
      # P == theta gives factor exactly 1, P > theta gives 1: both end the warm-up.
      self._end = np.where((self._end < 0) & (self._progress >= theta), t, self._end)

    # Step 4: learning rate, with the schedule on the chosen clock.
    if self.schedule is None:
      lr = self.lr0
    else:
      clock_value = (t - 1) if self.clock == "updates" else (t - 1) * k
      lr = self.lr0 * float(self.schedule(clock_value))
    mult = (ratio_g**self.power * factor_g)[gof]

    # Step 6: momentum SGD with coupled weight decay; the layer rate multiplies the buffer.
    new_params = []
    if self.decay_mask is not None and len(self.decay_mask) != len(params):
      raise ValueError(f"decay_mask has {len(self.decay_mask)} entries for {len(params)} layers")
    assert self._v is not None
    for j, (w, gb) in enumerate(zip(params, gbar, strict=True)):
      decay = self.weight_decay * w if self.decay_mask is None or self.decay_mask[j] else 0.0
      if self.inner == "sgd":
        self._m[j] = self.momentum * self._m[j] + gb + decay
        step = gb + decay + self.momentum * self._m[j] if self.nesterov else self._m[j]
      else:
        self._m[j] = self.b1 * self._m[j] + (1.0 - self.b1) * gb
        self._v[j] = self.b2 * self._v[j] + (1.0 - self.b2) * gb**2
        m_hat = self._m[j] / (1.0 - self.b1**t)
        v_hat = self._v[j] / (1.0 - self.b2**t)
        step = m_hat / (np.sqrt(v_hat) + self.adam_eps) + decay
      new_params.append(w - lr * mult[j] * step)

    self.history.append(
      StepRecord(
        step=t,
        num_samples=S,
        beta=beta,
        learning_rate=lr,
        mean_grad=gbar,
        sq_norm_mean=top,
        mean_grad_sq_norm=bot,
        lena_ratio=r_g[gof],
        gain_ratio=ratio_g[gof],
        global_ratio=R,
        warmup_progress=progress_g[gof],
        warmup_factor=factor_g[gof],
        lr_multiplier=mult,
        warmup_end_step=self._end[gof].copy(),
        params=[w.copy() for w in new_params],
      )
    )
    return new_params
