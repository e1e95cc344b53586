"""The overhead benchmark (benchmarks/overhead/) still runs: every section at toy sizes.

The numbers mean nothing at these sizes; the test checks that each section produces finite,
positive timings and that the reports (markdown, JSON, PNG) are written.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from benchmarks import harness
from benchmarks.overhead import data_parallel, main, report, state_and_compile, trees, update


def test_every_section_runs_and_reports(tmp_path):
  pytest.importorskip("flax")
  pytest.importorskip("matplotlib")
  devices = jax.devices()[:2]  # the sections take any number; fewer run and compile faster
  tree = trees.leaves_tree(4, d_model=8)
  scanned, axes = trees.scanned_mlp_shapes(3, 8), trees.scanned_layer_axes
  names = ("sgd_momentum", "lena")
  rows = update.bench_update_only("toy", tree, repeats=2, names=names)
  rows += update.bench_update_only(
    "toy scanned", scanned, 2, names, layer_axes=axes, target="update_only_scanned"
  )
  rows += update.bench_stacked("toy", tree, repeats=2, with_slow_mean=True)
  rows += update.bench_stacked("toy scanned", scanned, repeats=2, layer_axes=axes)
  rows += data_parallel.bench_dp_step("toy", tree, 2, devices, modes=("shard_map",))  # pmap: in (d)
  rows += data_parallel.bench_train_step("cnn1d", 2, devices, per_device_batch=2)
  memory = state_and_compile.memory_rows({"toy": tree})
  compile_rows = state_and_compile.bench_compile([3])
  assert {r.section.split(".")[0] for r in rows} == {"a", "b", "c", "d"}
  targets = {(r.tree, r.candidate): r.target for r in rows}
  assert targets[("toy scanned", "lena")] == "update_only_scanned"
  assert targets[("toy scanned", "stacked_grad_stats+lena")] == "stacked"
  assert {r.baseline for r in rows if r.section.startswith("b")} == {update.BASELINE}
  assert ("toy", update.SLOW_BASELINE) in targets  # the jnp.mean baseline, for context
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
  markdown = (tmp_path / "overhead.md").read_text()
  assert "| update only" in markdown and "sum of the slices / S" in markdown
  (tmp_path / "overhead.md").unlink()
  main.rebuild_reports(str(tmp_path))  # --report_only
  assert (tmp_path / "overhead.md").read_text() == markdown


def test_kernel_counts_tell_distinct_kernels_apart():
  """The compile-time profile's claim: per-leaf slices of one vector make every kernel distinct,
  a scalar input per leaf keeps one kernel for all leaves of a shape."""
  from benchmarks.overhead import compile_profile

  result = compile_profile.profile(6)
  assert result["slice"]["distinct_kernels"] == 6
  for variant in ("same_slice", "scalar_inputs", "index_inputs"):
    assert result[variant]["distinct_kernels"] == 1, (variant, result[variant])
  assert all(r["kernels"] == 6 for r in result.values()), result


def test_compile_decomposition_pieces_compute_the_statistics(tmp_path):
  """Each piece's step returns the statistics it claims to add (against float64 NumPy), so the
  table's columns measure what they are labelled with; one compile is timed; the report lists
  every variant."""
  from benchmarks.overhead import compile_decomposition as cd
  from benchmarks.overhead.whole_step_compile import NUM_SAMPLES, PER_WORKER_BATCH, model_for

  # Timed first: a compile measured after the same step ran in this process can be a cache hit.
  cpu, wall = cd.compile_cpu_seconds("mlp1", "guard")
  assert cpu > 0 and wall > 0
  apply, shapes, in_shape = model_for("mlp1")
  keys = iter(jax.random.split(jax.random.PRNGKey(1), len(jax.tree.leaves(shapes))))
  params = jax.tree.map(lambda s: 0.3 * jax.random.normal(next(keys), s.shape, s.dtype), shapes)
  x = jax.random.normal(jax.random.PRNGKey(0), (NUM_SAMPLES, PER_WORKER_BATCH, *in_shape))
  y = jnp.arange(NUM_SAMPLES * PER_WORKER_BATCH).reshape(NUM_SAMPLES, -1) % 10

  def loss(p, xb, yb):
    return optax.softmax_cross_entropy_with_integer_labels(apply(p, xb), yb).mean()

  stacked = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, x, y)
  grads = [np.asarray(g, np.float64) for g in jax.tree.leaves(stacked)]
  want = {
    "mean_sq": [np.sum(g.mean(0) ** 2) for g in grads],
    "per_worker_sq": [np.mean([np.sum(w**2) for w in g]) for g in grads],
  }
  want["per_worker_dot"] = want["per_worker_concat"] = want["per_worker_sq"]
  for piece, expected in want.items():
    step, tx = cd._piece_step(apply, piece)
    (got,) = jax.jit(step)(params, tx.init(params), x, y)[2]
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=1e-5)
  for piece in ("stats_separate", "stats_grouped"):
    step, tx = cd._piece_step(apply, piece)
    top, bot = jax.jit(step)(params, tx.init(params), x, y)[2]
    np.testing.assert_allclose(np.asarray(top, np.float64), want["per_worker_sq"], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(bot, np.float64), want["mean_sq"], rtol=1e-5)
  names = [*cd.VARIANTS, *cd.REFORMULATIONS]
  row = {"model": "mlp1", "leaves": 6}
  row |= {n: {"cpu_s": [1.0 + k], "ratio_vs_sgd_momentum": 1.0 + k} for k, n in enumerate(names)}
  record = {
    "command": "c",
    "machine": {"cpu": "x", "cpu_cores": 2, "jax": "v"},
    "num_samples": NUM_SAMPLES,
    "load_average_before": [0],
    "load_average_after": [0],
    "rows": [row],
    "repeats": 1,
  }
  cd.write_report(record, tmp_path)
  text = (tmp_path / "compile_decomposition.md").read_text()
  assert "| mlp1 | 6 | 1.00x | 2.00x |" in text
  assert "| mlp1 | 3.00x | 9.00x | 10.00x | 4.00x | 11.00x | 12.00x |" in text
  assert (tmp_path / "compile_decomposition.png").stat().st_size > 1000


def test_sections_option_runs_only_the_chosen_sections(tmp_path):
  """``--sections e``: the report holds the state-memory rows and no time ratio or compile row
  (the step sections were not run); a letter outside a-f is a command-line error."""
  pytest.importorskip("flax")
  pytest.importorskip("matplotlib")
  result = main.run(main.QUICK, jax.devices()[:1], str(tmp_path), "c", sections=("e",))
  assert result["rows"] == [] and result["compile"] == []
  assert {m["optimizer"] for m in result["memory"]} >= {"lena", "adascale"}
  assert [t["id"] for t in result["targets"] if t["checks"]] == ["memory"]
  with pytest.raises(SystemExit):
    main.main(["--sections", "a,x", "--out", str(tmp_path)])


def test_stacked_profile_steps_run_on_a_scanned_tree():
  """stacked_profile's steps on a toy scanned tree (LENA per slice): the per-leaf-only comparison
  step is left out (it cannot feed per-slice LENA), and the statistics step moves the parameters
  as LENA's update from the same mean and statistics does (to float32 rounding). Only those two
  steps are compiled, to keep the test cheap."""
  import optax_lena as ol
  from benchmarks.overhead import stacked_profile
  from benchmarks.overhead.common import NUM_WORKERS, optimizers

  shapes, axes = trees.scanned_mlp_shapes(3, 8), trees.scanned_layer_axes
  steps = stacked_profile.steps(axes)
  assert "two_output_norms+lena" not in steps and "stacked_grad_stats+lena" in steps
  stacked = trees.materialize(shapes, seed=1, lead=(NUM_WORKERS,))
  mean, stats = ol.stacked_grad_stats(stacked, layer_axes=axes)
  params = trees.materialize(shapes, seed=0)
  opts = optimizers(NUM_WORKERS, layer_axes=axes)
  out = {}
  for name in ("stacked_grad_stats+lena", "lena (update only)"):
    fn, opt = steps[name]
    out[name] = jax.jit(fn)(params, opts[opt][0].init(params), stacked, mean, stats)[0]
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(out[name])), name
  # To float32 rounding: inside the step XLA fuses the statistics with the update.
  close = lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
  jax.tree.map(close, out["stacked_grad_stats+lena"], out["lena (update only)"])


def test_codegen_size_counts_the_kernels_xla_compiles(tmp_path):
  """codegen_size on a toy scanned MLP: XLA's dump is read back (every kernel has IR lines, the
  totals are the kernels' sums), LENA per slice generates more code than SGD-momentum, the
  growth table picks the kernel that grew most, and --report_only rebuilds the report."""
  pytest.importorskip("flax")
  pytest.importorskip("matplotlib")
  import copy

  from benchmarks.overhead import codegen_size

  names = ["sgd_momentum", "lena"]
  (row,) = codegen_size.bench(["mlp2_scan"], names)
  sizes = row["lena"]["per_kernel"]
  assert "per_kernel" not in row["sgd_momentum"]  # only LENA's kernels are kept
  assert row["lena"]["kernels"] == len(sizes) > row["sgd_momentum"]["kernels"] > 0
  assert row["lena"]["ir_lines"] == sum(s["ir_lines"] for s in sizes.values())
  assert row["lena"]["ir_lines"] > row["sgd_momentum"]["ir_lines"] > 0
  assert all(s["ir_lines"] > 0 and s["object_bytes"] > 0 for s in sizes.values())
  assert sum(s["scalar_stores"] + s["vector_stores"] for s in sizes.values()) > 0

  deeper = copy.deepcopy(row) | {"model": "mlp2_scan_grown", "depth": 3}
  grown = sorted(sizes)[0]
  before = sizes[grown]["ir_lines"]
  deeper["lena"]["per_kernel"][grown]["ir_lines"] += 10_000
  (top, *_) = codegen_size.growing_kernels([row, deeper])
  assert top["kernel"] == grown
  assert [s["ir_lines"] for s in top["sizes"]] == [before, before + 10_000]

  record = {
    "command": "test",
    "machine": harness.machine_info(),
    "num_samples": 4,
    "seconds": 1.0,
    "variants": names,
    "rows": [row, deeper],
  }
  harness.write_json(tmp_path / "codegen_size.json", record)
  markdown = codegen_size.write_report(record, tmp_path)
  assert f"`{grown}`" in markdown and (tmp_path / "codegen_size.png").stat().st_size > 0
  (tmp_path / "codegen_size.md").unlink()
  codegen_size.main(["--report_only", "--out", str(tmp_path)])
  assert (tmp_path / "codegen_size.md").read_text() == markdown
