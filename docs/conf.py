"""Sphinx configuration of the optax_lena documentation site, built by ``make docs``.

Pages are MyST markdown (``.md``), the API reference is generated from the docstrings by
autodoc/autosummary (``api/*.rst``), and the notebook is rendered by myst-nb without running it
(its own test runs it). ``_ext/coverage_check.py`` fails the build when a public name has no
entry in the API pages; ``_ext/studies.py`` shows every study's ``RESULTS.md`` as a page.
"""

import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # the package and benchmarks/ of this checkout
sys.path.insert(0, str(DOCS / "_ext"))

import optax_lena  # noqa: E402

project = "optax_lena"
author = "the optax_lena authors"
copyright = "the optax_lena authors"
version = release = optax_lena.__version__

extensions = [
  "sphinx.ext.autodoc",
  "sphinx.ext.autosummary",
  "sphinx.ext.napoleon",
  "myst_nb",
  "coverage_check",
  "studies",
  "constants",
]

root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []

# -- autodoc: the reference is the docstrings (Google style: Args, Returns, Raises, Examples) --
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autosummary_generate = False  # the API pages list their names by hand, as optax's do
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# -- MyST and the notebook ----------------------------------------------------------------------
myst_heading_anchors = 3  # `[..](LENA.md#one-update-for-every-layer-k)` links resolve
nb_execution_mode = "off"  # colab/lena_vs_adascale.ipynb is run by tests/examples/test_colab.py
suppress_warnings: list[str] = []

# -- HTML: sphinx-book-theme, as optax's site; everything works offline from file:// ----------
html_theme = "sphinx_book_theme"
html_title = f"optax_lena {release}"
html_theme_options = {
  "show_toc_level": 2,
  "navigation_with_keys": False,
  "home_page_in_toc": True,
}
html_show_sourcelink = False
smartquotes = False  # error messages and options are quoted as the code prints them
html_static_path = ["_static"]
html_css_files = ["custom.css"]
