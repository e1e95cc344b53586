"""The recipe study's reports: the candidates' table (``recipe.md``) and the validation re-choice's
tables and plot (``validation/tables.md``, ``validation.png``), from their ``runs.json``."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import driver, harness, paired_intervals
from benchmarks.aladdin import protocol
from benchmarks.aladdin.recipe.grid import (
  BASELINE,
  CANDIDATES,
  DEFAULT,
  Candidates,
  Scale,
  choose_rate,
  choose_recipe,
  final_cells,
  fsum_mean,
  rates_of,
  tuning_cells,
  tuning_means,
)
from examples import analysis


def _mean_std(values: Sequence[float]) -> str:
  return harness.mean_std(values, ".3f") if values else "-"


def candidates_table(runs: dict[str, dict[str, Any]]) -> str:
  """Mean ± std of the final global-model accuracy per candidate and cluster, and the gaps the
  target is about (ALADDIN vs AR-SGD on HO; ALADDIN HE1 vs its HO), each the mean of the
  differences paired by seed over the seeds both sides ran."""
  cell: dict[tuple[str, str], dict[int, float]] = {}
  for r in runs.values():
    cell.setdefault((r["candidate"], r["cluster"]), {})[r["seed"]] = r["test_accuracy"]

  def paired_gap(a: dict[int, float], b: dict[int, float]) -> str:
    seeds = sorted(a.keys() & b.keys())
    return f"{statistics.mean(a[s] - b[s] for s in seeds):+.3f}" if seeds else "-"

  ar_ho = cell.get(("ar_sgd", "HO"), {})
  rows = []
  for name in CANDIDATES:
    ho, he1 = cell.get((name, "HO"), {}), cell.get((name, "HE1"), {})
    if not ho and not he1:
      continue
    gap, cost = paired_gap(ho, ar_ho), paired_gap(he1, ho)
    seeds = f"{len(ho)}/{len(he1)}"
    rows.append(
      [name, _mean_std(list(ho.values())), _mean_std(list(he1.values())), gap, cost, seeds]
    )
  header = ["candidate", "HO", "HE1", "HO - AR-SGD HO", "HE1 - HO", "seeds"]
  return harness.markdown_table(header, rows) + "\n"


def final_accuracy(runs: dict[str, dict], candidate: str, cluster: str) -> dict[int, float]:
  """Test accuracy per seed of the final runs (AR-SGD: its HO runs stand for every cluster)."""
  where = "HO" if candidate == BASELINE else cluster
  return {
    r["cell"]["seed"]: r["test_accuracy"]
    for r in runs.values()
    if r["cell"]["group"] == "final"
    and r["cell"]["candidate"] == candidate
    and r["cell"]["cluster"] == where
  }


def _tuning_table(runs: dict[str, dict], scale: Scale) -> str:
  width = max(len(scale.rates), len(scale.ar_rates))
  chosen = choose_recipe(runs, scale)
  rows = []
  for candidate in (BASELINE, *scale.recipes):
    rates = rates_of(scale, candidate)
    accs = tuning_means(runs, scale, candidate)
    cells = [harness.mean_std(accs[lr], ".3f") if accs[lr] else "—" for lr in rates]
    lr = choose_rate(runs, scale, candidate)
    edge = "" if lr is None or lr not in (rates[0], rates[-1]) else " (grid edge)"
    best = "—" if lr is None else f"{lr:g}{edge}"
    mean = "—" if lr is None else f"{fsum_mean(accs[lr]):.4f}"
    mark = " (chosen)" if chosen is not None and chosen[0] == candidate else ""
    grid = ", ".join(f"{x:g}" for x in rates)
    row = [f"{candidate}{mark}", grid, *cells, *[""] * (width - len(rates)), best, mean]
    rows.append(row)
  header = ["candidate", "rates", *[f"rate {i + 1}" for i in range(width)], "best rate"]
  return harness.markdown_table([*header, "mean at best"], rows)


def _final_table(runs: dict[str, dict], scale: Scale) -> str:
  rows = []
  for candidate in (BASELINE, *scale.recipes):
    for cluster in scale.clusters:
      mine = [
        r
        for r in runs.values()
        if r["cell"]["group"] == "final"
        and r["cell"]["candidate"] == candidate
        and r["cell"]["cluster"] == cluster
      ]
      if mine:
        accs = [r["test_accuracy"] for r in mine]
        lr = f"{mine[0]['cell']['lr']:g}"
        rows.append([candidate, cluster, lr, harness.mean_std(accs, ".3f"), len(mine)])
  return harness.markdown_table(["candidate", "cluster", "rate", "test accuracy", "seeds"], rows)


def paired_rows(runs: dict[str, dict], scale: Scale) -> list[tuple[str, paired_intervals.Paired]]:
  """The pre-registered headlines: chosen - AR-SGD per cluster, chosen on the second cluster -
  on the first, and chosen - default per cluster when they differ."""
  chosen = choose_recipe(runs, scale)
  if chosen is None:
    return []
  name, first = chosen[0], scale.clusters[0]
  pairs = [(f"{name} - ar_sgd, {k}", name, k, BASELINE, k) for k in scale.clusters]
  pairs += [(f"{name} {k} - {name} {first}", name, k, name, first) for k in scale.clusters[1:]]
  if name != DEFAULT:
    pairs += [(f"{name} - {DEFAULT}, {k}", name, k, DEFAULT, k) for k in scale.clusters]
  rows = []
  for label, a, ka, b, kb in pairs:
    x, y = final_accuracy(runs, a, ka), final_accuracy(runs, b, kb)
    if set(x) & set(y):
      rows.append((f"{label}, test accuracy", paired_intervals.paired_by_seed(x, y)))
  return rows


def validation_tables(runs: dict[str, dict], scale: Scale) -> str:
  """The validation re-choice's tables (``tables.md``)."""
  tune, final = tuning_cells(scale), final_cells(runs, scale)
  done = sum(c.name in runs for c in tune)
  parts = [
    f"# The recipe chosen on validation: {done} of {len(tune)} tuning cells, "
    f"{sum(c.name in runs for c in final)} of {len(final)} final cells\n",
    f"## Tuning (validation accuracy, {scale.clusters[0]}, mean ± std over the tuning seeds)\n",
    _tuning_table(runs, scale) + "\n",
  ]
  chosen = choose_recipe(runs, scale)
  if chosen is not None:
    same = "the library default" if chosen[0] == DEFAULT else f"not the default {DEFAULT}"
    parts.append(f"Chosen: {chosen[0]} at workers' rate {chosen[1]:g} ({same}).\n")
  if any(c.name in runs for c in final):
    rows = [[*pair.row(label, 2, 100), pair.verdict()] for label, pair in paired_rows(runs, scale)]
    header = ["claim (A - B)", "seeds", "mean (points)", "95% interval (points)", "seeds A > B"]
    parts += [
      "## Final runs (test accuracy, mean ± std)\n",
      _final_table(runs, scale) + "\n",
      "## Paired by seed (Student-t, n - 1 degrees of freedom)\n",
      harness.markdown_table([*header, "verdict"], rows) + "\n",
    ]
  parts += protocol.not_run_note([*tune, *final], runs)
  return "\n".join(parts)


def plot(runs: dict[str, dict], path: Path, scale: Scale) -> bool:
  """Validation accuracy against the rate per recipe (left); seed 0's test curves (right)."""
  plt = analysis.pyplot()
  if not any(c.name in runs for c in tuning_cells(scale)):
    return False
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  for candidate in (BASELINE, *scale.recipes):
    accs = tuning_means(runs, scale, candidate)
    xs = [lr for lr, v in accs.items() if v]
    style = "k-o" if candidate == BASELINE else ("r-o" if candidate == DEFAULT else "-")
    left.plot(xs, [fsum_mean(accs[lr]) for lr in xs], style, label=candidate, lw=1)
  left.set_xscale("log")
  ticks = sorted({*scale.rates, *scale.ar_rates})
  left.set_xticks(ticks, [f"{x:g}" for x in ticks])
  left.minorticks_off()
  left.set_xlabel("workers' rate (AR-SGD: on the mean gradient)")
  left.set_ylabel(f"validation accuracy ({scale.clusters[0]}, mean of tuning seeds)")
  left.legend(fontsize=6)
  left.grid(alpha=0.3)
  seed = scale.seeds[0]
  for _, r in sorted(runs.items()):  # by name: the same plot from a resumed or a loaded run
    cell = r["cell"]
    if cell["group"] == "final" and cell["seed"] == seed:
      curve = r["curve"]
      label = f"{cell['candidate']} {cell['cluster']} lr {cell['lr']:g}"
      right.plot([p[0] for p in curve], [p[1] for p in curve], label=label)
  right.set_xscale("symlog", linthresh=10)
  right.set_xlim(left=0)  # symlog would otherwise add an empty negative axis
  right.set_xlabel("simulated time (worker iterations)")
  right.set_ylabel(f"test accuracy, seed {seed}")
  right.grid(alpha=0.3)
  if right.lines:
    right.legend(fontsize=7)
  analysis.save_figure(fig, path, dpi=110)
  return True


def candidates_report(setup: Candidates, out: Path) -> driver.Report:
  """``recipe.md`` from ``out/runs.json`` (no plot)."""
  text = candidates_table(harness.load_summaries(out))
  return driver.Report(text, {"recipe.md": text})


def validation_report(scale: Scale, out: Path) -> driver.Report:
  """``tables.md`` and ``validation.png`` from ``out/runs.json``."""
  runs = harness.load_summaries(out)
  text = validation_tables(runs, scale)
  plot(runs, out / "validation.png", scale)
  return driver.Report(text, {"tables.md": text})
