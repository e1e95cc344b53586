"""The CI-time benchmark's declared comparison (one measurement: the cell ``per_test``) and the
rule that matches today's tests to the baseline's."""

from __future__ import annotations

import collections
import dataclasses
import os

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


@dataclasses.dataclass(frozen=True)
class CiTime:
  """The commit to compare with, and optionally the per-test records already measured."""

  baseline: str = "34a7beb"
  from_dirs: tuple[str, ...] = ()  # (baseline folder, current folder) of the plugin's records
  current: str = ""  # with from_dirs: the measured commit ("": HEAD)


def _name(nodeid: str) -> str:
  return nodeid.split("::", 1)[1]


def _base(nodeid: str) -> str:
  return os.path.basename(nodeid.split("::", 1)[0]).replace("test_aladdin_", "test_")


def match(baseline: Records, current: Records) -> dict[str, str]:
  """current node id -> baseline node id, for the tests of the same name."""
  by_name: dict[str, list[str]] = collections.defaultdict(list)
  for nodeid in sorted(baseline):  # in name order: the same matches from any stored order
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
