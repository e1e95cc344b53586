"""What the API pages show of ALADDIN's public names is written for them: every class and
function of ``optax_lena.aladdin`` and its simulator has a docstring of its own that opens with
a one-line summary, and every constant a ``#:`` comment where it is defined (which the site
shows; ``tests/aladdin/test_docstrings.py`` checks the functions' sections and runs their
examples)."""

from __future__ import annotations

import importlib
import inspect

import pytest

from tests.docs.pages import extension

pytest.importorskip("sphinx")

MODULES = ["optax_lena.aladdin", "optax_lena.aladdin.simulator"]


def public_names() -> list[object]:
  out = []
  for module_name in MODULES:
    module = importlib.import_module(module_name)
    for name in module.__all__:
      out.append(pytest.param(module_name, name, getattr(module, name), id=f"{module_name}.{name}"))
  return out


@pytest.mark.parametrize("module_name, name, obj", public_names())
def test_public_name_has_its_own_summary(module_name: str, name: str, obj: object) -> None:
  if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj):
    own = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    assert own and not own.startswith(f"{name}("), f"{name} has no docstring of its own"
    summary = inspect.cleandoc(own).split("\n\n", 1)[0]
    assert "\n" not in summary, f"{name}: no one-line summary opens its docstring"
  else:
    comment = extension("constants").defining_comment(module_name, name)
    assert comment, f"{module_name}.{name} has no #: comment where it is defined"
