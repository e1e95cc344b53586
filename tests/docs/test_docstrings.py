"""The API reference is written for every public name, and its examples run.

The public names are the ``__all__`` of the modules the API pages cover
(``docs/_ext/coverage_check.py``, whose check fails the site build when a name has no entry on
those pages). Each one has:

* a docstring of its own that opens with a one-line summary (a constant: a ``#:`` comment where
  it is defined, which the site shows);
* a function: ``Args:`` when it takes arguments, ``Returns:`` unless it is annotated to return
  None, ``Raises:`` when its body has a ``raise`` (outside the functions it defines) or when
  :data:`RAISES` lists it (it validates through helpers);
* a class: ``Attributes:`` when it declares fields (a NamedTuple's, a dataclass's own), ``Args:``
  when an ``__init__`` of its own takes arguments, ``Raises:`` when :data:`RAISES` lists it;
* ``References:`` when it implements a paper's algorithm (:data:`REFERENCES`) and ``Examples:``
  for the names of :data:`EXAMPLES`.

Every ``>>>`` example in the package runs as a doctest: ``test_examples_run`` runs ``doctest``
over each module whose source has one (the Ray runtime's under the ``ray`` marker).
"""

from __future__ import annotations

import ast
import dataclasses
import doctest
import importlib
import inspect
import pkgutil
import textwrap
from typing import Any

import pytest

import optax_lena
from tests.docs.pages import ROOT, extension

pytest.importorskip("sphinx")

MODULES: tuple[str, ...] = extension("coverage_check").DOCUMENTED_MODULES
# The package of the Ray runtime: its modules import Ray, and their examples start a cluster.
RAY_PACKAGES = ("optax_lena._src.aladdin.ray", "optax_lena.aladdin.distributed")


def functions(module_name: str) -> tuple[str, ...]:
  """The public functions of a module (its ``__all__`` names that are functions)."""
  module = importlib.import_module(module_name)
  return tuple(n for n in module.__all__ if inspect.isfunction(getattr(module, n)))


# ALADDIN's functions that implement an algorithm, its paper's or a baseline's: each cites it and
# gives an example; with the simulator's and the Ray runtime's entry points.
ALADDIN_ALGORITHMS = {
  "optax_lena.aladdin": (
    "algorithm",
    "ar_sgd_mean",
    "asp_server",
    "easgd_server",
    "local_optimizer",
    "local_step",
    "parameter_server",
    "sgp",
    "worker_merge",
  ),
  "optax_lena.aladdin.simulator": ("calibrated_compute_time", "paper_cluster", "simulate"),
  "optax_lena.aladdin.distributed": ("Runtime",),
}

# Examples: every function of optax_lena and optax_lena.flax (the ready optimizers, the
# statistics, the diagnostics, the building blocks, the Flax helpers) and the classes a user
# builds; ALADDIN's algorithms and entry points.
EXAMPLES = {
  "optax_lena": (*functions("optax_lena"), "GainRatioRule", "GradStats"),
  "optax_lena.flax": (*functions("optax_lena.flax"), "TrainState"),
  **ALADDIN_ALGORITHMS,
}

# References: the names that implement an algorithm of a paper cite it (the paper and, where it
# numbers them, the equations). In optax_lena every name does but these helpers and states.
NO_PAPER = (
  "FixedWarmupState",
  "ScaleBySampleClockState",
  "SkipNonFiniteState",
  "flat_diagnostics",
  "group_by_module",
  "per_layer_tree",
  "skip_nonfinite_steps",
)
REFERENCES = {
  "optax_lena": tuple(n for n in optax_lena.__all__ if n not in NO_PAPER),
  "optax_lena.flax": ("linen_grad_stats", "nnx_grad_stats"),
  **ALADDIN_ALGORITHMS,
}
REFERENCES["optax_lena.aladdin"] += ("Aladdin", "ArSgd", "Asp", "Easgd", "Sgp")

# Raises, beyond the functions whose body raises: the names whose arguments are checked by
# helpers they call. In optax_lena every function is, but three pure formulas, and the two
# classes a user builds.
NEVER_RAISE = ("expected_speedup", "group_by_module", "noise_scale")
RAISES = {
  "optax_lena": (
    *(n for n in functions("optax_lena") if n not in NEVER_RAISE),
    "GainRatioRule",
    "GradStats",
  ),
  "optax_lena.flax": ("linen_grad_stats", "nnx_grad_stats"),
}

# Classes with an ``__init__`` of their own that users subclass but never call: the library
# constructs them (their subclasses' authors read the class's ``Attributes`` and methods).
CONSTRUCTED_BY_THE_LIBRARY = {"optax_lena.aladdin.simulator": ("Process",)}


def public_names() -> list[Any]:
  out = []
  for module_name in MODULES:
    module = importlib.import_module(module_name)
    for name in module.__all__:
      out.append(pytest.param(module_name, name, getattr(module, name), id=f"{module_name}.{name}"))
  return out


def own_doc(obj: Any) -> str:
  """The docstring written for ``obj`` itself (a class's, not one it inherits), cleaned."""
  doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
  return inspect.cleandoc(doc or "")


def sections(doc: str) -> set[str]:
  """The Google-style section headers of a cleaned docstring (``Args``, ``Returns``...)."""
  return {line[:-1] for line in doc.splitlines() if line.endswith(":") and line[:-1].istitle()}


def raises_itself(fn: Any) -> bool:
  """Whether the body of ``fn`` has a ``raise`` statement outside the functions it defines."""
  try:
    source = textwrap.dedent(inspect.getsource(fn))
  except (OSError, TypeError):
    return False
  definition = ast.parse(source).body[0]

  nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)

  def visit(node: ast.AST) -> bool:
    return any(
      isinstance(child, ast.Raise) or (not isinstance(child, nested) and visit(child))
      for child in ast.iter_child_nodes(node)
    )

  return visit(definition)


def own_fields(cls: type) -> bool:
  """Whether ``cls`` declares fields of its own (a NamedTuple's, or a dataclass's not
  inherited): those its ``Attributes:`` describe."""
  if getattr(cls, "_fields", ()):
    return True
  own = inspect.get_annotations(cls)
  return dataclasses.is_dataclass(cls) and any(f.name in own for f in dataclasses.fields(cls))


def required_sections(module_name: str, name: str, obj: Any) -> set[str]:
  """The sections the docstring of ``obj`` must have (beyond its summary)."""
  need = set()
  if inspect.isfunction(obj):
    signature = inspect.signature(obj)
    if signature.parameters:
      need.add("Args")
    if signature.return_annotation not in ("None", None):
      need.add("Returns")
    if raises_itself(obj):
      need.add("Raises")
  elif inspect.isclass(obj) and not issubclass(obj, BaseException):
    if own_fields(obj):
      need.add("Attributes")
    init = obj.__dict__.get("__init__")
    # A NamedTuple's or dataclass's constructor takes its fields: its Attributes.
    generated = dataclasses.is_dataclass(obj) or bool(getattr(obj, "_fields", ()))
    if (
      not generated
      and inspect.isfunction(init)
      and init.__qualname__ == f"{obj.__qualname__}.__init__"
      and len(inspect.signature(init).parameters) > 1
      and name not in CONSTRUCTED_BY_THE_LIBRARY.get(module_name, ())
    ):
      need.add("Args")
  if name in RAISES.get(module_name, ()):
    need.add("Raises")
  if name in REFERENCES.get(module_name, ()):
    need.add("References")
  if name in EXAMPLES.get(module_name, ()):
    need.add("Examples")
  return need


@pytest.mark.parametrize("module_name, name, obj", public_names())
def test_public_name_is_documented(module_name: str, name: str, obj: Any) -> None:
  if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj)):
    comment = extension("constants").defining_comment(module_name, name)
    assert comment, f"{module_name}.{name} has no #: comment where it is defined"
    return
  doc = own_doc(obj)
  assert doc and not doc.startswith(f"{name}("), f"{name} has no docstring of its own"
  assert "\n" not in doc.split("\n\n", 1)[0], f"{name}: no one-line summary opens its docstring"
  need = required_sections(module_name, name, obj)
  missing = need - sections(doc)
  assert not missing, f"{module_name}.{name} lacks the sections {sorted(missing)}"
  if "Examples" in need:
    examples = doc.split("\nExamples:\n", 1)[1]
    assert ">>> " in examples, f"{module_name}.{name}: its Examples are not doctests"


def test_the_lists_name_public_names() -> None:
  public = {(m, n) for m, n, _ in (p.values for p in public_names())}
  for table in (EXAMPLES, REFERENCES, RAISES):
    listed = {(m, n) for m, names in table.items() for n in names}
    assert listed <= public, sorted(listed - public)
  # The check reads the body of the functions that raise (and not of those they define).
  assert raises_itself(importlib.import_module("optax_lena.aladdin").algorithm)
  assert not raises_itself(optax_lena.noise_scale)


def example_modules() -> list[Any]:
  """Every module of the package whose source has a ``>>>`` example (Ray's marked ``ray``)."""
  out = []
  package = ROOT / "optax_lena"
  for info in pkgutil.walk_packages([str(package)], "optax_lena."):
    relative = info.name.split(".")[1:]
    path = package.joinpath(*relative)
    source = path / "__init__.py" if info.ispkg else path.with_suffix(".py")
    if ">>> " not in source.read_text():
      continue
    marks = [pytest.mark.ray] if info.name.startswith(RAY_PACKAGES) else []
    out.append(pytest.param(info.name, marks=marks, id=info.name))
  return out


# One worker runs them all: JAX compiles each small kernel once per process, and the examples
# share their shapes.
@pytest.mark.xdist_group("doctests")
@pytest.mark.parametrize("name", example_modules())
def test_examples_run(name: str) -> None:
  module = importlib.import_module(name)
  tests = [t for t in doctest.DocTestFinder().find(module) if t.examples]
  assert tests, f"{name} has no examples"
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  failures: list[str] = []
  for test in tests:
    runner.run(test, out=failures.append)
  assert runner.failures == 0, "".join(failures)
