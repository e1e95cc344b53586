"""``python -m tests.examples.faults ARGS``: ``python -m examples.main ARGS`` in which one process
of a multi-host run kills itself at a chosen moment (the multi-host tests' fault injection).

``EXAMPLES_LENA_FAULT=PROCESS:MOMENT:STEP`` makes process ``PROCESS`` end itself with SIGKILL, as
a crashed or preempted host would, at

* ``step:N``: when it would start update N (its peers are then inside update N's collectives),
* ``save:N``: right after it has started writing the checkpoint of update N (every process's
  background write is in flight),
* ``eval:N``: when it starts the evaluation after update N (its peers are evaluating).

The moments are patched in from here, nothing of it ships with the trainer: the step of every
strategy the trainer makes (``parallel.create``, so a batch ramp's steps too),
``train.evaluate`` and Orbax's ``CheckpointManager.save``. A process of a multi-host run starts
the supervisor (``examples.lena.supervisor``) with this module as the program its child runs;
the child dies with the supervisor, the whole process disappearing, not only the trainer inside
it. Without the variable this is ``python -m examples.main``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

ENV = "EXAMPLES_LENA_FAULT"
MOMENTS = ("step", "save", "eval")
PROGRAM = "tests.examples.faults"


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
  import jax

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


def _updates_done(state: Any) -> int:
  """The step of a train state as a strategy's step receives it (replicated, or per device)."""
  import numpy as np

  return int(np.asarray(state.step.addressable_data(0)).reshape(-1)[0])


def install(spec: str) -> Fault | None:
  """Arms the fault of ``spec`` ('' or None: none) in this process. The patches ask which
  process this is when they fire, after ``jax.distributed`` has joined the processes."""
  if not spec:
    return None
  fault = parse(spec)
  import jax
  import orbax.checkpoint as ocp

  from examples.lena import parallel, train

  mine = lambda: jax.process_index() == fault.process
  if fault.moment == "step":
    create = parallel.create

    @functools.wraps(create)
    def create_then_watch(*args: Any, **kwargs: Any) -> parallel.Strategy:
      strategy = create(*args, **kwargs)
      step = strategy.step

      def step_or_die(state: Any, batch: Any) -> Any:
        if mine() and _updates_done(state) + 1 == fault.step:
          die()
        return step(state, batch)

      strategy.step = step_or_die
      return strategy

    parallel.create = create_then_watch
  elif fault.moment == "eval":
    evaluate = train.evaluate

    @functools.wraps(evaluate)
    def evaluate_or_die(state: Any, *args: Any, **kwargs: Any) -> Any:
      if mine() and int(state.step) == fault.step:
        die()
      return evaluate(state, *args, **kwargs)

    train.evaluate = evaluate_or_die
  else:
    save = ocp.CheckpointManager.save

    @functools.wraps(save)
    def save_then_die(self: Any, step: int, *args: Any, **kwargs: Any) -> Any:
      result = save(self, step, *args, **kwargs)
      if mine() and step == fault.step:
        die()
      return result

    ocp.CheckpointManager.save = save_then_die
  return fault


def main(argv: Sequence[str]) -> None:
  from examples.lena import supervisor

  if supervisor.wanted(argv):  # before JAX is imported, as examples.main does
    sys.exit(supervisor.run(argv, program=PROGRAM))
  install(os.environ.get(ENV, ""))
  from examples.lena.main import main as trainer_main

  trainer_main(argv)


if __name__ == "__main__":
  main(sys.argv[1:])
