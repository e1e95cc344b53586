"""The progress line: a tqdm bar on a terminal; elsewhere (a log file, CI) one short line at
most every ``log_every`` seconds, so that a long run writes a few hundred bytes per minute."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
  """Progress over a time budget (or a number of iterations)."""

  def __init__(
    self,
    total: float,
    *,
    enabled: bool,
    unit: str = "s",
    log_every: float = 15.0,
    stream: TextIO | None = None,
  ):
    self.total, self.unit, self.log_every, self.enabled = total, unit, log_every, enabled
    self.stream = stream if stream is not None else sys.stderr
    self._bar: Any = None
    self._last = time.monotonic()
    if not enabled or not self.stream.isatty():
      return
    try:
      from tqdm.auto import tqdm
    except ImportError:
      return
    self._bar = tqdm(
      total=round(total, 1),
      unit=unit,
      desc="training",
      leave=False,
      file=self.stream,
      mininterval=0.5,
    )

  def update(self, done: float, iterations: int) -> None:
    if not self.enabled:
      return
    if self._bar is not None:
      self._bar.n = round(min(done, self.total), 1)
      self._bar.set_postfix(iterations=iterations, refresh=False)
      self._bar.refresh()
      return
    now = time.monotonic()
    if now - self._last >= self.log_every:
      self._last = now
      line = f"training {done:.0f}/{self.total:.0f} {self.unit}, {iterations} iterations"
      print(line, file=self.stream, flush=True)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
      self._bar = None
