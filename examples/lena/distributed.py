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
watches the processes: when one dies the others stop (within ``heartbeat_timeout`` seconds, or
at once when a collective loses its peer) instead of waiting forever.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import threading
import time

import jax

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
  heartbeat_timeout: int = 100  # seconds after which a silent process counts as dead

  @property
  def explicit(self) -> bool:
    """Whether any of the coordinator / process-count / process-id flags was given."""
    return bool(self.coordinator_address) or self.num_processes > 0 or self.process_id >= 0


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
      heartbeat_timeout_seconds=options.heartbeat_timeout,
    )
  except Exception as e:  # e.g. ValueError: nothing to detect the cluster from
    raise DistributedError(f"{_join_failure(options, launcher)} JAX said: {e}") from e
  finally:
    joined.set()
  log.info(
    "Process %d of %d joined (%s); %d local of %d devices.",
    *(jax.process_index(), jax.process_count(), launcher or "flags"),
    *(jax.local_device_count(), jax.device_count()),
  )
  return True
