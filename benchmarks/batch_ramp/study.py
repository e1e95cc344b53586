"""Batch ramps against fixed S at equal samples: the MNIST-1D CNN trainer (issue 36 item 3).

Five arms of the trainer's ``batch_ramp`` (``examples/lena/ramp.py``), each over the same
examples (``num_epochs`` epochs) and the same seeds (a seed fixes the initialisation and the
data order):

* ``small``: fixed S = ``small`` per-worker gradients (``steps:0:S``, the ramp's loop at one S,
  bitwise the fixed trainer: same budget rule and timing for every arm);
* ``large``: fixed S = ``large``;
* ``steps``: S doubles from ``small`` to ``large`` at the ``step_fractions`` of the examples
  (the update indices are computed from the budget);
* ``noise``: ``noise:every=N,max=large`` from S = ``small`` (S follows the state's B_crit);
* ``seesaw``: ``seesaw:max=large`` from S = ``small`` (S doubles, rate x sqrt(2), wherever the
  decay has halved the rate).

Every run evaluates on a validation split held out of the training set once per epoch; the
target accuracy is a validation accuracy fixed in the setup before the study ran (never chosen
on the test set), and the updates to it are interpolated linearly between the evaluations
around the first crossing. The final state is evaluated once on the test split. Time per
sample is the run's wall time (training, each S's compilation and the per-epoch evaluations)
over its examples. Each arm is compared with ``small`` seed by seed
(``benchmarks/paired_intervals.py``: Student t, n - 1 degrees of freedom).

Usage::

  python -m benchmarks.batch_ramp.study                 # the study (RESULTS.md: its duration)
  python -m benchmarks.batch_ramp.study --quick --out /tmp/ramp   # seconds: the smoke test's
  python -m benchmarks.batch_ramp.study --report_only   # table and plots from summary.json

A stopped study resumes: finished runs are kept in ``summary.json`` after every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.paired_intervals import Paired, paired_by_seed

DEFAULT_OUT = "benchmarks/batch_ramp/results"
ARMS = ("small", "large", "steps", "noise", "seesaw")


@dataclasses.dataclass(frozen=True)
class Setup:
  """The study's sizes, all fixed before it runs (``quick()``: the smoke test's)."""

  config: str = "default"  # the trainer's MNIST-1D CNN configuration
  num_epochs: int = 30
  num_validation: int = 1000  # training examples held out: the target is read off these
  small: int = 2  # S of the small fixed batch and every ramp's first S
  large: int = 16  # S of the large fixed batch and every ramp's largest S
  step_fractions: tuple[float, ...] = (0.25, 0.5, 0.75)  # 'steps': S doubles at these
  noise_every: int = 50  # 'noise': updates between readings of B_crit
  seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
  # A validation accuracy, fixed before the study from a pilot run of 'small' on seed 100
  # (outside `seeds`): about two points below its final one (RESULTS.md gives the pilot).
  target: float = 0.92
  mnist1d_samples: int = 10_000
  per_worker_batch: int = 0  # 0: the configuration's
  width: int = 0  # CNN features; 0: the configuration's
  rng_impl: str = "default"
  cache_dir: str = "data_cache"


def quick(cache_dir: str = "data_cache") -> Setup:
  """A seconds-long setup for the smoke test (two seeds, so that intervals exist)."""
  return Setup(
    num_epochs=2,
    num_validation=200,
    small=1,
    large=4,
    noise_every=3,
    seeds=(0, 1),
    target=0.15,
    mnist1d_samples=1000,
    per_worker_batch=16,
    width=8,
    rng_impl="rbg",
    cache_dir=cache_dir,
  )


@dataclasses.dataclass(frozen=True)
class Run:
  arm: str
  seed: int

  @property
  def name(self) -> str:
    return f"{self.arm}_seed{self.seed}"


def runs_of(setup: Setup) -> list[Run]:
  """Seed-major order: a change of the machine's load during the study falls on every arm."""
  return [Run(arm, seed) for seed in setup.seeds for arm in ARMS]


def step_schedule(small: int, large: int, fractions: Sequence[float], batches: float) -> str:
  """``steps:0:S0,U1:S1,...``: S doubles from ``small`` (capped at ``large``) when the
  examples reach each of ``fractions`` of the budget (``batches`` per-worker batches).

  Update ``U_i`` is the first update whose examples reach ``fractions[i] x batches``."""
  s, u, seen, entries = small, 0, 0.0, [f"0:{small}"]
  for f in fractions:
    if 2 * s > large:
      break
    # Updates of S until the examples reach this fraction (a ceiling: never before it).
    n = math.ceil((f * batches - seen) / s - 1e-9)
    u, seen, s = u + n, seen + n * s, 2 * s
    entries.append(f"{u}:{s}")
  return "steps:" + ",".join(entries)


def crossing(evals: Sequence[Sequence[float]], target: float) -> float | None:
  """The (fractional) update where the accuracy first reaches ``target``, linear between the
  evaluation before and the first at or above it (None: never). ``evals``: ``(update,
  accuracy)`` pairs in order; before the first evaluation the curve starts at update 0 with
  the first accuracy."""
  prev_u, prev_a = 0.0, None
  for u, a in evals:
    if a >= target:
      if prev_a is None or a == prev_a:
        return float(u)
      return float(prev_u + (target - prev_a) / (a - prev_a) * (u - prev_u))
    prev_u, prev_a = float(u), a
  return None


# ----------------------------------------------------------------------------------------------
# Training (the trainer as a library)
# ----------------------------------------------------------------------------------------------


def base_config(setup: Setup, seed: int) -> Any:
  from examples import lena

  config = lena.get_config(setup.config)
  changes: dict[str, Any] = {
    "num_epochs": setup.num_epochs,
    "num_steps": 0,
    "eval_every": 0,  # once per epoch: evaluations equally spaced in examples in every arm
    "num_validation": setup.num_validation,
    "eval_split": "validation",
    "mnist1d_num_samples": setup.mnist1d_samples,
    "cache_dir": setup.cache_dir,
    "seed": seed,
    "rng_impl": setup.rng_impl,
    "progress_bar": False,
    "log_every": 0,
    "checkpoint_every": 0,
  }
  if setup.per_worker_batch:
    changes["per_worker_batch"] = setup.per_worker_batch
  if setup.width:
    changes["width"] = setup.width
  return dataclasses.replace(config, **changes)


def ramp_of(setup: Setup, arm: str, num_train: int, per_worker_batch: int) -> str:
  """The ``batch_ramp`` of an arm."""
  if arm == "small":
    return f"steps:0:{setup.small}"
  if arm == "large":
    return f"steps:0:{setup.large}"
  if arm == "steps":
    batches = setup.num_epochs * num_train / per_worker_batch
    return step_schedule(setup.small, setup.large, setup.step_fractions, batches)
  if arm == "noise":
    return f"noise:every={setup.noise_every},max={setup.large}"
  if arm == "seesaw":
    return f"seesaw:max={setup.large}"
  raise ValueError(f"Unknown arm {arm!r}; valid arms: {', '.join(ARMS)}.")


def train_run(setup: Setup, run: Run) -> dict[str, Any]:
  """Trains one run in a temporary directory and returns its summary."""
  from examples import input_pipeline, lena, metrics

  config = base_config(setup, run.seed)
  num_train = input_pipeline.create_dataset(config, 1).num_train
  spec = ramp_of(setup, run.arm, num_train, config.per_worker_batch)
  config = dataclasses.replace(config, batch_ramp=spec, batch_scale=setup.small)
  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory() as workdir:
    state = lena.train_and_evaluate(config, workdir)
    evals = metrics.read_metrics(workdir)
  seconds = time.perf_counter() - t0
  last = evals[-1]
  curve = [
    [r["iteration"], r["samples_seen"], r["num_samples"], r["eval_accuracy"], r["wall_time"]]
    for r in evals
  ]
  reach = crossing([(c[0], c[3]) for c in curve], setup.target)
  return {
    "arm": run.arm,
    "seed": run.seed,
    "batch_ramp": spec,
    "first_num_samples": setup.large if run.arm == "large" else setup.small,
    "per_worker_batch": config.per_worker_batch,
    "num_train": num_train,
    # [update, examples seen, S of the last update, validation accuracy, wall seconds]
    "evals": curve,
    "updates": last["iteration"],
    "samples": last["samples_seen"],
    "final_validation_accuracy": last["eval_accuracy"],
    "updates_to_target": reach,
    "wall_time": last["wall_time"],
    "seconds_per_sample": last["wall_time"] / last["samples_seen"],
    "process_seconds": seconds,  # with the initialisation and the test evaluation
    **{f"test_{k}": v for k, v in lena.evaluate_split(config, state, "test").items()},
  }


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


def steady_seconds_per_sample(run: dict[str, Any]) -> float:
  """The median over epochs (but the first) of the wall time per example: without the
  compilations, which fall in the first epoch and in the epochs where a ramp meets a new S."""
  c = run["evals"]
  return statistics.median(
    (c[i][4] - c[i - 1][4]) / (c[i][1] - c[i - 1][1]) for i in range(1, len(c))
  )


def by_seed(result: dict[str, Any], arm: str, key: str) -> dict[int, float]:
  """seed -> ``key`` of the arm's runs (those where it is not None); the key
  ``steady_seconds_per_sample`` is :func:`steady_seconds_per_sample`."""
  get = lambda r: steady_seconds_per_sample(r) if key == "steady_seconds_per_sample" else r[key]
  return {
    r["seed"]: get(r) for r in result["runs"].values() if r["arm"] == arm and get(r) is not None
  }


def reduction(result: dict[str, Any], arm: str, key: str) -> dict[int, float]:
  """seed -> ``1 - arm / small`` of ``key`` (the fraction of the small batch's saved)."""
  a, b = by_seed(result, arm, key), by_seed(result, "small", key)
  return {s: 1.0 - a[s] / b[s] for s in sorted(set(a) & set(b))}


def comparisons(result: dict[str, Any]) -> dict[str, dict[str, Paired | None]]:
  """Per arm but ``small``, paired by seed: the test accuracy minus small's (and large's), the
  fraction of small's updates saved (in all, and to the target, over the seeds where both
  reached it) and the time per sample minus small's. None where no seed has both sides."""

  def pair(a: dict[int, float], b: dict[int, float] | None = None) -> Paired | None:
    b = {s: 0.0 for s in a} if b is None else b  # a fraction saved is already a difference
    return paired_by_seed(a, b) if set(a) & set(b) else None

  acc = lambda arm: by_seed(result, arm, "test_accuracy")
  per_sample = lambda arm, key="seconds_per_sample": by_seed(result, arm, key)
  steady = "steady_seconds_per_sample"
  return {
    arm: {
      "test_accuracy": pair(acc(arm), acc("small")),
      "vs_large": None if arm == "large" else pair(acc(arm), acc("large")),
      "updates_saved": pair(reduction(result, arm, "updates")),
      "target_updates_saved": pair(reduction(result, arm, "updates_to_target")),
      "seconds_per_sample": pair(per_sample(arm), per_sample("small")),
      steady: pair(per_sample(arm, steady), per_sample("small", steady)),
    }
    for arm in ARMS[1:]
  }


def _cell(p: Paired | None, digits: int, scale: float) -> str:
  return "—" if p is None else p.format(digits, scale)


def _goal(p: Paired | None, bound: float, scale: float) -> str:
  """Whether the interval (``yes``), only the mean (``mean only``) or neither is >= bound."""
  if p is None:
    return "no seed reached the target"
  if p.n > 1 and p.low >= bound:
    return "yes"
  return "mean only" if p.mean >= bound else f"no (mean {p.mean * scale:+.1f})"


def tables(result: dict[str, Any]) -> str:
  """The Markdown tables of a result: per arm, paired against small, and the goal."""
  setup, runs = result["setup"], list(result["runs"].values())
  seeds = sorted({r["seed"] for r in runs})
  header = [
    "arm",
    "batch_ramp",
    "S range",
    "updates",
    "final validation acc",
    "test acc",
    f"updates to {setup['target']:.2f} (validation)",
    "µs per sample",
    "µs per sample, median epoch",
  ]
  rows = []
  for arm in ARMS:
    mine = [r for r in runs if r["arm"] == arm]
    if not mine:
      continue
    sizes = [r["first_num_samples"] for r in mine] + [c[2] for r in mine for c in r["evals"]]
    hits = [r["updates_to_target"] for r in mine if r["updates_to_target"] is not None]
    rows.append(
      [
        arm,
        f"`{mine[0]['batch_ramp']}`",
        f"{min(sizes)}-{max(sizes)}" if min(sizes) != max(sizes) else str(sizes[0]),
        harness.mean_std([r["updates"] for r in mine], ".0f"),
        harness.mean_std([r["final_validation_accuracy"] for r in mine]),
        harness.mean_std([r["test_accuracy"] for r in mine]),
        harness.mean_std_reached(hits, len(mine)),
        harness.mean_std([1e6 * r["seconds_per_sample"] for r in mine], ".1f"),
        harness.mean_std([1e6 * steady_seconds_per_sample(r) for r in mine], ".1f"),
      ]
    )
  per_arm = harness.markdown_table(header, rows)
  comp = comparisons(result)
  paired_rows = [
    [
      arm,
      _cell(c["test_accuracy"], 2, 100),
      _cell(c["vs_large"], 2, 100),
      _cell(c["updates_saved"], 1, 100),
      _cell(c["target_updates_saved"], 1, 100),
      _cell(c["seconds_per_sample"], 2, 1e6),
      _cell(c["steady_seconds_per_sample"], 2, 1e6),
    ]
    for arm, c in comp.items()
  ]
  paired_table = harness.markdown_table(
    [
      "arm",
      "test acc - small (points)",
      "test acc - large (points)",
      "updates saved vs small (%)",
      "updates to target saved vs small (%)",
      "µs per sample - small",
      "µs per sample, median epoch - small",
    ],
    paired_rows,
  )
  goal_rows = [
    [
      arm,
      _goal(c["test_accuracy"], -0.01, 100),
      _goal(c["target_updates_saved"], 0.40, 100),
      _goal(c["updates_saved"], 0.40, 100),
      "—" if c["vs_large"] is None else c["vs_large"].verdict("yes", "no: behind large"),
    ]
    for arm, c in comp.items()
    if arm not in ("small", "large")
  ]
  goal_table = harness.markdown_table(
    [
      "ramp",
      "test acc >= small - 1 point",
      ">= 40% fewer updates to target",
      ">= 40% fewer updates in all",
      "test acc > large",
    ],
    goal_rows,
  )
  note = (
    f"Seeds {seeds}; differences paired by seed, mean [95% Student-t interval, n - 1 degrees of "
    "freedom]; 'yes' = the interval clears the bound, 'mean only' = the mean does."
  )
  return "\n\n".join([per_arm, paired_table, goal_table, note])


def mean_curves(result: dict[str, Any], arm: str) -> tuple[list[float], list[float], list[float]]:
  """Per evaluation (one per epoch, so the same examples in every seed): the mean update,
  epoch and validation accuracy over the arm's seeds."""
  mine = [r for r in result["runs"].values() if r["arm"] == arm]
  n = min(len(r["evals"]) for r in mine)
  mean = lambda i, k: sum(r["evals"][i][k] for r in mine) / len(mine)
  epochs = [mean(i, 1) / mine[0]["num_train"] for i in range(n)]
  return [mean(i, 0) for i in range(n)], epochs, [mean(i, 3) for i in range(n)]


def plots(result: dict[str, Any], out: Path) -> list[Path]:
  """Accuracy against updates, S against examples, and the paired differences (PNG)."""
  from examples import analysis

  plt = analysis.pyplot()
  present = [a for a in ARMS if any(r["arm"] == a for r in result["runs"].values())]
  target = result["setup"]["target"]
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for arm in present:
    updates, _, acc = mean_curves(result, arm)
    ax.plot(updates, acc, marker=".", label=arm, color=f"C{ARMS.index(arm)}")
  ax.axhline(target, color="gray", ls=":", lw=1, label=f"target {target:.2f}")
  ax.set(xscale="log", xlabel="updates", ylabel="validation accuracy (mean over seeds)")
  ax.set(title="Equal examples: accuracy against updates")
  ax.set_ylim(max(0.0, target - 0.3), None)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  out.mkdir(parents=True, exist_ok=True)
  paths = [analysis.save_figure(fig, out / "accuracy_vs_updates.png", dpi=110)]

  fig, ax = plt.subplots(figsize=(7, 4.5))
  for arm in present:
    i = ARMS.index(arm)
    for j, r in enumerate(r for r in result["runs"].values() if r["arm"] == arm):
      epochs = [0.0] + [c[1] / r["num_train"] for c in r["evals"]]
      sizes = [r["first_num_samples"]] + [c[2] for c in r["evals"]]
      ax.step(epochs, sizes, where="pre", color=f"C{i}", alpha=0.6, label=arm if j == 0 else None)
  ax.set(yscale="log", xlabel="epoch", ylabel="S (per-worker batches per update)")
  ax.set(title="S at each evaluation (every seed)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  paths.append(analysis.save_figure(fig, out / "batch_vs_examples.png", dpi=110))

  comp = comparisons(result)
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
  for ax, key, scale, label in (
    (axes[0], "test_accuracy", 100, "test acc - small (points)"),
    (axes[1], "target_updates_saved", 100, "updates to target saved vs small (%)"),
  ):
    for k, arm in enumerate(comp):
      p = comp[arm][key]
      if p is None or p.n < 2:
        continue
      ax.errorbar(
        [p.mean * scale],
        [k],
        xerr=[[(p.mean - p.low) * scale], [(p.high - p.mean) * scale]],
        fmt="o",
        capsize=3,
        color=f"C{ARMS.index(arm)}",  # the arm's colour in the other plots
      )
    ax.axvline(-1.0 if key == "test_accuracy" else 40.0, color="gray", ls=":", lw=1)
    ax.axvline(0.0, color="k", lw=0.5)
    ax.set(yticks=range(len(comp)), yticklabels=list(comp), xlabel=label)
    ax.grid(alpha=0.3)
  fig.suptitle("Paired by seed against small: mean and 95% interval (dotted: the goal)")
  paths.append(analysis.save_figure(fig, out / "paired.png", dpi=110))
  return paths


def report(result: dict[str, Any], out: Path) -> str:
  """Writes ``table.md`` and the plots of ``result`` into ``out``; returns the tables."""
  text = tables(result)
  harness.write_text(out / "table.md", text + "\n")
  plots(result, out)
  return text


# ----------------------------------------------------------------------------------------------
# The study
# ----------------------------------------------------------------------------------------------


def setup_of(record: dict[str, Any]) -> Setup:
  """The ``Setup`` of a summary's ``setup`` field (JSON lists back to tuples)."""
  fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
  return Setup(**fields)


def run_study(setup: Setup, out: Path, limit: int | None = None) -> dict[str, Any]:
  """Trains the unfinished runs of ``setup`` into ``out/summary.json`` (saved after every
  run, so a stopped study resumes) and returns the result."""
  path = out / "summary.json"
  result: dict[str, Any] = {"setup": dataclasses.asdict(setup), "runs": {}}
  if path.exists():
    previous = harness.load_summaries(path)
    if setup_of(previous["setup"]) != setup:
      raise ValueError(
        f"{path} holds a study of another setup; use another --out or delete it to restart."
      )
    result["runs"] = previous["runs"]
  result["recorded"] = harness.recorded()
  result["machine"] = harness.machine_info()

  def save(runs: dict[str, Any]) -> None:
    result["runs"] = runs
    harness.write_json(path, result, sort_keys=True)

  harness.run_summaries(
    runs_of(setup),
    lambda run: train_run(setup, run),
    result["runs"],
    save,
    limit=limit,
    describe=lambda s: (
      f"{s['updates']} updates, test acc {s['test_accuracy']:.4f}, "
      f"{1e6 * s['seconds_per_sample']:.1f} µs/sample"
    ),
  )
  save(result["runs"])
  return result


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
  parser.add_argument("--out", default=DEFAULT_OUT)
  parser.add_argument("--quick", action="store_true", help="the smoke test's sizes")
  parser.add_argument(
    "--report_only", action="store_true", help="table and plots from OUT/summary.json"
  )
  parser.add_argument("--limit", type=int, default=None, help="train at most this many runs")
  parser.add_argument(harness.SYSTEM_MALLOC_FLAG, action="store_true")
  args = parser.parse_args(argv)
  out = Path(args.out)
  if args.report_only:
    result = harness.load_summaries(out / "summary.json")
  else:
    harness.reexec_with_caching_malloc()  # steadier time per sample
    result = run_study(quick() if args.quick else Setup(), out, args.limit)
  print(report(result, out))


if __name__ == "__main__":
  main()
