"""Tests for the Colab notebook colab/lena_vs_adascale.ipynb.

The notebook is executed end to end on the CPU with tiny parameters (MNIST-1D generated locally,
no network, no TensorFlow) in a kernel that runs this interpreter: the test writes its own
``python3`` kernelspec into a temporary directory, so no user or system kernelspec is used or
installed. The committed notebook must have its outputs stripped.
"""

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("mnist1d")
pytest.importorskip("flax")
pytest.importorskip("matplotlib")

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO_ROOT / "colab" / "lena_vs_adascale.ipynb"

# Appended after the `parameters` cell, as papermill does.
TINY_PARAMETERS = f"""\
# Injected by tests/test_colab.py
DATASET = "mnist1d"
STEPS = 12
BATCH_SCALE = 8
PER_WORKER_BATCH = 16
EVAL_EVERY = 4
SEED = 0
TINY = True
INSTALL = False
OPTAX_LENA_PATH = {str(REPO_ROOT)!r}
"""

# Appended at the end: the MNIST-1D path must not touch TensorFlow (Datasets).
NO_TENSORFLOW_CHECK = """\
import sys
assert "tensorflow_datasets" not in sys.modules, "the MNIST-1D path imported tensorflow_datasets"
assert "tensorflow" not in sys.modules, "the MNIST-1D path imported tensorflow"
print("no tensorflow imported")
"""


def _read():
  return nbformat.read(NOTEBOOK, as_version=4)


def _parameters_index(nb):
  idx = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
  assert len(idx) == 1, f"expected exactly one cell tagged 'parameters', found {len(idx)}"
  return idx[0]


def _install_index(nb):
  idx = [
    i
    for i, c in enumerate(nb.cells)
    if c.cell_type == "code" and "pip" in c.source and "OPTAX_LENA_PATH" in c.source
  ]
  assert len(idx) == 1, "expected exactly one install cell"
  return idx[0]


def _text(cell):
  out = []
  for o in cell.get("outputs", []):
    if o.output_type == "stream":
      out.append(o.text)
    elif o.output_type in ("execute_result", "display_data"):
      out.append(o.get("data", {}).get("text/plain", ""))
  return "".join(out)


def _kernel_manager(tmp_path):
  """A kernel manager whose `python3` kernelspec runs this interpreter (the venv's)."""
  from jupyter_client.kernelspec import KernelSpecManager
  from jupyter_client.manager import AsyncKernelManager

  spec_dir = tmp_path / "kernels" / "python3"
  spec_dir.mkdir(parents=True)
  spec = {
    "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
    "display_name": "Python 3 (test)",
    "language": "python",
  }
  (spec_dir / "kernel.json").write_text(json.dumps(spec))
  ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
  assert ksm.get_kernel_spec("python3").argv[0] == sys.executable
  # Async, as nbclient creates by default: with it nbclient notices a dead kernel.
  return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ksm)


def test_committed_notebook_is_stripped():
  nb = _read()
  nbformat.validate(nb)
  for i, cell in enumerate(nb.cells):
    if cell.cell_type == "code":
      assert cell.outputs == [], f"cell {i} has outputs"
      assert cell.execution_count is None, f"cell {i} has an execution count"
  assert nb.metadata.get("kernelspec", {}).get("name") == "python3"


def test_notebook_structure():
  nb = _read()
  i = _parameters_index(nb)
  params = nb.cells[i].source
  for name in ("DATASET", "STEPS", "BATCH_SCALE", "PER_WORKER_BATCH", "SEED", "TINY", "INSTALL"):
    assert f"{name} =" in params, name
  # The parameters precede the (skippable) install cell; the install cell installs the checkout
  # (OPTAX_LENA_PATH or found from the working directory), with no placeholder URL.
  source = "\n".join(c.source for c in nb.cells)
  j = _install_index(nb)
  assert j > i
  assert "OPTAX_LENA_PATH" in nb.cells[j].source and "INSTALL" in nb.cells[j].source
  assert "<your-" + "org>" not in source and "git+" not in source  # the old placeholder URL
  # Model, data, optimizers and analysis come from the example package, not from copies.
  assert "from examples import" in source
  for copy in ("nn.Module", "make_dataset(", "def iterations_to", "ol.lena(", "ol.adascale("):
    assert copy not in source, copy
  assert "get_dataset(" not in source  # never mnist1d's download
  # A TPU runtime's cores all go to the trainer (num_devices), through the same config.
  assert 'if BACKEND == "tpu":' in source and "num_devices=NUM_DEVICES" in source


def test_install_cell_skips_when_importable(capsys, monkeypatch):
  """With INSTALL=True and optax_lena importable, the install cell runs no pip."""
  import subprocess

  nb = _read()
  install = nb.cells[_install_index(nb)].source
  calls = []
  monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
  monkeypatch.chdir(NOTEBOOK.parent)  # the checkout is found from colab/
  exec(compile(install, "install_cell", "exec"), {"INSTALL": True, "OPTAX_LENA_PATH": None})
  assert calls == []
  assert "already importable" in capsys.readouterr().out


def test_notebook_runs_tiny_on_cpu(tmp_path):
  from jupyter_client.utils import run_sync

  nb = _read()
  i = _parameters_index(nb)
  nb.cells.insert(i + 1, nbformat.v4.new_code_cell(TINY_PARAMETERS))
  nb.cells.append(nbformat.v4.new_code_cell(NO_TENSORFLOW_CHECK))

  km = _kernel_manager(tmp_path)
  client = nbclient.NotebookClient(
    nb,
    km=km,
    kernel_name="python3",
    timeout=120,
    startup_timeout=60,
    allow_errors=False,
    resources={"metadata": {"path": str(tmp_path)}},
  )
  try:
    client.execute()  # raises CellExecutionError on any error
  finally:
    # nbclient shuts down only the kernels it started; this one is ours.
    if km.has_kernel:
      run_sync(km.shutdown_kernel)(now=True)

  errors = [
    o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
  ]
  assert not errors
  texts = [_text(c) for c in nb.cells if c.cell_type == "code"]
  everything = "\n".join(texts)
  assert "INSTALL=False" in everything
  assert "Backend: CPU" in everything
  assert "mnist1d" in everything and "CIFAR" not in everything
  images = [
    o
    for c in nb.cells
    if c.cell_type == "code"
    for o in c.outputs
    if "image/png" in o.get("data", {})
  ]
  assert len(images) >= 3, f"expected 3 figures, got {len(images)}"
  table = texts[-2]  # the conclusion cell (the last one is the injected check)
  assert "LENA" in table and "AdaScale" in table and "SGD" in table
  assert "final acc" in table
  assert "no tensorflow imported" in texts[-1]
