"""Joining the processes of a multi-host run: ``jax.distributed.initialize`` from flags or the
environment, with errors that say what to fix.

Every process of a multi-host run executes the same program; :func:`initialize` must run before
anything touches a JAX device. It joins the processes when

* ``--coordinator_address`` / ``--num_processes`` / ``--process_id`` are given (two local
  processes, or any cluster JAX does not detect), or
* ``distributed='auto'`` (the default) finds a multi-process launcher in the environment:
  ``JAX_COORDINATOR_ADDRESS``, a SLURM job step of more than one task, an Open MPI job of more
  than one rank, or a multi-host TPU slice (``TPU_WORKER_HOSTNAMES`` naming several hosts);
  JAX then fills in the coordinator, the process count and the process id itself, or
* ``distributed='on'`` (JAX's own cluster detection, e.g. a TPU pod slice whose environment
  names no hosts).

A process whose peers have not all joined within ``initialization_timeout`` seconds exits
(status 2) with a message saying whether the coordinator was unreachable or processes were
missing, and what to check. Once joined, JAX's coordination service
watches the processes. When one dies, each survivor notices it (at once when a collective loses
its peer, else within about ``heartbeat_timeout`` seconds, default 15, when the coordination
service misses its heartbeats) and ends within seconds with status 1 and one message naming the
dead process and the command that resumes the run (:func:`end_run`). It exits without JAX's
shutdown barrier (which would wait for the dead process) and without finishing a checkpoint
save in flight, so the newest complete checkpoint stays the one a resume picks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path

import jax

from examples.lena import supervisor
from examples.lena.supervisor import launcher_in_environment

log = logging.getLogger("examples.lena.train")
MODES = ("auto", "on", "off")


class DistributedError(RuntimeError):
  """The processes of a multi-host run could not be joined; the message says what to fix."""


@dataclasses.dataclass(frozen=True)
class DistributedOptions:
  """How this process joins the others (the command line's multi-host flags)."""

  distributed: str = "auto"  # 'auto', 'on' or 'off'
  coordinator_address: str = ""  # host:port of process 0 ('' = from the environment)
  num_processes: int = 0  # 0 = from the environment
  process_id: int = -1  # -1 = from the environment
  initialization_timeout: int = 120  # seconds to wait for every process to join
  # Seconds after which a silent process counts as dead. JAX's default (100 s) keeps the
  # survivors waiting; heartbeats come from a background thread, so a busy process still sends
  # them. Raise it where a process can stall longer (swapping, a host paused for snapshots).
  heartbeat_timeout: int = 15

  @property
  def explicit(self) -> bool:
    """Whether any of the coordinator / process-count / process-id flags was given."""
    return bool(self.coordinator_address) or self.num_processes > 0 or self.process_id >= 0


def validate(options: DistributedOptions) -> None:
  """Raises DistributedError for flags that cannot work, before anything is started."""
  if options.distributed not in MODES:
    raise DistributedError(
      f"Unknown distributed mode {options.distributed!r}; valid modes: {', '.join(MODES)}."
    )
  if options.distributed == "off" and options.explicit:
    raise DistributedError(
      "distributed='off' contradicts --coordinator_address / --num_processes / --process_id; "
      "drop one or the other."
    )
  address = options.coordinator_address
  if address and (":" not in address or not address.rsplit(":", 1)[1].isdigit()):
    raise DistributedError(
      f"--coordinator_address {address!r} is not host:port (e.g. 10.0.0.1:1234); every process "
      "gives the address of process 0."
    )
  if address and not 1 <= int(address.rsplit(":", 1)[1]) <= 65535:
    raise DistributedError(
      f"--coordinator_address {address!r}: the port must be in 1..65535 (e.g. 127.0.0.1:1234)."
    )
  n, i = options.num_processes, options.process_id
  if options.explicit and (n <= 0 or i < 0 or not address):
    raise DistributedError(
      "A multi-process run without a cluster launcher needs all three of --coordinator_address "
      f"HOST:PORT, --num_processes N and --process_id I (got {address or '-'!s}, "
      f"{n if n > 0 else '-'}, {i if i >= 0 else '-'})."
    )
  if options.explicit and not 0 <= i < n:
    raise DistributedError(
      f"--process_id {i} is outside 0..{n - 1}: with --num_processes {n}, start the processes "
      f"with --process_id 0 to {n - 1}, each id once."
    )
  if options.initialization_timeout < 1 or options.heartbeat_timeout < 1:
    raise DistributedError("initialization_timeout and heartbeat_timeout must be >= 1 second.")


def bind_address(coordinator_address: str) -> str | None:
  """Where process 0's coordination service listens: the coordinator's own host and port when
  that host is loopback (127.0.0.0/8, ``localhost``, ``::1``), else None (JAX's default, every
  interface, ``[::]:port``), since other machines must reach it there.

  JAX's coordination service is not authenticated: a run on one machine must not listen beyond
  it, and without this JAX binds every interface even for a loopback address.
  """
  import ipaddress

  host, _, port = coordinator_address.rpartition(":")
  host = host.strip("[]")
  try:
    loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
  except ValueError:  # a host name
    loopback = False
  if not loopback:
    return None
  return (
    f"[{host}]:{port}" if ":" in host else f"{'127.0.0.1' if host == 'localhost' else host}:{port}"
  )


_JAX_GRACE_S = 30  # JAX's own initialization timeout runs this much longer than ours


def _reachable(address: str) -> bool:
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
      return True
  except (OSError, ValueError):
    return False


def _coordinator_address(options: DistributedOptions) -> str:
  return options.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS", "")


def _join_failure(
  options: DistributedOptions, launcher: str | None, coordinator_seen: bool = True
) -> str:
  """What went wrong joining the processes (``coordinator_seen``: whether anything answered at
  the coordinator's address meanwhile), and what to check."""
  address = _coordinator_address(options)
  n = options.num_processes or "auto"
  me = options.process_id if options.process_id >= 0 else "auto"
  if address and not coordinator_seen:
    where = (
      f"nothing answers at the coordinator address {address}: start process 0 (which listens "
      "there), or give every process the host:port of process 0 (reachable from this host: "
      "hostname, firewall)"
    )
  else:
    where = (
      f"the coordinator ({address or 'from ' + (launcher or 'JAX')}) did not hear from all "
      f"{n} processes: start exactly --num_processes processes, each with its own --process_id "
      "0..N-1 and the same --coordinator_address"
    )
  return (
    f"The multi-host run did not start within --initialization_timeout="
    f"{options.initialization_timeout} s (this is process {me} of {n}): {where}."
  )


def _watch(options: DistributedOptions, launcher: str | None, joined: threading.Event) -> None:
  address, seen = _coordinator_address(options), False
  deadline = time.monotonic() + options.initialization_timeout
  # Probe the coordinator while waiting (it may start after this process, or stop first).
  while not joined.wait(min(1.0, max(0.0, deadline - time.monotonic()))):
    seen = seen or not address or _reachable(address)
    if time.monotonic() >= deadline:
      break
  if not joined.is_set():
    sys.stderr.write(f"error: {_join_failure(options, launcher, seen)}\n")
    sys.stderr.flush()
    os._exit(2)  # the main thread is blocked inside JAX: end the process from here


@dataclasses.dataclass
class _Resume:
  """What a survivor of a dead peer tells the user (set by the command line)."""

  command: str = ""  # this process's command line
  checkpoint_dir: Path | None = None
  finished: bool = False  # training and its checkpoints are done: a lost peer is harmless


_resume = _Resume()
_ending = threading.Lock()


def set_resume(command: str, checkpoint_dir: str | Path | None) -> None:
  """Records the command and the checkpoint directory that :func:`end_run` names."""
  _resume.command = command
  _resume.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None


def mark_finished() -> None:
  """Training ended and its checkpoints are written: a peer lost from now on (e.g. during JAX's
  shutdown barrier) ends this process with status 0 instead of 1."""
  _resume.finished = True
  _stop_watching.set()
  from jax._src import distributed as jax_distributed

  client = jax_distributed.global_state.client
  if client is not None:  # the others stop watching this process
    with _writing, contextlib.suppress(Exception):
      client.key_value_set(f"{_PULSE_KEY}{jax.process_index()}", _DONE, allow_overwrite=True)


def _live_processes(timeout_s: float = 3.0) -> set[int] | None:
  """The processes the coordination service still counts as alive, or None when it does not
  answer within ``timeout_s`` (process 0, which runs it, is gone)."""
  from jax._src import distributed as jax_distributed  # the client JAX joined with

  client, n = jax_distributed.global_state.client, jax.process_count()
  result: list[set[int]] = []

  if client is None:
    return None

  def ask() -> None:
    with contextlib.suppress(Exception):  # the service is gone: None below
      result.append(set(client.get_live_nodes(list(range(n)))))

  asking = threading.Thread(target=ask, daemon=True)
  asking.start()
  asking.join(timeout_s)
  return result[0] if result else None


def _dead_processes(detail: str) -> str:
  """Which process died, from JAX's message (``/task:K``), the process count or the service."""
  me, n = jax.process_index(), jax.process_count()
  named = sorted({int(k) for k in re.findall(r"/task:(\d+)", detail)} - {me})
  if named:
    return ", ".join(f"process {k}" for k in named)
  if n == 2:
    return f"process {1 - me}"
  live = _live_processes()
  if live is None:
    return "process 0 (its coordination service no longer answers)"
  dead = sorted(set(range(n)) - live - {me})
  return ", ".join(f"process {k}" for k in dead) if dead else "another process"


def end_run(cause: str, detail: str = "", dead: str = "") -> None:
  """Ends this process of a multi-host run whose peer died: one message on stderr naming the
  dead process and the resume command, then status 1 at once.

  ``os._exit`` skips JAX's shutdown barrier (which would wait for the dead process, then
  abort) and Orbax's finalisation of a save in flight (whose barrier would wait too): that
  save stays a temporary directory, which Orbax never takes for a checkpoint. Called from the
  main thread (a failed collective) or the watch on the peers; the first caller ends the
  process, a second one waits for that.

  Args:
    cause: what this process noticed (a failed collective, a missed heartbeat).
    detail: JAX's error text (its first line is quoted).
    dead: which process died ('' = found from ``detail``, the process count or the service).
  """
  with _ending:
    first = detail.strip().splitlines()[0] if detail.strip() else ""
    me, n = jax.process_index(), jax.process_count()
    if _resume.finished:
      sys.stderr.write(
        f"warning: process {me} of {n}: a peer was lost after training finished ({first}).\n"
      )
      sys.stderr.flush()
      os._exit(0)
    sys.stdout.flush()
    cause = f"{cause}: {first}" if first else cause
    who = dead or _dead_processes(detail)
    sys.stderr.write(
      supervisor.message(str(me), str(n), who, cause, _resume.command, _resume.checkpoint_dir)
    )
    sys.stderr.flush()
    os._exit(1)


_PULSE_KEY = "examples_lena/pulse/"
_PULSE_S = 1.0  # how often each process tells the others it is alive
_DONE = "done"
_stop_watching = threading.Event()
_writing = threading.Lock()  # the last pulse written is _DONE, once finished


def _pulse(client: object, me: int, last_seen: dict[int, float], last_ok: list[float]) -> None:
  """Every ``_PULSE_S``: bumps this process's counter in the coordination service's key-value
  store and notes when each peer's counter last changed (and when the service last answered)."""
  counters: dict[int, str] = {}
  beat = 0
  while not _stop_watching.wait(_PULSE_S):
    beat += 1
    try:
      with _writing:
        if _stop_watching.is_set():
          return
        client.key_value_set(f"{_PULSE_KEY}{me}", str(beat), allow_overwrite=True)  # type: ignore[attr-defined]
      entries = client.key_value_dir_get(_PULSE_KEY)  # type: ignore[attr-defined]
    except Exception:  # the service is gone (process 0 died) or slow: the judge decides
      continue
    now = time.monotonic()
    last_ok[0] = now
    for key, value in entries:
      k = int(key.rsplit("/", 1)[1])
      if value == _DONE:  # it finished training: silent from now on, and rightly so
        last_seen[k] = float("inf")
      elif counters.get(k) != value:
        counters[k], last_seen[k] = value, now


def _judge(me: int, n: int, timeout_s: int, last_seen: dict[int, float], last_ok: list[float]):
  """Ends the process (:func:`end_run`) once a peer's counter or the service stood still for
  ``timeout_s`` seconds."""
  while not _stop_watching.wait(0.5):
    now = time.monotonic()
    silent = [k for k in range(n) if k != me and now - last_seen[k] > timeout_s]
    if me != 0 and now - last_ok[0] > timeout_s:
      end_run(f"its coordination service did not answer for {timeout_s} s", dead="process 0")
    if silent:
      who = ", ".join(f"process {k}" for k in silent)
      end_run(f"no sign of life for {timeout_s} s (--heartbeat_timeout)", dead=who)


def _watch_peers(timeout_s: int) -> None:
  """Starts the watch on the other processes (daemon threads; :func:`mark_finished` stops it).

  JAX's own heartbeat check would abort the process with a C++ fatal error, and its
  missed-heartbeat callback cannot be set from Python (the binding fails to pass the status),
  so this watch, with a shorter timeout than JAX's, ends the process first."""
  from jax._src import distributed as jax_distributed  # the client JAX joined with

  client = jax_distributed.global_state.client
  me, n = jax.process_index(), jax.process_count()
  start = time.monotonic()
  last_seen, last_ok = dict.fromkeys(range(n), start), [start]
  for target, args in (
    (_pulse, (client, me, last_seen, last_ok)),
    (_judge, (me, n, timeout_s, last_seen, last_ok)),
  ):
    threading.Thread(target=target, args=args, daemon=True, name=target.__name__).start()


def initialize(options: DistributedOptions) -> bool:
  """Joins the run's processes if the options or the environment ask for it.

  Args:
    options: the multi-host flags.

  Returns:
    Whether ``jax.distributed`` was initialized (False: a single-process run).

  Raises:
    DistributedError: bad flags, or the processes did not all join in time.
  """
  validate(options)
  launcher = launcher_in_environment()
  if options.distributed == "off" or (
    options.distributed == "auto" and not options.explicit and launcher is None
  ):
    return False
  # Cross-process collectives between CPU devices (simulated multi-host, tests) use gloo.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  # JAX aborts the process (no Python exception) when the processes do not all register in
  # time, blaming "another task". A watchdog that fires first says what to fix instead.
  joined = threading.Event()
  watchdog = threading.Thread(target=_watch, args=(options, launcher, joined), daemon=True)
  watchdog.start()
  bind = bind_address(options.coordinator_address) if options.coordinator_address else None
  try:
    jax.distributed.initialize(
      coordinator_address=options.coordinator_address or None,
      coordinator_bind_address=bind,  # None: JAX's default, every interface
      num_processes=options.num_processes if options.num_processes > 0 else None,
      process_id=options.process_id if options.process_id >= 0 else None,
      initialization_timeout=options.initialization_timeout + _JAX_GRACE_S,
      # JAX's check is the backstop of ours (_watch_peers), which must fire first.
      heartbeat_timeout_seconds=2 * options.heartbeat_timeout,
    )
  except Exception as e:  # e.g. ValueError: nothing to detect the cluster from
    raise DistributedError(f"{_join_failure(options, launcher)} JAX said: {e}") from e
  finally:
    joined.set()
  _watch_peers(options.heartbeat_timeout)
  log.info(
    "Process %d of %d joined (%s); %d local of %d devices.",
    *(jax.process_index(), jax.process_count(), launcher or "flags"),
    *(jax.local_device_count(), jax.device_count()),
  )
  return True
