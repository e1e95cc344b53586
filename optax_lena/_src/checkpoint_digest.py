"""Digests that make a checkpoint unable to restore wrong: one ``digest.json`` per step.

The digest of a step holds the path, shape, dtype and SHA-256 of every array (its
little-endian C-order bytes) in tree order, one SHA-256 over them all, the size and SHA-256 of
every file of the step, and a seal over the record itself. TensorStore checks its b-trees but
not the arrays' value chunks, so a flipped bit there restores without error; the digest's file
hashes catch it before the restore, and :func:`check_tree` compares what was restored with what
was saved. A step without a digest, or an empty step directory, is incomplete: the process died
while saving. Used by the example trainer's checkpoints and by the ALADDIN parameter-server
shards.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

DIGEST = "digest.json"
INCOMPLETE = (f"no {DIGEST}: the save did not finish", "an empty step directory")
_FORMAT = 1


def _sha(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _canonical_bytes(a: np.ndarray) -> bytes:
  if a.dtype.byteorder == ">":
    a = a.byteswap().view(a.dtype.newbyteorder("<"))
  return a.tobytes(order="C")


def _host_leaf(x: Any) -> np.ndarray:
  if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if not isinstance(x, jax.Array) or x.is_fully_addressable:
    return np.asarray(jax.device_get(x))  # one process: no collective
  if x.is_fully_replicated:
    return np.asarray(x.addressable_shards[0].data)
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.process_allgather(x, tiled=True))  # every process calls it


def tree_digest(tree: Any) -> list[dict[str, Any]]:
  """``path`` (``/``-joined keys, the same for dataclasses, NamedTuples and dicts), ``shape``,
  ``dtype`` and ``sha256`` of every array of ``tree``, in tree order.

  On several processes every process must call it (sharded arrays are gathered)."""
  out = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    a = _host_leaf(leaf)
    key = jax.tree_util.keystr(path, simple=True, separator="/")
    digest = _sha(_canonical_bytes(a))
    out.append({"path": key, "shape": list(a.shape), "dtype": str(a.dtype), "sha256": digest})
  return out


def _tree_sha(leaves: list[dict[str, Any]]) -> str:
  return _sha(json.dumps(leaves, sort_keys=True).encode())


def _files(step_dir: Path) -> dict[str, dict[str, Any]]:
  files = sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != DIGEST)
  return {
    str(p.relative_to(step_dir)): {"size": p.stat().st_size, "sha256": _sha(p.read_bytes())}
    for p in files
  }


def _seal(record: dict[str, Any]) -> str:
  return _sha(json.dumps({k: v for k, v in record.items() if k != "seal"}, sort_keys=True).encode())


def write_digest(step_dir: Path, step: int, leaves: list[dict[str, Any]]) -> None:
  """Writes ``step_dir/digest.json`` (atomically: a reader sees all of it or none)."""
  record: dict[str, Any] = {
    "format": _FORMAT,
    "step": step,
    "leaves": leaves,
    "tree_sha256": _tree_sha(leaves),
    "files": _files(step_dir),
  }
  record["seal"] = _seal(record)
  tmp = step_dir / f".{DIGEST}.tmp"
  with tmp.open("w") as f:
    json.dump(record, f)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, step_dir / DIGEST)


def check_files(step_dir: Path) -> tuple[dict[str, Any] | None, str]:
  """``(digest, '')`` when ``step_dir`` holds a sealed digest whose files are all intact, else
  ``(None, reason)``."""
  if not any(step_dir.iterdir()):
    return None, INCOMPLETE[1]
  path = step_dir / DIGEST
  if not path.exists():
    return None, INCOMPLETE[0]
  try:
    record = json.loads(path.read_text())
    ok = isinstance(record, dict) and record.get("seal") == _seal(record)
    ok = ok and record.get("tree_sha256") == _tree_sha(record.get("leaves"))
  except (ValueError, TypeError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
    return None, f"{DIGEST} is unreadable ({type(e).__name__}: {e})"
  if not ok or record.get("step") != int(step_dir.name):
    return None, f"{DIGEST} does not match its own seal"
  files = _files(step_dir)
  for name, want in record["files"].items():
    got = files.get(name)
    if got is None:
      return None, f"{name} is missing"
    if got != want:
      what = "size" if got["size"] != want["size"] else "content"
      return None, f"{name} changed ({what} differs from the digest)"
  return record, ""


def check_tree(record: dict[str, Any], tree: Any) -> str:
  """'' when the arrays of ``tree`` are those of ``record`` (shapes, dtypes and bytes), else the
  first difference."""
  got = {leaf["path"]: leaf for leaf in tree_digest(tree)}
  want = {leaf["path"]: leaf for leaf in record["leaves"]}
  if set(got) != set(want):
    return f"the restored tree has arrays {sorted(set(got) ^ set(want))[:3]} unlike the digest"
  for key, leaf in want.items():
    if got[key] != leaf:
      field = next(f for f in ("shape", "dtype", "sha256") if got[key][f] != leaf[f])
      return f"array {key} restored with another {field} than was saved"
  return ""
