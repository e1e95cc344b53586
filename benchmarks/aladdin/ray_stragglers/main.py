"""Straggler robustness on real processes: ALADDIN, AR-SGD, ASP and SGP on Ray, one worker slower.

Every (cluster, algorithm) pair trains the MNIST-1D CNN of ``python -m examples.aladdin`` with
4 workers for the same wall-time budget, on one local Ray cluster (fresh actors for every run):
HO (homogeneous), HE1 (worker 0 x10) and HE2 (worker 0 x100; the worker sleeps so that each of
its iterations takes FACTOR times its compute time). Throughput is reported relative to the same
algorithm's HO run, since the machine has fewer cores than processes. Resumable: finished runs
are kept in ``--out`` and skipped. The plots go next to ``--out``: ``<stem>_accuracy.png`` and
``<stem>_throughput.png``; the JSON's ``recorded`` field holds the commit, date and command.

Usage::

  python -m benchmarks.aladdin.ray_stragglers.main --time_budget 20 \\
      --out benchmarks/aladdin/ray_stragglers/results/sgd_server.json
  python -m benchmarks.aladdin.ray_stragglers.main --report_only \\
      --out benchmarks/aladdin/ray_stragglers/results/sgd_server.json   # table and plots only
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from benchmarks import harness

CLUSTERS = {"HO": {}, "HE1": {0: 10.0}, "HE2": {0: 100.0}}
RESULTS = Path(__file__).resolve().parent / "results"


@dataclasses.dataclass(frozen=True)
class Pair:
  """One algorithm on one cluster (its key in the results' ``runs``)."""

  cluster: str
  algorithm: str

  @property
  def name(self) -> str:
    return f"{self.cluster}/{self.algorithm}"


def _describe(row: dict[str, Any]) -> str:
  return (
    f"{row['throughput']:.0f} samples/s, acc {row['test_accuracy']:.3f}, iterations "
    f"{row['iterations']}, wait {[round(w, 3) for w in row['wait_fraction']]}"
  )


def main() -> None:
  """Runs the missing (cluster, algorithm) pairs, then prints the relative table."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--algorithms", nargs="+", default=["aladdin", "ar_sgd", "asp", "sgp"])
  parser.add_argument("--clusters", nargs="+", default=list(CLUSTERS))
  parser.add_argument("--workers", type=int, default=4)
  parser.add_argument("--time_budget", type=float, default=20.0)
  parser.add_argument("--worker_nice", type=int, default=None, help="None: the runtime's")
  parser.add_argument("--num_cpus", type=int, default=2)
  parser.add_argument("--server_momentum", action="store_true", help="server: SGD momentum 0.9")
  parser.add_argument("--out", type=Path, default=RESULTS / "defaults.json")
  parser.add_argument("--report_only", action="store_true", help="table and plots from --out")
  args = parser.parse_args()
  if args.report_only:
    results = json.loads(args.out.read_text())
    print(table(results))
    plot(results, args.out)
    return

  from examples.aladdin.main import Options, run_one
  from examples.aladdin.task import TaskOptions, build_task
  from optax_lena.aladdin import distributed as ad

  base = Options(
    task=TaskOptions(workers=args.workers),
    time_budget=args.time_budget,
    server_momentum=args.server_momentum,
    worker_nice=args.worker_nice,
    progress=False,
  )
  task, accuracy = build_task(base.task)
  accuracy(task.init_params)
  results: dict[str, Any] = harness.load_summaries(args.out)
  results.setdefault("recorded", harness.recorded())
  results.setdefault("machine", harness.machine_info())
  ad.exit_on_stop_signals()
  ad.connect(num_cpus=args.num_cpus)

  def train(pair: Pair) -> dict[str, Any]:
    options = dataclasses.replace(base, slowdown=CLUSTERS[pair.cluster])
    return {**run_one(pair.algorithm, options, task, accuracy), "load_average": os.getloadavg()}

  harness.run_summaries(
    [Pair(c, a) for c in args.clusters for a in args.algorithms],
    train,
    results.setdefault("runs", {}),
    lambda _: harness.write_json(args.out, results),
    describe=_describe,
  )
  print(table(results))
  plot(results, args.out)


def table(results: dict[str, Any]) -> str:
  """Markdown table: throughput relative to the algorithm's HO run, waits, accuracy."""
  runs = results["runs"]
  rows = []
  for key, r in runs.items():
    cluster, algorithm = key.split("/")
    ho = runs.get(f"HO/{algorithm}")
    rel = f"{r['throughput'] / ho['throughput']:.2f}" if ho else "-"
    waits = " ".join(f"{100 * w:.1f}" for w in r["wait_fraction"])
    its = " ".join(str(i) for i in r["iterations"])
    rows.append([cluster, algorithm, f"{r['throughput']:.0f}", rel, f"{r['test_accuracy']:.3f}"])
    rows[-1] += [its, waits]
  header = ["cluster", "algorithm", "samples/s", "relative to its HO", "test acc"]
  return harness.markdown_table([*header, "iterations per worker", "wait % per worker"], rows)


def plot(results: dict[str, Any], out: Path) -> None:
  """Accuracy vs wall time per cluster, and relative throughput bars, next to ``out``."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  runs = results["runs"]
  clusters = sorted({k.split("/")[0] for k in runs}, key=list(CLUSTERS).index)
  algorithms = sorted({k.split("/")[1] for k in runs})
  fig, axes = plt.subplots(1, len(clusters), figsize=(4.5 * len(clusters), 3.6), sharey=True)
  for ax, cluster in zip(list(axes) if len(clusters) > 1 else [axes], clusters, strict=True):
    for algorithm in algorithms:
      r = runs.get(f"{cluster}/{algorithm}")
      if r:
        t, acc = zip(*r["curve"], strict=True)
        ax.plot(t, acc, marker=".", label=algorithm)
    ax.set(title=cluster, xlabel="wall time (s)")
    ax.grid(alpha=0.3)
  (axes[0] if len(clusters) > 1 else axes).set_ylabel("test accuracy")
  (axes[0] if len(clusters) > 1 else axes).legend()
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out.with_name(f"{out.stem}_accuracy.png"), dpi=120, bbox_inches="tight")
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(6, 3.6))
  width = 0.8 / len(algorithms)
  for k, algorithm in enumerate(algorithms):
    ho = runs.get(f"HO/{algorithm}")
    rel = [
      runs[f"{c}/{algorithm}"]["throughput"] / ho["throughput"]
      if ho and f"{c}/{algorithm}" in runs
      else 0
      for c in clusters
    ]
    ax.bar([i + k * width for i in range(len(clusters))], rel, width=width, label=algorithm)
  ax.set_xticks([i + width * (len(algorithms) - 1) / 2 for i in range(len(clusters))], clusters)
  ax.set(ylabel="throughput / own HO throughput")
  ax.axhline(0.8, color="gray", ls="--", lw=0.8)
  ax.legend()
  fig.savefig(out.with_name(f"{out.stem}_throughput.png"), dpi=120, bbox_inches="tight")
  plt.close(fig)


if __name__ == "__main__":
  main()
