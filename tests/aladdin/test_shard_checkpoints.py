"""The parameter-server shards' checkpoints cannot restore wrong, without a Ray cluster: the
shard's own save and restore functions on a real server state. Seeded bit flips in every kind
of file of a step, truncation, zero-fill, damaged metadata, a missing digest and an empty step
are each set aside with a warning and the older step is resumed, bitwise; shards that disagree
resume from the newest step intact in all of them; nothing left is one clear error."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from optax_lena import aladdin as al
from optax_lena import checkpoint_digest as digest
from optax_lena._src.aladdin.ray import shard_checkpoints as sc

OLD, NEW, SHARDS = 20, 40, 2


def _state(seed: int):
  server = al.algorithm("aladdin", period=2).server(2)
  state = server.init(jax.numpy.zeros(64, np.float32))
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: np.asarray(rng.normal(size=np.shape(x)).astype(x.dtype)), state)


def _manager(directory: Path) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=False)
  return ocp.CheckpointManager(directory, options=options)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory):
  """Two shards, each with steps 20 and 40 (different states), saved as the shard saves."""
  root = tmp_path_factory.mktemp("ckpt")
  payloads = {}
  for k in range(SHARDS):
    with _manager(sc.shard_dir(root, k)) as mgr:
      for step in (OLD, NEW):
        payloads[k, step] = {"state": _state(10 * k + step), "updates": np.asarray(step, np.int64)}
        sc.save(mgr, step, payloads[k, step])
  return root, payloads


def _copy(saved, tmp_path: Path) -> Path:
  root = tmp_path / "ckpt"
  shutil.copytree(saved[0], root)
  return root


def _restore(root: Path, shard: int, payloads):
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, payloads[shard, OLD])
  with _manager(sc.shard_dir(root, shard)) as mgr:
    return sc.restore(mgr, root, shard, target)


def _same(a, b) -> bool:
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb, strict=True))


def _files(step_dir: Path) -> dict[str, list[Path]]:
  kinds: dict[str, list[Path]] = {}
  for p in sorted(step_dir.rglob("*")):
    if p.is_file() and p.stat().st_size:
      rel = str(p.relative_to(step_dir))
      kind = "value chunk" if "/d/" in f"/{rel}" else p.name
      kinds.setdefault(kind if kind in ("value chunk", digest.DIGEST) else "metadata", []).append(p)
  return kinds


def test_the_undamaged_newest_step_restores_bitwise(saved, tmp_path: Path) -> None:
  root = _copy(saved, tmp_path)
  assert sc.agree(root, SHARDS) == NEW
  for k in range(SHARDS):
    assert _same(_restore(root, k, saved[1]), saved[1][k, NEW])
  assert sc.agree(tmp_path / "none", SHARDS) is None  # a fresh run


def test_bit_flips_in_every_file_kind_are_never_resumed(
  saved, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
  kinds = _files(saved[0] / "shard_0" / str(NEW))
  assert {"value chunk", digest.DIGEST, "metadata"} <= set(kinds), kinds
  rng = np.random.default_rng(0)
  flips = [(kind, int(rng.integers(len(kinds[kind])))) for kind in sorted(kinds) for _ in range(8)]
  assert len(flips) >= 20
  for n, (kind, index) in enumerate(flips):
    root = _copy(saved, tmp_path / str(n))
    target = sorted(_files(root / "shard_0" / str(NEW))[kind])[index]
    data = bytearray(target.read_bytes())
    data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
    target.write_bytes(bytes(data))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="optax_lena.aladdin"):
      # On the driver: shard 0's step 40 is damaged, so both shards resume from 20.
      assert sc.agree(root, SHARDS) == OLD, (kind, target)
      # A shard restarted by Ray: the same files, the same fallback.
      for k in range(SHARDS):
        assert _same(_restore(root, k, saved[1]), saved[1][k, OLD])
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert f"shard_0/{NEW} is set aside (damaged)" in warned, (kind, warned)
    assert f"shard_1/{NEW} is set aside (unmatched)" in warned
    assert (root / "damaged" / "shard_0" / str(NEW)).is_dir()


@pytest.mark.parametrize("damage", ["truncate", "zero-fill", "metadata", "no digest", "empty"])
def test_truncated_zeroed_or_unfinished_steps_are_set_aside(
  saved, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
  root = _copy(saved, tmp_path)
  step_dir = root / "shard_1" / str(NEW)
  kinds = _files(step_dir)
  if damage == "no digest":
    (step_dir / digest.DIGEST).unlink()
  elif damage == "empty":
    shutil.rmtree(step_dir)
    step_dir.mkdir()
  else:
    target = max(kinds["metadata" if damage == "metadata" else "value chunk"], key=_size)
    size = target.stat().st_size
    target.write_bytes(target.read_bytes()[: size // 2] if damage != "zero-fill" else bytes(size))
  with caplog.at_level(logging.WARNING, logger="optax_lena.aladdin"):
    assert sc.agree(root, SHARDS) == OLD
  kind = "incomplete" if damage in ("no digest", "empty") else "damaged"
  assert (root / kind / "shard_1" / str(NEW)).is_dir()
  assert any(f"shard_1/{NEW} is set aside ({kind})" in r.getMessage() for r in caplog.records)
  assert _same(_restore(root, 1, saved[1]), saved[1][1, OLD])


def _size(p: Path) -> int:
  return p.stat().st_size


def test_arrays_unlike_the_digest_and_nothing_left_are_clear_errors(saved, tmp_path: Path) -> None:
  root = _copy(saved, tmp_path)
  # A digest rewritten for other arrays (files intact, sealed): the restore-time check catches it.
  step_dir = root / "shard_0" / str(NEW)
  other = {"state": _state(99), "updates": np.asarray(NEW, np.int64)}
  digest.write_digest(step_dir, NEW, digest.tree_digest(other))
  assert _same(_restore(root, 0, saved[1]), saved[1][0, OLD])
  assert (root / "damaged" / "shard_0" / str(NEW)).is_dir()
  # No step intact in every shard: the driver stops before any actor, naming what to delete.
  root = _copy(saved, tmp_path / "none")
  for step in (OLD, NEW):
    (root / "shard_0" / str(step) / digest.DIGEST).write_text("{")
  with pytest.raises(sc.CheckpointError, match=r"no step intact in every shard.*Delete"):
    sc.agree(root, SHARDS)
  # A restarted shard whose every step is damaged stops rather than start from scratch.
  root = _copy(saved, tmp_path / "restarted")
  for step in (OLD, NEW):
    (root / "shard_0" / str(step) / digest.DIGEST).write_text("{")
  with pytest.raises(sc.CheckpointError, match="no usable checkpoint left"):
    _restore(root, 0, saved[1])
