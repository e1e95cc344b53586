"""Runs the non-Ray test pass of a baseline commit and of the working tree, the plugin recording
every test (see the package's docstring)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import driver, harness
from benchmarks.ci_time.grid import CiTime, Records

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
PYTEST_ARGS = ("-n", "2", "--dist", "loadgroup", "-q", "-m", "not slow and not ray", "tests")


def run_suite(tree: Path, out: Path) -> dict[str, Any]:
  """Runs the non-Ray pass in ``tree`` with the timing plugin; returns its wall time and code."""
  out.mkdir(parents=True, exist_ok=True)
  env = dict(os.environ, CI_TIME_OUT=str(out), PYTHONPATH=f"{tree}{os.pathsep}{HERE}")
  start = time.perf_counter()
  cmd = [sys.executable, "-m", "pytest", "-p", "pytest_times", *PYTEST_ARGS]
  proc = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  tail = proc.stdout.decode(errors="replace").strip().splitlines()[-1:]
  return {
    "wall_s": round(time.perf_counter() - start, 1),
    "returncode": proc.returncode,
    "last_line": tail[0] if tail else "",
    "load_average_after": [round(x, 1) for x in os.getloadavg()],
  }


def measure(baseline: str, scratch: Path) -> dict[str, Any]:
  """Both suites, the baseline first; returns the runs' facts and per-test records."""
  tree = scratch / "baseline"
  subprocess.run(
    ["git", "worktree", "add", "--detach", str(tree), baseline], cwd=REPO_ROOT, check=True
  )
  try:
    runs = {"baseline": run_suite(tree, scratch / "times_baseline")}
  finally:
    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO_ROOT, check=False)
  runs["current"] = run_suite(REPO_ROOT, scratch / "times_current")
  return {
    "baseline": baseline,
    "current": git_head(),
    "runs": runs,
    "tests": {side: load_records(scratch / f"times_{side}") for side in ("baseline", "current")},
  }


def git_head() -> str:
  out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True)
  return out.stdout.decode().strip()


def load_records(directory: Path) -> Records:
  """The plugin's JSON lines of every worker, by node id (CPU of reaped children included)."""
  records: Records = {}
  for path in sorted(directory.glob("*.jsonl")):
    for line in path.read_text().splitlines():
      r = json.loads(line)
      cpu = r["cpu"] + r.get("cpu_children", 0.0)
      records[r["nodeid"]] = {"wall": round(r["wall"], 4), "cpu": round(cpu, 4)}
  return records


def run(cell: driver.Measurement, setup: CiTime, context: driver.Context) -> dict[str, Any]:
  """The per-test records of both suites (measured, or read from ``setup.from_dirs``)."""
  del cell, context
  if setup.from_dirs:
    tests = {
      side: load_records(Path(d))
      for side, d in zip(("baseline", "current"), setup.from_dirs, strict=True)
    }
    data = {
      "baseline": setup.baseline,
      "current": setup.current or git_head(),
      "runs": {},
      "tests": tests,
    }
  else:
    with tempfile.TemporaryDirectory() as scratch:
      data = measure(setup.baseline, Path(scratch))
  return {**data, "machine": harness.machine_info()}
