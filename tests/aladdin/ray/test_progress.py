"""The driver's clocks: the progress output in a log (not a terminal), a short line every 15 s at
most; and the stall clock, which restarts of the run's actors pause (no Ray needed: the actor
table is faked)."""

from __future__ import annotations

import io

import pytest

from optax_lena._src.aladdin.ray import progress, stall


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


def test_the_stall_clock_pauses_while_an_actor_restarts_for_at_most_restart_timeout(
  monkeypatch: pytest.MonkeyPatch,
) -> None:
  clock, starting = [0.0], {"a": set()}
  monkeypatch.setattr(stall.time, "monotonic", lambda: clock[0])
  monkeypatch.setattr(stall, "starting_actors", lambda actors: starting["a"] & set(actors))
  reachable = [True]
  watch = stall.StallClock(lambda: ["w0", "s0"], lambda: reachable[0], restart_timeout=100.0)

  def advance(seconds: float) -> float:  # polled every 0.5 s, as the driver's waits do
    for _ in range(int(seconds * 2)):
      clock[0] += 0.5
      stalled = watch.stalled_for()
    return stalled

  assert advance(10) == pytest.approx(10)  # nothing restarts: the clock runs
  watch.progress()
  starting["a"] = {"s0"}  # a shard restarts for 60 s: paused (to within a poll)
  assert advance(60) <= 1.0
  starting["a"] = set()  # back: the clock runs from the last poll that saw the restart
  assert advance(10) == pytest.approx(10, abs=1.0)
  watch.progress()
  starting["a"] = {"other run's actor"}  # restarts of actors that are not the run's: no pause
  assert advance(10) == pytest.approx(10)
  watch.progress()
  starting["a"] = {"w0"}  # an actor that never comes back is a stall after restart_timeout
  assert advance(99) <= 1.0 and 0 < watch.restarting_for() <= 100
  assert advance(30) == pytest.approx(30, abs=1.0)
  watch.progress()
  reachable[0] = False  # a GCS that does not answer: the table is not read, the clock runs
  starting["a"] = {"w0"}
  assert advance(10) == pytest.approx(10)
