"""``pip install 'optax_lena[distributed]'`` installs everything the Ray runtime imports."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RUNTIME = [ROOT / "optax_lena/_src/aladdin/ray", ROOT / "optax_lena/aladdin/distributed.py"]
# Import names of distributions whose module is spelled differently.
MODULE_OF = {"orbax-checkpoint": "orbax"}
OPTIONAL = {"tqdm"}  # the progress bar falls back to plain lines without it


def _imports(path: Path) -> set[str]:
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found |= {a.name.split(".")[0] for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      found.add(node.module.split(".")[0])
  return found


def test_the_distributed_extra_installs_every_module_the_runtime_imports() -> None:
  files = [p for root in RUNTIME for p in ([root] if root.is_file() else root.glob("*.py"))]
  imported = set().union(*map(_imports, files)) - set(sys.stdlib_module_names) - OPTIONAL
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  requirements = project["dependencies"] + project["optional-dependencies"]["distributed"]
  names = {re.split(r"[<>=\[; ]", r, maxsplit=1)[0] for r in requirements}
  provided = {MODULE_OF.get(n, n.replace("-", "_")) for n in names} | {"optax_lena"}
  assert "orbax" in imported and "ray" in imported  # the check sees the runtime's imports
  assert imported <= provided, f"missing from the distributed extra: {imported - provided}"


def test_the_public_names_document_themselves_and_their_examples_run() -> None:
  """Every public name of ``ad`` has a summary line; the entry points have Args or Attributes,
  Raises and Examples; every example runs (those that need a cluster are marked to skip, and
  ``test_runtime.py`` runs them on its cluster)."""
  import doctest
  import inspect

  from optax_lena.aladdin import distributed as ad

  documented = [getattr(ad, name) for name in ad.__all__ if inspect.isclass(getattr(ad, name))] + [
    ad.runs,
    ad.connect,
    ad.exit_on_stop_signals,
  ]
  for obj in documented:
    assert (obj.__doc__ or "").strip(), obj
  for obj in (ad.Runtime, ad.Config, ad.Task):
    assert all(f"\n  {part}:" in obj.__doc__ for part in ("Raises", "Examples")), obj
    assert "\n  Args:" in obj.__doc__ or "\n  Attributes:" in obj.__doc__, obj
  finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
  for obj in documented:
    for test in finder.find(obj, getattr(obj, "__name__", ""), globs={}):
      runner.run(test)
  assert runner.failures == 0 and runner.tries >= 20, runner.summarize()
