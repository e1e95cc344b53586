"""Where CI's time goes: the test suite of a baseline commit against today's, test by test.

CI runs ``make test``; most of its time is the non-Ray pytest pass. This benchmark runs that
pass (``-m "not slow and not ray"``, two xdist workers, as the Makefile does) on a checkout of
``--baseline`` and on the working tree, one after the other, with the plugin
:mod:`benchmarks.ci_time.pytest_times` recording each test's wall and CPU seconds. Tests are
matched by name (the test files were moved and renamed since; a name found in several files is
matched within the file of the same base name), so the report separates

* the tests both suites have: the same assertions, now and then (what a refactoring of the
  tests or of the code they run made faster or slower);
* the tests only today's suite has, grouped by the work that added them (``ORIGINS``);
* the baseline's tests with no match today (merged or renamed beyond recognition).

CPU seconds (every thread and reaped child process of the test) are the comparison: the two
suites run minutes apart on a shared machine, and CPU time moves far less with the load than
wall time does. The wall times are reported beside them.

Usage::

  python -m benchmarks.ci_time.measure --baseline 34a7beb      # runs both suites (~40 min)
  python -m benchmarks.ci_time.measure --report_only           # tables and plot from results/
"""

from __future__ import annotations

import argparse
import collections
import json
import lzma
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
DEFAULT_OUT = HERE / "results"
PYTEST_ARGS = ("-n", "2", "--dist", "loadgroup", "-q", "-m", "not slow and not ray", "tests")

# Today's test files that the baseline did not have, by the work that added them (from each
# file's first commit). A path matches its longest prefix here.
ORIGINS: dict[str, str] = {
  "tests/aladdin/": "ALADDIN rebuilt and its recipe",
  "tests/examples/test_multihost.py": "multi-host trainer",
  "tests/examples/test_sharded_trainer.py": "multi-host trainer",
  "tests/lena/test_model_parallel.py": "multi-host trainer",
  "tests/benchmarks/test_multihost_bench.py": "multi-host trainer",
  "tests/benchmarks/test_adamw_scaling.py": "Adam-type optimizers",
  "tests/examples/test_reference_batch.py": "Adam-type optimizers",
  "tests/lena/test_scaling_rules.py": "Adam-type optimizers",
  "tests/": "experiment kit",
}

Records = dict[str, dict[str, float]]


def origin(nodeid: str) -> str:
  path = nodeid.split("::", 1)[0]
  prefix = max((p for p in ORIGINS if path.startswith(p)), key=len)
  return ORIGINS[prefix]


# ------------------------------------------------------------------------------------------
# Measuring
# ------------------------------------------------------------------------------------------


def run_suite(tree: Path, out: Path) -> dict[str, Any]:
  """Runs the non-Ray pass in ``tree`` with the timing plugin; returns its wall time and code."""
  out.mkdir(parents=True, exist_ok=True)
  env = dict(os.environ, CI_TIME_OUT=str(out), PYTHONPATH=f"{tree}{os.pathsep}{HERE}")
  start = time.perf_counter()
  cmd = [sys.executable, "-m", "pytest", "-p", "pytest_times", *PYTEST_ARGS]
  proc = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  tail = proc.stdout.decode(errors="replace").strip().splitlines()[-1:]
  return {
    "wall_s": round(time.perf_counter() - start, 1),
    "returncode": proc.returncode,
    "last_line": tail[0] if tail else "",
    "load_average_after": [round(x, 1) for x in os.getloadavg()],
  }


def measure(baseline: str, scratch: Path) -> dict[str, Any]:
  """Both suites, the baseline first; returns the runs' facts and per-test records."""
  tree = scratch / "baseline"
  subprocess.run(
    ["git", "worktree", "add", "--detach", str(tree), baseline], cwd=REPO_ROOT, check=True
  )
  try:
    runs = {"baseline": run_suite(tree, scratch / "times_baseline")}
  finally:
    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO_ROOT, check=False)
  runs["current"] = run_suite(REPO_ROOT, scratch / "times_current")
  return {
    "baseline": baseline,
    "current": git_head(),
    "runs": runs,
    "tests": {side: load_records(scratch / f"times_{side}") for side in ("baseline", "current")},
  }


def git_head() -> str:
  out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True)
  return out.stdout.decode().strip()


def load_records(directory: Path) -> Records:
  """The plugin's JSON lines of every worker, by node id (CPU of reaped children included)."""
  records: Records = {}
  for path in sorted(directory.glob("*.jsonl")):
    for line in path.read_text().splitlines():
      r = json.loads(line)
      cpu = r["cpu"] + r.get("cpu_children", 0.0)
      records[r["nodeid"]] = {"wall": round(r["wall"], 4), "cpu": round(cpu, 4)}
  return records


# ------------------------------------------------------------------------------------------
# Matching and reporting
# ------------------------------------------------------------------------------------------


def _name(nodeid: str) -> str:
  return nodeid.split("::", 1)[1]


def _base(nodeid: str) -> str:
  return os.path.basename(nodeid.split("::", 1)[0]).replace("test_aladdin_", "test_")


def match(baseline: Records, current: Records) -> dict[str, str]:
  """current node id -> baseline node id, for the tests of the same name."""
  by_name: dict[str, list[str]] = collections.defaultdict(list)
  for nodeid in baseline:
    by_name[_name(nodeid)].append(nodeid)
  matched: dict[str, str] = {}
  used: set[str] = set()
  for nodeid in sorted(current):
    candidates = [c for c in by_name.get(_name(nodeid), []) if c not in used]
    same_file = [c for c in candidates if _base(c) == _base(nodeid)]
    if same_file or candidates:
      matched[nodeid] = (same_file or candidates)[0]
      used.add(matched[nodeid])
  return matched


def _totals(records: Iterable[Mapping[str, float]]) -> dict[str, float]:
  records = list(records)
  return {
    "tests": len(records),
    "cpu_s": round(sum(r["cpu"] for r in records), 1),
    "wall_s": round(sum(r["wall"] for r in records), 1),
  }


def summarise(data: Mapping[str, Any]) -> dict[str, Any]:
  baseline, current = data["tests"]["baseline"], data["tests"]["current"]
  matched = match(baseline, current)
  used = set(matched.values())
  new = [n for n in current if n not in matched]
  groups: dict[str, list[Mapping[str, float]]] = collections.defaultdict(list)
  for nodeid in new:
    groups[origin(nodeid)].append(current[nodeid])
  by_file: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
  for nodeid, old in matched.items():
    row = by_file[nodeid.split("::", 1)[0]]
    row["tests"] += 1
    row["cpu_baseline_s"] += baseline[old]["cpu"]
    row["cpu_current_s"] += current[nodeid]["cpu"]
  return {
    "baseline": data["baseline"],
    "current": data["current"],
    "runs": data["runs"],
    "machine": data.get("machine", {}),
    "suites": {"baseline": _totals(baseline.values()), "current": _totals(current.values())},
    "matched": {
      "baseline": _totals(baseline[o] for o in matched.values()),
      "current": _totals(current[n] for n in matched),
    },
    "baseline_unmatched": _totals(baseline[n] for n in baseline if n not in used),
    "new_by_origin": {k: _totals(v) for k, v in sorted(groups.items())},
    "matched_by_file": {
      f: {k: round(v, 1) for k, v in row.items()} for f, row in sorted(by_file.items())
    },
  }


def tables(summary: Mapping[str, Any]) -> str:
  def row(label: str, t: Mapping[str, float]) -> list[object]:
    return [label, int(t["tests"]), f"{t['cpu_s']:.0f}", f"{t['wall_s']:.0f}"]

  header = ["tests", "count", "CPU s", "wall s (summed per test)"]
  rows = [
    row(f"baseline suite ({summary['baseline']}), all", summary["suites"]["baseline"]),
    row("  of which matched today", summary["matched"]["baseline"]),
    row("  of which not matched", summary["baseline_unmatched"]),
    row(f"today's suite ({summary['current']}), all", summary["suites"]["current"]),
    row("  matched: the baseline's tests today", summary["matched"]["current"]),
  ]
  rows += [row(f"  new: {k}", v) for k, v in summary["new_by_origin"].items()]
  text = harness.markdown_table(header, rows) + "\n\n"
  files = sorted(
    summary["matched_by_file"].items(),
    key=lambda kv: -abs(kv[1]["cpu_current_s"] - kv[1]["cpu_baseline_s"]),
  )
  file_rows = [
    [f, int(r["tests"]), f"{r['cpu_baseline_s']:.1f}", f"{r['cpu_current_s']:.1f}"]
    for f, r in files[:15]
  ]
  header = ["file today (matched tests)", "tests", "CPU s baseline", "CPU s today"]
  text += harness.markdown_table(header, file_rows) + "\n"
  return text


def plot(summary: Mapping[str, Any], path: Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 3.6))
  bottom = 0.0
  ax.bar(0, summary["matched"]["baseline"]["cpu_s"], color="tab:gray", label="matched tests")
  ax.bar(
    0,
    summary["baseline_unmatched"]["cpu_s"],
    bottom=summary["matched"]["baseline"]["cpu_s"],
    color="lightgray",
    label="baseline tests not matched",
  )
  ax.bar(1, summary["matched"]["current"]["cpu_s"], color="tab:gray")
  bottom = summary["matched"]["current"]["cpu_s"]
  for i, (name, t) in enumerate(summary["new_by_origin"].items()):
    ax.bar(1, t["cpu_s"], bottom=bottom, color=f"C{i}", label=f"new: {name}")
    bottom += t["cpu_s"]
  ax.set_xticks([0, 1], [f"baseline {summary['baseline']}", f"today {summary['current']}"])
  ax.set_ylabel("CPU seconds (non-Ray tests)")
  ax.legend(fontsize=7, loc="upper left")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--baseline", default="34a7beb", help="the commit to compare with")
  parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
  parser.add_argument(
    "--from_dirs",
    nargs=2,
    type=Path,
    metavar=("BASELINE", "CURRENT"),
    help="analyse per-test records already measured (the plugin's output folders)",
  )
  parser.add_argument("--current", default=None, help="with --from_dirs: the measured commit")
  parser.add_argument("--report_only", action="store_true")
  args = parser.parse_args(argv)
  raw = args.out / "per_test.json.xz"
  if args.report_only:
    data = json.loads(lzma.decompress(raw.read_bytes()))
  elif args.from_dirs:
    tests = {
      side: load_records(d) for side, d in zip(("baseline", "current"), args.from_dirs, strict=True)
    }
    current = args.current or git_head()
    data = {"baseline": args.baseline, "current": current, "runs": {}, "tests": tests}
  else:
    with tempfile.TemporaryDirectory() as scratch:
      data = measure(args.baseline, Path(scratch))
  if not args.report_only:
    data["machine"] = harness.machine_info()
    args.out.mkdir(parents=True, exist_ok=True)
    raw.write_bytes(lzma.compress(json.dumps(data, sort_keys=True).encode()))
  summary = summarise(data)
  harness.write_json(args.out / "summary.json", summary)
  harness.write_text(args.out / "tables.md", tables(summary))
  plot(summary, args.out / "ci_time.png")
  print(tables(summary))
  return summary


if __name__ == "__main__":
  main()
