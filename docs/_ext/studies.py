"""Shows every study's ``RESULTS.md`` as a page of the site, generated when the build starts.

``benchmarks/<study>/RESULTS.md`` becomes the page ``studies/<study>/RESULTS``, which includes the
file with its plots; a Markdown file that a ``RESULTS.md`` links (e.g. ``results/tables.md``)
becomes a page at its own path too, so that the links between them work as in the repository.
``results.md`` lists the studies: a study it does not list is a page outside the navigation and
fails the build. The generated pages live in ``docs/studies/`` (ignored by git); a page whose file
is gone is removed.
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any

from sphinx.application import Sphinx
from sphinx.config import Config

#: Where the generated pages go, relative to the docs folder.
STUDIES = "studies"
#: A relative link to a Markdown file: ``[text](path.md)`` or ``[text](path.md#anchor)``.
MD_LINK = re.compile(r"\]\(([^)#:\s]+\.md)(?:#[^)]*)?\)")


def pages(benchmarks: pathlib.Path) -> dict[pathlib.Path, bool]:
  """``{Markdown file under benchmarks: whether it is a study's RESULTS.md}`` to show."""
  out = {}
  for results in sorted(benchmarks.rglob("RESULTS.md")):
    out[results] = True
    for link in MD_LINK.findall(results.read_text()):
      target = (results.parent / link).resolve()
      if target.is_file() and target.is_relative_to(benchmarks.resolve()):
        out.setdefault(target, False)
  return out


def page_text(source: pathlib.Path, page: pathlib.Path, in_navigation: bool) -> str:
  """The MyST page at ``page`` that shows ``source`` (an orphan when it is not a study)."""
  path = pathlib.Path(os.path.relpath(source, page.parent)).as_posix()
  header = "" if in_navigation else "---\norphan: true\n---\n"
  return f"{header}```{{include}} {path}\n:relative-images:\n```\n"


def write_pages(app: Sphinx, config: Config) -> None:
  """Writes the pages whose text changed and removes those whose file is gone."""
  docs = pathlib.Path(app.srcdir).resolve()
  benchmarks = (docs.parent / "benchmarks").resolve()
  folder = docs / STUDIES
  wanted = set()
  for source, is_study in pages(benchmarks).items():
    page = folder / source.relative_to(benchmarks)
    wanted.add(page)
    text = page_text(source, page, is_study)
    if not page.exists() or page.read_text() != text:
      page.parent.mkdir(parents=True, exist_ok=True)
      page.write_text(text)
  for page in folder.rglob("*.md"):
    if page not in wanted:
      page.unlink()


def setup(app: Sphinx) -> dict[str, Any]:
  app.connect("config-inited", write_pages)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
