"""The documentation site: a README that fits on two screens, every page in the navigation,
every public name on the API pages, search that finds the pages.

``make test`` builds the site (``make docs``, warnings as errors) before it runs the tests; run
alone, the module builds it the same way when the build is missing or older than its sources.
"""

from __future__ import annotations

import html.parser
import pathlib
import posixpath
import re
import shutil
import subprocess
import sys
import zlib

import pytest

from tests.docs.pages import DOCS, README, ROOT, extension

pytest.importorskip("sphinx")

pytestmark = pytest.mark.xdist_group("docs_site")  # one build, one worker

SITE = DOCS / "_build" / "html"
README_LIMIT = 8000  # characters: optax's README is about 6,000, flax's about 7,900
_TOCTREE = re.compile(r"```\{toctree\}\n(.*?)```", flags=re.S)
_EXPLICIT_TITLE = re.compile(r"^.*<(.+)>$")


def source_pages() -> set[str]:
  """The docnames of the pages written in ``docs/`` (the generated study pages excluded)."""
  out = set()
  for path in DOCS.rglob("*"):
    relative = path.relative_to(DOCS)
    if relative.parts[0] in ("_build", "_ext", "studies") or path.suffix not in (
      ".md",
      ".rst",
      ".ipynb",
    ):
      continue
    out.add(relative.with_suffix("").as_posix())
  return out


def toctree_entries(docname: str) -> list[str]:
  """The docnames a page's toctrees list (MyST pages; options and blank lines skipped)."""
  page = next(DOCS.glob(f"{docname}.*"))
  entries = []
  for body in _TOCTREE.findall(page.read_text()):
    for line in body.splitlines():
      line = line.strip()
      if line and not line.startswith(":"):
        target = _EXPLICIT_TITLE.sub(r"\1", line)  # "A title <page>" -> "page"
        entries.append(posixpath.normpath(posixpath.join(posixpath.dirname(docname), target)))
  return entries


def test_readme_fits_two_screens():
  size = len(README.read_text())
  assert size <= README_LIMIT, f"README.md has {size} characters; move content to docs/guides/"


def test_every_page_is_in_the_navigation():
  studies = extension("studies")
  study_pages = {
    f"{studies.STUDIES}/{path.relative_to(ROOT / 'benchmarks').with_suffix('').as_posix()}"
    for path, is_study in studies.pages(ROOT / "benchmarks").items()
    if is_study
  }
  reached, todo = {"index"}, ["index"]
  while todo:
    for entry in toctree_entries(todo.pop()):
      assert entry in source_pages() | study_pages, f"a toctree lists {entry!r}, which is no page"
      if entry not in reached and entry not in study_pages:
        todo.append(entry)
      reached.add(entry)
  assert not source_pages() - reached, f"pages in no toctree: {sorted(source_pages() - reached)}"
  assert not study_pages - reached, f"studies not in results.md: {sorted(study_pages - reached)}"


def test_the_claims_page_is_generated_from_the_committed_json():
  from benchmarks import claims_page
  from benchmarks.paired_intervals import paired

  committed = (DOCS / "claims.md").read_text()
  assert committed == claims_page.render(), (
    "docs/claims.md differs from the committed JSON: python -m benchmarks.claims_page --write "
    "docs/claims.md"
  )
  assert "(claims.md)" in (DOCS / "results.md").read_text()
  # The page copies two studies' labels (so that it imports no JAX): they agree.
  from benchmarks.aladdin.baselines import grid as baselines
  from benchmarks.aladdin.outer_optimizer import grid as outer

  assert (claims_page.BASELINE_LABELS, claims_page.OUTER_LABELS) == (baselines.LABELS, outer.LABELS)
  # The verdict words come from the interval and the family's better side.
  up, flat = paired([3.0, 4.0, 5.0], [1.0, 1.5, 2.0]), paired([1.0, 2.0, 0.0], [1.5, 1.0, 0.5])
  assert [claims_page.verdict(up, better) for better in (1, -1, 0)] == ["ahead", "behind", "higher"]
  assert claims_page.verdict(flat, 1) == "not distinguishable"
  # A family's Bonferroni interval contains its 95% interval, and both verdicts are on the page.
  rows = [line for line in committed.splitlines() if line.startswith("| ") and "[" in line]
  assert len(rows) > 150
  for row in rows:
    cells = [c.strip() for c in row.strip("|").split("|")]
    (low, high), (b_low, b_high) = (
      map(float, c.strip("[]").split(", ")) for c in (cells[-4], cells[-2])
    )
    assert b_low <= low <= high <= b_high, row
    assert cells[-3] in ("ahead", "behind", "not distinguishable", "higher", "lower"), row


def _sources_newer_than(built: pathlib.Path) -> bool:
  if not built.exists():
    return True
  stamp = built.stat().st_mtime
  sources = [README, ROOT / "colab" / "lena_vs_adascale.ipynb"]
  sources += [p for p in DOCS.rglob("*") if "_build" not in p.parts and "studies" not in p.parts]
  sources += list((ROOT / "optax_lena").rglob("*.py")) + list((ROOT / "benchmarks").rglob("*.md"))
  return any(p.is_file() and p.stat().st_mtime > stamp for p in sources)


@pytest.fixture(scope="module")
def site() -> pathlib.Path:
  """The built site; built here, as ``make docs`` does, when missing or out of date."""
  if _sources_newer_than(SITE / "objects.inv"):
    shutil.rmtree(DOCS / "_build", ignore_errors=True)
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    subprocess.run([*command, str(DOCS), str(SITE)], check=True, cwd=ROOT)
  return SITE


def inventory(site: pathlib.Path) -> dict[str, tuple[str, str]]:
  """``{object name: (domain:role, page)}`` from the site's ``objects.inv`` (version 2)."""
  data = (site / "objects.inv").read_bytes()
  header_end = 0
  for _ in range(4):
    header_end = data.index(b"\n", header_end) + 1
  out = {}
  for line in zlib.decompress(data[header_end:]).decode().splitlines():
    match = re.match(r"(.+?)\s+(\S+)\s+(-?\d+)\s+?(\S*)\s+(.*)", line)
    assert match, line
    name, role, _, uri, _ = match.groups()
    out[name] = (role, uri.split("#")[0])
  return out


def test_every_public_name_has_an_entry_on_the_api_pages(site):
  objects = inventory(site)
  public = extension("coverage_check").public_names()
  assert len(public) > 100  # the five modules were read
  missing = sorted(public - set(objects))
  assert not missing, f"public names with no entry in docs/api/*.rst: {missing}"
  elsewhere = sorted(n for n in public if not objects[n][1].startswith("api/"))
  assert not elsewhere, f"public names documented outside the API pages: {elsewhere}"


class _Links(html.parser.HTMLParser):
  def __init__(self) -> None:
    super().__init__()
    self.hrefs: list[str] = []

  def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
    href = dict(attrs).get("href")
    if tag == "a" and href and "://" not in href and not href.startswith(("#", "mailto:")):
      self.hrefs.append(href.split("#")[0])


def test_every_page_is_reachable_from_the_home_page_and_searchable(site):
  indices = {"genindex.html", "py-modindex.html", "search.html"}  # Sphinx's, not pages
  pages = {
    p.relative_to(site).as_posix()
    for p in site.rglob("*.html")
    if p.relative_to(site).parts[0] not in ("_static", "_sources", "_modules")
  } - indices
  reached, todo = {"index.html"}, ["index.html"]
  while todo:
    page = todo.pop()
    parser = _Links()
    parser.feed((site / page).read_text())
    for href in parser.hrefs:
      target = posixpath.normpath(posixpath.join(posixpath.dirname(page), href)) if href else page
      if target in pages and target not in reached:
        reached.add(target)
        todo.append(target)
  assert not pages - reached, f"pages no link leads to: {sorted(pages - reached)}"
  search_index = (site / "searchindex.js").read_text()
  searched = set(
    re.search(r'"docnames":\[(.*?)\]', search_index).group(1).replace('"', "").split(",")
  )
  content = {p.removesuffix(".html") for p in pages}
  assert content <= searched, f"pages the search does not know: {sorted(content - searched)}"
