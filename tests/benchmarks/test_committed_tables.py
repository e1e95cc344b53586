"""The committed RESULTS tables equal the committed data they come from.

* ``--report_only`` of every study (every ``benchmarks/**/__main__.py`` on the driver), setup by
  setup, rebuilds the files of its committed results folder byte for byte from the committed
  JSON / run archive, and every table of its RESULTS file is one of the rebuilt tables,
  verbatim (the few tables that are not derived from committed data are listed, with why).
* Every RESULTS file carries its study's claims table (``benchmarks/claims.py``) verbatim.
* The Ray stragglers' tables of the sections that make claims match their JSON number by number.
* The paired-interval helper against printed t tables, closed forms and a float64 reference.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks import claims, driver
from benchmarks.paired_intervals import paired, paired_by_seed, t_quantile, t_two_sided
from examples import analysis

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
# Every study on the driver: the packages whose __main__ runs one.
STUDIES = sorted(
  ".".join(p.parent.relative_to(ROOT).parts)
  for p in BENCH.rglob("__main__.py")
  if "driver.main(STUDY)" in p.read_text()
)

# Tables of a RESULTS file that are not derived from committed data: a definition, and runs
# retrained into /tmp (not committed) whose numbers the text reports as such.
NOT_FROM_DATA = {
  "large_batch_resnet/RESULTS.md": ("| `progress=` |", "| run | archived (seed 0) |"),
  "large_batch_cnn/RESULTS.md": ("| run | bitwise equal |",),
}
# How many tables each RESULTS file takes verbatim from its rebuilt reports and claims (so that
# one dropped or edited by hand fails). None: its RESULTS condenses its tables by hand (the
# ALADDIN baselines and outer optimizer, the critical batch, multi-host: their rebuilt files are
# checked byte for byte above), or quotes rows of its JSON (the Ray stragglers: checked number
# by number below).
RESULTS_TABLES = {
  "benchmarks.adamw_scaling": 4,
  "benchmarks.aladdin.baselines": None,
  "benchmarks.aladdin.call_cost": 1,
  "benchmarks.aladdin.outer_optimizer": None,
  "benchmarks.aladdin.ray_efficiency": 2,
  "benchmarks.aladdin.ray_stragglers": None,
  "benchmarks.aladdin.receive_cost": 2,
  "benchmarks.aladdin.recipe": 5,
  "benchmarks.aladdin.reproduction": 9,
  "benchmarks.batch_ramp": 6,
  "benchmarks.ci_time": 1,
  "benchmarks.critical_batch": None,
  "benchmarks.large_batch_cnn": 5,
  "benchmarks.large_batch_resnet": 10,
  "benchmarks.multihost": None,
}


def md_tables(text: str) -> list[str]:
  """Every Markdown table of ``text`` (runs of lines starting with "|"), stripped."""
  out: list[str] = []
  current: list[str] = []
  for line in [*text.splitlines(), ""]:
    if line.strip().startswith("|"):
      current.append(line.strip())
    elif current:
      out.append("\n".join(current))
      current = []
  return out


def assert_results_tables_in(results: str, sources: list[str]) -> int:
  """Every table of the RESULTS file (but the listed ones) is a table of ``sources``."""
  text = (BENCH / results).read_text()
  known = {t for src in sources for t in md_tables(src)}
  checked = 0
  for table in md_tables(text):
    if table.startswith(NOT_FROM_DATA.get(results, ())):
      continue
    assert table in known, f"{results}: this table is not in the rebuilt tables:\n{table[:300]}"
    checked += 1
  return checked


# ------------------------------------------------------------------------------------------------
# The paired-interval helper
# ------------------------------------------------------------------------------------------------


# Two-sided 95% / 99% points of printed Student-t tables (6 digits).
T_TABLE = {
  (0.975, 3): 3.182446,
  (0.975, 4): 2.776445,
  (0.975, 5): 2.570582,
  (0.975, 9): 2.262157,
  (0.975, 14): 2.144787,
  (0.975, 29): 2.045230,
  (0.995, 4): 4.604095,
  (0.995, 5): 4.032143,
  (0.995, 9): 3.249836,
  (0.95, 4): 2.131847,
  (0.95, 10): 1.812461,
  (0.9, 7): 1.414924,
}


def test_t_quantiles_exact():
  for (p, dof), value in T_TABLE.items():
    assert t_quantile(p, dof) == pytest.approx(value, abs=1.5e-6), (p, dof)
  # Closed forms: dof 1 is the Cauchy distribution, dof 2 has t = (2p - 1) / sqrt(2 p (1 - p)).
  for p in np.linspace(0.01, 0.99, 41):
    assert t_quantile(p, 1) == pytest.approx(np.tan(np.pi * (p - 0.5)), rel=1e-12, abs=1e-13)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / np.sqrt(2 * p * (1 - p)), abs=1e-12)
  # Large dof tends to the normal quantile (1.959964 for 0.975).
  assert t_quantile(0.975, 2000) == pytest.approx(1.959964, abs=2e-3)
  assert t_two_sided(t_quantile(0.975, 6), 6) == pytest.approx(0.95, abs=1e-14)
  with pytest.raises(ValueError, match="integer >= 1"):
    t_quantile(0.975, 0)


def test_paired_interval_against_float64_reference():
  rng = np.random.default_rng(0)
  for n, t in ((3, 4.302653), (5, 2.776445), (10, 2.262157), (15, 2.144787)):
    a, b = rng.normal(0.8, 0.02, n), rng.normal(0.79, 0.02, n)
    d = a.astype(np.float64) - b
    half = t * d.std(ddof=1) / np.sqrt(n)
    p = paired(list(a), list(b))
    assert (p.n, p.wins) == (n, int((d > 0).sum()))
    np.testing.assert_allclose([p.mean, p.std], [d.mean(), d.std(ddof=1)], rtol=1e-12)
    np.testing.assert_allclose([p.low, p.high], [d.mean() - half, d.mean() + half], rtol=1e-5)
  one = paired([0.9], [0.8])
  assert one.n == 1 and np.isnan(one.low) and one.verdict() == "one seed: no interval"
  with pytest.raises(KeyError, match="missing on one side"):
    paired_by_seed({0: 1.0, 1: 2.0}, {0: 1.0}, seeds=[0, 1])


def test_the_corrected_recipe_interval():
  # Issue 37's example: seeds 0-4 of the recipe, HO, the t(4) interval contains 0.
  runs = json.loads((BENCH / "aladdin/recipe/results/runs.json").read_text())
  acc = {
    (r["candidate"], r["seed"]): r["test_accuracy"] for r in runs.values() if r["cluster"] == "HO"
  }
  p = paired([acc[("update_p4_a0.5", s)] for s in range(5)], [acc[("ar_sgd", s)] for s in range(5)])
  assert round(p.mean, 4) == -0.0204 and (round(p.low, 3), round(p.high, 3)) == (-0.044, 0.003)
  assert not p.distinguishable


# ------------------------------------------------------------------------------------------------
# Claims tables
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("study", list(claims.STUDIES))
def test_results_file_carries_its_claims_table(study):
  results, _ = claims.STUDIES[study]
  table = claims.render(study)
  assert table.count("\n") >= 3
  assert table in (BENCH / results).read_text(), f"{results}: claims table differs; rerun claims"


# ------------------------------------------------------------------------------------------------
# --report_only rebuilds the committed tables, and RESULTS carries them
# ------------------------------------------------------------------------------------------------


def _no_figure(fig, path, dpi=120):
  """``analysis.save_figure`` without the PNG (plots are not tables; drawing them is slow)."""
  analysis.pyplot().close(fig)
  return path


@pytest.mark.parametrize("module", STUDIES)
def test_report_only_rebuilds_the_committed_tables(module, tmp_path, monkeypatch):
  monkeypatch.setattr(analysis, "save_figure", _no_figure)
  study = importlib.import_module(f"{module}.__main__").STUDY
  assert study.module == module and study.committed()
  rebuilt: list[str] = []
  for name in study.committed():
    setup, committed = study.setups[name], study.out(name)
    out = tmp_path / name
    out.mkdir()
    for path in committed.iterdir():  # the committed data (derived files are overwritten)
      if path.is_file():
        shutil.copy(path, out / path.name)
    report = driver.rebuild(setup, setup.config, out)
    for file, text in report.files.items():
      assert text == (committed / file).read_text(), f"{module} {name}: {file} differs"
    rebuilt += [report.text, *report.files.values()]
  results = str(study.results.parent.relative_to(BENCH) / "RESULTS.md")
  rebuilt += [claims.render(c) for c, (path, _) in claims.STUDIES.items() if path == results]
  if RESULTS_TABLES[module] is not None:
    assert assert_results_tables_in(results, rebuilt) == RESULTS_TABLES[module]


def test_every_study_is_in_the_table_and_the_index():
  assert sorted(RESULTS_TABLES) == STUDIES
  index = (BENCH / "README.md").read_text()
  for module in STUDIES:
    assert f"python -m {module}`" in index, f"benchmarks/README.md does not list {module}"
  studies = {str(p.parent.relative_to(ROOT)).replace("/", ".") for p in BENCH.rglob("RESULTS.md")}
  assert studies - {"benchmarks.overhead"} == set(STUDIES)  # no RESULTS without its study


def test_adamw_claims_copy_the_study_pairs():
  from benchmarks.adamw_scaling import report

  assert report.PAIRS == claims.ADAMW_PAIRS
  assert report.REFERENCE_RULES == claims.ADAMW_REFERENCE_RULES
  assert report.REFERENCE == claims.ADAMW_REFERENCE


# ------------------------------------------------------------------------------------------------
# Ray: the tables of the sections that make claims, number by number from their JSON
# ------------------------------------------------------------------------------------------------

RAY = BENCH / "aladdin/ray_stragglers"
RAY_ALGORITHMS = {"aladdin": "aladdin", "ar-sgd": "ar_sgd", "ar_sgd": "ar_sgd", "asp": "asp"}


def _ray_section_tables(heading: str) -> list[str]:
  text = (RAY / "RESULTS.md").read_text()
  start = text.index(heading)
  end = text.find("\n## ", start + 1)
  return md_tables(text[start : end if end > 0 else None])


def _check_ray_table(table: str, runs: dict) -> int:
  rows = [
    [c.strip().strip("*") for c in line.strip("|").split("|")] for line in table.splitlines()[2:]
  ]
  for cluster, alg, thr, rel, acc, its, waits in rows:
    run = runs[f"{cluster.split()[0]}/{RAY_ALGORITHMS[alg.split()[0].lower()]}"]
    ho = runs[f"HO/{RAY_ALGORITHMS[alg.split()[0].lower()]}"]
    assert int(thr) == round(run["throughput"]), (cluster, alg)
    assert float(rel) == round(run["throughput"] / ho["throughput"], 2), (cluster, alg)
    assert float(acc) == round(run["test_accuracy"], 3), (cluster, alg)
    assert [int(x) for x in its.split()] == run["iterations"], (cluster, alg)
    assert [float(x) for x in waits.split()] == [round(100 * w, 1) for w in run["wait_fraction"]]
  return len(rows)


def test_ray_tables_match_their_json():
  recipe = json.loads((RAY / "results/recipe.json").read_text())["runs"]
  plain = json.loads((RAY / "results/sgd_server.json").read_text())["runs"]
  momentum = json.loads((RAY / "results/momentum_server.json").read_text())["runs"]
  first, both = _ray_section_tables("## The recipe against AR-SGD at a fixed wall budget")
  assert _check_ray_table(first, recipe) == 4
  for line in both.splitlines()[2:]:
    run, cluster, a_thr, r_thr, a_acc, r_acc = [c.strip() for c in line.strip("|").split("|")]
    runs = recipe if run.startswith("this one") else plain
    a, r = runs[f"{cluster}/aladdin"], runs[f"{cluster}/ar_sgd"]
    assert (int(a_thr), int(r_thr)) == (round(a["throughput"]), round(r["throughput"]))
    assert (float(a_acc), float(r_acc)) == (
      round(a["test_accuracy"], 3),
      round(r["test_accuracy"], 3),
    )
  # The load ranges the section states for the two runs (1-minute load averages).
  for runs, (low, high) in ((recipe, (24, 35)), (plain, (14, 22))):
    loads = [r["load_average"][0] for r in runs.values()]
    assert low <= min(loads) and max(loads) <= high + 0.5
  tables = _ray_section_tables("### Result (one run each, 2026-12-01)")
  assert _check_ray_table(tables[0], plain) == 9
  tables = _ray_section_tables("### Second run: the server with momentum 0.9")
  assert _check_ray_table(tables[0], momentum) == 9
  assert re.search(r"12\.5x", (RAY / "RESULTS.md").read_text())
  assert round(plain["HO/ar_sgd"]["throughput"] / recipe["HO/ar_sgd"]["throughput"], 1) == 12.5
