"""A damaged checkpoint is never resumed: bit flips in every kind of file of the newest step,
truncation, zero-fill and damaged metadata each end in a warning naming the step and a fallback
to the previous checkpoint (or, when asked, an error naming the directory to delete); a save
that did not finish and a stray empty step are set aside as incomplete; a resumed run from
the fallback ends bitwise as the undamaged run. A partial last line of ``metrics.jsonl`` is
dropped, a damaged ``config.json`` is a clear error."""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from examples import checkpoints
from examples.lena import configs, train

STEPS, EVERY = 6, 3


def _config(cache_dir: str, **changes) -> configs.Config:
  base = configs.get_config("tiny_test")
  changes = {"num_steps": STEPS, "checkpoint_every": EVERY, "eval_every": EVERY, **changes}
  return dataclasses.replace(base, cache_dir=cache_dir, log_every=0, **changes)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, cache_dir: str):
  workdir = tmp_path_factory.mktemp("trained")
  config = _config(cache_dir)
  final = train.train_and_evaluate(config, workdir)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["3", "6"]
  steps = {s: checkpoints.restore_checkpoint(workdir, s) for s in (EVERY, STEPS)}
  return workdir, config, jax.device_get(final.params), steps


def _copy(trained, tmp_path: Path) -> Path:
  workdir = tmp_path / "run"
  shutil.copytree(trained[0], workdir)
  return workdir


def _same(a, b) -> bool:
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(
    np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True)
  )


def _resume_layer(workdir: Path, config: configs.Config, template) -> dict:
  mgr = checkpoints.manager(workdir, config)
  assert mgr is not None
  try:
    return checkpoints.restore_latest(mgr, template, config.seed, config.damaged_checkpoints)
  finally:
    mgr.close()


def _kind(relative: str) -> str:
  name = relative.rsplit("/", 1)[-1]
  if "/d/" in f"/{relative}":
    return "value chunk"
  if name in ("manifest.ocdbt", checkpoints.DIGEST, "_METADATA", "_CHECKPOINT_METADATA"):
    return name
  return "other"


def _files_by_kind(step_dir: Path) -> dict[str, list[Path]]:
  out: dict[str, list[Path]] = {}
  for p in sorted(step_dir.rglob("*")):
    if p.is_file() and p.stat().st_size:
      out.setdefault(_kind(str(p.relative_to(step_dir))), []).append(p)
  return out


def _assert_fell_back(trained, restored, caplog, damaged: str, how: str = "damaged") -> None:
  """The resume took step 3 exactly, after a warning naming the damaged step."""
  assert restored is not None
  assert int(restored["state"]["step"]) == EVERY
  assert _same(restored["state"], trained[3][EVERY]["state"])
  warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert any(f"checkpoints/{damaged} is {how}" in m for m in warned), warned


def test_bit_flips_in_every_file_kind_fall_back_to_the_previous_checkpoint(
  trained, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
  kinds = _files_by_kind(trained[0] / "checkpoints" / str(STEPS))
  assert {"value chunk", "manifest.ocdbt", checkpoints.DIGEST, "_METADATA"} <= set(kinds)
  rng = np.random.default_rng(20261203)
  template = trained[3][EVERY]
  flips = 0
  for round_ in range(6):  # every kind each round: at least 20 flips over all kinds
    for kind, files in sorted(kinds.items()):
      workdir = tmp_path / f"{round_}-{kind.replace('.', '_')}"
      shutil.copytree(trained[0], workdir)
      source = files[int(rng.integers(len(files)))]
      target = workdir / source.relative_to(trained[0])
      data = bytearray(target.read_bytes())
      at = int(rng.integers(len(data)))
      data[at] ^= 1 << int(rng.integers(8))
      target.write_bytes(bytes(data))
      caplog.clear()
      with caplog.at_level(logging.WARNING, logger="examples.lena.train"):
        restored = _resume_layer(workdir, trained[1], template)
      _assert_fell_back(trained, restored, caplog, str(STEPS))
      assert (workdir / checkpoints.DAMAGED_DIR / str(STEPS)).is_dir()  # kept for inspection
      flips += 1
      shutil.rmtree(workdir)
  assert flips >= 20


@pytest.mark.parametrize(
  "damage", ["truncate value chunk", "zero-fill value chunk", "truncate _METADATA", "no digest"]
)
def test_truncated_zeroed_or_unfinished_checkpoints_are_not_resumed(
  trained, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
  workdir = _copy(trained, tmp_path)
  kinds = _files_by_kind(workdir / "checkpoints" / str(STEPS))
  if damage == "no digest":  # the save was cut off before its digest was written
    (workdir / "checkpoints" / str(STEPS) / checkpoints.DIGEST).unlink()
  else:
    target = max(
      kinds["_METADATA" if "METADATA" in damage else "value chunk"], key=lambda p: p.stat().st_size
    )
    size = target.stat().st_size
    target.write_bytes(target.read_bytes()[: size // 2] if "truncate" in damage else bytes(size))
  with caplog.at_level(logging.WARNING, logger="examples.lena.train"):
    restored = _resume_layer(workdir, trained[1], trained[3][EVERY])
  how = "incomplete" if damage == "no digest" else "damaged"
  _assert_fell_back(trained, restored, caplog, str(STEPS), how)
  kept = checkpoints.INCOMPLETE_DIR if damage == "no digest" else checkpoints.DAMAGED_DIR
  assert (workdir / kept / str(STEPS)).is_dir()


def test_an_unfinished_save_is_set_aside_even_when_damage_is_an_error(
  trained, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
  """A crash between orbax's rename and the digest is an ordinary crash, not damage: with
  ``damaged_checkpoints='error'`` it is set aside, and with no older step the run starts afresh
  (nothing was saved); a damaged step still stops the run, naming the directory to delete."""
  workdir = _copy(trained, tmp_path)
  error = dataclasses.replace(trained[1], damaged_checkpoints="error")
  for step in (STEPS, EVERY):
    (workdir / "checkpoints" / str(step) / checkpoints.DIGEST).unlink()
  with caplog.at_level(logging.WARNING, logger="examples.lena.train"):
    assert _resume_layer(workdir, error, trained[3][EVERY]) is None
  assert sorted(p.name for p in (workdir / checkpoints.INCOMPLETE_DIR).iterdir()) == ["3", "6"]
  assert not (workdir / checkpoints.DAMAGED_DIR).exists()
  shutil.rmtree(workdir)
  workdir = _copy(trained, tmp_path)
  (workdir / "checkpoints" / str(STEPS) / checkpoints.DIGEST).write_text("{")
  with pytest.raises(checkpoints.DamagedCheckpointError, match=f"checkpoints/{STEPS}.*Delete"):
    _resume_layer(workdir, error, trained[3][EVERY])


def test_a_stray_empty_step_is_skipped_and_no_good_checkpoint_is_a_clear_error(
  trained, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
  workdir = _copy(trained, tmp_path)
  (workdir / "checkpoints" / "9").mkdir()
  with caplog.at_level(logging.WARNING, logger="examples.lena.train"):
    restored = _resume_layer(workdir, trained[1], trained[3][EVERY])
  assert restored is not None and int(restored["state"]["step"]) == STEPS
  assert any(
    "checkpoints/9 is incomplete: an empty step directory" in r.getMessage() for r in caplog.records
  )
  for step in (EVERY, STEPS):
    (workdir / "checkpoints" / str(step) / checkpoints.DIGEST).write_text("{")
  with pytest.raises(checkpoints.DamagedCheckpointError, match="No usable checkpoint"):
    _resume_layer(workdir, trained[1], trained[3][EVERY])


def test_the_trainer_resumes_bitwise_from_the_fallback(
  trained, tmp_path: Path, caplog: pytest.LogCaptureFixture, cache_dir: str
) -> None:
  workdir = _copy(trained, tmp_path)
  value = max(
    _files_by_kind(workdir / "checkpoints" / str(STEPS))["value chunk"],
    key=lambda p: p.stat().st_size,
  )
  data = bytearray(value.read_bytes())
  data[len(data) // 2] ^= 0x10
  value.write_bytes(bytes(data))
  with (workdir / "metrics.jsonl").open("a") as f:
    f.write('{"type": "eval", "iter')  # a run killed mid-write
  with caplog.at_level(logging.WARNING, logger="examples.lena.train"):
    final = train.train_and_evaluate(trained[1], workdir)
  assert any(f"checkpoints/{STEPS} is damaged" in r.getMessage() for r in caplog.records)
  assert any("partial last line" in r.getMessage() for r in caplog.records)
  assert int(final.step) == STEPS and _same(jax.device_get(final.params), trained[2])
  # A damaged config.json stops the resume with the file's name and what to do.
  (workdir / "config.json").write_text('{"seed": 0, "mod')
  with pytest.raises(configs.ConfigError, match=r"config\.json is damaged.*delete it"):
    train.train_and_evaluate(trained[1], workdir)
