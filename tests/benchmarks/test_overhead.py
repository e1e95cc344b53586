"""The overhead benchmark (benchmarks/overhead/) still runs: every section at toy sizes.

The numbers mean nothing at these sizes; the test checks that each section produces finite,
positive timings and that the reports (markdown, JSON, PNG) are written.
"""

import json

import jax
import numpy as np
import pytest

from benchmarks import harness
from benchmarks.overhead import common, data_parallel, report, state_and_compile, trees, update


def test_every_section_runs_and_reports(tmp_path):
  pytest.importorskip("flax")
  pytest.importorskip("matplotlib")
  devices = jax.devices()[: common.NUM_WORKERS]
  tree = trees.leaves_tree(4, d_model=8)
  rows = update.bench_update_only("toy", tree, repeats=2, names=("sgd_momentum", "lena"))
  rows += update.bench_stacked("toy", tree, repeats=2)
  rows += data_parallel.bench_dp_step("toy", tree, 2, devices, modes=("shard_map",))  # pmap: in (d)
  rows += data_parallel.bench_train_step("cnn1d", 2, devices, per_device_batch=2)
  memory = state_and_compile.memory_rows({"toy": tree})
  compile_rows = state_and_compile.bench_compile([3])
  assert {r.section.split(".")[0] for r in rows} == {"a", "b", "c", "d"}
  assert {"pmean+local_sq_norms+sgd_momentum", "pmean+mean_sq_norms+sgd_momentum"} <= {
    r.candidate for r in rows
  }  # the profile of the statistics' two passes
  assert all(np.isfinite(r.ratio) and r.ratio > 0 for r in rows)
  (compile_row,) = compile_rows
  assert compile_row["ratio"] > 0
  for name in ("lena", "sgd_momentum"):
    assert compile_row[f"{name}_kernels"] >= compile_row[f"{name}_distinct_kernels"] >= 1
  lena_memory = next(m for m in memory if m["optimizer"] == "lena")
  assert lena_memory["passed"], lena_memory  # a few scalars per leaf, whatever the sizes

  meta = {
    "command": "smoke",
    "machine": harness.machine_info(devices),
    "repeats": 2,
    "seconds": 0.0,
  }
  result = report.write_reports(str(tmp_path), meta, rows, memory, compile_rows)
  for name in ("overhead.md", "overhead.json", "overhead.png"):
    assert (tmp_path / name).stat().st_size > 0
  assert json.loads((tmp_path / "overhead.json").read_text())["targets"] == json.loads(
    json.dumps(result["targets"])
  )
  assert "| update only" in (tmp_path / "overhead.md").read_text()


def test_kernel_counts_tell_distinct_kernels_apart():
  """The compile-time profile's claim: per-leaf slices of one vector make every kernel distinct,
  a scalar input per leaf keeps one kernel for all leaves of a shape."""
  from benchmarks.overhead import compile_profile

  result = compile_profile.profile(6)
  assert result["slice"]["distinct_kernels"] == 6
  for variant in ("same_slice", "scalar_inputs", "index_inputs"):
    assert result[variant]["distinct_kernels"] == 1, (variant, result[variant])
  assert all(r["kernels"] == 6 for r in result.values()), result
