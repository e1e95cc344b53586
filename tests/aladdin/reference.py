"""An independent float64 NumPy ALADDIN parameter server (Algorithm 2), for the tests.

Written from the algorithm's description, not from the JAX code: the server keeps the global
model x~, the accumulator g~, c~ (gradients since the last global update, all workers) and c_i
(per worker since its last reply). On a gradient g from worker i: c~ += 1, c_i += 1, g~ += g
(every gradient accumulated, the triggering one included); if c_i >= period: x~ is updated with
normalise(g~) ("sum": g~; "mean": g~ / c~; "mean_of_locals": g~ / n) by plain SGD
(x~ - eta * step) or momentum SGD (mu = momentum * mu + step; x~ - eta * mu), alpha_i is
1 - 1/sqrt(c~) ("count", c~ before the reset), 1 - 1/sqrt(n * period) ("n_pi") or a fixed float,
and g~, c~ and c_i (this worker only) are reset. Non-finite gradients are dropped (counted).
"""

from __future__ import annotations

import math

import numpy as np


class ReferenceServer:
  def __init__(
    self, params, *, num_workers, lr, momentum=None, period=4, normalise="mean_of_locals",
    alpha="count",
  ):  # fmt: skip
    self.n = num_workers
    self.lr = lr
    self.momentum = momentum
    self.period = period
    self.normalise = normalise
    self.alpha = alpha
    self.params = {k: np.asarray(v, np.float64).copy() for k, v in params.items()}
    self.mu = {k: np.zeros_like(v) for k, v in self.params.items()}
    self.acc = {k: np.zeros_like(v) for k, v in self.params.items()}
    self.count = 0
    self.worker_counts = [0] * num_workers
    self.num_rejected = 0
    self.num_updates = 0

  def receive(self, grads, worker):
    """Returns (ready, x~ after the message, alpha or 0.0 when not ready)."""
    grads = {k: np.asarray(v, np.float64) for k, v in grads.items()}
    if not all(np.all(np.isfinite(g)) for g in grads.values()) or not 0 <= worker < self.n:
      self.num_rejected += 1
      return False, self.snapshot(), 0.0
    self.count += 1
    self.worker_counts[worker] += 1
    for k in self.acc:
      self.acc[k] = self.acc[k] + grads[k]
    if self.worker_counts[worker] < self.period:
      return False, self.snapshot(), 0.0
    divisor = {"sum": 1.0, "mean": float(self.count), "mean_of_locals": float(self.n)}
    for k in self.params:
      step = self.acc[k] / divisor[self.normalise]
      if self.momentum is not None:
        self.mu[k] = self.momentum * self.mu[k] + step
        step = self.mu[k]
      self.params[k] = self.params[k] - self.lr * step
    if self.alpha == "count":
      alpha = 1.0 - 1.0 / math.sqrt(self.count)
    elif self.alpha == "n_pi":
      alpha = 1.0 - 1.0 / math.sqrt(self.n * self.period)
    else:
      alpha = float(self.alpha)
    self.acc = {k: np.zeros_like(v) for k, v in self.acc.items()}
    self.count = 0
    self.worker_counts[worker] = 0
    self.num_updates += 1
    return True, self.snapshot(), alpha

  def snapshot(self):
    return {k: v.copy() for k, v in self.params.items()}


def merge(params, global_params, alpha):
  """Eq. 3 in float64: (1 - alpha) x + alpha x~."""
  return {
    k: (1.0 - alpha) * np.asarray(params[k], np.float64)
    + alpha * np.asarray(global_params[k], np.float64)
    for k in params
  }
