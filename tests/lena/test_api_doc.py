"""docs/API.md cannot drift from the code: every public name of ``optax_lena`` and
``optax_lena.flax`` is documented there with its exact signature, and every name the page
mentions exists.

A signature is written as Python prints it without annotations (``inspect.signature``), e.g.
``ol.per_layer_tree(vector, params)``, in the first cell of a table row. When a
signature changes, the failure message prints the row to paste.
"""

from __future__ import annotations

import inspect
import pathlib
import re
from typing import Any

import pytest

import optax_lena as ol

API_MD = pathlib.Path(__file__).resolve().parents[2] / "docs" / "API.md"
# How the page spells the modules (``import optax_lena as ol``, ``import optax_lena.flax as olf``).
PREFIXES = {"optax_lena": "ol", "optax_lena.flax": "olf"}
# Defaults that are classes are written as the user spells them.
_MODULE_ALIASES = {"flax.nnx": "nnx"}


class _Spelled:
  """A default value whose repr is how the documentation spells it."""

  def __init__(self, text: str) -> None:
    self.text = text

  def __repr__(self) -> str:
    return self.text


def _default(value: Any) -> Any:
  if isinstance(value, type):
    for module, alias in _MODULE_ALIASES.items():
      if value.__module__.startswith(module):
        return _Spelled(f"{alias}.{value.__qualname__}")
    return _Spelled(value.__qualname__)
  return value


def render(prefix: str, name: str, obj: Any) -> str:
  """``prefix.name(signature)`` without annotations, as API.md writes it."""
  sig = inspect.signature(obj)
  params = [
    p.replace(
      annotation=inspect.Parameter.empty,
      default=p.default if p.default is inspect.Parameter.empty else _default(p.default),
    )
    for p in sig.parameters.values()
  ]
  return f"{prefix}.{name}{sig.replace(parameters=params, return_annotation=sig.empty)}"


def public_names() -> dict[str, Any]:
  import importlib

  out = {}
  for module_name, prefix in PREFIXES.items():
    if module_name == "optax_lena.flax" and importlib.util.find_spec("flax") is None:
      continue
    module = importlib.import_module(module_name)
    for name in module.__all__:
      out[f"{prefix}.{name}"] = getattr(module, name)
  return out


def documented_rows() -> dict[str, str]:
  """``{"ol.name": "first cell"}`` of every table row whose first cell is a backticked name."""
  rows = {}
  for line in API_MD.read_text().splitlines():
    m = re.match(r"\|\s*`((?:ol|olf)\.\w+)([^`]*)`\s*\|", line)
    if m:
      assert m.group(1) not in rows, f"{m.group(1)} has two rows in docs/API.md"
      rows[m.group(1)] = m.group(1) + m.group(2)
  return rows


def test_every_public_name_has_a_row_with_its_exact_signature():
  rows = documented_rows()
  wrong = []
  for full_name, obj in public_names().items():
    prefix, name = full_name.split(".")
    want = render(prefix, name, obj)
    if rows.get(full_name) != want:
      wrong.append(f"| `{want}` | ... |   (docs/API.md has: {rows.get(full_name)!r})")
  assert not wrong, "docs/API.md is out of date; rows to paste:\n" + "\n".join(wrong)


def test_every_name_the_page_mentions_exists():
  text = API_MD.read_text()
  public = public_names()
  mentioned = set(re.findall(r"\b((?:ol|olf)\.[A-Za-z_]\w*)", text))
  if not any(k.startswith("olf.") for k in public):
    mentioned = {m for m in mentioned if not m.startswith("olf.")}
  stale = sorted(mentioned - set(public))
  assert not stale, f"docs/API.md mentions names that are not public: {stale}"
  assert set(documented_rows()) <= set(public)


def test_the_renderer_writes_what_the_page_expects():
  # Guards the checker itself: keyword-only markers, defaults and class defaults.
  assert render("ol", "noise_scale", ol.noise_scale) == (
    "ol.noise_scale(sq_norm_mean, mean_grad_sq_norm, s)"
  )

  def f(a, *args, b=1e-6, c="x", d=int, **kw):
    del a, args, b, c, d, kw

  assert render("ol", "f", f) == "ol.f(a, *args, b=1e-06, c='x', d=int, **kw)"
  with pytest.raises(AssertionError):
    assert render("ol", "lena", ol.lena) == "ol.lena(learning_rate)"
