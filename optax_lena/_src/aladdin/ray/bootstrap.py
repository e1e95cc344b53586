"""Connecting to Ray securely: a local node bound to 127.0.0.1 with no dashboard or job API,
or an existing cluster; and the Ray options of the actors (resources, accelerators)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from optax_lena._src.aladdin.ray import channel
from optax_lena._src.aladdin.ray.config import Config
from optax_lena._src.aladdin.ray.errors import ClusterLostError

# Ray's switch for "multi-node clusters allowed" doubles as the one that makes a local node
# advertise, and therefore bind, the loopback address instead of the machine's external IP.
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# The nice level of Ray's worker processes (15 by default; ``docs/ALADDIN-ray.md``, "Priority").
_NICENESS_ENV = "RAY_worker_niceness"


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

  A local cluster binds every Ray service to 127.0.0.1 and starts no dashboard (hence no job
  submission API) and keeps Ray's token authentication; a remote cluster's TLS and tokens are
  Ray's own environment variables (``docs/ALADDIN-ray.md``, "Security").

  Args:
    address: an existing cluster's address (``"host:port"``), or None to start a local one.
    num_cpus: CPUs the local node advertises (the actors themselves request none).
    num_gpus: GPUs the local node advertises (None: the ones Ray detects).
    resources: custom resources of the local node.
    temp_dir: Ray's session directory root (an absolute path; None: Ray's default).
    log_to_driver: forward the actors' stdout/stderr to the driver.

  Returns:
    True when this call started the cluster (the caller shuts it down), False when Ray was
    already initialised or ``address`` was joined.

  Raises:
    ClusterLostError: ``address`` cannot be reached.
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
  with _loopback_node(), _keep_sigterm_handler():
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
      # Call arguments up to 1 MiB (a fold of a small model's messages) travel inline in the
      # call, not through the object store (``docs/ALADDIN-ray.md``, "Priority, accelerators").
      _system_config={"max_direct_call_object_size": 1 << 20},
      _temp_dir=None if temp_dir is None else os.path.abspath(temp_dir),
    )
  tighten_local_files()
  return True


def _make_private(path: Path, mode: int) -> None:
  """``chmod path mode`` if ``path`` is this user's own file or directory (never a link)."""
  with contextlib.suppress(OSError):
    info = os.lstat(path)
    if info.st_uid == os.getuid() and not stat.S_ISLNK(info.st_mode):
      os.chmod(path, mode)


def tighten_local_files() -> None:
  """Closes what Ray leaves open to other local users of a node this process started.

  On loopback the token is the only barrier between another local user and the cluster, and Ray
  writes it world-readable (``~/.ray/auth_token``, 0644 in a 0755 directory) and makes its
  session directory (its sockets and logs) 0777: both become the user's own (0600 / 0700).
  """
  import ray

  token = Path.home() / ".ray" / "auth_token"
  _make_private(token.parent, 0o700)
  _make_private(token, 0o600)
  node = getattr(ray._private.worker, "_global_node", None)  # private: skipped if it moves
  session = getattr(node, "get_session_dir_path", None)
  if session is not None:
    _make_private(Path(session()), 0o700)


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
