"""Test setup: 8 simulated CPU devices, set before anything imports jax."""

import os
import shutil
import tempfile

import pytest

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# One persistent XLA compilation cache for the whole test session (the xdist workers inherit
# the variable from the controller, and the subprocesses they start from them): many tests
# train the same tiny configurations, whose programs are then compiled once instead of once
# per test. A fresh directory per session, removed at its end, so nothing carries over.
_OWN_CACHE = "OPTAX_LENA_TESTS_JAX_CACHE"
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ[_OWN_CACHE] = tempfile.mkdtemp(
    prefix="optax_lena_tests_jax_cache_"
  )
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")


def pytest_sessionfinish(session, exitstatus):
  own = os.environ.get(_OWN_CACHE)
  if own and not hasattr(session.config, "workerinput"):  # the controller, after the workers
    shutil.rmtree(own, ignore_errors=True)


def pytest_runtest_setup(item):
  """Tests marked ``xdist_group`` share a module fixture (a Ray cluster, multi-process runs):
  under ``--dist loadgroup`` they must reach one worker, or the fixture runs once per worker.
  pytest-xdist groups them by appending ``@group`` to their node ids; fail if that was lost."""
  if (
    getattr(item.config.option, "loadgroup", False)
    and any(item.iter_markers("xdist_group"))
    and "@" not in item.nodeid
  ):
    pytest.fail(
      "--dist loadgroup ignored this test's xdist_group: this pytest / pytest-xdist pair "
      "cannot group tests; install the versions pyproject.toml pins",
      pytrace=False,
    )
