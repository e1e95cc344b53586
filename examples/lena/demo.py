"""``make demo``: single-worker SGD against large-batch LSW, AdaScale and LENA on MNIST-1D.

Everything runs offline on the CPU in a few minutes: MNIST-1D is generated locally (cached in
``./data_cache``), and 8 CPU devices are simulated so that the large-batch runs are really
data-parallel (8 devices x 4 micro-batches = S = 32 per-worker gradients per update). All runs
get the same epoch budget; the large-batch runs therefore make S times fewer updates.

Writes to ``runs/demo/``: one sub-directory per method (``config.json``, ``metrics.jsonl``),
``table.md``, ``summary.json`` and the plots ``accuracy.png`` (accuracy vs iterations),
``lr_multipliers.png`` (LENA's per-layer rate multipliers over training) and
``warmup_end.png`` (the iteration at which each layer ended its warm-up, the paper's Figure 7).

Usage::

  python -m examples.demo            # the full demo
  python -m examples.demo --quick    # seconds-long smoke version (tests)
"""

from __future__ import annotations

import os

# Simulate 8 devices on the CPU; XLA reads this when jax is first imported, so it comes first.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()

import argparse
import dataclasses
import json
import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from examples import analysis, metrics, optimizers
from examples.analysis import TARGET_FRACTIONS, iterations_to_target
from examples.lena import configs as configs_lib
from examples.lena import train

# The single-worker baseline, then the large-batch methods (each with its paper warm-up).
BASELINE = "sgd"
LARGE_BATCH = ("linear_scaling", "adascale", "lena")


@dataclasses.dataclass(frozen=True)
class Method:
  """One run of the comparison."""

  label: str
  optimizer: str
  batch_scale: int
  warmup: str  # the paper's choice for the method


def methods(batch_scale: int) -> list[Method]:
  """The single-worker baseline and the large-batch methods, from the optimizer registry."""
  return [
    Method(e.label, e.name, 1 if e.name == BASELINE else batch_scale, e.paper_warmup)
    for e in map(optimizers.get, (BASELINE, *LARGE_BATCH))
  ]


def demo_config(quick: bool, cache_dir: str) -> configs_lib.Config:
  """The shared configuration (MNIST-1D, CNN1D) of every method.

  Args:
    quick: a seconds-long version for tests.
    cache_dir: where MNIST-1D is cached.

  Returns:
    The base configuration; :func:`method_config` sets optimizer and batch.
  """
  config = dataclasses.replace(
    configs_lib.get_config("default"),
    cache_dir=cache_dir,
    per_worker_batch=16,
    learning_rate=0.05,
    num_epochs=30,
    checkpoint_every=0,  # the demo always starts afresh
    parallel="shard_map",
  )
  if quick:
    config = dataclasses.replace(
      config,
      mnist1d_num_samples=1000,
      per_worker_batch=8,
      width=8,
      num_epochs=2,
      eval_batch_size=200,
      progress_bar=False,
    )
  return config


def method_config(base: configs_lib.Config, method: Method) -> configs_lib.Config:
  """``base`` with the method's optimizer, warm-up, batch and logging cadence."""
  large = method.batch_scale > 1
  return dataclasses.replace(
    base,
    optimizer=method.optimizer,
    warmup=method.warmup,
    batch_scale=method.batch_scale,
    # Once per epoch for the baseline; every other update at large batch, which makes few
    # updates per epoch, so that "iterations to target" is precise.
    eval_every=2 if large else 0,
    # Optimizer diagnostics every update (the multiplier plot); the baseline has none.
    log_every=1 if large else 0,
  )


def run_methods(
  config: configs_lib.Config, workdir: Path, batch_scale: int
) -> dict[str, dict[str, Any]]:
  """Trains every method from scratch and reads back its metrics.

  Args:
    config: the shared configuration.
    workdir: the demo directory; each method gets a fresh sub-directory.
    batch_scale: S of the large-batch methods.

  Returns:
    Per method label: ``method``, ``config``, ``evals`` and ``train`` records and ``seconds``.
  """
  results = {}
  for method in methods(batch_scale):
    run_dir = workdir / method.optimizer
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = method_config(config, method)
    print(
      f"\n== {method.label}: per-worker batch {cfg.per_worker_batch} x S="
      f"{method.batch_scale}, {cfg.num_epochs} epochs ==",
      flush=True,
    )
    start = time.perf_counter()
    train.train_and_evaluate(cfg, run_dir)
    seconds = time.perf_counter() - start
    results[method.label] = {
      "method": method,
      "config": cfg,
      "seconds": seconds,
      "layout": json.loads((run_dir / "config.json").read_text())["layout"],
      "evals": metrics.read_metrics(run_dir, "eval"),
      "all": metrics.read_metrics(run_dir, None),
    }
    final = results[method.label]["evals"][-1]["eval_accuracy"]
    print(f"   {method.label}: test accuracy {final:.4f} in {seconds:.0f} s", flush=True)
  return results


def summarize(results: dict[str, dict[str, Any]]) -> tuple[list[float], list[dict[str, Any]]]:
  """Table rows: accuracy at the epoch budget and iterations to the baseline's accuracy.

  Args:
    results: from :func:`run_methods`; the first entry is the single-worker baseline.

  Returns:
    ``(targets, rows)``: the accuracies ``TARGET_FRACTIONS x`` the baseline's final one, and
    per method a row whose ``iterations_to_target`` lists the first iteration reaching each
    (None: never).
  """
  baseline = next(iter(results.values()))
  targets = analysis.targets(baseline["evals"][-1]["eval_accuracy"])
  rows = []
  for label, res in results.items():
    evals = res["evals"]
    rows.append(
      {
        "method": label,
        "global_batch": res["layout"]["global_batch"],
        "S": res["layout"]["num_samples"],
        "devices_x_micro": f"{res['layout']['num_devices']}x{res['layout']['micro_batches']}",
        "iterations": evals[-1]["iteration"],
        "final_accuracy": evals[-1]["eval_accuracy"],
        "best_accuracy": max(r["eval_accuracy"] for r in evals),
        "iterations_to_target": [iterations_to_target(evals, t) for t in targets],
        "seconds": res["seconds"],
      }
    )
  return targets, rows


def format_table(targets: list[float], rows: list[dict[str, Any]]) -> str:
  """A Markdown table of :func:`summarize`'s rows."""
  reach_heads = "".join(
    f" iterations to {f:.0%} ({t:.4f}) |" for f, t in zip(TARGET_FRACTIONS, targets, strict=True)
  )
  lines = [
    "| method | global batch | S (devices x micro) | iterations | test acc @ budget "
    f"| best acc |{reach_heads} time (s) |",
    "|---|---|---|---|---|---|" + "---|" * len(targets) + "---|",
  ]
  for r in rows:
    reach = "".join(f" {'never' if it is None else it} |" for it in r["iterations_to_target"])
    lines.append(
      f"| {r['method']} | {r['global_batch']} | {r['S']} ({r['devices_x_micro']}) "
      f"| {r['iterations']} | {r['final_accuracy']:.4f} | {r['best_accuracy']:.4f} "
      f"|{reach} {r['seconds']:.0f} |"
    )
  return "\n".join(lines)


def plot_all(results: dict[str, dict[str, Any]], targets: list[float], workdir: Path) -> list[Path]:
  """Writes ``accuracy.png``, ``lr_multipliers.png`` and ``warmup_end.png``.

  Args:
    results: from :func:`run_methods`.
    targets: the accuracy target lines.
    workdir: output directory.

  Returns:
    The paths written.
  """
  curves = {
    f"{label} (batch {res['layout']['global_batch']})": (
      [r["iteration"] for r in res["evals"]],
      [r["eval_accuracy"] for r in res["evals"]],
    )
    for label, res in results.items()
  }
  hlines = [
    (t, f"{f:.0%} of 1-worker accuracy") for f, t in zip(TARGET_FRACTIONS, targets, strict=True)
  ]
  fig = analysis.plot_accuracy(curves, hlines, title="MNIST-1D, equal epoch budget")
  paths = [analysis.save_figure(fig, workdir / "accuracy.png")]

  lena = results.get("LENA")
  if lena is not None:
    records = [r for r in lena["all"] if "lr_multiplier" in r]
    ada = results.get("AdaScale")
    ratio = None
    if ada is not None:
      recs = [r for r in ada["all"] if "global_ratio" in r]
      ratio = ([r["iteration"] for r in recs], [r["global_ratio"] for r in recs])
    s = lena["layout"]["num_samples"]
    title = f"LENA per-layer learning-rate multipliers (S={s})"
    fig = analysis.plot_lr_multipliers(records, s, ratio, title=title)
    paths.append(analysis.save_figure(fig, workdir / "lr_multipliers.png"))

    ends = records[-1]["warmup_end_step"] if records else {}
    total = lena["evals"][-1]["iteration"]
    lsw = results.get("LSW")
    fixed_end = math.ceil(lsw["config"].warmup_fraction * total) if lsw is not None else None
    fig = analysis.plot_warmup_ends(
      {"LENA": (ends, total)},
      fraction=False,
      fixed_end=fixed_end,
      fixed_label=f"LSW fixed warm-up end (iteration {fixed_end})",
    )
    paths.append(analysis.save_figure(fig, workdir / "warmup_end.png"))
  return paths


def main(
  quick: bool = False,
  workdir: str | Path = "runs/demo",
  cache_dir: str = "data_cache",
  batch_scale: int = 32,
) -> dict[str, Any]:
  """Runs the comparison, prints the table and writes the plots.

  Args:
    quick: seconds-long version (tiny data, 2 epochs) for tests.
    workdir: output directory.
    cache_dir: MNIST-1D cache directory.
    batch_scale: S of the large-batch runs.

  Returns:
    ``{'targets', 'rows', 'table', 'plots', 'seconds'}``.
  """
  start = time.perf_counter()
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  config = demo_config(quick, cache_dir)
  results = run_methods(config, workdir, 8 if quick else batch_scale)
  targets, rows = summarize(results)
  table = format_table(targets, rows)
  plots = plot_all(results, targets, workdir)
  seconds = time.perf_counter() - start
  (workdir / "table.md").write_text(table + "\n")
  (workdir / "summary.json").write_text(
    json.dumps(
      {"targets": targets, "target_fractions": TARGET_FRACTIONS, "rows": rows, "seconds": seconds},
      indent=2,
    )
  )
  print(
    f"\nMNIST-1D, {config.num_epochs} epochs for every method; targets = "
    f"{', '.join(f'{f:.0%}' for f in TARGET_FRACTIONS)} of the single-worker "
    "accuracy.\n"
  )
  print(table)
  print(f"\nPlots: {', '.join(str(p) for p in plots)}\nTotal time {seconds:.0f} s.")
  return {"targets": targets, "rows": rows, "table": table, "plots": plots, "seconds": seconds}


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog="python -m examples.demo", description=__doc__)
  parser.add_argument("--quick", action="store_true", help="seconds-long smoke version")
  parser.add_argument("--workdir", default="runs/demo")
  parser.add_argument("--cache_dir", default="data_cache")
  parser.add_argument("--batch_scale", type=int, default=32, help="S of the large batch")
  return parser.parse_args(argv)


def cli(argv: Sequence[str] | None = None) -> None:
  """Command-line entry point (``python -m examples.demo``)."""
  args = _parse(argv)
  main(
    quick=args.quick, workdir=args.workdir, cache_dir=args.cache_dir, batch_scale=args.batch_scale
  )


if __name__ == "__main__":
  cli()
