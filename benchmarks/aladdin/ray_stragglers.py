"""Straggler robustness on real processes: ALADDIN, AR-SGD, ASP and SGP on Ray, one worker slower.

Every (cluster, algorithm) pair trains the MNIST-1D CNN of ``python -m examples.aladdin`` with
4 workers for the same wall-time budget, on one local Ray cluster (fresh actors for every run):
HO (homogeneous), HE1 (worker 0 x10) and HE2 (worker 0 x100; the worker sleeps so that each of
its iterations takes FACTOR times its compute time). Throughput is reported relative to the same
algorithm's HO run, since the machine has fewer cores than processes. Resumable: finished runs
are kept in ``--out`` and skipped.

Usage::

  python -m benchmarks.aladdin.ray_stragglers --time_budget 20 \\
      --out benchmarks/aladdin/ray/ray_stragglers.json --plot_dir benchmarks/aladdin/ray
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any

CLUSTERS = {"HO": {}, "HE1": {0: 10.0}, "HE2": {0: 100.0}}


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
  parser.add_argument(
    "--out", type=Path, default=Path("benchmarks/aladdin/ray/ray_stragglers.json")
  )
  parser.add_argument("--plot_dir", type=Path, default=Path("benchmarks/aladdin/ray"))
  args = parser.parse_args()

  import dataclasses

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
  results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
  results.setdefault(
    "machine",
    {
      "cpus": os.cpu_count(),
      "platform": platform.platform(),
      "load_average_at_start": os.getloadavg(),
    },
  )
  runs = results.setdefault("runs", {})
  ad.exit_on_stop_signals()
  ad.connect(num_cpus=args.num_cpus)
  for cluster in args.clusters:
    for algorithm in args.algorithms:
      key = f"{cluster}/{algorithm}"
      if key in runs:
        continue
      options = dataclasses.replace(base, slowdown=CLUSTERS[cluster])
      row = run_one(algorithm, options, task, accuracy)
      runs[key] = {**row, "load_average": os.getloadavg()}
      args.out.parent.mkdir(parents=True, exist_ok=True)
      args.out.write_text(json.dumps(results, indent=1))
      print(
        f"{key:<14} {row['throughput']:8.0f} samples/s  acc {row['test_accuracy']:.3f}  "
        f"iterations {row['iterations']}  wait {[round(w, 3) for w in row['wait_fraction']]}",
        flush=True,
      )
  print(table(results))
  plot(results, args.plot_dir)


def table(results: dict[str, Any]) -> str:
  """Markdown table: throughput relative to the algorithm's HO run, waits, accuracy."""
  runs = results["runs"]
  lines = [
    "| cluster | algorithm | samples/s | relative to its HO | test acc | iterations per worker "
    "| wait % per worker |",
    "|---|---|---|---|---|---|---|",
  ]
  for key, r in runs.items():
    cluster, algorithm = key.split("/")
    ho = runs.get(f"HO/{algorithm}")
    rel = f"{r['throughput'] / ho['throughput']:.2f}" if ho else "-"
    waits = " ".join(f"{100 * w:.1f}" for w in r["wait_fraction"])
    its = " ".join(str(i) for i in r["iterations"])
    lines.append(
      f"| {cluster} | {algorithm} | {r['throughput']:.0f} | {rel} | {r['test_accuracy']:.3f} "
      f"| {its} | {waits} |"
    )
  return "\n".join(lines)


def plot(results: dict[str, Any], plot_dir: Path) -> None:
  """Accuracy vs wall time per cluster, and relative throughput bars."""
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
  plot_dir.mkdir(parents=True, exist_ok=True)
  fig.savefig(plot_dir / "ray_stragglers_accuracy.png", dpi=120, bbox_inches="tight")
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
  fig.savefig(plot_dir / "ray_stragglers_throughput.png", dpi=120, bbox_inches="tight")
  plt.close(fig)


if __name__ == "__main__":
  main()
