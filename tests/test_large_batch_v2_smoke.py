"""Smoke test of the second study (benchmarks/large_batch/study_v2.py).

Trains three of the ``--smoke`` preset's Table-1 runs (the single worker, LENA with the paper's
warm-up and with ``relative_to_max``; tiny MNIST-1D, a width-2 ResNet1D, two epochs)
into a temporary directory, checks the tables, summary and plots, that a second invocation
skips every finished run, and that the chunked per-worker statistics are those of
``ol.stacked_grad_stats``.
"""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

_REPO_ROOT = str(Path(__file__).resolve().parents[1])
if _REPO_ROOT not in sys.path:
  sys.path.insert(0, _REPO_ROOT)

import optax_lena as ol  # noqa: E402
from benchmarks.large_batch import study_v2  # noqa: E402
from examples import models  # noqa: E402


def test_smoke_study_v2_writes_tables_plots_and_resumes(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  out = tmp_path / "study"
  argv = ["--smoke", "--groups", "table1", "--only", "sgd", "lena_", "--out", str(out)]
  argv += ["--cache_dir", str(tmp_path)]
  text = study_v2.main(argv)
  first = capsys.readouterr().out
  grid = study_v2.build_grid(study_v2.PRESETS["smoke"], out, ["table1"])
  grid = [sp for sp in grid if sp.name.startswith(("sgd", "lena_"))]
  assert len(grid) == 3 and first.count("after ") == len(grid)
  for heading in ("Table 1", "Table 2", "Per-layer warm-up end", "LARS / LAMB", "Longer budget"):
    assert f"## {heading}" in text
  assert (out / "tables.md").read_text() == text + "\n"
  table1 = text.split("## Table 1")[1].split("## Table 2")[0]
  assert "LENA, warm-up relative_to_max (state_aware) | 1 | 0." in table1
  config = json.loads((out / "runs" / grid[-1].name / "config.json").read_text())
  assert config["num_leaves"] == 62 and config["label"] == "LENA, warm-up relative_to_max"
  ends = [
    json.loads(line)
    for line in (out / "runs" / grid[-1].name / "metrics.jsonl").read_text().splitlines()
  ][-1]["warmup_end_step"]
  assert len(ends) == 62
  summary = json.loads((out / "summary.json").read_text())
  assert len(summary["runs"]) == len(grid)
  for name in ("accuracy_vs_iterations_s4.png", "accuracy_vs_scale.png"):
    assert (out / name).read_bytes()[:4] == b"\x89PNG" and name in summary["plots"]

  study_v2.main(argv)  # resumes: nothing to train
  assert capsys.readouterr().out.count("finished earlier, skipped") == len(grid)


def test_chunked_statistics_match_stacked_grad_stats() -> None:
  """Chunks of workers (sums and squared norms accumulated) give the statistics of S workers."""
  model = models.ResNet1D(width=2)
  variables = model.init(jax.random.key(0), jnp.zeros((2, 40)), train=False)
  params, bs = variables["params"], variables["batch_stats"]
  x = jax.random.normal(jax.random.key(1), (4, 3, 40))
  y = jax.random.randint(jax.random.key(2), (4, 3), 0, 10)
  grads, stats, _, _ = study_v2.grad_fn(2, 4, 2)(params, bs, x, y)

  def loss(p, xb, yb):
    logits, _ = model.apply(
      {"params": p, "batch_stats": bs}, xb, train=True, mutable=["batch_stats"]
    )
    return jnp.mean(
      jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, yb[:, None], -1)[:, 0]
    )

  stacked = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, x, y)
  want_grads, want = ol.stacked_grad_stats(stacked)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)  # float32 sums in another order
  for field in ("sq_norm_mean", "mean_grad_sq_norm"):
    got, exp = jax.tree.leaves(getattr(stats, field)), jax.tree.leaves(getattr(want, field))
    np.testing.assert_allclose(np.array(got), np.array(exp), rtol=1e-4, atol=1e-10)
  assert stats.num_samples == 4
