"""The outer-optimizer study's tables and plot, from ``runs.json`` and the grid."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks import driver, harness, paired_intervals
from benchmarks.aladdin import protocol
from benchmarks.aladdin.outer_optimizer.grid import (
  LABELS,
  METHODS,
  VARIANTS,
  Cell,
  Scale,
  choose_rate,
  explore_cells,
  final_cells,
  tuning_cells,
)
from examples import analysis
from optax_lena.aladdin import simulator as sim

LEVEL = 0.01  # "level": the paired interval vs tuned AR-SGD has its lower end >= -1 point


def _final(runs: dict[str, dict], method: str, cluster: str) -> dict[int, dict]:
  return {
    r["cell"]["seed"]: r
    for r in runs.values()
    if r["cell"]["group"] == "final"
    and r["cell"]["method"] == method
    and r["cell"]["cluster"] == cluster
  }


def _tuning_table(runs: dict[str, dict], scale: Scale) -> str:
  width = max(len(scale.ar_rates), len(scale.worker_rates))
  rows = []
  for method in METHODS:
    rates = scale.ar_rates if method == "ar_sgd" else scale.worker_rates
    cells = []
    for lr in rates:
      accs = [
        runs[c.name]["test_accuracy"]
        for c in tuning_cells(scale)
        if c.method == method and c.lr == lr and c.name in runs
      ]
      cells.append(harness.mean_std(accs, ".3f") if accs else "—")
    cells += [""] * (width - len(rates))
    best = choose_rate(runs, scale, method)
    edge = "" if best is None or best not in (rates[0], rates[-1]) else " (grid edge)"
    rows.append([LABELS[method], *cells, "—" if best is None else f"{best:g}{edge}"])
  header = ["method", *[f"rate {i + 1}" for i in range(width)], "chosen"]
  return harness.markdown_table(header, rows)


def _explore_table(runs: dict[str, dict], scale: Scale) -> str | None:
  explore = explore_cells(runs, scale)
  if not any(c.name in runs for c in explore):
    return None
  options = sorted({(4, 0.5), *[(p, 0.5) for p in scale.periods]}) + [(4, a) for a in scale.alphas]
  rows = []
  for method in VARIANTS:
    lr = choose_rate(runs, scale, method)
    row: list[object] = [LABELS[method], f"{lr:g}"]
    for period, alpha in options:
      group = "tune" if (period, alpha) == (4, 0.5) else "explore"
      names = [
        Cell(group, method, scale.clusters[0], s, lr or 0.0, period, alpha).name
        for s in scale.tune_seeds
      ]
      accs = [runs[n]["test_accuracy"] for n in names if n in runs]
      row.append(harness.mean_std(accs, ".3f") if accs else "—")
    rows.append(row)
  header = ["variant", "worker rate", *[f"period {p}, alpha {a:g}" for p, a in options]]
  table = harness.markdown_table(header, rows)
  below = []
  for method, lr in scale.extra:
    names = [Cell("explore", method, scale.clusters[0], s, lr).name for s in scale.tune_seeds]
    accs = [runs[n]["test_accuracy"] for n in names if n in runs]
    if accs:
      below.append([LABELS[method], f"{lr:g}", harness.mean_std(accs, ".3f")])
  if below:
    table += "\n\n" + harness.markdown_table(["method", "worker rate", "validation"], below)
  return table


def _when_fastest_finishes(runs: dict[str, dict], cluster: str) -> dict[tuple[str, int], float]:
  """Each run's test accuracy when the first method of its cluster and seed has finished."""
  here = {(m, s): r for m in METHODS for s, r in _final(runs, m, cluster).items()}
  fastest: dict[int, float] = {}
  for (_, seed), r in here.items():
    fastest[seed] = min(fastest.get(seed, math.inf), r["time"])
  return {key: protocol.accuracy_at(r, fastest[key[1]]) for key, r in here.items()}


def _final_table(runs: dict[str, dict], scale: Scale) -> str:
  rows = []
  for cluster in scale.clusters:
    at_first = _when_fastest_finishes(runs, cluster)
    for method in METHODS:
      mine = list(_final(runs, method, cluster).values())
      if not mine:
        continue
      hits = [t for t in (protocol.time_to(r, protocol.TARGET) for r in mine) if t is not None]
      rows.append([
        cluster,
        LABELS[method],
        f"{mine[0]['cell']['lr']:g}",
        harness.mean_std([r["test_accuracy"] for r in mine], ".3f"),
        harness.mean_std_reached(hits, len(mine)),
        harness.mean_std([r["time"] for r in mine], ".0f"),
        harness.mean_std([at_first[(method, r["cell"]["seed"])] for r in mine], ".3f"),
        len(mine),
      ])  # fmt: skip
  header = [
    "cluster",
    "method",
    "rate",
    "test accuracy",
    f"time to {protocol.TARGET}",
    "time to finish",
  ]
  return harness.markdown_table([*header, "acc. when the fastest finishes", "seeds"], rows)


def _accuracy(runs: dict[str, dict], method: str, cluster: str) -> dict[int, float]:
  # AR-SGD's model does not depend on the cluster: its HO runs stand for every cluster.
  where = "HO" if method == "ar_sgd" else cluster
  return {s: r["test_accuracy"] for s, r in _final(runs, method, where).items()}


def verdict(pair: paired_intervals.Paired, against: str) -> str:
  """The pre-registered decision rule."""
  if pair.n < 2:
    return "one seed: no interval"
  if against == "ar_sgd":
    if pair.low >= -LEVEL:
      return "level or above"
    return "behind by over 1 point" if pair.high < -LEVEL else "not shown level"
  return "beats plain" if pair.low > 0 else pair.verdict("beats plain", "behind plain")


def _paired_table(runs: dict[str, dict], scale: Scale) -> str:
  rows = []
  for cluster in scale.clusters:
    for method in VARIANTS:
      for against in ("ar_sgd", "plain"):
        if against == method:
          continue
        a, b = _accuracy(runs, method, cluster), _accuracy(runs, against, cluster)
        if not set(a) & set(b):
          continue
        pair = paired_intervals.paired_by_seed(a, b)
        label = f"{LABELS[method]} - {LABELS[against]}, {cluster}"
        rows.append([*pair.row(label, 2, 100), verdict(pair, against)])
  # Not pre-registered: at equal simulated time, when the first method of the seed finished.
  home = scale.clusters[0]
  at_first = _when_fastest_finishes(runs, home)
  for method in VARIANTS:
    a = {s: v for (m, s), v in at_first.items() if m == method}
    b = {s: v for (m, s), v in at_first.items() if m == "ar_sgd"}
    if set(a) & set(b):
      pair = paired_intervals.paired_by_seed(a, b)
      label = f"{LABELS[method]} - AR-SGD, {home}, when the fastest finishes (not pre-registered)"
      rows.append([*pair.row(label, 2, 100), pair.verdict()])
  header = ["claim (A - B), test accuracy", "seeds", "mean (points)", "95% interval (points)"]
  return harness.markdown_table([*header, "seeds A > B", "verdict"], rows)


def _throughput_table(runs: dict[str, dict], scale: Scale) -> str:
  n = protocol.PRESETS[scale.preset].num_workers
  rows = []
  for method in METHODS:
    home = _final(runs, method, scale.clusters[0])
    for cluster in scale.clusters[1:]:
      here = _final(runs, method, cluster)
      seeds = sorted(set(home) & set(here))
      if not seeds:
        continue
      ratios = [here[s]["time"] / home[s]["time"] for s in seeds]
      # Wait-free: the slow worker's share of the samples shrinks, the others keep their pace.
      law = n / (n - 1 + 1 / sim.PAPER_SLOWDOWNS[cluster])
      rows.append([
        LABELS[method], cluster, harness.mean_std(ratios, ".3f"), f"{law:.3f}", len(seeds)
      ])  # fmt: skip
  header = ["method", "cluster", "time to finish / HO's", "wait-free law", "seeds"]
  return harness.markdown_table(header, rows)


def _ar_sgd_cluster_check(runs: dict[str, dict], scale: Scale) -> str:
  seed = scale.seeds[0]
  accs = {c: _final(runs, "ar_sgd", c).get(seed) for c in scale.clusters}
  if any(r is None for r in accs.values()):
    return "AR-SGD off HO: not run yet."
  values = {c: r["test_accuracy"] for c, r in accs.items() if r is not None}
  same = len(set(values.values())) == 1
  text = ", ".join(f"{c} {v:.4f}" for c, v in values.items())
  return (
    f"AR-SGD test accuracy on seed {seed} by cluster: {text} ({'identical' if same else 'DIFFER'})."
  )


def tables(runs: dict[str, dict], scale: Scale) -> str:
  """The study's tables (``tables.md``)."""
  tune, final = tuning_cells(scale), final_cells(runs, scale)
  done_t = sum(c.name in runs for c in tune)
  finals = sum(r["cell"]["group"] == "final" for r in runs.values())
  parts = [
    f"# ALADDIN's outer optimizer: {done_t} of {len(tune)} tuning cells, {finals} final cells\n",
    "## Tuning (validation accuracy, mean ± std over the tuning seeds)\n",
    f"Rates in grid order: AR-SGD {', '.join(f'{x:g}' for x in scale.ar_rates)}; ALADDIN "
    f"workers {', '.join(f'{x:g}' for x in scale.worker_rates)}.\n",
    _tuning_table(runs, scale) + "\n",
  ]
  if finals:
    parts += [
      "## Final runs (test accuracy)\n",
      _final_table(runs, scale) + "\n",
      _ar_sgd_cluster_check(runs, scale) + "\n",
      "## Paired by seed (Student-t, n - 1 degrees of freedom)\n",
      _paired_table(runs, scale) + "\n",
      "## Straggler throughput\n",
      _throughput_table(runs, scale) + "\n",
    ]
  explore = _explore_table(runs, scale)
  if explore:
    parts += ["## Exploratory: period, alpha, other Nesterov servers (validation, HO)\n"]
    parts += [explore + "\n"]
  parts += protocol.not_run_note([*tune, *final, *explore_cells(runs, scale)], runs)
  return "\n".join(parts)


def plot(runs: dict[str, dict], path: Path, scale: Scale) -> bool:
  """The final runs' test accuracy against simulated time, seed 0, one panel per cluster
  (False: no final run yet)."""
  plt = analysis.pyplot()
  seed = scale.seeds[0]
  clusters = [c for c in scale.clusters if any(seed in _final(runs, m, c) for m in VARIANTS)]
  if not clusters:
    return False
  fig, axes = plt.subplots(1, len(clusters), figsize=(4.5 * len(clusters), 3.5), squeeze=False)
  for ax, cluster in zip(axes[0], clusters, strict=True):
    for method in METHODS:
      run = _final(runs, method, cluster).get(seed)
      if run is not None:
        curve = run["curve"]
        ax.plot([p[0] for p in curve], [p[1] for p in curve], label=LABELS[method])
    ax.set_xscale("symlog", linthresh=10)
    ax.set_title(f"{cluster}, seed {seed}")
    ax.set_xlabel("simulated time (worker iterations)")
    ax.set_ylabel("test accuracy (global model)")
    ax.grid(alpha=0.3)
  axes[0][0].legend(fontsize=8)
  analysis.save_figure(fig, path, dpi=110)
  return True


def report(scale: Scale, out: Path) -> driver.Report:
  """``tables.md`` and ``accuracy_vs_time.png`` from ``out/runs.json``."""
  runs = harness.load_summaries(out)
  text = tables(runs, scale)
  plot(runs, out / "accuracy_vs_time.png", scale)
  return driver.Report(text, {"tables.md": text})
