"""Paired differences with a Student-t interval: the form of every headline claim in RESULTS.

Two methods run on the same seeds (a seed fixes the initialisation and the data order), so the
claim "A beats B" is a claim about the seed-by-seed differences ``a_s - b_s``. Their mean, with
the interval ``mean +- t(1 - (1 - c) / 2, n - 1) * std / sqrt(n)`` (Student t with ``n - 1``
degrees of freedom, ``std`` the sample standard deviation), is what the RESULTS files report; a
claim whose interval contains 0 is stated as "not distinguishable".

The t quantile is exact for integer degrees of freedom without SciPy: the two-sided
distribution function of Student's t has a closed form (Abramowitz and Stegun 26.7.3-4), which
is inverted by bisection to float precision.

References:
  Abramowitz and Stegun, Handbook of Mathematical Functions (1964), 26.7.3 and 26.7.4.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple


def t_two_sided(t: float, dof: int) -> float:
  """``P(|T| <= t)`` for Student's t with ``dof`` (a positive integer) degrees of freedom.

  Args:
    t: a non-negative number.
    dof: degrees of freedom, an integer >= 1.

  Returns:
    The probability, exact up to float rounding (A&S 26.7.3 for odd, 26.7.4 for even dof).
  """
  if not isinstance(dof, int) or dof < 1:
    raise ValueError(f"dof must be an integer >= 1, got {dof!r}.")
  if t < 0:
    raise ValueError(f"t must be >= 0, got {t}: the function is symmetric, pass abs(t).")
  theta = math.atan(t / math.sqrt(dof))
  s, c2 = math.sin(theta), math.cos(theta) ** 2
  if dof % 2:  # odd: (2/pi) (theta + sin(theta) (cos + (2/3) cos^3 + ... cos^(dof-2)))
    term, total = math.cos(theta), 0.0
    for k in range((dof - 1) // 2):
      total += term
      term *= c2 * (2 * k + 2) / (2 * k + 3)
    return min(1.0, 2.0 / math.pi * (theta + s * total))
  term, total = 1.0, 0.0  # even: sin(theta) (1 + (1/2) cos^2 + (1*3)/(2*4) cos^4 + ...)
  for k in range(dof // 2):
    total += term
    term *= c2 * (2 * k + 1) / (2 * k + 2)
  return min(1.0, s * total)


def t_quantile(p: float, dof: int) -> float:
  """The ``p`` quantile of Student's t with ``dof`` degrees of freedom (e.g. 0.975, 4: 2.776).

  Args:
    p: a probability in (0, 1).
    dof: degrees of freedom, an integer >= 1.

  Returns:
    t with ``P(T <= t) = p``, to float precision.
  """
  if not 0.0 < p < 1.0:
    raise ValueError(f"p must be in (0, 1), got {p}.")
  if p == 0.5:
    return 0.0
  if p < 0.5:
    return -t_quantile(1.0 - p, dof)
  target = 2.0 * p - 1.0  # P(|T| <= t)
  lo, hi = 0.0, 1.0
  while t_two_sided(hi, dof) < target:
    lo, hi = hi, hi * 2.0
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    if t_two_sided(mid, dof) < target:
      lo = mid
    else:
      hi = mid
  return hi


class Paired(NamedTuple):
  """The paired differences ``a - b`` over the seeds both sides ran."""

  n: int  # seeds
  mean: float
  std: float  # sample standard deviation of the differences (0 for one seed)
  low: float  # the confidence interval of the mean (nan for one seed)
  high: float
  wins: int  # seeds with a > b
  confidence: float

  @property
  def distinguishable(self) -> bool:
    """Whether the interval excludes 0."""
    return self.n > 1 and (self.low > 0.0 or self.high < 0.0)

  def verdict(self, ahead: str = "ahead", behind: str = "behind") -> str:
    """``ahead`` / ``behind`` when the interval excludes 0, else "not distinguishable"."""
    if self.n < 2:
      return "one seed: no interval"
    if not self.distinguishable:
      return "not distinguishable"
    return ahead if self.mean > 0 else behind

  def row(self, label: str, digits: int = 3, scale: float = 1.0) -> list[Any]:
    """A table row ``[label, seeds, mean, [low, high], wins/seeds]`` (values times ``scale``;
    the interval "—" for one seed)."""
    lo, hi = self.low * scale, self.high * scale
    interval = "—" if self.n < 2 else f"[{lo:+.{digits}f}, {hi:+.{digits}f}]"
    return [label, self.n, f"{self.mean * scale:+.{digits}f}", interval, f"{self.wins}/{self.n}"]

  def format(self, digits: int = 3, scale: float = 1.0) -> str:
    """``-0.020 [-0.044, +0.003], 5 seeds`` (values multiplied by ``scale`` first)."""
    m = self.mean * scale
    if self.n < 2:
      return f"{m:+.{digits}f} (1 seed)"
    lo, hi = self.low * scale, self.high * scale
    return f"{m:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}], {self.n} seeds"


def paired(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Paired:
  """The mean of ``a[i] - b[i]`` with its Student-t interval (``n - 1`` degrees of freedom).

  Args:
    a: one value per seed.
    b: the other side's value on the same seeds, in the same order.
    confidence: the interval's coverage, e.g. 0.95.

  Returns:
    A ``Paired``.
  """
  if len(a) != len(b) or not a:
    raise ValueError(f"a and b must be non-empty and pair up, got {len(a)} and {len(b)} values.")
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must be in (0, 1), got {confidence}.")
  d = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
  n = len(d)
  mean = math.fsum(d) / n
  wins = sum(x > 0 for x in d)
  if n == 1:
    return Paired(1, mean, 0.0, math.nan, math.nan, wins, confidence)
  std = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
  half = t_quantile(1.0 - (1.0 - confidence) / 2.0, n - 1) * std / math.sqrt(n)
  return Paired(n, mean, std, mean - half, mean + half, wins, confidence)


def paired_by_seed(
  a: Mapping[int, float],
  b: Mapping[int, float],
  seeds: Sequence[int] | None = None,
  confidence: float = 0.95,
) -> Paired:
  """``paired`` over the seeds present on both sides (or exactly ``seeds``, which must be)."""
  chosen = sorted(set(a) & set(b)) if seeds is None else list(seeds)
  missing = [s for s in chosen if s not in a or s not in b]
  if missing:
    raise KeyError(f"seeds {missing} are missing on one side; pass seeds both sides ran.")
  return paired([a[s] for s in chosen], [b[s] for s in chosen], confidence)
