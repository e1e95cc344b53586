"""docs/ALADDIN.md cannot drift from the code: its public-names section lists exactly the names
each ALADDIN module exports (``__all__``), and every name it lists exists."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest

ALADDIN_MD = pathlib.Path(__file__).resolve().parents[2] / "docs" / "ALADDIN.md"
# How the page spells the three modules.
PREFIXES = {
  "al": "optax_lena.aladdin",
  "sim": "optax_lena.aladdin.simulator",
  "ad": "optax_lena.aladdin.distributed",
}


def documented() -> dict[str, list[str]]:
  """``{"al": [names...]}``: the first cells of the section's table rows, in order."""
  text = ALADDIN_MD.read_text()
  section = text[text.index("## 7. Public names") :]
  out: dict[str, list[str]] = {prefix: [] for prefix in PREFIXES}
  for prefix, name in re.findall(r"^\| `(al|sim|ad)\.(\w+)` \|", section, flags=re.M):
    out[prefix].append(name)
  return out


@pytest.mark.parametrize("prefix", sorted(PREFIXES))
def test_every_public_name_is_listed_once_and_every_listed_name_exists(prefix: str) -> None:
  if prefix == "ad":
    pytest.importorskip("ray")
  module = importlib.import_module(PREFIXES[prefix])
  listed = documented()[prefix]
  assert len(listed) == len(set(listed)), f"listed twice: {sorted(listed)}"
  missing = sorted(set(module.__all__) - set(listed))
  stale = sorted(set(listed) - set(module.__all__))
  assert not missing, f"docs/ALADDIN.md section 7 lacks {prefix}.{missing}"
  assert not stale, f"docs/ALADDIN.md section 7 lists names that are not public: {stale}"
  for name in module.__all__:
    assert hasattr(module, name), f"{PREFIXES[prefix]}.__all__ names {name}, which is missing"


def test_the_section_is_read_as_written() -> None:
  # Guards the parser: it finds the three tables, and a name outside them is not counted.
  rows = documented()
  assert "worker_merge" in rows["al"] and "simulate" in rows["sim"] and "Runtime" in rows["ad"]
  assert "ShardSpec" not in rows["al"]  # named in the prose of removed names, not in a row
