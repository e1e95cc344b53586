"""Escapes, for the site only, the reStructuredText that docstrings this site does not own get
wrong, until their owners fix them; an entry that no longer matches fails the build, so that it
is removed once the docstring is fixed.
"""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

#: ``{object as autodoc names it: [(text in the docstring, what the site shows instead)]}``.
#: ``|G|^2`` reads as the start of a substitution reference in reStructuredText.
ESCAPES: dict[str, list[tuple[str, str]]] = {
  "optax_lena.noise_scale": [("/ |G|^2,", "/ \\|G\\|^2,")],
}

logger = logging.getLogger(__name__)


def _escape(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
  for old, new in ESCAPES.get(name, []):
    found = [i for i, line in enumerate(lines) if old in line]
    if not found:
      logger.warning("%s no longer contains %r: remove its entry in %s", name, old, __file__)
    for i in found:
      lines[i] = lines[i].replace(old, new)


def setup(app: Sphinx) -> dict[str, Any]:
  app.connect("autodoc-process-docstring", _escape)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
