"""What both large-batch studies (``large_batch_cnn``, ``large_batch_resnet``) share: run names,
table labels, the trainer configuration every run starts from, and their finished runs read
back and aggregated over seeds against per-seed targets.

A run specification is a frozen dataclass with at least ``optimizer``, ``batch_scale``,
``warmup``, ``seed``, ``epochs`` (0 = the preset's budget) and a ``name``; its single-worker
baseline is the spec ``sgd``, S = 1, ``warmup='none'`` of the same seed and budget. The target
of a run is a fraction (``examples.analysis.TARGET_FRACTIONS``) of that baseline's final
accuracy.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from benchmarks import harness
from examples import analysis, lena, metrics, optimizers

S = TypeVar("S")


def run_name(spec: Any, *options: str) -> str:
  """``<optimizer>_s<S>_<warmup>[_<option>...][_ep<epochs>]_seed<seed>``: ``options`` are the
  study's own settings that differ from their defaults."""
  parts = [spec.optimizer, f"s{spec.batch_scale}", spec.warmup, *options]
  if spec.epochs:
    parts.append(f"ep{spec.epochs}")
  return "_".join(parts) + f"_seed{spec.seed}"


def label_of(name: str, study_optimizers: Iterable[optimizers.Optimizer]) -> str:
  """The table label of an optimizer: the study's own, or the registry's."""
  own = {e.name: e.label for e in study_optimizers}
  return own[name] if name in own else optimizers.get(name).label


def baselines(spec_type: Callable[..., S], seeds: Sequence[int]) -> list[S]:
  """The single-worker SGD run of every seed (every grid starts with them: the targets)."""
  return [spec_type("sgd", 1, "none", s) for s in seeds]


def unique(grid: Sequence[S]) -> list[S]:
  """The grid without repeated runs (a cell of one table reappears in another), in order."""
  return list(dict.fromkeys(grid))


def trainer_config(
  base: str, spec: Any, *, num_samples: int, per_worker_batch: int, cache_dir: str, **options: Any
) -> lena.Config:
  """The trainer configuration ``base`` for one run of a study: its MNIST-1D draw, S per-worker
  batches on one device (the same numbers as S workers, tested in the repository; simulated
  devices would only add overhead on a 2-core host), no checkpoints, no progress bar, and the
  study's own ``options`` (width, rates, evaluation cadence, ...)."""
  return dataclasses.replace(
    lena.get_config(base),
    cache_dir=cache_dir,
    mnist1d_num_samples=num_samples,
    per_worker_batch=per_worker_batch,
    batch_scale=spec.batch_scale,
    num_devices=1,
    micro_batches=0,
    optimizer=spec.optimizer,
    warmup=spec.warmup,
    seed=spec.seed,
    checkpoint_every=0,
    progress_bar=False,
    **options,
  )


# Target = the first fraction (98%) of the same seed's single-worker SGD accuracy at the same
# budget; the looser second (90%) shows which method gets close first when none reaches it.
TARGET_FRACTION, LOOSE_FRACTION = analysis.TARGET_FRACTIONS
BASELINE = {"optimizer": "sgd", "batch_scale": 1, "warmup": "none"}


@dataclasses.dataclass
class RunResult:
  """What the tables and plots read from one finished run."""

  spec: Any
  config: dict[str, Any]
  records: list[dict[str, Any]]  # every record of metrics.jsonl, in order

  @functools.cached_property
  def evals(self) -> list[dict[str, Any]]:
    """The trainer's ``"eval"`` records."""
    return [r for r in self.records if r.get("type") == "eval"]

  @functools.cached_property
  def layer_records(self) -> list[dict[str, Any]]:
    """The records with per-layer diagnostics (``gain_ratio``, ...), train and eval alike."""
    return [r for r in self.records if r.get("gain_ratio")]

  @property
  def final(self) -> float:
    return self.evals[-1]["eval_accuracy"]

  @property
  def best(self) -> float:
    return max(e["eval_accuracy"] for e in self.evals)

  @property
  def total_steps(self) -> int:
    return self.config["total_steps"]

  def reach(self, target: float) -> dict[str, Any] | None:
    """The first evaluation at >= ``target`` (None: never)."""
    return analysis.first_reaching(self.evals, target)

  def warmup_ends(self) -> dict[str, int]:
    """Per layer, the iteration at which LENA's warm-up ended (-1 = never), at the end."""
    return self.evals[-1].get("warmup_end_step") or {}


def load_results(grid: Sequence[Any], runs_dir: str | Path) -> dict[Any, RunResult]:
  """The finished runs of ``grid`` (:func:`benchmarks.harness.is_finished`)."""
  results = {}
  for spec in grid:
    workdir = Path(runs_dir) / spec.name
    if harness.is_finished(workdir):
      config = harness.read_config(workdir)
      assert config is not None  # finished runs have one
      results[spec] = RunResult(spec, config, metrics.read_metrics(workdir, None))
  return results


class Summary:
  """Finished runs looked up by spec fields, with per-seed targets."""

  def __init__(self, results: dict[Any, RunResult]):
    self.results = results

  def runs(self, seeds: Sequence[int], **fields: Any) -> list[RunResult]:
    """The finished runs of ``seeds`` (in that order) whose spec has these fields and the
    defaults elsewhere."""
    out = []
    for seed in seeds:
      for spec, r in self.results.items():
        defaults = {
          f.name: f.default
          for f in dataclasses.fields(spec)
          if f.default is not dataclasses.MISSING and f.name not in fields
        }
        wanted = {**defaults, **fields, "seed": seed}
        if all(getattr(spec, k) == v for k, v in wanted.items()):
          out.append(r)
    return out

  def baselines(self, seeds: Sequence[int], epochs: int = 0) -> list[RunResult]:
    """The single-worker runs of ``seeds`` at the budget ``epochs``."""
    return self.runs(seeds, **BASELINE, epochs=epochs)

  def target(self, r: RunResult, fraction: float = TARGET_FRACTION) -> float | None:
    """``fraction`` x the final accuracy of ``r``'s seed's single worker at ``r``'s budget."""
    base = self.baselines([r.spec.seed], r.spec.epochs)
    return fraction * base[0].final if base else None

  def targets(self) -> dict[str, float]:
    """``seed<s>_ep<e>`` -> the target of that seed and budget (``ep0``: the default)."""
    return {
      f"seed{r.spec.seed}_ep{r.spec.epochs}": TARGET_FRACTION * r.final
      for spec, r in self.results.items()
      if all(getattr(spec, k) == v for k, v in BASELINE.items())
    }

  def to_target(
    self, runs: Sequence[RunResult], key: str = "iteration", fmt: str = ".0f", loose: bool = False
  ) -> str:
    """A "time to target" cell: ``key`` (``iteration``, ``epoch``, ``wall_time``) of the first
    evaluation at the target, over the runs that have a baseline."""
    fraction = LOOSE_FRACTION if loose else TARGET_FRACTION
    targets = [(r, t) for r in runs if (t := self.target(r, fraction)) is not None]
    hits = [h[key] for r, t in targets if (h := r.reach(t)) is not None]
    return harness.mean_std_reached(hits, len(targets), fmt)


def mean_curve(runs: Sequence[RunResult]) -> tuple[list[int], list[float]]:
  """Accuracy against iteration averaged over the runs (their evaluation iterations coincide)."""
  n = min(len(r.evals) for r in runs)
  its = [runs[0].evals[i]["iteration"] for i in range(n)]
  return its, [statistics.mean(r.evals[i]["eval_accuracy"] for r in runs) for i in range(n)]


def plot_curves(
  curves: dict[str, list[RunResult]], target: float | None, title: str, path: Path
) -> Path:
  """Mean accuracy against iterations of each label's runs, with the target line."""
  hlines = [] if target is None else [(target, f"target ({TARGET_FRACTION:.0%} of 1 worker)")]
  fig = analysis.plot_accuracy(
    {label: mean_curve(runs) for label, runs in curves.items() if runs},
    hlines,
    title=title,
    colors={label: "k" for label in curves if label.startswith("SGD")},
  )
  return analysis.save_figure(fig, path, dpi=110)


def summary_record(sm: Summary, extra: dict[str, Any]) -> dict[str, Any]:
  """``summary.json``: ``extra`` (preset, plots, ...), the targets and per run the final
  accuracy, run length, wall time, time to target and per-layer warm-up ends."""
  runs = {}
  for spec, r in sm.results.items():
    t = sm.target(r)
    hit = None if t is None else r.reach(t)
    runs[spec.name] = {
      "final_accuracy": r.final,
      "total_steps": r.total_steps,
      "wall_time": r.evals[-1]["wall_time"],
      "reach": None
      if hit is None
      else {"iterations": hit["iteration"], "epochs": hit["epoch"], "wall": hit["wall_time"]},
      "warmup_end_step": r.warmup_ends() or None,
    }
  return {**extra, "targets": sm.targets(), "runs": runs}
