"""The ALADDIN docstrings are a reference that runs: every ``Examples:`` section passes as a
doctest, and every public function documents its arguments, its result and its source."""

from __future__ import annotations

import doctest
import importlib
import inspect
from typing import Any

import pytest

# The modules whose docstrings hold the examples of the public names of ``optax_lena.aladdin``
# and ``optax_lena.aladdin.simulator`` (outside the Ray runtime).
MODULES = [
  "optax_lena._src.precision",
  "optax_lena._src.aladdin.algorithms",
  "optax_lena._src.aladdin.baselines",
  "optax_lena._src.aladdin.server",
  "optax_lena._src.aladdin.server_step",
  "optax_lena._src.aladdin.worker",
  "optax_lena._src.aladdin.sim.cluster",
  "optax_lena._src.aladdin.sim.simulator",
]
PUBLIC = ["optax_lena.aladdin", "optax_lena.aladdin.simulator"]
# The functions that implement an algorithm of a paper (they cite it) and give an example.
ALGORITHMIC = {
  "optax_lena.aladdin": [
    "algorithm",
    "ar_sgd_mean",
    "asp_server",
    "easgd_server",
    "local_optimizer",
    "local_step",
    "parameter_server",
    "sgp",
    "worker_merge",
  ],
  "optax_lena.aladdin.simulator": ["calibrated_compute_time", "paper_cluster", "simulate"],
}


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name: str) -> None:
  module = importlib.import_module(name)
  tests = [t for t in doctest.DocTestFinder().find(module) if t.examples]
  assert tests, f"{name} has no examples"
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
  failures: list[str] = []
  for test in tests:
    runner.run(test, out=failures.append)
  assert runner.failures == 0, "".join(failures)


def public_functions() -> list[object]:
  out = []
  for module_name in PUBLIC:
    module = importlib.import_module(module_name)
    for name in module.__all__:
      fn = getattr(module, name)
      if inspect.isfunction(fn):
        out.append(pytest.param(module_name, name, fn, id=f"{module_name}.{name}"))
  return out


@pytest.mark.parametrize("module_name, name, fn", public_functions())
def test_public_function_is_documented(module_name: str, name: str, fn: Any) -> None:
  doc = inspect.getdoc(fn) or ""
  assert doc and "\n" not in doc.split("\n\n", 1)[0], f"{name}: no one-line summary opens it"
  signature = inspect.signature(fn)
  if signature.parameters:
    assert "\nArgs:\n" in doc, f"{name} documents no Args"
  if signature.return_annotation not in ("None", None):
    assert "\nReturns:\n" in doc, f"{name} documents no Returns"
  if name in ALGORITHMIC[module_name]:
    assert "\nReferences:\n" in doc, f"{name} cites no paper"
    assert "\nExamples:\n" in doc, f"{name} has no Examples"


def test_the_scan_sees_the_entry_points() -> None:
  found = {name for _, name, _ in (p.values for p in public_functions())}
  assert {"parameter_server", "simulate", "worker_merge"} <= found
