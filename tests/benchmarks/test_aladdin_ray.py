"""The Ray benchmarks run end to end (seconds-long runs) and report every ratio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]


def _smoke(study: str, out: Path) -> subprocess.CompletedProcess:
  """``python -m benchmarks.aladdin.<study> --setup smoke --out OUT``, checked to exit 0."""
  module = f"benchmarks.aladdin.{study}"
  done = subprocess.run(
    [sys.executable, "-m", module, "--setup", "smoke", "--out", str(out)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  return done


def test_efficiency_benchmark_smoke(tmp_path: Path) -> None:
  done = _smoke("ray_efficiency", tmp_path)
  results = json.loads((tmp_path / "efficiency.json").read_text())
  (single,) = results["single"]
  pair = single["pairs"][0]
  loops = ("loop_default_pool", "loop_one_thread", "loop_pinned", "loop_one_core_waiting")
  assert pair["loop"] == max(pair[key] for key in loops) > 0  # the limit: the fastest loop
  assert pair["efficiency"] == pair["ray"] / pair["loop"] > 0
  assert 0 < pair["compute_fraction"] <= 1
  assert pair["worker_cpu_per_iteration"] > 0 and pair["shard_cpu_per_iteration"] > 0
  (run,) = results["cluster"]["runs"]["default"]
  assert len(run["wait_fraction"]) == 2 and run["throughput"] > 0
  assert "| 32 |" in done.stdout and "efficiency" in done.stdout


def test_call_cost_benchmark_smoke(tmp_path: Path) -> None:
  done = _smoke("call_cost", tmp_path)
  (row,) = json.loads((tmp_path / "call_cost.json").read_text())["rows"]
  (inline,), (ring,) = row["runs"]["inline"], row["runs"]["ring"]
  for run in (inline, ring):
    assert run["wall_ms"] > 0 and run["caller_cpu_ms"] > 0 and run["callee_cpu_ms"] >= 0
  if ring["callee_cpu_ms"] > 0:  # CPU times tick every 10 ms
    assert row["callee_cpu_ms_ratio"] == inline["callee_cpu_ms"] / ring["callee_cpu_ms"]
  assert (tmp_path / "call_cost.png").exists() and "| 4 (189) |" in done.stdout
