"""The scanned-layers study's results as data: the finished runs by cell, the reported seeds'
endpoints, the declared comparisons paired by seed, and the logging reruns' per-slice gain
ratios. Shared by the report (``report.py``), its plots (``plots.py``) and the claims page
(``benchmarks/claims_page.py``, through :func:`claims` on the committed ``summary.json``);
imports neither JAX nor matplotlib.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks.paired_intervals import Paired, paired_by_seed
from benchmarks.scanned_layers import grid
from benchmarks.scanned_layers.grid import LOG_METHODS, METHODS, PRIMARY, SECONDARY, Cell, Setup

Runs = dict[Cell, dict[str, Any]]  # a finished cell -> the runner's summary of it


class Endpoint(NamedTuple):
  """A measure of a reported run: its name, and how its differences are shown."""

  name: str
  unit: str  # "points": an accuracy shown x100; "": shown as it is
  scale: float
  digits: int
  higher_is_better: bool

  @property
  def column(self) -> str:
    return f"{self.name} ({self.unit})" if self.unit else self.name


ENDPOINTS = {
  "test_accuracy": Endpoint("test accuracy", "points", 100.0, 2, True),
  "test_loss": Endpoint("test loss", "", 1.0, 3, False),
  "validation_accuracy": Endpoint("final validation accuracy", "points", 100.0, 2, True),
}
PRIMARY_ENDPOINT = "test_accuracy"  # the pre-registered primary endpoint, final test accuracy


def load(setup: Setup, out: Path) -> Runs:
  """The finished cells of the grid (as far as it is known) and their summaries."""
  results = {c: grid.read_result(out, c) for c in grid.cells(setup, out)}
  return {c: r for c, r in results.items() if r is not None}


def from_summary(summary: Mapping[str, Mapping[str, Any]]) -> Runs:
  """The runs of a committed ``summary.json`` (what :func:`summary` wrote), by cell."""
  return {
    Cell(r["group"], r["method"], r["scale"], r["rate"], r["seed"]): dict(r)
    for r in summary.values()
  }


def finals(runs: Runs, method: str, s: int) -> dict[int, dict[str, Any]]:
  """seed -> summary of ``method``'s reported runs at S = ``s``."""
  return {
    c.seed: r for c, r in runs.items() if c.group == "final" and c.method == method and c.scale == s
  }


def endpoint(runs: Runs, method: str, s: int, key: str) -> dict[int, float]:
  """seed -> ``key`` of ``method``'s reported runs at S = ``s``."""
  return {seed: float(r[key]) for seed, r in finals(runs, method, s).items()}


class Comparison(NamedTuple):
  """``a - b`` in ``key`` at S = ``scale``, paired by seed (None: no seed has both sides)."""

  scale: int
  a: str
  b: str
  key: str
  paired: Paired | None

  @property
  def primary(self) -> bool:
    return (self.a, self.b, self.key) == (*PRIMARY, PRIMARY_ENDPOINT)

  @property
  def label(self) -> str:
    return f"{METHODS[self.a].label} - {METHODS[self.b].label}"


def compared(setup: Setup) -> list[tuple[int, str, str, str]]:
  """``(S, A, B, endpoint)`` of the primary comparison then the secondary ones, at each S."""
  return [
    (s, a, b, key)
    for s in setup.scales
    for a, b, key in ((*PRIMARY, PRIMARY_ENDPOINT), *SECONDARY)
    if a in setup.methods and b in setup.methods
  ]


def comparisons(setup: Setup, runs: Runs) -> list[Comparison]:
  """The declared comparisons, each paired over the seeds both sides ran."""
  rows = []
  for s, a, b, key in compared(setup):
    x, y = endpoint(runs, a, s, key), endpoint(runs, b, s, key)
    rows.append(Comparison(s, a, b, key, paired_by_seed(x, y) if set(x) & set(y) else None))
  return rows


def claims(
  summary: Mapping[str, Mapping[str, Any]], setup: Setup | None = None
) -> list[tuple[str, dict[int, float], dict[int, float]]]:
  """``(label, A's values, B's values)``, by seed, of every declared comparison, from the
  ``summary.json`` the report wrote (the claims page's rows; ``setup``: the committed one)."""
  runs, setup = from_summary(summary), setup or Setup()
  return [
    (
      f"{METHODS[a].label} - {METHODS[b].label}, {ENDPOINTS[key].name}, S = {s}",
      endpoint(runs, a, s, key),
      endpoint(runs, b, s, key),
    )
    for s, a, b, key in compared(setup)
  ]


# ----------------------------------------------------------------------------------------------
# The logging reruns
# ----------------------------------------------------------------------------------------------


def log_records(setup: Setup, runs: Runs, out: Path) -> dict[str, list[dict[str, Any]]] | None:
  """Method -> the diagnostics records of its logging rerun, one every ``log_every`` updates
  (None before every logging rerun has finished)."""
  from examples import metrics

  logged = {c.method: c for c in runs if c.group == "log"}
  if any(m not in logged for m in LOG_METHODS):
    return None
  return {
    m: [
      r
      for r in metrics.read_metrics(out / "runs" / logged[m].name, None)
      if r["iteration"] % setup.log_every == 0 and "gain_ratio" in r
    ]
    for m in LOG_METHODS
  }


class SliceRow(NamedTuple):
  """A stacked leaf in the logging reruns: its blocks' mean gain ratios and warm-up ends beside
  the stack's (-1: not ended)."""

  leaf: str
  ratios: list[float]
  stack_ratio: float
  ends: list[int]
  stack_end: int


def slice_rows(setup: Setup, records: dict[str, list[dict[str, Any]]]) -> list[SliceRow]:
  """Per stacked leaf (a per-stack key whose slice 0 the per-slice records hold), the mean of
  each block's gain ratio over the rerun's records and its last warm-up end."""
  per_slice, per_stack = (records[m] for m in LOG_METHODS)

  def mean_ratio(recs: list[dict[str, Any]], key: str) -> float:
    return statistics.mean(r["gain_ratio"][key] for r in recs)

  stacked = per_slice[-1]["gain_ratio"]
  leaves = sorted(k for k in per_stack[-1]["gain_ratio"] if f"{k}/0" in stacked)
  blocks = range(setup.depth)
  return [
    SliceRow(
      leaf,
      [mean_ratio(per_slice, f"{leaf}/{b}") for b in blocks],
      mean_ratio(per_stack, leaf),
      [per_slice[-1]["warmup_end_step"][f"{leaf}/{b}"] for b in blocks],
      per_stack[-1]["warmup_end_step"][leaf],
    )
    for leaf in leaves
  ]
