"""A worker's stream of mini-batches, shared by both engines: the simulator draws every
worker's batches with it, and ``ad.Task.from_problem`` gives the Ray workers the same streams."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def batch_stream(
  x: np.ndarray, y: np.ndarray, batch_size: int, rng: np.random.Generator
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """One worker's endless mini-batches of ``(x, y)``: consecutive slices of per-epoch
  permutations.

  Args:
    x: the training inputs (first axis: samples).
    y: the training targets, as many as ``x``.
    batch_size: samples per mini-batch.
    rng: the worker's generator; a new permutation is drawn whenever the rest of the current
      one is shorter than a batch (also when a batch is larger than the training set).

  Returns:
    An endless iterator of ``(x[idx], y[idx])``.

  Examples:
    >>> import numpy as np
    >>> x, y = np.arange(5.0), np.arange(5)
    >>> stream = batch_stream(x, y, 2, np.random.default_rng(0))
    >>> [len(next(stream)[0]) for _ in range(3)]
    [2, 2, 2]
  """
  order, pos = rng.permutation(len(x)), 0
  while True:
    if pos + batch_size > len(order):
      order, pos = rng.permutation(len(x)), 0
    idx = order[pos : pos + batch_size]
    pos += batch_size
    yield x[idx], y[idx]
