"""The progress output in a log (not a terminal): a short line every 15 s at most."""

from __future__ import annotations

import io

import pytest

from optax_lena._src.aladdin.ray import progress


def test_progress_in_a_log_writes_a_few_hundred_bytes_per_minute(
  monkeypatch: pytest.MonkeyPatch,
) -> None:
  clock = [0.0]
  monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
  log = io.StringIO()  # not a terminal: no tqdm bar
  bar = progress.Progress(120.0, enabled=True, stream=log)
  for step in range(12_000):  # one update every 10 ms for two minutes
    clock[0] = step * 0.01
    bar.update(clock[0], step)
  bar.close()
  lines = log.getvalue().splitlines()
  assert len(lines) == 7  # at 15, 30, ..., 105 s
  assert lines[0] == "training 15/120 s, 1500 iterations"
  assert len(log.getvalue()) < 300  # bytes in two minutes


def test_disabled_progress_writes_nothing() -> None:
  log = io.StringIO()
  bar = progress.Progress(10.0, enabled=False, stream=log)
  bar.update(5.0, 10)
  bar.close()
  assert log.getvalue() == ""
