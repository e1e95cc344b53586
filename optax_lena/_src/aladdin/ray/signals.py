"""SIGINT / SIGTERM in the driver: recorded before the handler raises, and checked after every
wait, so that no Ray internal can swallow them (``docs/ALADDIN-ray.md``, "Faults and security",
says why)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from optax_lena._src.aladdin.ray.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def disarm_crash_alarm(signum: int) -> None:
  """After SIGTERM: cancels the abort that Ray's C++ crash handler armed for it (``alarm(3)``
  with SIGALRM set to abort), so that a clean shutdown longer than 3 s still exits with 143;
  SIGALRM gets back the handler Python knows of."""
  if signum != signal.SIGTERM or threading.current_thread() is not threading.main_thread():
    return
  signal.alarm(0)
  handler = signal.getsignal(signal.SIGALRM)
  signal.signal(signal.SIGALRM, signal.SIG_DFL if handler is None else handler)


class StopSignals:
  """Installs the handlers (main thread only; elsewhere it does nothing) until :meth:`restore`."""

  def __init__(self) -> None:
    self.received: int | None = None
    self._defer = 0
    self._previous: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
      return
    for signum in SIGNALS:
      self._previous[signum] = signal.signal(signum, self._handle)

  def _handle(self, signum: int, frame: Any) -> None:
    disarm_crash_alarm(signum)
    if self.received is None:
      self.received = signum
    if not self._defer:
      raise Interrupted(signum)

  def check(self) -> None:
    """Raises :class:`Interrupted` if a signal was received."""
    if self.received is not None:
      raise Interrupted(self.received)

  @contextlib.contextmanager
  def deferred(self) -> Iterator[None]:
    """Signals are only recorded inside (check them afterwards)."""
    self._defer += 1
    try:
      yield
    finally:
      self._defer -= 1

  def restore(self) -> None:
    """Puts the previous handlers back."""
    for signum, handler in self._previous.items():
      with contextlib.suppress(ValueError, TypeError):
        signal.signal(signum, handler)
    self._previous = {}


def exit_on_stop_signals() -> None:
  """Makes SIGTERM raise :class:`Interrupted`, as Ctrl-C does (for programs).

  Then one ``except KeyboardInterrupt`` handles both and the program can exit with
  ``exit_code`` (143 / 130)."""

  def handle(signum: int, frame: Any) -> None:
    disarm_crash_alarm(signum)
    raise Interrupted(signum)

  for signum in SIGNALS:
    signal.signal(signum, handle)
