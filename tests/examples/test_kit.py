"""The declared kit: the benchmarks and the notebook import only ``examples.KIT`` (and, from
``examples.lena``, only its public names), so the programs' internals can change freely.

The imports are read by parsing the sources (nothing is executed). ``benchmarks/aladdin/`` uses
the ALADDIN program, whose entry point belongs to that program's folder, and is not checked here.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO_ROOT / "colab" / "lena_vs_adascale.ipynb"
LENA_INIT = REPO_ROOT / "examples" / "lena" / "__init__.py"


def _kit() -> tuple[str, ...]:
  tree = ast.parse((REPO_ROOT / "examples" / "__init__.py").read_text())
  for node in tree.body:
    if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["KIT"]:
      return tuple(ast.literal_eval(node.value))
  raise AssertionError("examples/__init__.py defines no KIT")


def _lena_public() -> set[str]:
  tree = ast.parse(LENA_INIT.read_text())
  for node in tree.body:
    if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
      "__all__"
    ]:
      return set(ast.literal_eval(node.value))
  raise AssertionError("examples/lena/__init__.py defines no __all__")


def _sources() -> list[tuple[str, str]]:
  """(name, Python source) of every benchmark module and of the notebook's code cells."""
  out = [
    (str(p.relative_to(REPO_ROOT)), p.read_text())
    for p in sorted((REPO_ROOT / "benchmarks").rglob("*.py"))
    if "aladdin" not in p.relative_to(REPO_ROOT / "benchmarks").parts
  ]
  cells = json.loads(NOTEBOOK.read_text())["cells"]
  code = "\n".join(
    line
    for c in cells
    if c["cell_type"] == "code"
    for line in "".join(c["source"]).splitlines()
    if not line.lstrip().startswith(("%", "!"))  # IPython magics are not Python
  )
  out.append((str(NOTEBOOK.relative_to(REPO_ROOT)), code))
  return out


def kit_violations(name: str, source: str, kit: tuple[str, ...], public: set[str]) -> list[str]:
  """The imports of ``source`` from ``examples`` outside ``kit``, and the uses of
  ``examples.lena`` names outside ``public``."""
  bad: list[str] = []
  lena_aliases: set[str] = set()
  tree = ast.parse(source, filename=name)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name == "examples" or alias.name.startswith("examples."):
          if alias.name not in kit:
            bad.append(f"{name}:{node.lineno}: import {alias.name}")
          elif alias.name == "examples.lena" and alias.asname:
            lena_aliases.add(alias.asname)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      module = node.module
      if module == "examples":
        for alias in node.names:
          if f"examples.{alias.name}" not in kit:
            bad.append(f"{name}:{node.lineno}: from examples import {alias.name}")
          elif alias.name == "lena":
            lena_aliases.add(alias.asname or "lena")
      elif module == "examples.lena":
        bad += [
          f"{name}:{node.lineno}: from examples.lena import {a.name}"
          for a in node.names
          if a.name not in public
        ]
      elif module.startswith("examples.") and module not in kit:
        bad.append(f"{name}:{node.lineno}: from {module} import ...")
  for node in ast.walk(tree):
    if (
      isinstance(node, ast.Attribute)
      and isinstance(node.value, ast.Name)
      and node.value.id in lena_aliases
      and node.attr not in public
    ):
      bad.append(f"{name}:{node.lineno}: {node.value.id}.{node.attr}")
  return bad


def test_kit_is_declared_in_the_package_docstring() -> None:
  import examples

  kit = _kit()
  assert kit == examples.KIT
  for module in kit:
    assert f"``{module}``" in (examples.__doc__ or ""), module
  assert "train_and_evaluate" in _lena_public()


def _imported_modules(source: str) -> set[str]:
  """Every module ``source`` imports, at any depth (function-local and TYPE_CHECKING too)."""
  names: set[str] = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names.add(node.module)
      names.update(f"{node.module}.{alias.name}" for alias in node.names)
  return names


@pytest.mark.parametrize("module", [m for m in _kit() if m != "examples.lena"])
def test_the_kit_imports_no_program(module: str) -> None:
  """The shared pieces stand below the programs: nothing of ``examples.lena`` (nor of the
  ALADDIN program) is imported by them, so a program's internals never reach back into them."""
  path = REPO_ROOT / (module.replace(".", "/") + ".py")
  programs = [
    name
    for name in _imported_modules(path.read_text())
    if name.startswith(("examples.lena", "examples.aladdin"))
  ]
  assert programs == [], programs


def test_lena_public_names_resolve() -> None:
  from examples import lena

  for name in _lena_public():
    assert getattr(lena, name) is not None, name
  with pytest.raises(AttributeError, match="no attribute 'parallel_internals'"):
    _ = lena.parallel_internals
  with pytest.raises(lena.ConfigError, match="split must be 'test' or 'validation'"):
    lena.evaluate_split(lena.get_config("tiny_test"), None, "train")  # type: ignore[arg-type]


def test_the_checker_catches_internal_imports() -> None:
  kit, public = _kit(), _lena_public()
  internal = (
    "from examples.lena import train\n"
    "from examples import lena, configs\n"
    "import examples.lena.parallel\n"
    "from examples.lena.train import worker_grads\n"
    "lena.create_optimizer\n"
  )
  bad = kit_violations("snippet", internal, kit, public)
  assert [b.split(": ", 1)[1] for b in bad] == [
    "from examples.lena import train",
    "from examples import configs",
    "import examples.lena.parallel",
    "from examples.lena.train import ...",
    "lena.create_optimizer",
  ]
  fine = "from examples import analysis, lena\nfrom examples.models import CNN1D\nlena.Config\n"
  assert kit_violations("snippet", fine, kit, public) == []


@pytest.mark.parametrize("name", [name for name, _ in _sources()])
def test_benchmarks_and_notebook_import_only_the_kit(name: str) -> None:
  source = dict(_sources())[name]
  assert kit_violations(name, source, _kit(), _lena_public()) == []


@pytest.mark.parametrize("module", ["examples.main", "examples.demo"])
def test_entry_points_parse_their_flags(module: str) -> None:
  out = subprocess.run(
    [sys.executable, "-m", module, "--help"],
    cwd=REPO_ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 0, out.stderr
  assert f"usage: python -m {module}" in out.stdout
