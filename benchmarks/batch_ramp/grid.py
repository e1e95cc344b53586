"""Batch ramps against fixed S at equal samples: the trainer on MNIST-1D (issue 36 item 3).

Two declared setups: ``cnn`` (the default: the trainer's 1D CNN, momentum SGD with LENA) and
``attention`` (``--setup attention``: the small attention model of ``benchmarks/adamw_scaling``
with LENA around AdamW, ``examples/lena/configs/mnist1d_attention.py``), each with its own
output folder (``results/``, ``results/attention/``).

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
  python -m benchmarks.batch_ramp.study --setup attention --pilot   # small on the pilot seed
  python -m benchmarks.batch_ramp.study --setup attention          # and --report_only

A stopped study resumes: finished runs are kept in ``summary.json`` after every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.batch_ramp.report import (  # noqa: F401  (the study's report, re-exported)
  ARMS,
  by_seed,
  comparisons,
  mean_curves,
  plots,
  reduction,
  report,
  steady_seconds_per_sample,
  tables,
)

DEFAULT_OUT = "benchmarks/batch_ramp/results"
PILOT_SEED = 100  # outside every setup's seeds: the pilot that fixed the target


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
  # A validation accuracy, fixed before the study from a pilot run of 'small' on PILOT_SEED
  # (outside `seeds`): about two points below its final one (RESULTS.md gives the pilot).
  target: float = 0.92
  mnist1d_samples: int = 10_000
  per_worker_batch: int = 0  # 0: the configuration's
  width: int = 0  # CNN features; 0: the configuration's
  rng_impl: str = "default"
  cache_dir: str = "data_cache"


# The attention model at the CNN's sizes (its runs are short enough for the time budget); the
# target is about two points below the final validation accuracy of its pilot (`--pilot`).
ATTENTION = Setup(config="mnist1d_attention", target=0.82)
SETUPS = {"cnn": Setup(), "attention": ATTENTION}
OUTS = {"cnn": DEFAULT_OUT, "attention": f"{DEFAULT_OUT}/attention"}


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


def train_run(setup: Setup, run: Run, test: bool = True) -> dict[str, Any]:
  """Trains one run in a temporary directory and returns its summary (``test=False``: without
  the test split, as for the pilot that fixes the target)."""
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
    **(
      {f"test_{k}": v for k, v in lena.evaluate_split(config, state, "test").items()}
      if test
      else {}
    ),
  }


def pilot(setup: Setup, out: Path) -> dict[str, Any]:
  """Trains ``small`` on ``PILOT_SEED`` (validation only) into ``out/pilot.json``."""
  summary = train_run(setup, Run("small", PILOT_SEED), test=False)
  record = {"setup": dataclasses.asdict(setup), "recorded": harness.recorded(), "run": summary}
  harness.write_json(out / "pilot.json", record, sort_keys=True)
  return summary


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
  parser.add_argument("--setup", choices=tuple(SETUPS), default="cnn")
  parser.add_argument("--out", default=None, help="default: the setup's results folder")
  parser.add_argument("--quick", action="store_true", help="the smoke test's sizes")
  parser.add_argument(
    "--pilot", action="store_true", help="train small on the pilot seed into OUT/pilot.json"
  )
  parser.add_argument(
    "--report_only", action="store_true", help="table and plots from OUT/summary.json"
  )
  parser.add_argument("--limit", type=int, default=None, help="train at most this many runs")
  parser.add_argument(harness.SYSTEM_MALLOC_FLAG, action="store_true")
  args = parser.parse_args(argv)
  out = Path(args.out or OUTS[args.setup])
  setup = quick() if args.quick else SETUPS[args.setup]
  if args.pilot:
    summary = pilot(setup, out)
    curve = [(c[0], c[3]) for c in summary["evals"]]
    print(json.dumps({"final_validation_accuracy": curve[-1][1], "curve": curve}))
    return
  if args.report_only:
    result = harness.load_summaries(out / "summary.json")
  else:
    harness.reexec_with_caching_malloc()  # steadier time per sample
    result = run_study(setup, out, args.limit)
  print(report(result, out))


if __name__ == "__main__":
  main()
