"""ResNet1D at large S: LENA, AdaScale, LARS and LAMB under one rate sweep and one selection rule.

The main study (``study.py``) swept LARS's and LAMB's rates on seed 0 and reported seed 0's test
accuracy against LENA and AdaScale at the single worker's eta0. Here every method gets the same
sweep, chosen on held-out data, and is then reported on other seeds:

* **Sweep**: five rates per method, half a decade apart (``METHODS``): LARS and LAMB on the main
  study's grid plus one rate above it, LENA and AdaScale on eta0 x {0.1, 0.3, 1, 3, 10} around
  the single worker's eta0 = 0.05.
* **Selection**: on ``SELECTION_SEED`` (never reported), the rate with the best validation
  accuracy at the end of the run; ties go to the smaller rate. The validation set is an
  independent MNIST-1D draw (generation seed ``VALIDATION_DATA_SEED``, its 20% test part): held
  out from the training and test examples by construction, and the 8k/2k train/test data of
  the archived runs stay as they are.
* **Final**: ``FINAL_SEEDS`` at each method's chosen rate, test accuracy at the budget, paired
  by seed (``benchmarks.paired_intervals``).

Every run is one call of the trainer (``examples.lena.train_and_evaluate``) with the main
study's settings (``study.run_config``) but one evaluation per epoch and the parallel
strategy ``parallel='shard_map'`` on one device, i.e. the S per-worker batches as sequential
micro-batches, each its own BatchNorm batch (the same computation as the main study's ``vmap``
to float rounding, tested in ``tests/benchmarks/test_large_batch_resnet.py``; faster on a CPU,
see RESULTS.md). The runs live in ``<out>/runs/<name>`` with a ``validation.json``;
``<out>/runs.tar.xz`` archives them.

Usage::

  python -m benchmarks.large_batch_resnet.equal_tuning                 # resumable
  python -m benchmarks.large_batch_resnet.equal_tuning --shard 0/2 &   # two processes
  python -m benchmarks.large_batch_resnet.equal_tuning --report_only
  python -m benchmarks.large_batch_resnet.equal_tuning --smoke --out /tmp/smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.large_batch_resnet import study
from benchmarks.paired_intervals import Paired, paired

DEFAULT_OUT = "benchmarks/large_batch_resnet/results/equal_tuning"
SELECTION_SEED = 100
FINAL_SEEDS = (0, 1, 2, 3, 4)
VALIDATION_DATA_SEED = 1  # the training/test data are generation seed 0
FILES = (*harness.RUN_FILES, "validation.json")


@dataclasses.dataclass(frozen=True)
class Method:
  """One arm: a registry optimizer, its warm-up and its five swept rates."""

  key: str
  label: str
  optimizer: str
  warmup: str
  rates: tuple[float, ...]


# eta0 x {0.1, 0.3, 1, 3, 10} of the single worker's eta0 = 0.05 (the preset's).
ETA0_RATES = (0.005, 0.015, 0.05, 0.15, 0.5)
METHODS = (
  # LENA and AdaScale with the paper's state-aware warm-up (LENA's documented configuration):
  # the same warm-up for both, so LENA - AdaScale compares the layer-wise with the global rule.
  Method("lena", "LENA (SA)", "lena", "state_aware", ETA0_RATES),
  Method("adascale", "AdaScale (SA)", "adascale", "state_aware", ETA0_RATES),
  Method("lars", "LARS (fixed)", "lars", "fixed", (1.0, 3.0, 10.0, 30.0, 100.0)),
  Method("lamb", "LAMB (fixed)", "lamb", "fixed", (0.003, 0.01, 0.03, 0.1, 0.3)),
)
# The questions (A - B), paired by seed on the test accuracy.
PAIRS = (("lena", "lars"), ("lena", "lamb"), ("adascale", "lars"), ("lena", "adascale"))


@dataclasses.dataclass(frozen=True)
class Setup:
  """The study's sizes: a main-study preset, the scale, the seeds and each method's rates."""

  preset: str
  scale: int
  selection_seed: int
  final_seeds: tuple[int, ...]
  methods: tuple[Method, ...]


SETUPS = {
  "default": Setup("default", 256, SELECTION_SEED, FINAL_SEEDS, METHODS),
  "smoke": Setup(
    "smoke",
    4,
    SELECTION_SEED,
    (0,),
    # Two rates for LENA (a choice to make), one for LARS (its pairing with LENA): five runs.
    tuple(
      dataclasses.replace(m, rates=m.rates[1:3] if m.key == "lena" else m.rates[1:2])
      for m in METHODS
      if m.key in ("lena", "lars")
    ),
  ),
}


def spec_of(m: Method, setup: Setup, rate: float, seed: int) -> study.RunSpec:
  """The run of ``m`` at ``rate`` and ``seed`` (the rate always in its name)."""
  return study.RunSpec(m.optimizer, setup.scale, m.warmup, seed, learning_rate=rate)


def run_config(setup: Setup, spec: study.RunSpec, cache_dir: str) -> Any:
  """The main study's trainer configuration, one evaluation per epoch, sequential workers."""
  p = study.PRESETS[setup.preset]
  config = study.run_config(p, spec, cache_dir)
  per_epoch = int(p.num_samples * 0.8) // (spec.batch_scale * p.per_worker_batch)
  return dataclasses.replace(config, parallel="shard_map", eval_every=per_epoch)


def read_validation(out: Path, spec: study.RunSpec) -> float | None:
  """The validation accuracy of a finished run (None: not finished)."""
  path = out / "runs" / spec.name / "validation.json"
  return json.loads(path.read_text())["accuracy"] if path.exists() else None


def read_test(out: Path, spec: study.RunSpec) -> list[dict[str, Any]] | None:
  """The evaluation records (test split) of a finished run (None: not finished)."""
  workdir = out / "runs" / spec.name
  if not (workdir / "validation.json").exists() or not harness.is_finished(workdir):
    return None
  from examples import metrics

  return metrics.read_metrics(workdir, "eval")


def choose(rates: Sequence[float], accs: Sequence[float | None]) -> float | None:
  """The rate of the best validation accuracy (ties: the smaller rate); None until every rate
  has finished."""
  if any(a is None for a in accs):
    return None
  pairs = sorted(zip(rates, accs, strict=True))
  best = max(a for _, a in pairs if a is not None)
  return next(r for r, a in pairs if a == best)


def chosen_rates(setup: Setup, out: Path) -> dict[str, float | None]:
  """Each method's selected rate (None while its sweep is unfinished)."""
  return {
    m.key: choose(
      m.rates, [read_validation(out, spec_of(m, setup, r, setup.selection_seed)) for r in m.rates]
    )
    for m in setup.methods
  }


def build_grid(setup: Setup, out: Path) -> list[study.RunSpec]:
  """The sweep (rates interleaved across methods), then, once every sweep has finished, the
  final seeds of every method, seed by seed (the grid then no longer changes, so the shards of
  concurrent processes stay disjoint)."""
  n = max(len(m.rates) for m in setup.methods)
  middle_out = sorted(range(n), key=lambda i: (abs(i - n // 2), i))  # 5 rates: 2, 1, 3, 0, 4
  grid = [
    spec_of(m, setup, m.rates[i], setup.selection_seed)
    for i in middle_out
    for m in setup.methods
    if i < len(m.rates)
  ]
  chosen = {k: r for k, r in chosen_rates(setup, out).items() if r is not None}
  if len(chosen) < len(setup.methods):
    return grid
  grid += [spec_of(m, setup, chosen[m.key], sd) for sd in setup.final_seeds for m in setup.methods]
  return grid


def train(setup: Setup, grid: Sequence[study.RunSpec], out: Path, cache: str, shard: Any) -> int:
  """Trains the unfinished runs of this shard; each then evaluated on the validation draw."""
  from examples import lena, optimizers

  runs = out / "runs"
  for spec in grid:  # killed between the last evaluation and validation.json: train it again
    workdir = runs / spec.name
    if harness.is_finished(workdir) and not (workdir / "validation.json").exists():
      (workdir / "metrics.jsonl").unlink()

  def one(spec: study.RunSpec, workdir: Path) -> None:
    config = run_config(setup, spec, cache)
    with optimizers.registered(*study.STUDY_OPTIMIZERS):
      state = lena.train_and_evaluate(config, workdir)
    held_out = dataclasses.replace(config, data_seed=VALIDATION_DATA_SEED)
    result = lena.evaluate_split(held_out, state, "test")
    harness.write_json(workdir / "validation.json", {**result, "data_seed": VALIDATION_DATA_SEED})

  trained, _ = harness.run_grid(
    grid,
    one,
    runs,
    shard=shard,
    config_of=lambda spec: dataclasses.asdict(run_config(setup, spec, cache)),
    ignore=("progress_bar", "cache_dir"),
    describe=described,
  )
  return trained


def described(workdir: Path) -> str:
  """The progress text of a run: its validation accuracy (the test split is for the report)."""
  from examples import metrics

  val = json.loads((workdir / "validation.json").read_text())["accuracy"]
  updates = metrics.read_metrics(workdir, "eval")[-1]["iteration"]
  return f"validation acc {val:.4f} after {updates} updates"


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


def summarise(setup: Setup, out: Path) -> dict[str, Any]:
  """Everything the tables and the plot read: the sweep and the final runs."""
  chosen = chosen_rates(setup, out)
  methods: dict[str, Any] = {}
  for m in setup.methods:
    sweep = {
      f"{r:g}": read_validation(out, spec_of(m, setup, r, setup.selection_seed)) for r in m.rates
    }
    final: dict[str, Any] = {}
    rate = chosen[m.key]
    if rate is not None:
      for seed in setup.final_seeds:
        evals = read_test(out, spec_of(m, setup, rate, seed))
        if evals is not None:
          final[str(seed)] = {
            "test_accuracy": evals[-1]["eval_accuracy"],
            "validation_accuracy": read_validation(out, spec_of(m, setup, rate, seed)),
            "curve": [[e["iteration"], e["eval_accuracy"]] for e in evals],
          }
    edge = None if rate is None else ("low" if rate == m.rates[0] else "high")
    methods[m.key] = {
      "label": m.label,
      "optimizer": m.optimizer,
      "warmup": m.warmup,
      "rates": list(m.rates),
      "sweep_validation_accuracy": sweep,
      "chosen_rate": rate,
      "chosen_at_edge": edge if rate in (m.rates[0], m.rates[-1]) else None,
      "final": final,
    }
  return {
    "scale": setup.scale,
    "selection_seed": setup.selection_seed,
    "final_seeds": list(setup.final_seeds),
    "validation_data_seed": VALIDATION_DATA_SEED,
    "methods": methods,
    "pairs": [[a, b] for a, b in PAIRS if a in methods and b in methods],
  }


def pair(summary: dict[str, Any], a: str, b: str) -> Paired | None:
  """Test accuracy ``a - b`` over the final seeds both finished (None: none)."""
  fa, fb = (summary["methods"][k]["final"] for k in (a, b))
  seeds = sorted((set(fa) & set(fb)), key=int)
  if not seeds:
    return None
  va = [fa[s]["test_accuracy"] for s in seeds]
  return paired(va, [fb[s]["test_accuracy"] for s in seeds])


def tables(summary: dict[str, Any]) -> str:
  """The sweep, the final runs and the paired intervals, as Markdown."""
  ms = summary["methods"]
  s, sel = summary["scale"], summary["selection_seed"]
  rows = []
  for m in ms.values():
    cells = [
      f"{r}: {'—' if v is None else f'{v:.4f}'}" for r, v in m["sweep_validation_accuracy"].items()
    ]
    rate = m["chosen_rate"]
    chosen = "sweep unfinished" if rate is None else f"{rate:g}"
    if m["chosen_at_edge"]:
      chosen += f" ({m['chosen_at_edge']} edge of the grid)"
    rows.append([m["label"], ", ".join(cells), chosen])
  sweep = harness.markdown_table(["method", f"rate: validation acc (seed {sel})", "chosen"], rows)
  final_rows = []
  for m in ms.values():
    accs = [f["test_accuracy"] for f in m["final"].values()]
    per_seed = ", ".join(f"{k}: {f['test_accuracy']:.4f}" for k, f in m["final"].items())
    rate = "—" if m["chosen_rate"] is None else f"{m['chosen_rate']:g}"
    mean = harness.mean_std(accs) if accs else "—"
    final_rows.append([m["label"], rate, len(accs), mean, per_seed or "—"])
  final = harness.markdown_table(
    ["method", "rate", "seeds", "test acc @ budget", "per seed"], final_rows
  )
  pair_rows = []
  for a, b in PAIRS:
    if a in ms and b in ms and (d := pair(summary, a, b)) is not None:
      label = f"{ms[a]['label']} - {ms[b]['label']}, S = {s}, equal tuning"
      pair_rows.append(
        [*d.row(label, 4), d.verdict(f"{ms[a]['label']} ahead", f"{ms[b]['label']} ahead")]
      )
  pairs = harness.markdown_table(
    [
      "claim (A - B), test acc",
      "seeds",
      "mean",
      "95% interval (t, n-1 dof)",
      "seeds A > B",
      "verdict",
    ],
    pair_rows,
  )
  return (
    f"### Equal tuning: rate sweep (S = {s}, selection seed {sel}, validation draw)\n\n{sweep}\n\n"
    f"### Equal tuning: final runs at the chosen rates (test accuracy)\n\n{final}\n\n"
    f"### Equal tuning: paired intervals\n\n{pairs}\n"
  )


def plot(summary: dict[str, Any], path: Path) -> None:
  """Validation accuracy against the rate relative to the grid's middle (left); test accuracy
  of the final runs against updates, mean over seeds (right)."""
  from examples import analysis

  fig, (left, right) = analysis.pyplot().subplots(1, 2, figsize=(11, 4.2))
  for m in summary["methods"].values():
    rates, mid = m["rates"], m["rates"][len(m["rates"]) // 2]
    pts = [
      (r / mid, v)
      for r, v in zip(rates, m["sweep_validation_accuracy"].values(), strict=True)
      if v is not None
    ]
    if pts:
      left.plot(*zip(*pts, strict=True), marker="o", label=f"{m['label']} (x {mid:g})")
    curves = [f["curve"] for f in m["final"].values()]
    if curves:
      n = min(len(c) for c in curves)
      its = [c[i][0] for c in curves[:1] for i in range(n)]
      acc = [statistics.fmean(c[i][1] for c in curves) for i in range(n)]
      right.plot(its, acc, label=f"{m['label']}, rate {m['chosen_rate']:g} ({len(curves)} seeds)")
  left.set(xscale="log", xlabel="rate / grid middle", ylabel="validation accuracy (end of run)")
  left.set_title(f"sweep, seed {summary['selection_seed']}")
  right.set(xlabel="update", ylabel="test accuracy", ylim=(0, 1))
  right.set_title(f"final runs, S = {summary['scale']}")
  for ax in (left, right):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  analysis.save_figure(fig, path, dpi=110)


def report(setup: Setup, out: Path) -> str:
  """Writes ``tables.md``, ``summary.json`` and ``equal_tuning.png``; returns the tables."""
  summary = summarise(setup, out)
  text = tables(summary)
  harness.write_text(out / "tables.md", text)
  harness.write_json(out / "summary.json", summary)  # in table order: tables(json) == tables
  plot(summary, out / "equal_tuning.png")
  return text


def main(argv: Sequence[str] | None = None) -> str:
  """Command-line entry point; returns the tables' text."""
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.large_batch_resnet.equal_tuning",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument("--smoke", action="store_true", help="a plumbing check (tests)")
  parser.add_argument("--out", default=DEFAULT_OUT)
  parser.add_argument("--cache_dir", default="data_cache")
  parser.add_argument("--shard", default="0/1", help="I/N: every N-th run from the I-th")
  parser.add_argument("--report_only", action="store_true")
  args = parser.parse_args(argv)
  setup = SETUPS["smoke" if args.smoke else "default"]
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  harness.unpack_runs(out)
  if not args.report_only:
    shard = harness.parse_shard(args.shard)
    grid = build_grid(setup, out)
    trained = train(setup, grid, out, args.cache_dir, shard)
    # The final runs join the grid once every sweep has finished: run them now.
    if (grown := build_grid(setup, out)) != grid:
      trained += train(setup, grown, out, args.cache_dir, shard)
    if trained:
      harness.pack_runs(out, files=FILES)
  text = report(setup, out)
  print(text, flush=True)
  return text


if __name__ == "__main__":
  main()
