"""The package's boundaries: code outside ``optax_lena/`` and ``tests/`` imports only public
names, every ALADDIN class name is unique, and each engine lives in its own folder."""

from __future__ import annotations

import ast
import collections
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
ALADDIN = [ROOT / "optax_lena" / "_src" / "aladdin", ROOT / "optax_lena" / "aladdin"]


def python_files() -> list[pathlib.Path]:
  """The repository's tracked Python files (what a checkout holds)."""
  out = subprocess.run(
    ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
  ).stdout.split()
  return [ROOT / p for p in out]


def imported_modules(path: pathlib.Path) -> list[str]:
  names = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
  return names


def test_no_private_import_outside_the_package_and_its_tests() -> None:
  files = python_files()
  outside = [p for p in files if p.relative_to(ROOT).parts[0] not in ("optax_lena", "tests")]
  assert any({"benchmarks", "aladdin"} <= set(p.parts) for p in outside)  # the scan sees them
  private = {
    str(p.relative_to(ROOT)): m
    for p in outside
    for m in imported_modules(p)
    if m == "optax_lena._src" or m.startswith("optax_lena._src.")
  }
  assert not private, f"import public names instead (optax_lena.aladdin, ...): {private}"


def test_every_aladdin_class_name_is_unique() -> None:
  where = collections.defaultdict(list)
  for folder in ALADDIN:
    for path in sorted(folder.rglob("*.py")):
      for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
          where[node.name].append(str(path.relative_to(ROOT)))
  assert len(where) > 40  # the scan sees the classes
  twice = {name: paths for name, paths in where.items() if len(paths) > 1}
  assert not twice, f"class names defined more than once: {twice}"


def test_each_engine_has_its_own_folder() -> None:
  src = ALADDIN[0]
  loose = sorted(p.name for p in src.glob("*.py"))
  assert loose == [
    "__init__.py",
    "algorithms.py",
    "baselines.py",
    "batches.py",
    "checks.py",
    "folding.py",
    "server.py",
    "server_step.py",
    "worker.py",
  ], loose
  assert (src / "sim" / "simulator.py").is_file() and (src / "ray" / "driver.py").is_file()


def test_every_repository_path_named_by_aladdin_code_and_docs_exists() -> None:
  # Moves (sim/, per-study benchmark folders) left docstrings naming files that were gone.
  out = subprocess.run(
    ["git", "ls-files", "optax_lena", "docs", "benchmarks/aladdin", "examples/aladdin"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    check=True,
  ).stdout.split()
  pattern = re.compile(r"(?<![\w/.])(?:benchmarks|optax_lena|examples|tests)/[\w./-]*\w")
  missing = [
    f"{p}: {m}"
    for p in out
    if p.endswith((".py", ".md"))
    for m in pattern.findall((ROOT / p).read_text())
    if not (ROOT / m).exists()
  ]
  assert not missing, "named paths that do not exist; fix the reference:\n" + "\n".join(missing)
