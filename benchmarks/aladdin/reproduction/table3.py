"""The paper's Table 3 in the simulator's timing-only mode: speed-ups of 8 workers over one.

Both compute settings (the published single-GPU throughput, and the compute time calibrated on
the paper's own AR-SGD speed-up) at the paper's model sizes on the paper's cluster.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from benchmarks.aladdin.protocol import ALGORITHMS, CLUSTERS, LABELS
from examples import analysis
from optax_lena.aladdin import simulator as cl
from optax_lena.aladdin import simulator as sim

# The paper's Table 3 (ResNet-50, VGG-16); ASP and EASGD are not in it.
PAPER_TABLE3 = {
  ("aladdin", "HO"): (6.70, 6.18),
  ("aladdin", "HE0"): (6.30, 5.74),
  ("aladdin", "HE1"): (5.95, 5.49),
  ("aladdin", "HE2"): (5.87, 5.41),
  ("ar_sgd", "HO"): (5.40, 2.03),
  ("ar_sgd", "HE0"): (3.22, 1.46),
  ("ar_sgd", "HE1"): (0.71, 0.62),
  ("ar_sgd", "HE2"): (0.08, 0.07),
  ("sgp", "HO"): (6.00, 4.64),
  ("sgp", "HE0"): (5.21, 4.15),
  ("sgp", "HE1"): (4.83, 3.81),
  ("sgp", "HE2"): (1.93, 1.89),
}


def table3(
  num_workers: int = 8, horizon_slow_iterations: int = 40, min_iterations: int = 1000
) -> dict:
  """Speed-ups of ``num_workers`` over one worker, timing-only, for both compute settings.

  Returns:
    ``{"rows": [...], "settings": {...}}``; each row has model, setting, cluster, algorithm,
    speed-up and the workers' mean waiting fraction.
  """
  rows = []
  settings = {}
  for model in cl.PAPER_MODELS.values():
    for setting in ("published", "calibrated"):
      compute = model.compute_time
      if setting == "calibrated":
        paper_ar = PAPER_TABLE3["ar_sgd", "HO"][0 if model.name == "ResNet-50" else 1]
        compute = cl.calibrated_compute_time(model, paper_ar, cl.paper_cluster(1.0))
      settings[f"{model.name}/{setting}"] = {
        "compute_time": compute,
        "batch_size": model.batch_size,
        "bytes": model.nbytes,
        "images_per_second": model.batch_size / compute,
      }
      for name, factor in cl.PAPER_SLOWDOWNS.items():
        cluster = cl.paper_cluster(compute, factor, num_workers=num_workers)
        # Long enough for the slow worker's iterations and for 1000 of a normal worker's
        # (the last, unfinished iteration then moves the speed-up by < 0.1%).
        horizon = max(horizon_slow_iterations * max(cluster.compute_time), min_iterations * compute)
        for alg in ALGORITHMS:
          r = sim.simulate(
            sim.algorithm(alg),
            cluster,
            batch_size=model.batch_size,
            model_bytes=model.nbytes,
            until_time=horizon,
          )
          rows.append(
            {
              "model": model.name,
              "setting": setting,
              "cluster": name,
              "alg": alg,
              "speedup": r.throughput * compute / model.batch_size,
              "wait_fraction": statistics.mean(r.wait_time) / r.time,
            }
          )
  return {"rows": rows, "settings": settings}


def table3_markdown(t3: dict) -> list[str]:
  """The Markdown lines of Table 3 (both compute settings) next to the paper's numbers."""
  rows = {(r["model"], r["setting"], r["cluster"], r["alg"]): r for r in t3["rows"]}
  lines = [
    "## Table 3 (shape): speed-up of 8 workers over one (timing-only), ResNet-50 / VGG-16",
    "",
    "Compute per iteration: "
    + "; ".join(
      f"{k}: {v['compute_time'] * 1000:.0f} ms ({v['images_per_second']:.0f} images/s)"
      for k, v in t3["settings"].items()
    )
    + ".",
    "",
  ]
  for setting in ("published", "calibrated"):
    lines += [
      f"### compute time: {setting}",
      "",
      "| cluster | " + " | ".join(LABELS[a] for a in ALGORITHMS) + " | paper ALADDIN | "
      "paper AR-SGD | paper SGP |",
      "|---|" + "---|" * (len(ALGORITHMS) + 3),
    ]
    for cluster in CLUSTERS:
      cells = []
      for alg in ALGORITHMS:
        vals = [rows[m, setting, cluster, alg]["speedup"] for m in cl.PAPER_MODELS]
        cells.append(" / ".join(f"{v:.2f}" for v in vals))
      paper = [
        " / ".join(f"{v:.2f}" for v in PAPER_TABLE3[a, cluster])
        for a in ("aladdin", "ar_sgd", "sgp")
      ]
      lines.append(f"| {cluster} | " + " | ".join(cells + paper) + " |")
    lines.append("")
  return lines


def plot_speedups(out: Path, t3: dict) -> str:
  """The simulated speed-ups (published compute times) next to the paper's, per model."""
  fig, axes = analysis.pyplot().subplots(1, 2, figsize=(12, 4), sharey=True)
  rows = {(r["model"], r["setting"], r["cluster"], r["alg"]): r["speedup"] for r in t3["rows"]}
  width = 0.1
  for ax, (mi, model) in zip(axes, enumerate(cl.PAPER_MODELS), strict=True):
    x = np.arange(len(CLUSTERS))
    for k, alg in enumerate(ALGORITHMS):
      ax.bar(
        x + (k - 3) * width,
        [rows[model, "published", c, alg] for c in CLUSTERS],
        width,
        label=f"{LABELS[alg]} (sim)",
      )
    for k, alg in enumerate(("aladdin", "ar_sgd", "sgp")):
      ax.bar(
        x + (k + 2.5) * width,
        [PAPER_TABLE3[alg, c][mi] for c in CLUSTERS],
        width,
        hatch="//",
        fill=False,
        edgecolor=f"C{ALGORITHMS.index(alg)}",  # the simulated bar's colour
        label=f"{LABELS[alg]} (paper)",
      )
    ax.set_xticks(x, CLUSTERS)
    ax.set_title(f"{model}: speed-up of 8 workers (published compute times)")
    ax.axhline(8, color="gray", lw=0.5)
  axes[0].set_ylabel("speed-up over one worker")
  axes[1].legend(fontsize=7, ncol=2)
  analysis.save_figure(fig, out / "speedup_table3.png", dpi=110)
  return "speedup_table3.png"
