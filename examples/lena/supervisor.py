"""A parent process for each process of a multi-host run: the trainer runs as its child, and a
dead peer ends the run with status 1 and one message, never with JAX's C++ abort.

The trainer notices most dead peers itself (``examples.lena.distributed``: a failed collective
or a peer's pulse standing still) and ends with status 1 and the message. One case it cannot
catch: when process 0, which runs JAX's coordination service, dies, the others' JAX clients
lose their connection to it and abort at once (a fatal C++ log with a stack trace, SIGABRT;
JAX's callback for this cannot be set from Python). The supervisor forwards the trainer's
stderr as it comes, drops that C++ report, and prints the message instead.

Standard library only (it runs before JAX is imported, and adds no import time). The child
dies with the supervisor (Linux ``PR_SET_PDEATHSIG``), so killing a process of the run ends its
trainer too; SIGTERM is forwarded.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ENV_PID = "EXAMPLES_LENA_SUPERVISOR_PID"  # set in the child: it is supervised (by this pid)
# The first line of JAX's abort when the coordination service reports an error or disappears.
JAX_FATAL = b"Terminating process because the JAX distributed service detected fatal errors"
_JOINED = re.compile(rb"Process (\d+) of (\d+) joined")
# JAX's C++ error line just before that abort: held back until the next output shows whether
# the abort follows (then dropped with it).
_POLLED = re.compile(rb"^E\d{4} [^\n]*coordination_service_agent\.cc:\d+\] [^\n]*\n?\Z")


def _count(name: str) -> int:
  try:
    return int(os.environ.get(name, "1"))
  except ValueError:
    return 1


def launcher_in_environment() -> str | None:
  """The multi-process launcher this process runs under, or None (a single process)."""
  if os.environ.get("JAX_COORDINATOR_ADDRESS"):
    return "JAX_COORDINATOR_ADDRESS"
  if max(_count("SLURM_STEP_NUM_TASKS"), _count("SLURM_NTASKS")) > 1 and "SLURM_PROCID" in (
    os.environ
  ):
    return "SLURM"
  if _count("OMPI_COMM_WORLD_SIZE") > 1:
    return "Open MPI"
  if "," in os.environ.get("TPU_WORKER_HOSTNAMES", ""):
    return "TPU slice"
  return None


def _flag(argv: Sequence[str], name: str) -> str | None:
  """The value of ``--name V`` / ``--name=V`` in ``argv`` (the last one), or None."""
  value = None
  for i, arg in enumerate(argv):
    if arg == name and i + 1 < len(argv):
      value = argv[i + 1]
    elif arg.startswith(name + "="):
      value = arg[len(name) + 1 :]
  return value


def wanted(argv: Sequence[str]) -> bool:
  """Whether ``python -m examples.main argv`` is a process of a multi-host run that is not
  supervised yet (the same rule as ``distributed.initialize``'s, from the flags alone)."""
  if os.environ.get(ENV_PID) or "-h" in argv or "--help" in argv:
    return False
  mode = _flag(argv, "--distributed") or "auto"
  if mode == "off":
    return False
  explicit = any(
    _flag(argv, name) is not None
    for name in ("--coordinator_address", "--num_processes", "--process_id")
  )
  return mode == "on" or explicit or launcher_in_environment() is not None


def newest_checkpoint(directory: Path | None) -> str:
  """Where a resume starts: the newest complete checkpoint in ``directory``."""
  try:  # Orbax renames a step's directory to its number once every process has written it
    steps = [int(p.name) for p in directory.iterdir() if p.name.isdigit()] if directory else []
  except OSError:
    steps = []
  if not steps:
    return "from the start (no complete checkpoint yet)"
  return f"from the newest complete checkpoint, step {max(steps)}, in {directory}"


def message(me: str, n: str, dead: str, cause: str, command: str, checkpoints: Path | None) -> str:
  """The one message of a process that stops because ``dead`` died (two lines)."""
  this = f" (this one's: {command})" if command else ""
  return (
    f"error: process {me} of {n} stops: {dead} died or stopped responding ({cause}).\n"
    f"  To resume, start all {n} processes again with the same commands{this}: training "
    f"continues {newest_checkpoint(checkpoints)}.\n"
  )


def resume_command(argv: Sequence[str]) -> str:
  return shlex.join(["python", "-m", "examples.main", *argv])


def checkpoint_dir(argv: Sequence[str]) -> Path | None:
  workdir = _flag(argv, "--workdir")
  return Path(workdir).absolute() / "checkpoints" if workdir else None


def _die_with_parent() -> None:  # in the child, before exec
  with contextlib.suppress(Exception):
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run(argv: Sequence[str], program: str = "examples.main") -> int:
  """Runs ``python -m program argv`` as a child; returns the exit status to end with.

  Args:
    argv: the command line of this process of the run (its resume command names it).
    program: the module the child runs: the command that started this supervisor, which in
      the child (marked supervised) runs the trainer itself.
  """
  env = {**os.environ, ENV_PID: str(os.getpid())}
  child = subprocess.Popen(
    [sys.executable, "-m", program, *argv],
    stderr=subprocess.PIPE,
    env=env,
    preexec_fn=_die_with_parent if sys.platform == "linux" else None,
  )
  signal.signal(signal.SIGTERM, lambda sig, frame: child.send_signal(sig))
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C reaches the child too
  assert child.stderr is not None
  out = sys.stderr.buffer
  pending, held, fatal, me, n = b"", b"", b"", "?", "?"
  while chunk := os.read(child.stderr.fileno(), 65536):
    if fatal:  # the rest of JAX's report: its stack trace
      fatal += chunk
      continue
    pending += chunk
    cut = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1  # whole lines, and bar updates
    lines, pending = pending[:cut], pending[cut:]
    if not lines:
      continue
    if joined := _JOINED.search(lines):
      me, n = joined.group(1).decode(), joined.group(2).decode()
    lines, held = held + lines, b""
    start = lines.find(JAX_FATAL)
    if start >= 0:  # from the start of its line on: not forwarded, nor a held line before it
      start = lines.rfind(b"\n", 0, start) + 1
      lines, fatal = lines[:start], lines[start:] + pending
      last = lines.rfind(b"\n", 0, len(lines) - 1) + 1
      if _POLLED.match(lines[last:]):
        lines = lines[:last]
    else:
      last = lines.rfind(b"\n", 0, len(lines) - 1) + 1
      if _POLLED.match(lines[last:]):
        lines, held = lines[:last], lines[last:]
    out.write(lines)
    out.flush()
  code = child.wait()
  if not fatal:
    out.write(held + pending)
    out.flush()
    return code if code >= 0 else 128 - code
  # Process 0's service gone: the client's long poll to it failed ('Socket closed',
  # 'Connection refused'); else the service reported another process (by its task number).
  text = fatal.decode(errors="replace")
  tasks = re.findall(r"/task:(\d+)", text)
  if me != "0" and ("while calling" in text or not tasks):
    dead, cause = "process 0", "the connection to its coordination service closed"
  else:
    dead = ", ".join(f"process {t}" for t in sorted(set(tasks) - {me})) or "another process"
    cause = "JAX's coordination service reported it"
  sys.stderr.write(message(me, n, dead, cause, resume_command(argv), checkpoint_dir(argv)))
  sys.stderr.flush()
  return 1
