"""Connecting to Ray securely: a local node bound to 127.0.0.1 with no dashboard or job API,
or an existing cluster; and the Ray options of the actors (resources, accelerators)."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from optax_lena._src.aladdin.ray import channel
from optax_lena._src.aladdin.ray.config import Config
from optax_lena._src.aladdin.ray.cores import make_private_directory
from optax_lena._src.aladdin.ray.errors import ClusterLostError

# Ray's switch for "multi-node clusters allowed" doubles as the one that makes a local node
# advertise, and therefore bind, the loopback address instead of the machine's external IP.
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# The nice level of Ray's worker processes (15 by default; ``docs/ALADDIN-ray.md``, "Priority").
_NICENESS_ENV = "RAY_worker_niceness"
# A local node's token: in the environment of the driver and of the processes Ray starts (which
# only their user can read), never in a file; one per node (``docs/ALADDIN-ray.md``, "Faults and
# security").
_TOKEN_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
_saved_env: dict[str, str | None] | None = None  # what ``connect`` replaced, until ``disconnect``
# Beyond the session root, Ray's longest Unix socket path (Linux allows 107 bytes).
_SOCKET_TAIL = len("/session_2026-12-06_10-15-35_435424_4194304/sockets/plasma_store")


@contextlib.contextmanager
def _loopback_node() -> Iterator[None]:
  """Makes a new local Ray node bind 127.0.0.1 and start its actors at the driver's priority.
  Ray reads the switch at import time, hence the module patch too; both are restored afterwards,
  so that a later ``ray.init(address=...)`` in the same process joins normally."""
  import ray._private.ray_constants as ray_constants

  old_env = {name: os.environ.get(name) for name in (_LOOPBACK_ENV, _NICENESS_ENV)}
  old_const = ray_constants.ENABLE_RAY_CLUSTER
  os.environ[_LOOPBACK_ENV] = "0"
  os.environ.setdefault(_NICENESS_ENV, "0")
  ray_constants.ENABLE_RAY_CLUSTER = False
  try:
    yield
  finally:
    ray_constants.ENABLE_RAY_CLUSTER = old_const
    for name, value in old_env.items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value


@contextlib.contextmanager
def _no_autoscaler_monitor() -> Iterator[None]:
  """A local node without Ray's autoscaler monitor: a fixed node has nothing to scale, and the
  monitor serves the node's metrics over HTTP (port 44217) to anyone on the machine, without
  the token. Restored afterwards."""
  from ray._private.node import Node

  original = Node.start_monitor
  Node.start_monitor = lambda self: None  # type: ignore[method-assign]
  try:
    yield
  finally:
    Node.start_monitor = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _keep_sigterm_handler() -> Iterator[None]:
  """``ray.init`` replaces the driver's SIGTERM handler (by one that exits with status 1, or
  15); the runtime's own handler stays in place instead, so that SIGTERM always ends in the
  same clean shutdown as Ctrl-C."""
  import ray._private.utils as ray_utils

  original = ray_utils.set_sigterm_handler
  ray_utils.set_sigterm_handler = lambda handler: None
  try:
    yield
  finally:
    ray_utils.set_sigterm_handler = original


def connect(
  address: str | None = None,
  *,
  num_cpus: int | None = None,
  num_gpus: int | None = None,
  resources: Mapping[str, float] | None = None,
  temp_dir: str | None = None,
  log_to_driver: bool = False,
) -> bool:
  """Starts a secure local Ray cluster, or joins ``address``; returns True if it started one.

  A local cluster binds every Ray service to 127.0.0.1, starts no dashboard (hence no job
  submission API), authenticates every call with a token of its own that no file holds, and
  keeps its session directory inside a directory only this user can enter
  (:func:`session_root`); a remote cluster's TLS and tokens are Ray's own environment variables
  (``docs/ALADDIN-ray.md``, "Faults and security").

  Args:
    address: an existing cluster's address (``"host:port"``), or None to start a local one.
    num_cpus: CPUs the local node advertises (the actors themselves request none).
    num_gpus: GPUs the local node advertises (None: the ones Ray detects).
    resources: custom resources of the local node.
    temp_dir: where the private directory of the session root goes (None: the temp
      directory).
    log_to_driver: forward the actors' stdout/stderr to the driver.

  Returns:
    True when this call started the cluster (the caller shuts it down), False when Ray was
    already initialised or ``address`` was joined.

  Raises:
    ClusterLostError: ``address`` cannot be reached.
    PermissionError: another user planted the private directory of the session root.
    ValueError: ``temp_dir`` is too long for Ray's socket paths.
  """
  import ray

  if ray.is_initialized():
    return False
  if address is not None:
    # Ray retries an unreachable GCS for minutes; a TCP probe of "host:port" fails in seconds.
    host, _, port = address.rpartition(":")
    if host and port.isdigit() and "://" not in address:
      try:
        socket.create_connection((host, int(port)), timeout=5.0).close()
      except OSError as err:
        raise ClusterLostError(
          f"Could not join the Ray cluster at {address!r}: {err}. Check the address (the head "
          "node's GCS, port 6379 by default) and that the cluster is up."
        ) from err
    try:
      with _keep_sigterm_handler():
        ray.init(address=address, log_to_driver=log_to_driver, include_dashboard=False)
    except (ConnectionError, TimeoutError, RuntimeError) as err:
      raise ClusterLostError(
        f"Could not join the Ray cluster at {address!r}: {err}. Check the address, that the "
        "cluster is up, and its TLS / token settings (RAY_USE_TLS, RAY_AUTH_MODE)."
      ) from err
    return False
  root = session_root(temp_dir)
  _use_private_token()
  try:
    with _loopback_node(), _no_autoscaler_monitor(), _keep_sigterm_handler():
      ray.init(
        # "local": always a new node of our own, never one that another program on this machine
        # started with `ray start` (which ray.init() would otherwise join).
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        resources=dict(resources) if resources else None,
        include_dashboard=False,
        log_to_driver=log_to_driver,
        configure_logging=True,
        logging_level=logging.WARNING,
        _node_ip_address="127.0.0.1",
        _system_config={
          # Call arguments up to 1 MiB (a fold of a small model's messages) travel inline in
          # the call, not through the object store (``docs/ALADDIN-ray.md``, "Priority,
          # accelerators").
          "max_direct_call_object_size": 1 << 20,
          # No Prometheus endpoint: it serves the node's metrics over HTTP to anyone who
          # reaches the port, without the token.
          "enable_metrics_collection": False,
        },
        _temp_dir=root,
      )
  except BaseException:
    _restore_env()
    raise
  return True


def session_root(temp_dir: str | None = None) -> str:
  """The root of a local node's session directories: ``ray`` inside a directory only this user
  can enter (``optax_lena-<uid>``, mode 0700, under ``temp_dir`` or the temp directory). Ray
  opens the root and the sessions in it to everyone (mode 0777) and the session holds the
  node's sockets and logs; the private directory above them keeps every other user out.

  Raises:
    PermissionError: the private directory is not this user's alone (planted by another user).
    ValueError: a ``temp_dir`` so long that Ray's Unix socket paths would not fit.
  """
  parent = None
  if temp_dir is not None:
    parent = Path(os.path.abspath(temp_dir))
    parent.mkdir(parents=True, exist_ok=True)
  try:
    root = str(make_private_directory(parent) / "ray")
  except PermissionError as err:
    raise PermissionError(f"No private directory for Ray's session: {err}.") from err
  if len(root) + _SOCKET_TAIL > 107:
    raise ValueError(
      f"temp_dir={temp_dir!r} is too long: Ray's Unix sockets under {root} would exceed the "
      f"107 bytes of a socket path. Give a shorter one (at most {107 - _SOCKET_TAIL - 20} "
      "characters, e.g. a directory under /tmp)."
    )
  return root


def _use_private_token() -> None:
  """A fresh token for the node about to start, in this process's environment (inherited by
  the node's processes)."""
  global _saved_env
  if _saved_env is None:
    _saved_env = {name: os.environ.get(name) for name in _TOKEN_ENV}
  os.environ["RAY_AUTH_MODE"] = "token"
  os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
  _reload_token()


def _reload_token() -> None:
  """Makes this process's Ray read the environment's mode and token again (both are cached
  from the first use, which may precede ``connect``)."""
  from ray import _raylet  # compiled: its stubs do not list these

  _raylet.Config.initialize("")  # type: ignore[attr-defined]
  _raylet.AuthenticationTokenLoader.instance().reset_cache()  # type: ignore[attr-defined]


def _restore_env() -> None:
  global _saved_env
  if _saved_env is None:
    return
  for name, value in _saved_env.items():
    if value is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = value
  _saved_env = None
  _reload_token()


def disconnect() -> None:
  """Shuts down Ray in this process and forgets the local node's token (the environment as it
  was before :func:`connect`)."""
  import ray

  ray.shutdown()
  _restore_env()


def gcs_reachable(timeout: float = 2.0) -> bool:
  """Whether the cluster's GCS accepts a TCP connection (cheap; never hangs)."""
  import ray

  try:
    host, port = ray.get_runtime_context().gcs_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout):
      return True
  except (OSError, ValueError, AttributeError):
    return False


def actor_options(config: Config, role: str) -> dict[str, Any]:
  """Ray options of a ``"worker"`` or ``"server"`` actor (shards, reducers, the mailbox): no
  CPU (a small machine runs more actors than it has cores; custom resources place them), and
  the accelerators of ``docs/ALADDIN-ray.md``, "Accelerators"."""
  resources = config.worker_resources if role == "worker" else config.server_resources
  gpus = config.worker_gpus if role == "worker" else config.server_gpus
  options: dict[str, Any] = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": -1}
  if resources:
    options["resources"] = dict(resources)
  if gpus:
    options["num_gpus"] = gpus
  return options


def _cluster_cpus() -> float:
  import ray

  return float(ray.cluster_resources().get("CPU", 0.0))


def worker_nice(config: Config, num_actors: int) -> int:
  """``config.worker_nice``, its None resolved for ``num_actors`` actors (see :class:`Config`)."""
  if config.worker_nice is not None:
    return int(config.worker_nice)
  return 5 if num_actors > _cluster_cpus() else 0


def intra_op_threads(config: Config, num_actors: int) -> int | None:
  """``config.intra_op_threads``, its None resolved for ``num_actors`` actors (None: XLA's)."""
  if config.intra_op_threads is not None:
    return int(config.intra_op_threads)
  return 1 if num_actors >= _cluster_cpus() else None


def step_cores(config: Config, threads: int | None) -> int:
  """Cores of its own that each worker pins its step to (0: none): ``config.pin_compute``, its
  None resolved for XLA pools of ``threads`` (see :class:`Config`)."""
  if config.pin_compute is False or threads is None:
    return 0
  if config.pin_compute:
    return threads
  return threads if config.num_workers * threads < _cluster_cpus() else 0


def remove_rings_on_other_nodes(run: str, timeout: float = 20.0) -> dict[str, list[str]]:
  """Removes run ``run``'s shared-memory rings on every live node but the driver's (which
  removes its own), with one task pinned to each: the workers killed by ``ray.kill`` could not.
  Returns the paths removed by node id, for the nodes that answered within ``timeout`` s."""
  import ray
  from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

  remove = ray.remote(num_cpus=0, max_retries=0)(channel.remove_rings)
  refs = {
    node["NodeID"]: remove.options(
      scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
    ).remote(run)
    for node in ray.nodes()
    if node["Alive"] and node["NodeID"] != ray.get_runtime_context().get_node_id()
  }
  if not refs:
    return {}
  ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
  removed = {}
  for node, ref in refs.items():
    if ref in ready:
      with contextlib.suppress(Exception):
        removed[node] = ray.get(ref)
  return removed
