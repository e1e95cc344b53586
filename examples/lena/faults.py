"""A test hook that kills one process of a multi-host run at a chosen moment.

``EXAMPLES_LENA_FAULT=PROCESS:MOMENT:STEP`` (read by ``examples.main`` in every process) makes
process ``PROCESS`` end itself with SIGKILL, as a crashed or preempted host would, at

* ``step:N``: when it would start update N (its peers are then inside update N's collectives),
* ``save:N``: right after it has started writing the checkpoint of update N (every process's
  background write is in flight),
* ``eval:N``: when it starts the evaluation after update N (its peers are evaluating).

Under the supervisor (``examples.lena.supervisor``) the supervisor goes too: the whole process
disappears, not only the trainer inside it. Without the variable nothing is changed.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax

ENV = "EXAMPLES_LENA_FAULT"
MOMENTS = ("step", "save", "eval")


@dataclasses.dataclass(frozen=True)
class Fault:
  """Process ``process`` dies at ``moment`` of update ``step``."""

  process: int
  moment: str
  step: int


def parse(spec: str) -> Fault:
  """``'PROCESS:MOMENT:STEP'`` as a :class:`Fault`.

  Raises:
    ValueError: a malformed spec (the message gives the format).
  """
  parts = spec.split(":")
  if len(parts) != 3 or parts[1] not in MOMENTS or not (parts[0] + parts[2]).isdigit():
    raise ValueError(
      f"{ENV}={spec!r} is not PROCESS:MOMENT:STEP with MOMENT one of {', '.join(MOMENTS)} "
      "(e.g. 1:step:4)."
    )
  return Fault(int(parts[0]), parts[1], int(parts[2]))


def die() -> None:
  """Ends this process (and its supervisor) at once, as SIGKILL from outside would."""
  line = f"{ENV}: process {jax.process_index()} kills itself now\n"
  supervised = os.environ.get("EXAMPLES_LENA_SUPERVISOR_PID") == str(os.getppid())
  # Under the supervisor this process's stderr is a pipe that the supervisor, killed next,
  # would not get to forward: the line goes straight to the supervisor's own stderr.
  try:
    if not supervised:
      raise OSError
    with open(f"/proc/{os.getppid()}/fd/2", "a") as err:
      err.write(line)
  except OSError:
    sys.stderr.write(line)
    sys.stderr.flush()
  if supervised:
    os.kill(os.getppid(), signal.SIGKILL)
  os.kill(os.getpid(), signal.SIGKILL)


def install(spec: str | None = None) -> Fault | None:
  """Arms the fault of ``spec`` (default: ``$EXAMPLES_LENA_FAULT``) in this process; call it
  after ``jax.distributed`` is initialized. Returns the fault, or None when there is none or
  it is another process's."""
  spec = os.environ.get(ENV, "") if spec is None else spec
  if not spec:
    return None
  fault = parse(spec)
  if fault.process != jax.process_index():
    return None
  # Patched where the trainer looks them up (module attributes), in this process only.
  from examples import input_pipeline
  from examples.lena import train

  if fault.moment == "step":
    original = input_pipeline.global_batches

    @functools.wraps(original)
    def global_batches(data: Any, global_batch: int, start_step: int = 0, part: Any = None):
      def stream() -> Iterator[Any]:
        for step, batch in enumerate(original(data, global_batch, start_step, part), start_step):
          if step + 1 == fault.step:
            die()
          yield batch

      return stream()

    input_pipeline.global_batches = global_batches
  elif fault.moment == "eval":
    evaluate: Callable[..., Any] = train.evaluate

    @functools.wraps(evaluate)
    def evaluate_then_die(state: Any, *args: Any, **kwargs: Any) -> Any:
      if int(state.step) == fault.step:
        die()
      return evaluate(state, *args, **kwargs)

    train.evaluate = evaluate_then_die
  else:
    import orbax.checkpoint as ocp

    manager_cls = ocp.CheckpointManager
    save = manager_cls.save

    @functools.wraps(save)
    def save_then_die(self: Any, step: int, *args: Any, **kwargs: Any) -> Any:
      result = save(self, step, *args, **kwargs)
      if step == fault.step:
        die()
      return result

    manager_cls.save = save_then_die
  return fault
