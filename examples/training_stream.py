"""The training stream cut into global batches: where every update's examples come from.

The stream is epoch 0, epoch 1, ... of a dataset (``input_pipeline.Dataset``), each in its
per-(seed, epoch) order, and a batch may straddle two epochs. So no example is dropped at any
batch size (a 16k batch would otherwise skip 27% of CIFAR-10's 45k images every epoch), and
where a run stands in the stream is one number, the examples its updates have used: resuming
there continues the same sequence of batches exactly, whether every batch has one size or the
sizes change from update to update (a batch ramp).

On several processes each process gets only its block of rows of every global batch, the rows
its devices hold (``examples.lena.mesh``). When every batch has one size, a process reads only
its own examples of the stream (``input_pipeline.process_part``: a CIFAR process decodes and
augments only those); when the sizes change, each reads the whole stream and keeps its block.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

import numpy as np

from examples.input_pipeline import Batch, Dataset, process_part


class ExampleStream:
  """The training stream from example ``start`` on, cut into global batches of any size.

  Args:
    data: the dataset.
    start: the first example to produce, counted from epoch 0's first (the examples a resumed
      run has used).
    process_index: this process (0 on one process).
    process_count: the processes of the run, each taking its block of every batch.
    batch_size: the size of every global batch when it never changes, so that each process
      reads only its own examples; 0: sizes that change (each process reads all of them).

  Raises:
    ValueError: a ``batch_size`` that does not split over the processes.
  """

  def __init__(
    self,
    data: Dataset,
    start: int = 0,
    *,
    process_index: int = 0,
    process_count: int = 1,
    batch_size: int = 0,
  ):
    self.data, self.index, self.count = data, process_index, process_count
    self.part = process_part(batch_size, process_index, process_count) if batch_size else None
    self.epoch, self.skip = divmod(start, data.num_train)  # the next epoch to open
    if self.part is not None:  # the part's own examples among those skipped in the epoch
      first = self.epoch * data.num_train
      self.skip = int(np.count_nonzero(self.part.keep(np.arange(first, first + self.skip))))
    self.chunks: Iterator[tuple[np.ndarray, np.ndarray]] = iter(())
    self.pending: collections.deque[tuple[np.ndarray, np.ndarray]] = collections.deque()
    self.have = 0  # examples in pending

  def take(self, n: int) -> Batch:
    """This process's rows of the next global batch of ``n`` examples.

    Returns:
      ``{'x': [rows, ...], 'y': [rows]}``: all ``n`` on one process, else ``n / process_count``.

    Raises:
      ValueError: ``n`` is not the stream's ``batch_size``, or does not split over the
        processes.
    """
    if self.part is not None:
      if n != self.part.global_batch:
        raise ValueError(
          f"This stream cuts global batches of {self.part.global_batch} examples, not {n}: "
          "make it with batch_size=0 for batches whose size changes."
        )
      return self._cut(self.part.size)
    if self.count == 1:
      return self._cut(n)
    size, rest = divmod(n, self.count)
    if rest:
      raise ValueError(f"The global batch {n} does not split over {self.count} processes.")
    rows = slice(self.index * size, (self.index + 1) * size)
    return {k: v[rows] for k, v in self._cut(n).items()}

  def _cut(self, n: int) -> Batch:
    """The next ``n`` examples of what this stream reads, pulling chunks as needed."""
    while self.have < n:
      chunk = next(self.chunks, None)
      if chunk is None:  # the epoch is used up: the next one, in its own order
        self.chunks = iter(self.data.epoch_examples(self.epoch, self.part))
        self.epoch += 1
        continue
      x, y = chunk
      if self.skip:  # resuming mid-epoch: drop what the checkpointed run already used
        x, y, self.skip = x[self.skip :], y[self.skip :], max(0, self.skip - len(y))
      self.pending.append((x, y))
      self.have += len(y)
    xs, ys, need = [], [], n
    while need:  # cut the batch off the front of the pending chunks (slices are views)
      x0, y0 = self.pending[0]
      k = min(need, len(y0))
      xs.append(x0[:k])
      ys.append(y0[:k])
      if k == len(y0):
        self.pending.popleft()
      else:
        self.pending[0] = (x0[k:], y0[k:])
      need -= k
    self.have -= n
    return {"x": np.concatenate(xs), "y": np.concatenate(ys)}


def global_batches(
  data: Dataset,
  global_batch: int,
  start_step: int = 0,
  process_index: int = 0,
  process_count: int = 1,
) -> Iterator[Batch]:
  """The training stream cut into global batches of one size, from update ``start_step`` on.

  Args:
    data: the dataset.
    global_batch: examples per update.
    start_step: the first update to produce (its batch starts at example
      ``start_step * global_batch``).
    process_index: this process (0 on one process).
    process_count: the processes of the run.

  Yields:
    This process's rows of every global batch: ``{'x': [global_batch / process_count, ...],
    'y': [...]}``.
  """
  stream = ExampleStream(
    data,
    start_step * global_batch,
    process_index=process_index,
    process_count=process_count,
    batch_size=global_batch,
  )
  while True:
    yield stream.take(global_batch)
