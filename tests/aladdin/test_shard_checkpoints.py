"""The parameter-server shards' checkpoints cannot restore wrong, without a Ray cluster: the
shard's own save and restore functions on a real server state, numbered by run-wide
generations. Seeded bit flips in every kind of file of a generation, truncation, zero-fill,
damaged metadata, a missing digest and an empty directory are each set aside with a warning and
the older generation is resumed, bitwise; an unfinished save is set aside; shards that disagree
resume from the newest generation intact in all of them, or each from its own newest when they
have none in common; a shard with nothing intact left is one clear error; a checkpoint_dir that
cannot be written is refused before any actor starts."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from optax_lena import aladdin as al
from optax_lena import checkpoint_digest as digest
from optax_lena._src.aladdin.ray import shard_checkpoints as sc

OLD, NEW, SHARDS = 1, 2, 2  # generations (the shards' update counts differ: see ``saved``)


def _state(seed: int):
  server = al.algorithm("aladdin", period=2).server(2)
  state = server.init(jax.numpy.zeros(64, np.float32))
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: np.asarray(rng.normal(size=np.shape(x)).astype(x.dtype)), state)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory):
  """Two shards, each with generations 1 and 2 (different states and update counts), saved as
  the shard saves."""
  root = tmp_path_factory.mktemp("ckpt")
  payloads = {}
  for k in range(SHARDS):
    with sc.manager(root, k) as mgr:
      for step in (OLD, NEW):
        updates = np.asarray(20 * step + 3 * k, np.int64)  # a shard's own count
        payloads[k, step] = {"state": _state(10 * k + step), "updates": updates}
        sc.save(mgr, step, payloads[k, step])
  return root, payloads


def _copy(saved, tmp_path: Path) -> Path:
  root = tmp_path / "ckpt"
  shutil.copytree(saved[0], root)
  return root


def _restore(root: Path, shard: int, payloads, generation: int | None = None):
  """What a shard restores: ``generation`` (the driver's choice), or its newest (after a restart
  by Ray); the payload, checked to be that generation's."""
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, payloads[shard, OLD])
  with sc.manager(root, shard) as mgr:
    restored = sc.restore(mgr, root, shard, target, generation)
  assert restored is not None
  step, payload = restored
  assert int(payload["updates"]) == int(payloads[shard, step]["updates"])
  return payload


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
  assert sc.agree(root, SHARDS) == [NEW, NEW]
  for k in range(SHARDS):
    assert _same(_restore(root, k, saved[1], NEW), saved[1][k, NEW])
    assert _same(_restore(root, k, saved[1], OLD), saved[1][k, OLD])  # the driver's choice
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
      # On the driver: shard 0's generation 2 is damaged, so both shards resume from 1.
      assert sc.agree(root, SHARDS) == [OLD, OLD], (kind, target)
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
    assert sc.agree(root, SHARDS) == [OLD, OLD]
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
  # A shard with no intact generation left: the driver stops before any actor, naming what to
  # delete.
  root = _copy(saved, tmp_path / "none")
  for step in (OLD, NEW):
    (root / "shard_0" / str(step) / digest.DIGEST).write_text("{")
  with pytest.raises(
    sc.CheckpointError, match=r"shard\(s\) \[0\] have no intact generation.*Delete"
  ):
    sc.agree(root, SHARDS)
  # A restarted shard whose every step is damaged stops rather than start from scratch.
  root = _copy(saved, tmp_path / "restarted")
  for step in (OLD, NEW):
    (root / "shard_0" / str(step) / digest.DIGEST).write_text("{")
  with pytest.raises(sc.CheckpointError, match="no usable checkpoint left"):
    _restore(root, 0, saved[1])


def test_interrupted_rounds_and_unfinished_saves_never_stop_a_resume(
  saved, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
  """What kills leave: a save round that reached one shard (generation 3 in shard 0 only), an
  Orbax save that never finished (its temporary directory), and shards with no generation in
  common (each resumes from its own newest, bitwise)."""
  root = _copy(saved, tmp_path)
  with sc.manager(root, 0) as mgr:
    sc.save(mgr, 3, {"state": _state(3), "updates": np.asarray(61, np.int64)})
  unfinished = root / "shard_1" / "3.orbax-checkpoint-tmp-1733480000"
  (unfinished / "state").mkdir(parents=True)
  (unfinished / "state" / "junk").write_bytes(b"half a save")
  with caplog.at_level(logging.WARNING, logger="optax_lena.aladdin"):
    assert sc.agree(root, SHARDS) == [NEW, NEW]
  warned = " ".join(r.getMessage() for r in caplog.records)
  assert "3.orbax-checkpoint-tmp-1733480000 is set aside (incomplete)" in warned
  assert (root / "incomplete" / "shard_1" / unfinished.name / "state" / "junk").exists()
  assert not unfinished.exists() and (root / "unmatched" / "shard_0" / "3").is_dir()
  # No generation in common (shard 0 keeps only 2, shard 1 only 1): each shard its newest.
  root = _copy(saved, tmp_path / "apart")
  shutil.rmtree(root / "shard_0" / str(OLD))
  shutil.rmtree(root / "shard_1" / str(NEW))
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="optax_lena.aladdin"):
    assert sc.agree(root, SHARDS) == [NEW, OLD]
  assert "no generation in common" in " ".join(r.getMessage() for r in caplog.records)
  assert _same(_restore(root, 0, saved[1], NEW), saved[1][0, NEW])
  assert _same(_restore(root, 1, saved[1], OLD), saved[1][1, OLD])


def test_a_shard_keeps_the_newest_generations_and_saves_each_once(tmp_path: Path) -> None:
  """The shard's own checkpoint(): generations as the driver numbers them, each saved once (a
  round retried on a restarted shard saves nothing), ``KEEP`` kept, counters saved with them."""
  import optax

  from optax_lena._src.aladdin.ray.shard import ServerShard
  from optax_lena.aladdin import distributed as ad

  spec = al.algorithm("aladdin", worker_tx=optax.sgd(0.1), period=1)
  config = ad.Config(spec, num_workers=1, checkpoint_dir=str(tmp_path / "ckpt"))
  shard = ServerShard(0, np.zeros(6, np.float32), config)
  assert shard.restored_generation == -1 and shard.checkpoint(1) == 1
  ones = np.ones((1, 6), np.float32)
  for generation in range(2, 2 + sc.KEEP + 1):
    shard.receive(0, ones, np.ones(1, bool))
    assert shard.checkpoint(generation) == generation
  assert shard.checkpoint(3) == 3 and shard.num_checkpoints == sc.KEEP + 2  # not saved again
  kept = sorted(int(p.name) for p in (tmp_path / "ckpt" / "shard_0").iterdir())
  assert kept == list(range(sc.KEEP + 2 - sc.KEEP + 1, sc.KEEP + 3))
  again = ServerShard(0, np.zeros(6, np.float32), config, generation=kept[0])
  assert again.restored_generation == kept[0] and again.restored_updates == kept[0] - 1
  np.testing.assert_array_equal(
    np.asarray(again.state.params), -np.full(6, kept[0] - 1, np.float32)
  )


@pytest.mark.parametrize("case", ["file", "shard file", "proc", "unwritable"])
def test_an_unusable_checkpoint_dir_is_refused_before_any_actor(tmp_path: Path, case: str) -> None:
  from optax_lena.aladdin import distributed as ad
  from tests.aladdin.ray import helpers

  spec = helpers.spec("aladdin")
  if case == "file":
    (tmp_path / "ckpt").write_text("")
    with pytest.raises(ValueError, match="exists and is not a directory"):
      ad.Config(spec, ps_shards=2, checkpoint_dir=str(tmp_path / "ckpt"))
  elif case == "shard file":
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "shard_1").write_text("")
    with pytest.raises(ValueError, match=r"shard_1 exists and is not a directory"):
      ad.Config(spec, ps_shards=2, checkpoint_dir=str(tmp_path / "ckpt"))
  elif case == "proc":  # a path Config cannot tell apart: the Runtime's probe, before Ray starts
    config = ad.Config(spec, ps_shards=2, checkpoint_dir="/proc/optax_lena_ckpt")
    with pytest.raises(ValueError, match=r"shard_0 cannot be made or written"):
      ad.Runtime(helpers.make_task(), config)
    assert not ray_initialized()
  else:  # root writes anywhere: an unprivileged user runs the probe, in a child process
    if os.getuid() != 0:
      pytest.skip("needs root to run the probe as an unprivileged user")
    (tmp_path / "ckpt").mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    code = (
      "from optax_lena._src.aladdin.ray import shard_checkpoints as sc\n"
      f"sc.prepare({str(tmp_path / 'ckpt')!r}, 2)\n"
    )
    child = helpers.run_as(helpers.RUNNER_UID, code, str(tmp_path), stderr=subprocess.PIPE)
    _, err = child.communicate(timeout=300)
    assert child.returncode == 1 and "shard_0 cannot be made or written" in err, err


def ray_initialized() -> bool:
  ray = pytest.importorskip("ray")
  return ray.is_initialized()
