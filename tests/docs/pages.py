"""The documentation's pages and their code blocks, for the tests that run what they print."""

from __future__ import annotations

import importlib.util
import pathlib
import re
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
GUIDES = DOCS / "guides"

_PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", flags=re.S)


def python_blocks(text: str) -> list[str]:
  """The fenced python blocks of a page's text, in order."""
  return _PYTHON_BLOCK.findall(text)


def block(page: pathlib.Path, *needles: str) -> str:
  """The one python block of ``page`` that contains every needle."""
  found = [b for b in python_blocks(page.read_text()) if all(n in b for n in needles)]
  assert len(found) == 1, f"{page.name}: {len(found)} python blocks contain {needles}"
  return found[0]


def marked_block(page: pathlib.Path, marker: str) -> str:
  """The python block between ``<!-- marker -->`` and ``<!-- /marker -->`` of ``page`` (the
  site includes the README's quickstarts by these markers)."""
  text = page.read_text()
  start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
  assert start in text and end in text, f"{page.name} lost its {marker} markers"
  found = python_blocks(text.split(start, 1)[1].split(end, 1)[0])
  assert len(found) == 1, f"{page.name}: {len(found)} python blocks between the {marker} markers"
  return found[0]


def run(source: str, name: str, namespace: dict | None = None) -> dict:
  """Executes a page's block as printed, in ``namespace`` (a new one by default)."""
  namespace = {} if namespace is None else namespace
  exec(compile(source, name, "exec"), namespace)
  return namespace


def extension(name: str) -> ModuleType:
  """A module of ``docs/_ext``, where the build's checks live."""
  spec = importlib.util.spec_from_file_location(name, DOCS / "_ext" / f"{name}.py")
  assert spec and spec.loader
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
