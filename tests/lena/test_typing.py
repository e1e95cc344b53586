"""The package is typed: py.typed ships as package data (mypy itself runs in `make typecheck`)."""

import importlib.resources
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_py_typed_is_shipped_and_mypy_is_configured():
  assert importlib.resources.files("optax_lena").joinpath("py.typed").is_file()
  config = tomllib.loads((ROOT / "pyproject.toml").read_text())
  assert "py.typed" in config["tool"]["setuptools"]["package-data"]["optax_lena"]
  assert any(d.startswith("mypy") for d in config["project"]["optional-dependencies"]["dev"])
  assert config["tool"]["mypy"]["files"] == ["optax_lena", "examples"]
  makefile = (ROOT / "Makefile").read_text()
  assert "typecheck:" in makefile and "test: install typecheck" in makefile


def test_import_does_not_pull_flax():
  import subprocess
  import sys

  code = "import sys, optax_lena; sys.exit(any(m.split('.')[0] == 'flax' for m in sys.modules))"
  assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_flax_module_without_flax_names_the_extra():
  """With flax not importable, ``import optax_lena.flax`` says which extra to install."""
  import subprocess
  import sys

  code = (
    "import sys\n"
    "class Block:\n"
    "  def find_spec(self, name, path=None, target=None):\n"
    "    if name == 'flax' or name.startswith('flax.'):\n"
    "      raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
    "sys.meta_path.insert(0, Block())\n"
    "import optax_lena\n"
    "try:\n"
    "  import optax_lena.flax\n"
    "except ImportError as err:\n"
    "  print(err)\n"
    "else:\n"
    "  print('imported')\n"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
  )
  assert "pip install 'optax_lena[flax]'" in out.stdout, out.stdout + out.stderr
