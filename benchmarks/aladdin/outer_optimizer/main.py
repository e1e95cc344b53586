"""ALADDIN's server as an outer optimizer (issue 37, item 4): plain, Nesterov, delayed Nesterov.

With update messages the ALADDIN server steps on the average of the workers' local
displacements, like DiLoCo's outer optimizer. This study compares three ``server_tx`` choices
against AR-SGD with its rate tuned the same way (the protocol is pre-registered in
``RESULTS.md``):

* ``plain``: ``optax.sgd(1.0)``, ``al.Aladdin``'s default;
* ``nesterov``: DiLoCo's ``optax.sgd(0.7, momentum=0.9, nesterov=True)``;
* ``delayed_nesterov``: Liu et al. 2024's delayed Nesterov (``delayed_nesterov`` below), lr 0.7,
  momentum 0.9, the momentum applied once every N = n server updates.

Setting: ``../training.py``'s default preset (MNIST-1D, CNN1D, 8 workers), 1,000 of the 4,000
training examples held out for validation; tuning (15 epochs, HO, seeds 100-101) selects each
method's rate on the validation accuracy; the final runs (seeds 0-9, HO / HE1 / HE2) report the
test accuracy.

Usage::

  python -m benchmarks.aladdin.outer_optimizer.main                # resumable
  python -m benchmarks.aladdin.outer_optimizer.main --report_only  # tables.md, plot
  python -m benchmarks.aladdin.outer_optimizer.main --smoke --out /tmp/s   # the CI smoke version

Outputs in ``--out``: ``runs.json`` (one summary per finished cell), ``tables.md``,
``accuracy_vs_time.png``, ``machine.json``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from benchmarks import harness, paired_intervals
from benchmarks.aladdin import training
from optax_lena import aladdin as al
from optax_lena.aladdin import simulator as sim

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
# nesterov_gain1 is post hoc (added after the pre-registered cells had run), tuned alike.
METHODS = ("ar_sgd", "plain", "nesterov", "delayed_nesterov", "nesterov_gain1")
VARIANTS = METHODS[1:]
LABELS = {
  "ar_sgd": "AR-SGD",
  "plain": "ALADDIN-plain",
  "nesterov": "ALADDIN-Nesterov",
  "delayed_nesterov": "ALADDIN-delayed-Nesterov",
  "nesterov_gain1": "ALADDIN-Nesterov-0.1 (post hoc)",
}
OUTER_LR = 0.7  # DiLoCo's outer Nesterov (Douillard et al. 2023), fixed, not tuned
OUTER_MOMENTUM = 0.9
LEVEL = 0.01  # "level": the paired interval vs tuned AR-SGD has its lower end >= -1 point


@dataclasses.dataclass(frozen=True)
class Scale:
  preset: str
  num_validation: int
  num_evals: int
  ar_rates: tuple[float, ...]
  worker_rates: tuple[float, ...]
  tune_seeds: tuple[int, ...]
  seeds: tuple[int, ...]
  clusters: tuple[str, ...]
  periods: tuple[int, ...] = ()  # exploratory, besides the default 4
  alphas: tuple[float, ...] = ()  # exploratory, besides the default 0.5
  extra: tuple[tuple[str, float], ...] = ()  # exploratory (server, worker rate) pairs


SCALES = {
  "default": Scale(
    "default",
    1000,
    30,
    (0.05, 0.1, 0.2, 0.4, 0.8),
    (0.025, 0.05, 0.1, 0.2, 0.4),
    (100, 101),
    tuple(range(10)),
    ("HO", "HE1", "HE2"),
    periods=(1, 2, 8, 16),
    alphas=(0.25, 1.0),
    extra=(
      *[("nesterov", lr) for lr in (0.0125, 0.00625, 0.003125)],  # below the grid
      *[("nesterov_gain1", lr) for lr in (0.1, 0.2)],
    ),
  ),
  "smoke": Scale("smoke", 200, 3, (0.2,), (0.05,), (100,), (0,), ("HO", "HE1"), periods=(8,)),
}


@dataclasses.dataclass(frozen=True)
class Cell:
  group: str  # "tune", "explore" (validation accuracy) or "final" (test accuracy)
  method: str
  cluster: str
  seed: int
  lr: float  # AR-SGD's rate on the mean of n gradients, or ALADDIN's worker rate
  period: int = 4  # ALADDIN's lazy global-update period (al.Aladdin's default)
  alpha: float = 0.5  # ALADDIN's merge weight (al.Aladdin's default)

  @property
  def name(self) -> str:
    name = f"{self.group}/{self.method}/{self.cluster}/lr{self.lr:g}/seed{self.seed}"
    # The defaults stay out of the name, so the pre-registered cells keep theirs.
    if self.period != 4:
      name += f"/period{self.period}"
    if self.alpha != 0.5:
      name += f"/alpha{self.alpha:g}"
    return name


# ------------------------------------------------------------------------------------------------
# Delayed Nesterov
# ------------------------------------------------------------------------------------------------


class DelayedNesterovState(NamedTuple):
  """State of ``delayed_nesterov``."""

  num_updates: jax.Array  # int32: server updates so far
  momentum: optax.Updates  # m, applied once every ``delay`` updates
  accumulated: optax.Updates  # the outer gradients since the last momentum update


def delayed_nesterov(
  learning_rate: float, momentum: float = 0.9, delay: int = 8
) -> optax.GradientTransformation:
  """Delayed Nesterov momentum for an asynchronous outer optimizer.

  Each update ``g_t`` (an outer gradient) is added to a buffer ``D``. On every ``delay``-th
  update the momentum absorbs the buffer's mean, ``m <- momentum * m + D / delay``, the step is
  Nesterov's ``-learning_rate * (momentum * m + g_t)`` and ``D`` is reset; on the others the
  step is plain, ``-learning_rate * g_t``, and ``m`` is left as is. So a single stale outer
  gradient never moves the momentum by itself; with ``delay = 1`` this is
  ``optax.sgd(learning_rate, momentum, nesterov=True)``.

  Args:
    learning_rate: the outer rate.
    momentum: the momentum decay, in [0, 1).
    delay: N >= 1, the updates between two momentum updates.

  Returns:
    An ``optax.GradientTransformation``; its state is a ``DelayedNesterovState``.

  References:
    Liu, Chhaparia, Douillard, Kale, Rusu, Shen, Szlam, Ranzato, "Asynchronous Local-SGD
    Training for Language Modeling", 2024 (arXiv:2401.09135), the Delayed Nesterov update.
  """
  if not 0.0 <= momentum < 1.0:
    raise ValueError(f"momentum must be in [0, 1), got {momentum}.")
  if int(delay) != delay or delay < 1:
    raise ValueError(f"delay must be a positive integer, got {delay}.")

  def init(params: optax.Params) -> DelayedNesterovState:
    return DelayedNesterovState(
      jnp.zeros([], jnp.int32), optax.tree.zeros_like(params), optax.tree.zeros_like(params)
    )

  def update(
    updates: optax.Updates, state: DelayedNesterovState, params: optax.Params | None = None
  ) -> tuple[optax.Updates, DelayedNesterovState]:
    del params
    num_updates = state.num_updates + 1
    apply = num_updates % delay == 0
    accumulated = jax.tree.map(lambda d, g: d + g, state.accumulated, updates)
    new_m = jax.tree.map(lambda m, d: momentum * m + d / delay, state.momentum, accumulated)
    m = jax.tree.map(lambda a, b: jnp.where(apply, a, b), new_m, state.momentum)
    steps = jax.tree.map(
      lambda g, m: -learning_rate * jnp.where(apply, momentum * m + g, g), updates, m
    )
    accumulated = jax.tree.map(lambda d: jnp.where(apply, jnp.zeros_like(d), d), accumulated)
    return steps, DelayedNesterovState(num_updates, m, accumulated)

  return optax.GradientTransformation(init, update)


# ------------------------------------------------------------------------------------------------
# Cells
# ------------------------------------------------------------------------------------------------


def server_tx(method: str, num_workers: int) -> optax.GradientTransformation:
  """The outer optimizer of an ALADDIN variant (N = n for the delayed Nesterov)."""
  if method == "plain":
    return optax.sgd(1.0)
  if method == "nesterov":
    return optax.sgd(OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True)
  if method == "delayed_nesterov":
    return delayed_nesterov(OUTER_LR, OUTER_MOMENTUM, delay=num_workers)
  if method == "nesterov_gain1":  # exploratory: steady-state gain 0.1 / (1 - 0.9) = 1, as plain's
    return optax.sgd(0.1, momentum=OUTER_MOMENTUM, nesterov=True)
  raise ValueError(f"unknown ALADDIN variant {method!r}; variants are {VARIANTS}.")


def make_algorithm(cell: Cell, num_workers: int) -> sim.Algorithm:
  worker_tx = al.local_optimizer(cell.lr)
  if cell.method == "ar_sgd":
    return sim.algorithm("ar_sgd", worker_tx=worker_tx)
  return sim.algorithm(
    "aladdin",
    worker_tx=worker_tx,
    server_tx=server_tx(cell.method, num_workers),
    period=cell.period,
    alpha=cell.alpha,
    label=cell.method,
  )


def tuning_cells(scale: Scale) -> list[Cell]:
  cells = []
  for method in METHODS:
    rates = scale.ar_rates if method == "ar_sgd" else scale.worker_rates
    for lr in rates:
      for seed in scale.tune_seeds:
        cells.append(Cell("tune", method, scale.clusters[0], seed, lr))
  return cells


def choose_rate(runs: dict[str, dict], scale: Scale, method: str) -> float | None:
  """The rate of the best mean validation accuracy (ties: the smaller), None until tuned."""
  rates = scale.ar_rates if method == "ar_sgd" else scale.worker_rates
  means = {}
  for lr in rates:
    accs = [
      runs[c.name]["test_accuracy"]
      for c in tuning_cells(scale)
      if c.method == method and c.lr == lr and c.name in runs
    ]
    if len(accs) < len(scale.tune_seeds):
      return None
    means[lr] = math.fsum(accs) / len(accs)
  return best_rate(means)


def best_rate(means: dict[float, float]) -> float:  # ties: the smaller rate
  return min(lr for lr, m in means.items() if m == max(means.values()))


def final_cells(runs: dict[str, dict], scale: Scale) -> list[Cell]:
  """Seed by seed, every tuned method; AR-SGD off HO on the first seed only (its accuracy does
  not depend on the cluster, only its time)."""
  chosen = {m: choose_rate(runs, scale, m) for m in METHODS}
  cells = []
  for seed in scale.seeds:
    for cluster in scale.clusters:
      for method in METHODS:
        lr = chosen[method]
        if lr is None or (method == "ar_sgd" and cluster != "HO" and seed != scale.seeds[0]):
          continue
        cells.append(Cell("final", method, cluster, seed, lr))
  return cells


def explore_cells(runs: dict[str, dict], scale: Scale) -> list[Cell]:
  """Exploratory, after the pre-registered cells: each tuned variant at its chosen rate with
  other periods and alphas, and ``scale.extra`` (validation, tuning seeds, HO)."""
  cells = []
  for method in VARIANTS:
    lr = choose_rate(runs, scale, method)
    if lr is None:
      continue
    options = [(p, 0.5) for p in scale.periods] + [(4, a) for a in scale.alphas]
    for period, alpha in options:
      for seed in scale.tune_seeds:
        cells.append(Cell("explore", method, scale.clusters[0], seed, lr, period, alpha))
  for method, lr in scale.extra:
    for seed in scale.tune_seeds:
      cells.append(Cell("explore", method, scale.clusters[0], seed, lr))
  return cells


def run_cell(cell: Cell, scale: Scale, cache_dir: Path) -> dict[str, Any]:
  preset = dataclasses.replace(training.PRESETS[scale.preset], num_evals=scale.num_evals)
  evaluate_on = "test" if cell.group == "final" else "validation"  # tuning: validation accuracy
  run = training.simulate_held_out(
    preset,
    make_algorithm(cell, preset.num_workers),
    cell.cluster,
    cell.seed,
    cache_dir,
    scale.num_validation,
    evaluate_on,
  )
  return {"cell": dataclasses.asdict(cell), **run}


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


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
  return {key: training.accuracy_at(r, fastest[key[1]]) for key, r in here.items()}


def _final_table(runs: dict[str, dict], scale: Scale) -> str:
  rows = []
  for cluster in scale.clusters:
    at_first = _when_fastest_finishes(runs, cluster)
    for method in METHODS:
      mine = list(_final(runs, method, cluster).values())
      if not mine:
        continue
      hits = [t for t in (training.time_to(r, training.TARGET) for r in mine) if t is not None]
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
    f"time to {training.TARGET}",
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
  n = training.PRESETS[scale.preset].num_workers
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


def report(runs: dict[str, dict], scale: Scale) -> str:
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
  parts += training.not_run_note([*tune, *final, *explore_cells(runs, scale)], runs)
  return "\n".join(parts)


def plot(runs: dict[str, dict], path: Path, scale: Scale) -> bool:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

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
  training.save_figure(fig, path)
  return True


def passes(runs: dict[str, dict], scale: Any) -> list[Callable[[], list[Any]]]:
  """The final and exploratory cells exist once a method is tuned: one pass each."""
  return [
    lambda: tuning_cells(scale),
    lambda: final_cells(runs, scale),
    lambda: explore_cells(runs, scale),
  ]


def main(argv: Sequence[str] | None = None) -> str:
  return training.study_main(
    argv,
    __doc__.splitlines()[0],
    DEFAULT_OUT,
    SCALES,
    passes,
    run_cell,
    report,
    plot,
    "accuracy_vs_time.png",
  )


if __name__ == "__main__":
  main()
