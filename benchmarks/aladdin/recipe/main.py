"""The measurement that chose ALADDIN's defaults (the recommended recipe of ``al.Aladdin``).

It chose on the test accuracy; ``validation.py`` re-makes the choice on a validation split.

The setting of the target: 8 simulated workers, the example CNN on MNIST-1D, 15 epochs of
samples, the workers' optimizer ``al.local_optimizer(0.1)`` (momentum 0.9, weight decay 1e-4)
for ALADDIN and AR-SGD alike, on the homogeneous cluster (HO) and with one worker 10x slower
(HE1), seeds 0, 1, 2 (the first study's cluster, data and model: ``../training.py``). Candidates:
update messages with alpha / period / server optimizer variants, and the paper's literal reading
(gradient messages, ``optax.sgd(eta)``, alpha ``"count"``).

Usage::

  python -m benchmarks.aladdin.recipe.main                # resumable; the table of RESULTS.md
  python -m benchmarks.aladdin.recipe.main --report_only  # the table from the finished runs

Every run's summary is kept in ``<out>/runs.json`` (one file; a run in it is skipped), the
table in ``<out>/recipe.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optax

from benchmarks import harness
from benchmarks.aladdin import training
from optax_lena import aladdin as al
from optax_lena.aladdin import simulator as sim

DEFAULT_OUT = Path(__file__).resolve().parent / "results"  # runs.json, recipe.md
SEEDS = (0, 1, 2)
CLUSTERS = ("HO", "HE1")
LR = 0.1

# name -> ALADDIN options (None: AR-SGD). "recipe" is whatever al.Aladdin defaults to.
CANDIDATES: dict[str, dict[str, Any] | None] = {
  "ar_sgd": None,
  "printed": dict(message="gradient", server_tx=("sgd", LR), alpha="count"),
  "update_p4_a0.5": dict(period=4, alpha=0.5),
  "update_p4_npi": dict(period=4, alpha="n_pi"),
  "update_p4_count": dict(period=4, alpha="count"),
  "update_p4_a1": dict(period=4, alpha=1.0),
  "update_p2_a0.5": dict(period=2, alpha=0.5),
  "update_p2_a0.8": dict(period=2, alpha=0.8),
  "update_p1_a0.5": dict(period=1, alpha=0.5),
  "update_p4_a0.5_server_m0.5": dict(period=4, alpha=0.5, server_tx=("sgd_m", 1.0)),
  "update_p4_a0.3": dict(period=4, alpha=0.3),
  "update_p8_a0.5": dict(period=8, alpha=0.5),
  "update_p4_a0.65": dict(period=4, alpha=0.65),
  "update_p6_a0.5": dict(period=6, alpha=0.5),
}


def _server_tx(key: tuple[str, float]) -> optax.GradientTransformation:
  kind, lr = key
  return optax.sgd(lr, momentum=0.5) if kind == "sgd_m" else optax.sgd(lr)


def make_algorithm(candidate: str, lr: float = LR) -> sim.Algorithm:
  """The candidate with the workers' rate ``lr`` ("printed": the server's rate too)."""
  options = CANDIDATES[candidate]
  worker_tx = al.local_optimizer(lr)
  if options is None:
    return sim.algorithm("ar_sgd", worker_tx=worker_tx)
  options = dict(options, message=options.get("message", "update"))
  if "server_tx" in options:
    kind, server_lr = options["server_tx"]
    options["server_tx"] = _server_tx((kind, lr if kind == "sgd" else server_lr))
  return sim.algorithm("aladdin", worker_tx=worker_tx, **options)


@dataclasses.dataclass(frozen=True)
class Run:
  """One candidate on one cluster with one seed."""

  candidate: str
  cluster: str
  seed: int

  @property
  def name(self) -> str:
    return f"{self.candidate}/{self.cluster}/{self.seed}"


def run_one(candidate: str, cluster_name: str, seed: int, cache_dir: Path) -> dict[str, Any]:
  preset = training.PRESETS["default"]
  problem = training.make_problem(preset, seed, cache_dir)
  nbytes = float(sum(x.size * x.dtype.itemsize for x in jax_leaves(problem.params)))
  cluster = training.training_cluster(preset, cluster_name, nbytes)
  result = sim.simulate(
    make_algorithm(candidate),
    cluster,
    batch_size=preset.batch_size,
    problem=problem,
    num_samples=int(preset.epochs * len(problem.x_train)),
    num_evals=preset.num_evals,
    seed=seed,
  )
  last = result.evals[-1]
  return {
    "candidate": candidate,
    "cluster": cluster_name,
    "seed": seed,
    "test_accuracy": last.test_accuracy,
    "local_accuracy": None if math.isnan(last.local_accuracy) else last.local_accuracy,
    "time": result.time,
    "wall_time": result.wall_time,
  }


def jax_leaves(tree: Any) -> list[Any]:
  import jax

  return jax.tree.leaves(tree)


def _mean_std(values: Sequence[float]) -> str:
  return harness.mean_std(values, ".3f") if values else "-"


def report(runs: dict[str, dict[str, Any]]) -> str:
  """Mean ± std of the final global-model accuracy per candidate and cluster, and the gaps the
  target is about (ALADDIN vs AR-SGD on HO; ALADDIN HE1 vs its HO), each the mean of the
  differences paired by seed over the seeds both sides ran."""
  cell: dict[tuple[str, str], dict[int, float]] = {}
  for r in runs.values():
    cell.setdefault((r["candidate"], r["cluster"]), {})[r["seed"]] = r["test_accuracy"]

  def paired_gap(a: dict[int, float], b: dict[int, float]) -> str:
    seeds = sorted(a.keys() & b.keys())
    return f"{statistics.mean(a[s] - b[s] for s in seeds):+.3f}" if seeds else "-"

  ar_ho = cell.get(("ar_sgd", "HO"), {})
  rows = []
  for name in CANDIDATES:
    ho, he1 = cell.get((name, "HO"), {}), cell.get((name, "HE1"), {})
    if not ho and not he1:
      continue
    gap, cost = paired_gap(ho, ar_ho), paired_gap(he1, ho)
    seeds = f"{len(ho)}/{len(he1)}"
    rows.append(
      [name, _mean_std(list(ho.values())), _mean_std(list(he1.values())), gap, cost, seeds]
    )
  header = ["candidate", "HO", "HE1", "HO - AR-SGD HO", "HE1 - HO", "seeds"]
  return harness.markdown_table(header, rows) + "\n"


def main(argv: Sequence[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
  parser.add_argument("--cache_dir", type=Path, default=Path.home() / ".cache" / "mnist1d")
  parser.add_argument("--candidates", nargs="*", default=list(CANDIDATES))
  parser.add_argument("--clusters", nargs="*", default=list(CLUSTERS))
  parser.add_argument("--seeds", nargs="*", type=int, default=list(SEEDS))
  parser.add_argument("--report_only", action="store_true")
  args = parser.parse_args(argv)
  args.out.mkdir(parents=True, exist_ok=True)
  path = harness.summaries_path(args.out)
  runs = harness.load_summaries(path)
  if not args.report_only:
    grid = [Run(c, k, s) for s in args.seeds for k in args.clusters for c in args.candidates]
    harness.run_summaries(
      grid,
      lambda run: run_one(run.candidate, run.cluster, run.seed, args.cache_dir),
      runs,
      lambda summaries: harness.save_summaries(path, summaries),
    )
  text = report(runs)
  harness.write_text(args.out / "recipe.md", text)
  print(text)
  return text


if __name__ == "__main__":
  main()
