"""The AdamW study's grid: its arms (``METHODS``), the rules' shared settings, and the phases of
runs, each joining once the runs it depends on have finished: AdamW's rate sweep at S = 8, the
grid of every rule (LAMB's rate swept on seed 0, its other seeds at that rate and its two
neighbours), the validation selection of AdamW's and LAMB's rates at every S (selection and
check seeds), and the final runs at the chosen rates with Malladi et al.'s rule."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness

SCALES = (8, 32, 128, 256)
ADAM_RATES = (1e-3, 3e-3, 1e-2, 3e-2)
LAMB_RATES = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
# At S >= 128 seed 0's best LAMB rate was the largest of LAMB_RATES: the sweep goes on there.
LAMB_LARGE_BATCH_RATES = (3e-1, 1.0)
LAMB_LARGE_BATCH_FROM = 128
EPOCHS = 8
NUM_SAMPLES = 10_000
SWEEP_METHOD = "adam_lsw"  # at S = 8 every rule has scale 1: this is plain AdamW
TUNED_METHOD = "adamw"  # plain AdamW with its own rate at every S
SELECTION_SEEDS = (100,)  # no reported seed: the rates are chosen on these ...
FINAL_SEEDS = (0, 1, 2, 3, 4)  # ... and reported (test accuracy) on these
# Added after the pre-registered selection had run (RESULTS.md says so): would a second
# selection seed have chosen the same rates?
CHECK_SEEDS = (100, 101)
SELECTED_METHODS = (TUNED_METHOD, "lamb")  # LAMB's validation selection: also added after
SELECTION_RATES = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)


PER_WORKER_BATCH = 8
REFERENCE_SCALE = 8  # the rate is tuned at S = 8 workers ...
REFERENCE_BATCH = REFERENCE_SCALE * PER_WORKER_BATCH  # ... i.e. at global batch 64
WEIGHT_DECAY = 1e-4
B1, B2, ADAM_EPS = 0.9, 0.999, 1e-8  # Adam's defaults at the reference batch
# The validation set is the test part of an independent MNIST-1D draw (another generation
# seed): held out from the seed-0 training and test sets by construction.
VALIDATION_SEED = 1
WARMUP_FRACTION = 0.05  # LSW's fixed warm-up and the state-aware theta: 5% of the base steps
NUM_EVALS = 10  # evaluations of the test split per run (one every total / NUM_EVALS updates)

# name: (label, kind, power, state-aware warm-up). kind "linear_scaling" gets LSW's fixed
# warm-up, "lamb" the same linear warm-up on its schedule.
METHODS: dict[str, tuple[str, str, float, bool]] = {
  "adam_lsw": ("Adam + LSW (linear)", "linear_scaling", 1.0, False),
  "adam_sqrt_lsw": ("Adam + sqrt LSW", "linear_scaling", 0.5, False),
  "lamb": ("LAMB (rate swept)", "lamb", 1.0, False),
  "adascale": ("AdaScale-AdamW p=1", "adascale", 1.0, False),
  "adascale_sqrt": ("AdaScale-AdamW p=1/2", "adascale", 0.5, False),
  "lena": ("LENA-AdamW p=1", "lena", 1.0, False),
  "lena_sqrt": ("LENA-AdamW p=1/2", "lena", 0.5, False),
  "adascale_sa": ("AdaScale-AdamW p=1 + SA warm-up", "adascale", 1.0, True),
  "adascale_sqrt_sa": ("AdaScale-AdamW p=1/2 + SA warm-up", "adascale", 0.5, True),
  "lena_sa": ("LENA-AdamW p=1 + SA warm-up", "lena", 1.0, True),
  "lena_sqrt_sa": ("LENA-AdamW p=1/2 + SA warm-up", "lena", 0.5, True),
  # Plain AdamW at its own rate (swept at every S on the validation set): the reference.
  "adamw": ("AdamW (rate tuned on validation)", "adamw", 1.0, False),
  # Malladi et al.'s square-root SDE rule for Adam: rate x sqrt(k), 1 - b1 and 1 - b2 times k,
  # eps / sqrt(k). Defined only where k (1 - b1) < 1.
  "malladi": ("Adam + Malladi SDE rule", "malladi", 0.5, False),
  # Where it is not (k >= 10): the same rule with b1 kept (a variant, not the paper's rule).
  "malladi_b2": ("Adam + Malladi rule, b1 kept (variant)", "malladi_b2", 0.5, False),
}
# The rules of the original grid (:func:`grid_runs`); the others run in their own phases.
GRID_METHODS = tuple(m for m in METHODS if METHODS[m][1] not in ("adamw", "malladi", "malladi_b2"))


@dataclasses.dataclass(frozen=True)
class Run:
  """One cell of the grid; ``name`` is its directory under ``runs/``."""

  method: str
  num_workers: int
  seed: int
  learning_rate: float
  epochs: int
  num_samples: int  # MNIST-1D examples before the 80/20 split
  sweep: bool = False  # a learning-rate sweep run (its rate is in the name)

  @property
  def name(self) -> str:
    rate = f"_lr{self.learning_rate:g}" if self.sweep else ""
    return f"{self.method}{rate}_S{self.num_workers}_seed{self.seed}"

  @property
  def global_batch(self) -> int:
    return self.num_workers * PER_WORKER_BATCH

  @property
  def scale(self) -> int:
    """k, reference batches per update."""
    return self.global_batch // REFERENCE_BATCH


def final_accuracy(workdir: Path) -> float | None:
  from examples import metrics

  if not harness.is_finished(workdir):
    return None
  return float(metrics.read_metrics(workdir, "eval")[-1]["eval_accuracy"])


def sweep_runs(epochs: int, num_samples: int) -> list[Run]:
  return [Run(SWEEP_METHOD, 8, 0, lr, epochs, num_samples, sweep=True) for lr in ADAM_RATES]


def lamb_rates(num_workers: int) -> tuple[float, ...]:
  """LAMB's swept rates at S = ``num_workers``."""
  large = num_workers >= LAMB_LARGE_BATCH_FROM
  return LAMB_RATES + (LAMB_LARGE_BATCH_RATES if large else ())


def neighbours(rates: Sequence[float], rate: float) -> tuple[float, ...]:
  """``rate`` and the rates either side of it in ``rates``."""
  i = list(rates).index(rate)
  return tuple(rates[max(i - 1, 0) : i + 2])


def best_rate(runs: Sequence[Any], runs_dir: Path) -> float | None:
  """The rate of the most accurate finished run (None until all have finished)."""
  scored = [(final_accuracy(runs_dir / r.name), r.learning_rate) for r in runs]
  if any(acc is None for acc, _ in scored):
    return None
  return max(scored, key=lambda t: (t[0], -t[1]))[1]


def validation_accuracy(workdir: Path) -> float | None:
  from examples import metrics

  if not harness.is_finished(workdir):
    return None
  return float(metrics.read_metrics(workdir, "eval")[-1]["val_accuracy"])


def edge_step(rates: Sequence[float], best: float) -> float | None:
  """The rate one step (x ~3) beyond ``best`` when it is the smallest or largest of ``rates``."""
  ordered = sorted(rates)
  if best == ordered[-1]:
    return float(f"{best * 3:.0e}")
  if best == ordered[0]:
    return float(f"{best / (10 / 3):.0e}")  # 1e-3 -> 3e-4, the grid's half-decades
  return None


def pick(scores: Mapping[float, float]) -> float:
  """The rate of the highest score (mean final validation accuracy); ties -> the smaller."""
  return max(sorted(scores), key=lambda lr: scores[lr])


def selection(
  score: Callable[[int, float, int], float | None],
  s: int,
  rates: Sequence[float] = SELECTION_RATES,
  seeds: Sequence[int] = SELECTION_SEEDS,
) -> tuple[list[float], float | None]:
  """The rates to sweep at S = ``s`` and the chosen one (None until the sweep has finished).

  ``score(s, rate, seed)`` is a finished run's final validation accuracy, or None. The sweep is
  ``rates``; if its best is at an edge, one more rate beyond that edge joins it (once).
  """
  swept = list(rates)
  for _ in range(2):
    scores = {}
    for lr in swept:
      values = [score(s, lr, seed) for seed in seeds]
      if any(v is None for v in values):
        return swept, None
      scores[lr] = sum(values) / len(values)  # type: ignore[arg-type]  # no None left
    best = pick(scores)
    extra = edge_step(rates, best) if len(swept) == len(rates) else None
    if extra is None:
      return swept, best
    swept.append(extra)
  return swept, best


def base_rates(method: str, s: int) -> tuple[float, ...]:
  """The first sweep of ``method`` (AdamW or LAMB) at S = ``s``."""
  return lamb_rates(s) if method == "lamb" else SELECTION_RATES


def chosen_rate(
  runs_dir: Path, method: str, s: int, epochs: int, num_samples: int, seeds: Sequence[int]
) -> tuple[list[float], float | None]:
  """``selection`` of ``method`` at S = ``s`` from the finished runs under ``runs_dir``."""

  def score(s: int, lr: float, seed: int) -> float | None:
    run = Run(method, s, seed, lr, epochs, num_samples, sweep=True)
    return validation_accuracy(runs_dir / run.name)

  return selection(score, s, base_rates(method, s), seeds)


def selection_runs(
  runs_dir: Path, scales: Sequence[int], epochs: int, num_samples: int
) -> list[Any]:
  """AdamW's and LAMB's rate sweeps on the selection (and check) seeds at every S."""
  runs: dict[str, Any] = {}
  for seeds in (SELECTION_SEEDS, CHECK_SEEDS):
    for method in SELECTED_METHODS:
      for s in scales:
        for lr in chosen_rate(runs_dir, method, s, epochs, num_samples, seeds)[0]:
          for seed in seeds:
            run = Run(method, s, seed, lr, epochs, num_samples, sweep=True)
            runs.setdefault(run.name, run)
  return list(runs.values())


def final_runs(
  runs_dir: Path, scales: Sequence[int], epochs: int, num_samples: int, malladi_variant: bool
) -> list[Any]:
  """On the reported seeds: Malladi's rule from the base rate where it is defined (k (1 - b1)
  < 1; elsewhere its b1-kept variant, if asked), and AdamW and LAMB at each S's chosen rates
  (by the selection and the check seeds; finished runs, e.g. archived LAMB ones, are skipped; at
  S = 8 the archived baseline is AdamW's run when the chosen rate is the base rate)."""
  base = best_rate(sweep_runs(epochs, num_samples), runs_dir)
  runs: dict[str, Any] = {}
  for s in (s for s in scales if s > 8):
    k = s // 8
    method = "malladi" if k * (1 - B1) < 1 else "malladi_b2"
    if base is not None and (method == "malladi" or malladi_variant):
      for seed in FINAL_SEEDS:
        run = Run(method, s, seed, base, epochs, num_samples)
        runs[run.name] = run
  for seeds in (SELECTION_SEEDS, CHECK_SEEDS):
    for method in SELECTED_METHODS:
      for s in scales:
        rate = chosen_rate(runs_dir, method, s, epochs, num_samples, seeds)[1]
        if rate is None or (method == TUNED_METHOD and s == 8 and rate == base):
          continue
        for seed in FINAL_SEEDS:
          run = Run(method, s, seed, rate, epochs, num_samples, sweep=True)
          runs.setdefault(run.name, run)
  order = {"malladi": 0, TUNED_METHOD: 1, "lamb": 2, "malladi_b2": 3}
  return sorted(runs.values(), key=lambda r: order[r.method])


def grid_runs(
  runs_dir: Path, seeds: Sequence[int], scales: Sequence[int], epochs: int, num_samples: int
) -> list[Run]:
  """Seed-major, so that a cut-short grid has every method at every S for the first seeds."""
  rate = best_rate(sweep_runs(epochs, num_samples), runs_dir)
  if rate is None:
    raise ValueError(
      "The AdamW rate sweep has not finished: the grid joins once it has (python -m "
      "benchmarks.adamw_scaling runs it first)."
    )
  runs = []
  for seed in seeds:
    for s in scales:
      for method in GRID_METHODS:
        if method == "lamb":
          sweep = [Run("lamb", s, 0, lr, epochs, num_samples, sweep=True) for lr in lamb_rates(s)]
          if seed == 0:
            runs += sweep
            continue
          lamb_rate = best_rate(sweep, runs_dir)
          if lamb_rate is not None:  # that rate and its neighbours: is it the best on this seed?
            runs += [
              Run("lamb", s, seed, lr, epochs, num_samples, sweep=True)
              for lr in neighbours(lamb_rates(s), lamb_rate)
            ]
        elif s == 8 and method != SWEEP_METHOD:
          continue  # scale 1: every optax_lena rule is the same AdamW as the baseline
        elif s == 8 and seed == 0:
          continue  # the sweep's best run is this cell
        else:
          runs.append(Run(method, s, seed, rate, epochs, num_samples, sweep=s == 8))
  return runs


@dataclasses.dataclass(frozen=True)
class Setup:
  """The study's sizes: the grid's seeds and scales, the epoch budget, the MNIST-1D draw, and
  whether the final runs add Malladi's b1-kept variant where the rule is undefined."""

  seeds: tuple[int, ...] = FINAL_SEEDS
  scales: tuple[int, ...] = SCALES
  epochs: int = EPOCHS
  num_samples: int = NUM_SAMPLES
  malladi_variant: bool = True


# A tiny version for the smoke test: one sweep rate is not enough to choose, so it is the
# whole grid at S = 8 and 16 on a small draw, one epoch.
SMOKE = Setup(seeds=(0,), scales=(8, 16), epochs=1, num_samples=1000, malladi_variant=False)


def cells(setup: Setup, out: Path) -> list[Run]:
  """The sweep; once it has finished, the grid; the selection sweeps; then the final runs at
  the chosen rates (each phase's runs in its own order, a run named twice kept once)."""
  runs_dir = out / "runs"
  sweep = sweep_runs(setup.epochs, setup.num_samples)
  phases = [sweep]
  if best_rate(sweep, runs_dir) is not None:
    phases.append(grid_runs(runs_dir, setup.seeds, setup.scales, setup.epochs, setup.num_samples))
  phases.append(selection_runs(runs_dir, setup.scales, setup.epochs, setup.num_samples))
  phases.append(
    final_runs(runs_dir, setup.scales, setup.epochs, setup.num_samples, setup.malladi_variant)
  )
  return list({run.name: run for phase in phases for run in phase}.values())
