"""Gives a public constant the ``#:`` comment written where it is defined.

autodoc reads a constant's ``#:`` comment in the module that documents it, but the public
modules import their constants from ``optax_lena._src``: without this, ``sim.GIGABIT`` would be
documented by the docstring of ``float``. A constant with no comment anywhere shows its name and
value only, never the docstring of its type.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
from typing import Any

from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer


@functools.cache
def imported_from(module_name: str) -> dict[str, str]:
  """``{name: defining module}`` for every ``from X import name`` of ``module_name``."""
  tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
  out = {}
  for node in tree.body:
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      for alias in node.names:
        out[alias.asname or alias.name] = node.module
  return out


def defining_comment(module_name: str, name: str) -> list[str] | None:
  """The ``#:`` comment of ``name`` where it is defined: in the module ``module_name`` imports it
  from, or in ``module_name`` itself; None if there is none."""
  source = imported_from(module_name).get(name, module_name)
  return ModuleAnalyzer.for_module(source).find_attr_docs().get(("", name))


def _docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
  if what != "data":
    return
  module_name, _, attr = name.rpartition(".")
  comment = defining_comment(module_name, attr)
  if comment:
    lines[:] = list(comment)
  elif (
    not inspect.ismodule(obj) and lines == inspect.cleandoc(type(obj).__doc__ or "").splitlines()
  ):
    lines.clear()


def setup(app: Sphinx) -> dict[str, Any]:
  app.connect("autodoc-process-docstring", _docstring)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
