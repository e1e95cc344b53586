"""Fixtures shared by the examples' tests."""

import pytest


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
  """One MNIST-1D cache for the module (generation takes about a second)."""
  return str(tmp_path_factory.mktemp("mnist1d_cache"))
