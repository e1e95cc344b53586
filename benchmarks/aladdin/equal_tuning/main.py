"""The second ALADDIN study: the five algorithms at equal tuning, with ALADDIN's recipe defaults.

Retired (``RESULTS.md``): its rates were chosen on the test set; ``../baselines/main.py`` asks
the same question with every rate chosen on a validation split. The code stays: other studies
import ``TARGET``, ``time_to`` and ``accuracy_at``, and it reruns the old grid.

Setting (the first study's, ``../training.py``): 8 simulated workers (4 machines x 2), the CNN
on MNIST-1D (4,000 training examples, batch 32 per worker), the paper's cluster ratios scaled to
the CNN, +-10% compute jitter; clusters HO, HE1 (worker 0 x10 slower), HE2 (x100).

Row sets (cells ``group/algorithm/cluster/epochs/seed``):

* ``equal``: one learning rate for all (0.1): the workers' ``al.local_optimizer(0.1)`` for
  ALADDIN (with ``al.Aladdin``'s defaults, the recipe), AR-SGD, EASGD and SGP; ASP's server
  ``optax.sgd(0.1, momentum=0.9)`` (the paper's momentum server); budgets 15 and 45 epochs.
* ``sweep``: the same at 0.0125, 0.025, 0.05 and 0.2, so that each method's best of the same
  sweep is known (both are reported: the common rate and each method's best).
* ``paper``: the paper's recipe: eta = 0.01 x n, linear warm-up over the first 8% of the budget,
  x0.1 at 60% (the paper's 20 and 150 of 250 epochs), the same for every algorithm.
* ``ablation`` (HE1): L1 = ``period=1, alpha="count"`` (every merge has c~ = 1, so alpha = 0:
  local training only, while x~ still moves at every message), L2 = ``period=1`` with a reply
  every 4 messages and alpha ``"n_pi"`` (PS-triggered merges without the lazy global update),
  full = the recipe.

Usage::

  python -m benchmarks.aladdin.equal_tuning.main                 # resumable: skips finished cells
  python -m benchmarks.aladdin.equal_tuning.main --max_cells 20  # the next 20 cells by priority
  python -m benchmarks.aladdin.equal_tuning.main --report_only   # tables, plot: finished cells
  python -m benchmarks.aladdin.equal_tuning.main --smoke --out /tmp/s   # the CI smoke version

Outputs in ``--out``: ``runs.json`` (one summary per finished cell), ``tables.md``,
``accuracy_vs_time.png``, ``machine.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import optax

from benchmarks import harness
from benchmarks.aladdin import training
from optax_lena import aladdin as al
from optax_lena.aladdin import simulator as sim

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
ALGORITHMS = ("aladdin", "ar_sgd", "asp", "easgd", "sgp")
LABELS = training.LABELS
TARGET = 0.8  # test accuracy for the time-to-target column


@dataclasses.dataclass(frozen=True)
class Scale:
  preset: str
  clusters: tuple[str, ...]
  seeds: tuple[int, ...]
  budgets: tuple[int, ...]
  lr: float
  sweep: tuple[float, ...]


SCALES = {
  "default": Scale(
    "default", ("HO", "HE1", "HE2"), (0, 1, 2), (15, 45), 0.1, (0.05, 0.2, 0.025, 0.0125)
  ),
  "smoke": Scale("smoke", ("HE1",), (0,), (1,), 0.05, (0.1,)),
}


@dataclasses.dataclass(frozen=True)
class Cell:
  group: str  # equal, sweep (with lr), paper, ablation (alg = L1 / L2 / full)
  alg: str
  cluster: str
  epochs: int
  seed: int
  lr: float

  @property
  def name(self) -> str:
    return f"{self.group}/{self.alg}/{self.cluster}/{self.epochs}ep/lr{self.lr:g}/seed{self.seed}"


def grid(scale: Scale) -> list[Cell]:
  """Every cell, in priority order: what a partial run has is the most useful part."""
  first, rest = scale.seeds[:1], scale.seeds[1:]
  short, longs = scale.budgets[0], scale.budgets[1:]
  n = training.PRESETS[scale.preset].num_workers
  paper_lr = 0.01 * n
  cells: list[Cell] = []

  def add(group, algs, clusters, epochs, seeds, lr):
    for seed in seeds:
      for cluster in clusters:
        for alg in algs:
          cells.append(Cell(group, alg, cluster, epochs, seed, lr))

  add("equal", ALGORITHMS, scale.clusters, short, scale.seeds, scale.lr)
  for lr in scale.sweep:
    add("sweep", ALGORITHMS, scale.clusters[:1], short, first, lr)
  add("paper", ALGORITHMS, scale.clusters[:2], short, first, paper_lr)
  for epochs in longs:
    add("equal", ALGORITHMS, scale.clusters[:2], epochs, first, scale.lr)
  add("ablation", ("L1", "L2", "full"), (scale.clusters[min(1, len(scale.clusters) - 1)],),
      short, first, scale.lr)  # fmt: skip
  # The rest: more seeds and clusters of every row set.
  for lr in scale.sweep:
    add("sweep", ALGORITHMS, scale.clusters[:1], short, rest, lr)
  add("paper", ALGORITHMS, scale.clusters, short, rest, paper_lr)
  add("paper", ALGORITHMS, scale.clusters[2:], short, first, paper_lr)
  for epochs in longs:
    add("equal", ALGORITHMS, scale.clusters[2:], epochs, first, scale.lr)
    add("equal", ALGORITHMS, scale.clusters, epochs, rest, scale.lr)
    add("paper", ALGORITHMS, scale.clusters, epochs, scale.seeds, paper_lr)
  add("ablation", ("L1", "L2", "full"), scale.clusters[1:2], short, rest, scale.lr)
  seen: set[str] = set()
  return [c for c in cells if not (c.name in seen or seen.add(c.name))]


def paper_schedule(lr: float, steps_per_epoch: float, epochs: int) -> optax.Schedule:
  """Linear warm-up over 8% of the budget, then ``lr``, x0.1 from 60% on (the paper's 20 and 150
  of 250 epochs)."""
  warmup = max(1, round(0.08 * epochs * steps_per_epoch))
  decay = max(warmup + 1, round(0.6 * epochs * steps_per_epoch))
  return optax.join_schedules(
    [
      optax.linear_schedule(0.0, lr, warmup),
      optax.piecewise_constant_schedule(lr, {decay - warmup: 0.1}),
    ],
    [warmup],
  )


def make_algorithm(cell: Cell, train_size: int, n: int, batch: int) -> sim.Algorithm:
  lr: optax.ScalarOrSchedule = cell.lr
  server_lr: optax.ScalarOrSchedule = cell.lr
  if cell.group == "paper":
    lr = paper_schedule(cell.lr, train_size / (n * batch), cell.epochs)  # one step per n batches
    server_lr = paper_schedule(cell.lr, train_size / batch, cell.epochs)  # ASP: one per batch
  worker_tx = al.local_optimizer(lr)
  if cell.group == "ablation":
    options = {
      "L1": dict(period=1, alpha="count"),
      "L2": dict(period=1, reply_every=4, alpha="n_pi"),
      "full": {},
    }[cell.alg]
    return sim.algorithm("aladdin", worker_tx=worker_tx, label=cell.alg, **options)
  if cell.alg == "asp":
    return sim.algorithm("asp", server_tx=optax.sgd(server_lr, momentum=0.9))
  return sim.algorithm(cell.alg, worker_tx=worker_tx)


def run_cell(cell: Cell, scale: Scale, cache_dir: Path) -> dict[str, Any]:
  preset = training.PRESETS[scale.preset]
  problem = training.make_problem(preset, cell.seed, cache_dir)
  nbytes = float(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(problem.params)))
  cluster = training.training_cluster(preset, cell.cluster, nbytes)
  train_size = len(problem.x_train)
  result = sim.simulate(
    make_algorithm(cell, train_size, preset.num_workers, preset.batch_size),
    cluster,
    batch_size=preset.batch_size,
    problem=problem,
    num_samples=cell.epochs * train_size,
    num_evals=preset.num_evals,
    seed=cell.seed,
  )

  def finite(x: float) -> float | None:
    return None if math.isnan(x) else x

  return {
    "cell": dataclasses.asdict(cell),
    "test_accuracy": result.evals[-1].test_accuracy,
    "local_accuracy": finite(result.evals[-1].local_accuracy),
    "time": result.time,
    "wait_fraction": sum(result.wait_time) / (len(result.wait_time) * result.time),
    "curve": [[p.time, p.test_accuracy, finite(p.local_accuracy)] for p in result.evals],
    "wall_time": result.wall_time,
  }


def accuracy_at(run: dict[str, Any], time: float) -> float:
  acc = math.nan
  for t, a, _ in run["curve"]:
    if t <= time + 1e-9:
      acc = a
  return acc


def time_to(run: dict[str, Any], target: float) -> float | None:
  return next((t for t, a, _ in run["curve"] if a >= target), None)


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


def _select(runs: dict[str, dict], **match: Any) -> list[dict]:
  return [r for r in runs.values() if all(r["cell"][k] == v for k, v in match.items())]


def _row_set_table(runs: dict[str, dict], group: str, epochs: int, lr: float) -> str | None:
  chosen = _select(runs, group=group, epochs=epochs, lr=lr)
  if not chosen:
    return None
  clusters = [
    c for c in ("HO", "HE0", "HE1", "HE2") if any(r["cell"]["cluster"] == c for r in chosen)
  ]
  rows = []
  for cluster in clusters:
    here = [r for r in chosen if r["cell"]["cluster"] == cluster]
    # Per seed: when the fastest algorithm of this cluster finished.
    fastest = {}
    for r in here:
      seed = r["cell"]["seed"]
      fastest[seed] = min(fastest.get(seed, math.inf), r["time"])
    for alg in ALGORITHMS:
      mine = [r for r in here if r["cell"]["alg"] == alg]
      if not mine:
        continue
      hits = [t for t in (time_to(r, TARGET) for r in mine) if t is not None]
      locals_ = [r["local_accuracy"] for r in mine if r["local_accuracy"] is not None]
      rows.append([
        cluster,
        LABELS[alg],
        harness.mean_std([r["test_accuracy"] for r in mine], ".3f"),
        harness.mean_std(locals_, ".3f") if locals_ else "—",
        harness.mean_std_reached(hits, len(mine)),
        harness.mean_std([accuracy_at(r, fastest[r["cell"]["seed"]]) for r in mine], ".3f"),
        harness.mean_std([r["time"] for r in mine], ".0f"),
        len(mine),
      ])  # fmt: skip
  header = ["cluster", "algorithm", "global model", "mean of local models", f"time to {TARGET}"]
  header += ["acc. when the fastest finishes", "time to finish", "seeds"]
  return harness.markdown_table(header, rows)


def _sweep_table(runs: dict[str, dict], scale: Scale) -> str | None:
  epochs = scale.budgets[0]
  rates = sorted({scale.lr, *scale.sweep})
  rows = []
  for cluster in scale.clusters[:1]:
    for alg in ALGORITHMS:
      accs = {}
      for lr in rates:
        group = "equal" if lr == scale.lr else "sweep"
        mine = _select(runs, group=group, alg=alg, cluster=cluster, epochs=epochs, lr=lr)
        if mine:
          accs[lr] = [r["test_accuracy"] for r in mine]
      if not accs:
        continue
      best = max(accs, key=lambda lr: sum(accs[lr]) / len(accs[lr]))
      cells = [harness.mean_std(accs[lr], ".3f") if lr in accs else "—" for lr in rates]
      rows.append([cluster, LABELS[alg], *cells, f"{best:g}"])
  if not rows:
    return None
  header = ["cluster", "algorithm", *[f"lr {lr:g}" for lr in rates], "best lr"]
  return harness.markdown_table(header, rows)


def _ablation_table(runs: dict[str, dict]) -> str | None:
  chosen = _select(runs, group="ablation")
  if not chosen:
    return None
  rows = []
  for variant in ("L1", "L2", "full"):
    mine = [r for r in chosen if r["cell"]["alg"] == variant]
    if mine:
      locals_ = [r["local_accuracy"] for r in mine if r["local_accuracy"] is not None]
      rows.append([
        variant,
        mine[0]["cell"]["cluster"],
        harness.mean_std([r["test_accuracy"] for r in mine], ".3f"),
        harness.mean_std(locals_, ".3f"),
        len(mine),
      ])  # fmt: skip
  return harness.markdown_table(
    ["variant", "cluster", "global model", "mean of local models", "seeds"], rows
  )


def report(runs: dict[str, dict], scale: Scale, grid_cells: Sequence[Cell]) -> str:
  done = sum(c.name in runs for c in grid_cells)
  parts = [f"# Second ALADDIN study: {done} of {len(grid_cells)} cells finished\n"]
  row_sets = sorted(
    {(r["cell"]["group"], r["cell"]["epochs"], r["cell"]["lr"]) for r in runs.values()}
  )
  for group, epochs, lr in row_sets:
    if group not in ("equal", "paper"):
      continue
    table = _row_set_table(runs, group, epochs, lr)
    what = "one learning rate for all" if group == "equal" else "the paper's recipe, eta = 0.01 n"
    parts.append(f"## {group}: {what}, lr {lr:g}, {epochs} epochs\n\n{table}\n")
  for title, table in (
    ("Learning-rate sweep (each method's best)", _sweep_table(runs, scale)),
    ("Ablation", _ablation_table(runs)),
  ):
    if table:
      parts.append(f"## {title}\n\n{table}\n")
  missing = [c.name for c in grid_cells if c.name not in runs]
  if missing:
    parts.append(f"Not run yet ({len(missing)} cells), e.g. `{missing[0]}`.\n")
  return "\n".join(parts)


def plot(runs: dict[str, dict], path: Path, scale: Scale) -> bool:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  clusters = [
    c
    for c in scale.clusters
    if _select(runs, group="equal", cluster=c, seed=scale.seeds[0], epochs=scale.budgets[0])
  ]
  if not clusters:
    return False
  fig, axes = plt.subplots(1, len(clusters), figsize=(4.5 * len(clusters), 3.5), squeeze=False)
  for ax, cluster in zip(axes[0], clusters, strict=True):
    for alg in ALGORITHMS:
      mine = _select(
        runs, group="equal", alg=alg, cluster=cluster, seed=scale.seeds[0], epochs=scale.budgets[0]
      )
      if mine:
        curve = mine[0]["curve"]
        ax.plot([p[0] for p in curve], [p[1] for p in curve], label=LABELS[alg])
    ax.set_xscale("symlog", linthresh=10)
    ax.set_title(f"{cluster}, {scale.budgets[0]} epochs, seed {scale.seeds[0]}")
    ax.set_xlabel("simulated time (worker iterations)")
    ax.set_ylabel("test accuracy (global model)")
    ax.grid(alpha=0.3)
  axes[0][0].legend(fontsize=8)
  fig.tight_layout()
  training.save_figure(fig, path)
  return True


def main(argv: Sequence[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
  parser.add_argument("--cache_dir", type=Path, default=Path.home() / ".cache" / "mnist1d")
  parser.add_argument("--smoke", action="store_true", help="the tiny CI version")
  parser.add_argument("--max_cells", type=int, default=None, help="run at most this many")
  parser.add_argument("--match", default="", help="run only the cells whose name contains this")
  parser.add_argument("--report_only", action="store_true")
  args = parser.parse_args(argv)
  scale = SCALES["smoke" if args.smoke else "default"]
  args.out.mkdir(parents=True, exist_ok=True)
  cells = grid(scale)
  path = harness.summaries_path(args.out)
  runs = harness.load_summaries(path)
  if not args.report_only:
    trained, _ = harness.run_summaries(
      [c for c in cells if args.match in c.name],
      lambda cell: run_cell(cell, scale, args.cache_dir),
      runs,
      lambda summaries: harness.save_summaries(path, summaries),
      limit=args.max_cells,
    )
    if trained:
      harness.write_json(args.out / "machine.json", harness.machine_info())
  text = report(runs, scale, cells)
  harness.write_text(args.out / "tables.md", text)
  plot(runs, args.out / "accuracy_vs_time.png", scale)
  print(text)
  return text


if __name__ == "__main__":
  main()
