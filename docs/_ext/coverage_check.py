"""Fails the build when a public name has no entry in the API pages (as optax's docs do).

The public names are the ``__all__`` of the documented modules; an entry is an object that
autodoc put into Sphinx's Python domain, under the name the module exports it as (e.g.
``optax_lena.lena``, not ``optax_lena._src.alias.lena``).
"""

from __future__ import annotations

import importlib
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

#: The modules whose public names the API pages must cover.
DOCUMENTED_MODULES = (
  "optax_lena",
  "optax_lena.flax",
  "optax_lena.aladdin",
  "optax_lena.aladdin.simulator",
  "optax_lena.aladdin.distributed",
)

logger = logging.getLogger(__name__)


def public_names() -> set[str]:
  """Every ``module.name`` that the documented modules export."""
  names: set[str] = set()
  for module_name in DOCUMENTED_MODULES:
    module = importlib.import_module(module_name)
    names.update(f"{module_name}.{name}" for name in module.__all__)
  return names


def undocumented(documented: set[str]) -> list[str]:
  """The public names missing from ``documented``, sorted."""
  return sorted(public_names() - documented)


def _check(app: Sphinx, exception: Exception | None) -> None:
  if exception is not None or app.builder.format != "html":
    return
  missing = undocumented(set(app.env.domaindata["py"]["objects"]))
  if missing:
    logger.warning(
      "public names without an entry in docs/api/*.rst (add an autofunction/autoclass/autodata"
      " line and a row of the page's autosummary table): %s",
      ", ".join(missing),
      type="coverage_check",
    )


def setup(app: Sphinx) -> dict[str, Any]:
  app.connect("build-finished", _check)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
