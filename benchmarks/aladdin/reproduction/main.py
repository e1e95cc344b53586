"""Reproduction study of ALADDIN (Ko et al., CIKM 2021) with the deterministic cluster simulator.

Parts (``--parts``, all by default):

* ``table3``: the paper's Table 3 in its own shape -- speed-up of 8 workers over one on HO / HE0
  (worker 0 x2 slower) / HE1 (x10) / HE2 (x100), ALADDIN, AR-SGD, ASP, EASGD and SGP, ResNet-50
  and VGG-16 sizes, from the timing-only mode (no training), next to the paper's numbers. Two
  compute-time settings: from a published RTX 2080 Ti throughput, and calibrated so that the
  model reproduces the paper's AR-SGD HO speed-up.
* ``table2``: Table 2's shape on MNIST-1D (generated offline; the example CNN1D): final test
  accuracy, accuracy at a fixed simulated time budget and simulated time to a target accuracy,
  five algorithms x HO / HE1 / HE2 x seeds, mean +- std.
* ``ablation``: ALADDIN-L1 (local self-update only: alpha = 0), L2 (+ PS-triggered local update
  without the lazy global update: period = 1, the PS updates x~ and replies at every gradient)
  and full ALADDIN (period = 4), on HE1.
* ``period``: period in {1, 2, 4} on HE1.
* ``choices``: normalise x server_tx x alpha on HE1 (the ambiguous points of the algorithm).
* ``overhead``: the simulator's host time outside the JAX computations it runs.

Every training run's summary is kept in ``<out>/runs.json`` and a run found there is skipped, so
the study resumes; ``--shard I/N`` splits the runs between processes. Every invocation ends by
writing ``<out>/tables.md``, ``summary.json`` and the plots from whatever has finished.

Usage::

  python -m benchmarks.aladdin.reproduction.main --smoke --out /tmp/aladdin_smoke  # seconds, CI
  python -m benchmarks.aladdin.reproduction.main                  # RESULTS.md's study
  python -m benchmarks.aladdin.reproduction.main --parts table3   # timing only, seconds
  python -m benchmarks.aladdin.reproduction.main --report_only    # tables from finished runs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

from benchmarks import harness
from benchmarks.aladdin.reproduction.table3 import plot_speedups, table3, table3_markdown
from benchmarks.aladdin.training import (
  ALGORITHMS,
  LABELS,
  PRESETS,
  Preset,
  make_problem,
  save_figure,
  training_cluster,
)
from optax_lena import aladdin as al
from optax_lena.aladdin import simulator as sim

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


# ALADDIN-L2: an eager global update (the PS updates x~ at every gradient: period 1) and a reply
# to each worker every 4 of its gradients, with Section 3.2's alpha for pi = 4 (with period 1,
# "count" would give alpha = 1 - 1/sqrt(1) = 0 at every update).
L2 = dict(period=1, reply_every=4, alpha=round(1 - 1 / math.sqrt(8 * 4), 4))
LR2 = 0.05  # the second learning rate of the "lr" part
NORMALISES = ("sum", "mean", "mean_of_locals")
SERVER_TXS = ("sgd", "momentum")
ALPHAS = ("count", "n_pi", 0.5)


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One training run: an algorithm with options on a cluster, one seed."""

  part: str
  alg: str
  cluster: str
  seed: int
  period: int = 4
  normalise: str = "mean_of_locals"
  server_tx: str = "momentum"  # the paper's PS optimizer (momentum SGD 0.9)
  alpha: str | float = "count"
  reply_every: int = 0  # 0: every reply (see sim.Algorithm.reply_every)
  lr: float = 0.0  # 0: the preset's

  @property
  def name(self) -> str:
    base = f"{self.alg}_{self.cluster}_seed{self.seed}" + (f"_lr{self.lr:g}" if self.lr else "")
    if self.alg != "aladdin":
      return base
    name = f"{base}_p{self.period}_{self.normalise}_{self.server_tx}_a{self.alpha}"
    return name + (f"_r{self.reply_every}" if self.reply_every else "")


def build_grid(preset: Preset, parts: Sequence[str]) -> list[RunSpec]:
  """The training runs of ``parts`` (duplicates shared between parts appear once)."""
  runs: list[RunSpec] = []
  if "table2" in parts:
    # The PS baselines last: a partial study still has ALADDIN, AR-SGD and SGP everywhere.
    for alg in ("aladdin", "ar_sgd", "sgp", "asp", "easgd"):
      for cluster in preset.clusters:
        for seed in preset.seeds:
          runs.append(RunSpec("table2", alg, cluster, seed))
  c = preset.study_cluster
  if "ablation" in parts:
    for seed in preset.seeds:
      runs.append(RunSpec("ablation", "aladdin", c, seed, alpha=0.0))  # L1
      runs.append(RunSpec("ablation", "aladdin", c, seed, **L2))
      runs.append(RunSpec("ablation", "aladdin", c, seed))  # full
  if "period" in parts:
    for seed in preset.seeds:
      for period in (1, 2, 4):
        for alpha in ("count", "n_pi"):
          runs.append(RunSpec("period", "aladdin", c, seed, period=period, alpha=alpha))
  if "lr" in parts:
    # The same comparisons at half the learning rate: does the ranking depend on it?
    for seed in preset.seeds:
      for opts in ({}, dict(alpha=0.5), dict(alpha="n_pi"), L2):
        runs.append(RunSpec("lr", "aladdin", c, seed, lr=LR2, **opts))
      runs.append(RunSpec("lr", "aladdin", c, seed, alpha=0.5))  # the best choice, 3 seeds
      for alg in ("easgd", "sgp", "asp"):
        runs.append(RunSpec("lr", alg, c, seed, lr=LR2))
  if "choices" in parts:
    for seed in preset.choice_seeds:
      for normalise in NORMALISES:
        for server_tx in SERVER_TXS:
          for alpha in ALPHAS:
            runs.append(
              RunSpec(
                "choices", "aladdin", c, seed, normalise=normalise, server_tx=server_tx, alpha=alpha
              )
            )
  seen: set[str] = set()
  unique = []
  for run in runs:
    if run.name not in seen:
      seen.add(run.name)
      unique.append(run)
  return unique


# ------------------------------------------------------------------------------------------------
# The training problem and cluster
# ------------------------------------------------------------------------------------------------


_TXS: dict[tuple, Any] = {}


def _tx(key: tuple) -> Any:
  """Optax transformations built once per configuration (the simulator's jit cache keys on
  them)."""
  if key not in _TXS:
    kind, lr = key[0], key[1]
    if kind == "local":
      _TXS[key] = al.local_optimizer(lr)  # momentum 0.9, weight decay 1e-4
    elif kind == "sgd":
      _TXS[key] = optax.sgd(lr)
    elif kind == "momentum":
      _TXS[key] = optax.sgd(lr, momentum=0.9)
    else:
      raise ValueError(key)
  return _TXS[key]


def make_algorithm(spec: RunSpec, preset: Preset) -> sim.Algorithm:
  """The algorithm of a run, with the study's learning rates.

  * ALADDIN, EASGD (``tau`` 2, the default), SGP workers: ``al.local_optimizer(lr)`` (momentum
    SGD 0.9, weight decay 1e-4, the paper's local optimizer). ALADDIN's PS: ``optax.sgd(lr)``
    (the printed plain step) or ``optax.sgd(lr, momentum=0.9)`` on the normalised g~.
  * AR-SGD: ``al.local_optimizer(ar_lr)`` on the mean of the n gradients.
  * ASP: the PS applies each gradient with ``optax.sgd(lr)`` (the printed Hogwild step).
  """
  lr = spec.lr or preset.lr
  if spec.alg == "aladdin":
    return sim.algorithm(
      "aladdin",
      message="gradient",  # the first study's ALADDIN: raw gradients (Algorithm 1 as printed)
      worker_tx=_tx(("local", lr)),
      server_tx=_tx((spec.server_tx, lr)),
      period=spec.period,
      normalise=spec.normalise,
      alpha=spec.alpha,
      reply_every=spec.reply_every or None,
    )
  if spec.alg == "ar_sgd":
    lr = preset.ar_lr
  # The optimizer that trains the model: the workers' local one, or ASP's server's plain step.
  on_server = sim.algorithm(spec.alg).optimizer_field == "server_tx"
  return sim.algorithm(spec.alg, optimizer=_tx(("sgd" if on_server else "local", lr)))


def run_one(spec: RunSpec, preset: Preset, cache_dir: Path, *, profile: bool = False) -> dict:
  """Simulates one training run and returns its JSON summary."""
  problem = make_problem(preset, spec.seed, cache_dir)
  nbytes = float(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(problem.params)))
  cluster = training_cluster(preset, spec.cluster, nbytes)
  budget = int(preset.epochs * len(problem.x_train))
  result = sim.simulate(
    make_algorithm(spec, preset),
    cluster,
    batch_size=preset.batch_size,
    problem=problem,
    num_samples=budget,
    num_evals=preset.num_evals,
    seed=spec.seed,
    profile=profile,
  )
  out = result.summary()
  out["spec"] = dataclasses.asdict(spec)
  out["name"] = spec.name
  out["model_bytes"] = nbytes
  return out


# ------------------------------------------------------------------------------------------------
# Table 3 (timing only)
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


def _mean_std(values: Sequence[float], fmt: str = ".4f") -> str:
  """:func:`harness.mean_std` of the values that exist (NaN: none); a time to target that some
  runs never reached (inf) is this study's ``"never (n/n)"`` or ``"mean (k/n reached)"``."""
  values = [v for v in values if not math.isnan(v)]
  finite = [v for v in values if math.isfinite(v)]
  if len(finite) == len(values):
    return harness.mean_std(values, fmt)
  if not finite:
    return f"never ({len(values)}/{len(values)})"
  return f"{statistics.mean(finite):{fmt}} ({len(finite)}/{len(values)} reached)"


def _acc_at(run: dict, t: float) -> float:
  acc = math.nan
  for point in run["evals"]:
    if point["time"] <= t + 1e-9:
      acc = point["test_accuracy"]
  return acc


def _time_to(run: dict, target: float) -> float:
  for point in run["evals"]:
    if point["test_accuracy"] >= target:
      return point["time"]
  return math.inf


def report(out: Path, preset: Preset, runs: dict[str, dict], t3: dict | None) -> str:
  """Writes tables.md, summary.json and the plots; returns the Markdown."""
  lines: list[str] = []
  plots: list[str] = []
  if t3 is not None:
    lines += table3_markdown(t3)
    plots.append(plot_speedups(out, t3))

  def cell(alg, cluster, **opts):
    key_opts = dict(
      period=4, normalise="mean_of_locals", server_tx="momentum", alpha="count", reply_every=0
    )
    lr = opts.pop("lr", 0.0)
    key_opts.update(opts)
    found = []
    for run in runs.values():
      s = run["spec"]
      if s["alg"] != alg or s["cluster"] != cluster or float(s.get("lr", 0.0)) != lr:
        continue
      if alg == "aladdin" and any(str(s.get(k, 0)) != str(v) for k, v in key_opts.items()):
        continue
      found.append(run)
    return sorted(found, key=lambda r: r["spec"]["seed"])

  # Table 2.
  ar_ho = cell("ar_sgd", "HO")
  target = 0.95 * statistics.mean(r["evals"][-1]["test_accuracy"] for r in ar_ho) if ar_ho else 0
  if any(cell(a, c) for a in ALGORITHMS for c in preset.clusters):
    lines += [
      "## Table 2 (shape): MNIST-1D, CNN1D, 8 simulated workers",
      "",
      f"Budget: {preset.epochs:g} epochs of samples over all workers; per-worker batch "
      f"{preset.batch_size}; time unit = one worker iteration. Accuracy at time T: T = the "
      "shortest mean total time among the algorithms on that cluster (when the fastest has "
      f"finished). Target = 95% of AR-SGD's final accuracy on HO ({target:.4f}).",
      "",
      "| cluster | algorithm | final test acc | total time | acc @ T | time to target | "
      "throughput (samples/unit) | mean wait fraction | final acc, average of local models | "
      "seeds |",
      "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cluster in preset.clusters:
      done = {a: cell(a, cluster) for a in ALGORITHMS}
      times = [statistics.mean(r["time"] for r in rs) for rs in done.values() if rs]
      budget_t = min(times) if times else math.nan
      for alg in ALGORITHMS:
        rs = done[alg]
        if not rs:
          lines.append(f"| {cluster} | {LABELS[alg]} | — | — | — | — | — | — | — | 0 |")
          continue
        lines.append(
          f"| {cluster} | {LABELS[alg]} | "
          f"{_mean_std([r['evals'][-1]['test_accuracy'] for r in rs])} | "
          f"{_mean_std([r['time'] for r in rs], '.0f')} | "
          f"{_mean_std([_acc_at(r, budget_t) for r in rs])} (T={budget_t:.0f}) | "
          f"{_mean_std([_time_to(r, target) for r in rs], '.0f')} | "
          f"{_mean_std([r['throughput'] for r in rs], '.0f')} | "
          f"{_mean_std([statistics.mean(r['wait_time']) / r['time'] for r in rs], '.2f')} | "
          f"{_mean_std([r['evals'][-1].get('local_accuracy', math.nan) for r in rs])} | "
          f"{len(rs)} |"
        )
    lines.append("")
    plots.append(
      _plot_curves(out, preset, {c: {a: cell(a, c) for a in ALGORITHMS} for c in preset.clusters})
    )

  c = preset.study_cluster
  variants = [
    ("ablation", "L1: local self-update only (alpha = 0)", dict(alpha=0.0)),
    (
      "ablation",
      f"L2: + PS-triggered local update, eager global update (period 1, reply "
      f"every 4, alpha {L2['alpha']})",
      L2,
    ),
    ("ablation", "full ALADDIN (period 4, alpha count)", {}),
    ("period", "period 1, alpha count (= alpha 0 at every update)", dict(period=1)),
    ("period", "period 2, alpha count", dict(period=2)),
    ("period", "period 4, alpha count (full)", {}),
    ("period", "period 1, alpha n_pi", dict(period=1, alpha="n_pi")),
    ("period", "period 2, alpha n_pi", dict(period=2, alpha="n_pi")),
    ("period", "period 4, alpha n_pi", dict(period=4, alpha="n_pi")),
  ]
  rows = [(label, cell("aladdin", c, **opts)) for _, label, opts in variants]
  if any(rs for _, rs in rows):
    lines += [
      f"## Ablation and period ({c})",
      "",
      "| variant | final test acc | acc @ 50% of the budget | seeds |",
      "|---|---|---|---|",
    ]
    for label, rs in rows:
      half = [r["evals"][len(r["evals"]) // 2]["test_accuracy"] for r in rs]
      lines.append(
        f"| {label} | {_mean_std([r['evals'][-1]['test_accuracy'] for r in rs])} | "
        f"{_mean_std(half)} | {len(rs)} |"
      )
    lines.append("")

  lr_rows = [
    (f"ALADDIN ({label})", cell("aladdin", c, lr=lr, **opts))
    for lr in (0.0, LR2)
    for label, opts in (
      ("alpha count", {}),
      ("alpha 0.5", dict(alpha=0.5)),
      ("alpha n_pi", dict(alpha="n_pi")),
      ("L2", dict(L2)),
    )
  ] + [(LABELS[alg], cell(alg, c, lr=lr)) for lr in (0.0, LR2) for alg in ("easgd", "sgp", "asp")]
  if any(cell("aladdin", c, lr=LR2)):
    lines += [
      f"## Learning rate {preset.lr:g} vs {LR2:g} ({c})",
      "",
      f"| method | final test acc, lr {preset.lr:g} | final test acc, lr {LR2:g} |",
      "|---|---|---|",
    ]
    pairs = list(zip(lr_rows[:4], lr_rows[4:8], strict=True)) + list(
      zip(lr_rows[8:11], lr_rows[11:14], strict=True)
    )
    for (label, rs_a), (_, rs_b) in pairs:
      lines.append(
        f"| {label} | {_mean_std([r['evals'][-1]['test_accuracy'] for r in rs_a])} | "
        f"{_mean_std([r['evals'][-1]['test_accuracy'] for r in rs_b])} |"
      )
    lines.append("")

  choice_rows = []
  for normalise in NORMALISES:
    for server_tx in SERVER_TXS:
      for alpha in ALPHAS:
        rs = [
          r
          for r in cell("aladdin", c, normalise=normalise, server_tx=server_tx, alpha=alpha)
          if r["spec"]["seed"] in preset.choice_seeds
        ]
        if rs:
          choice_rows.append((normalise, server_tx, alpha, rs))
  if choice_rows:
    lines += [
      f"## normalise x server_tx x alpha ({c}, seeds {list(preset.choice_seeds)})",
      "",
      "| normalise | server_tx | alpha | final test acc | final test loss | best acc |",
      "|---|---|---|---|---|---|",
    ]
    choice_rows.sort(
      key=lambda row: -statistics.mean(r["evals"][-1]["test_accuracy"] for r in row[3])
    )
    for normalise, server_tx, alpha, rs in choice_rows:
      lines.append(
        f"| {normalise} | {server_tx} | {alpha} | "
        f"{_mean_std([r['evals'][-1]['test_accuracy'] for r in rs])} | "
        f"{_mean_std([r['evals'][-1]['test_loss'] for r in rs])} | "
        f"{_mean_std([max(p['test_accuracy'] for p in r['evals']) for r in rs])} |"
      )
    lines.append("")

  overhead = out / "overhead.json"
  if overhead.exists():
    o = json.loads(overhead.read_text())
    lines += [
      "## Simulator overhead",
      "",
      f"One {o['name']} run with every JAX call timed (blocked on): wall {o['wall_time']:.2f} s, "
      f"inside JAX {o['jax_time']:.2f} s, outside (the simulator's Python: heap, bookkeeping, "
      f"batch slicing) {o['wall_time'] - o['jax_time']:.2f} s = "
      f"**{o['overhead_fraction']:.1%} of wall time**; {o['num_events']} events.",
      "",
    ]
  text = "\n".join(lines)
  harness.write_text(out / "tables.md", text)
  harness.write_text(
    out / "summary.json",
    json.dumps(
      {
        "preset": dataclasses.asdict(preset),
        "target": target,
        "plots": plots,
        "num_runs": len(runs),
        "table3": t3,
      },
      indent=1,
    ),
  )
  return text


def _plot_curves(out: Path, preset: Preset, cells: dict[str, dict[str, list[dict]]]) -> str:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  clusters = list(cells)
  fig, axes = plt.subplots(2, len(clusters), figsize=(5 * len(clusters), 7), squeeze=False)
  for j, cluster in enumerate(clusters):
    for alg, rs in cells[cluster].items():
      if not rs:
        continue
      n = min(len(r["evals"]) for r in rs)
      t = [rs[0]["evals"][k]["time"] for k in range(n)]
      it = [rs[0]["evals"][k]["iterations"] for k in range(n)]
      acc = np.mean([[r["evals"][k]["test_accuracy"] for k in range(n)] for r in rs], axis=0)
      axes[0, j].plot(t, acc, marker=".", label=LABELS[alg])
      axes[1, j].plot(it, acc, marker=".", label=LABELS[alg])
    axes[0, j].set_title(f"{cluster}: test accuracy vs simulated time")
    axes[0, j].set_xlabel("simulated time (worker iterations, log scale above 10)")
    # AR-SGD and SGP take 10-100x longer on HE1/HE2: a log axis keeps the others readable.
    axes[0, j].set_xscale("symlog", linthresh=10)
    axes[1, j].set_title(f"{cluster}: test accuracy vs samples / (n B)")
    axes[1, j].set_xlabel("cluster iterations")
    for ax in axes[:, j]:
      ax.set_ylim(0, 1)
      ax.grid(alpha=0.3)
  axes[0, 0].legend()
  save_figure(fig, out / "accuracy_vs_time.png")
  return "accuracy_vs_time.png"


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------


def measure_overhead(out: Path, preset: Preset, cache_dir: Path) -> dict:
  """Runs ALADDIN on the study cluster twice (the first compiles) and times the JAX calls of
  the second; writes overhead.json."""
  spec = RunSpec("overhead", "aladdin", preset.study_cluster, 0)
  run_one(spec, preset, cache_dir)
  t0 = time.perf_counter()
  result = run_one(spec, preset, cache_dir, profile=True)
  result["outer_wall_time"] = time.perf_counter() - t0
  result["overhead_fraction"] = (result["wall_time"] - result["jax_time"]) / result["wall_time"]
  keep = {
    k: result[k]
    for k in ("name", "wall_time", "jax_time", "num_events", "overhead_fraction", "outer_wall_time")
  }
  harness.write_text(out / "overhead.json", json.dumps(keep, indent=1))
  return keep


def main(argv: Sequence[str] | None = None) -> str:
  """Runs the study (see the module docstring) and returns the tables' Markdown."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
  parser.add_argument("--out", type=Path, default=None)
  parser.add_argument("--cache_dir", type=Path, default=Path.home() / ".cache" / "mnist1d")
  parser.add_argument(
    "--parts",
    nargs="+",
    default=["table3", "table2", "ablation", "period", "choices", "lr", "overhead"],
  )
  parser.add_argument("--shard", default="0/1", help="I/N: run every N-th run from the I-th")
  parser.add_argument("--report_only", action="store_true")
  args = parser.parse_args(argv)
  shard = harness.parse_shard(args.shard)
  preset = PRESETS["smoke" if args.smoke else "default"]
  out = args.out or (DEFAULT_OUT if not args.smoke else Path("/tmp/aladdin_smoke"))
  out.mkdir(parents=True, exist_ok=True)

  t3 = None
  t3_path = out / "table3.json"
  if "table3" in args.parts and not args.report_only:
    if t3_path.exists():
      print("Table 3: finished earlier, skipped", flush=True)
    else:
      t0 = time.perf_counter()
      t3 = table3(8, 4, 20) if args.smoke else table3()
      harness.write_text(t3_path, json.dumps(t3, indent=1))
      print(
        f"Table 3: {len(t3['rows'])} timing-only runs in {time.perf_counter() - t0:.1f} s",
        flush=True,
      )
  if t3_path.exists():
    t3 = json.loads(t3_path.read_text())

  grid = build_grid(preset, args.parts)
  # Every run's summary in one file per shard (runs.json without sharding); all are read.
  path = harness.summaries_path(out, shard)
  runs = harness.load_summaries(out)
  own = harness.load_summaries(path)
  if not args.report_only:
    trained, _ = harness.run_summaries(
      grid,
      lambda spec: run_one(spec, preset, args.cache_dir),
      own,
      lambda summaries: harness.save_summaries(path, summaries),
      finished=runs,
      shard=shard,
      describe=lambda r: f"acc {r['evals'][-1]['test_accuracy']:.4f}, sim time {r['time']:.0f}",
    )
    runs.update(own)
    if trained:
      harness.write_json(out / "machine.json", harness.machine_info())
    if "overhead" in args.parts and shard[0] == 0 and not (out / "overhead.json").exists():
      o = measure_overhead(out, preset, args.cache_dir)
      print(f"Simulator overhead: {o['overhead_fraction']:.1%} of wall time", flush=True)

  return report(out, preset, runs, t3)


if __name__ == "__main__":
  main()
