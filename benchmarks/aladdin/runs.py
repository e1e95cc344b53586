"""The ALADDIN studies' resumable cells and report helpers (one place for both studies).

The reporting helpers have the names and signatures of ``benchmarks/harness.py`` (the shared
benchmark kit): once the kit is on this branch, they become imports from it.

Every finished run is kept as one JSON summary in a single ``runs.json`` per study (a summary,
not a raw dump: final numbers and the evaluation curve), so a study resumes from the file and
git holds it instead of one file per run.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any


def load_runs(path: Path) -> dict[str, dict[str, Any]]:
  """The finished runs of a study (empty when the file does not exist yet)."""
  return json.loads(path.read_text()) if path.exists() else {}


def save_runs(path: Path, runs: dict[str, dict[str, Any]]) -> None:
  """Writes the runs atomically (a reader never sees half a file)."""
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  tmp.write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")
  os.replace(tmp, path)


def run_cells(
  cells: Sequence[str],
  path: Path,
  run: Callable[[str], dict[str, Any]],
  *,
  runs: dict[str, dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
  """Runs every cell of ``cells`` not in ``path`` yet, saving after each (atomic), with one
  progress line per run; returns every finished run."""
  runs = load_runs(path) if runs is None else runs
  todo = [c for c in cells if c not in runs]
  print(f"{len(cells) - len(todo)} of {len(cells)} cells finished earlier; running {len(todo)}")
  for n, cell in enumerate(todo, 1):
    start = time.perf_counter()
    runs[cell] = run(cell)
    save_runs(path, runs)
    acc = runs[cell].get("test_accuracy", float("nan"))
    print(f"[{n}/{len(todo)}] {cell}: {acc:.4f} ({time.perf_counter() - start:.0f} s)")
    sys.stdout.flush()
  return runs


def mean_std(values: Sequence[float], fmt: str = ".4f") -> str:
  """``"mean ± std"`` (sample standard deviation); one value alone; ``"—"`` for none."""
  if not values:
    return "—"
  if len(values) == 1:
    return format(values[0], fmt)
  return f"{statistics.mean(values):{fmt}} ± {statistics.stdev(values):{fmt}}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
  """A Markdown table (``str()`` of every cell)."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def machine_info() -> dict[str, Any]:
  """What the numbers were measured on."""
  import jax

  return {
    "machine": platform.machine(),
    "cpus": os.cpu_count(),
    "load_average": os.getloadavg(),
    "python": platform.python_version(),
    "jax": jax.__version__,
    "devices": [str(d) for d in jax.devices()],
  }
