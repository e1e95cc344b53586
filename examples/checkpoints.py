"""Orbax checkpoints of the train state and of where the data stream stands.

A checkpoint holds the state (params, BatchNorm statistics, optimizer state, step), the data
stream's position and the wall time so far. The stream is a function of (seed, epoch)
(``input_pipeline.global_batches``), so its position after ``step`` updates is all that is
needed to continue the same sequence of batches: on the CPU a resumed run is bitwise identical
to an uninterrupted one.

Every checkpoint ``checkpoints/<step>`` gets a ``digest.json`` once its save has finished: the
path, shape, dtype and SHA-256 of every array (its little-endian C-order bytes) in tree order,
one SHA-256 over them all, the size and SHA-256 of every file of the step, and a seal over the
record itself. TensorStore checks its b-trees but not the arrays' value chunks, so a flipped
bit there restores without error; the digest is what catches it. A step without a digest (or
an empty one) is incomplete: the process died while saving, before the digest was written. It
is named in a warning and moved to ``checkpoints_incomplete/`` whatever the setting, as orbax
sets aside its own unfinished saves, and resuming goes on from the step before it (from the
start when there is none: nothing was saved). On resume the newest step is tried first: a
damaged one is named in a warning, moved to ``checkpoints_damaged/`` and the next older one is
tried (``damaged_checkpoints='fallback'``), or the run stops naming the directory to delete
(``'error'``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Protocol

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from examples.errors import ConfigError
from optax_lena import checkpoint_digest

log = logging.getLogger("examples.lena.train")
DIGEST = checkpoint_digest.DIGEST
DAMAGED_DIR = "checkpoints_damaged"  # beside checkpoints/, where orbax does not look
INCOMPLETE_DIR = "checkpoints_incomplete"
_INCOMPLETE = checkpoint_digest.INCOMPLETE
tree_digest, write_digest = checkpoint_digest.tree_digest, checkpoint_digest.write_digest
check_files, check_tree = checkpoint_digest.check_files, checkpoint_digest.check_tree
ON_DAMAGE = ("fallback", "error")


class DamagedCheckpointError(ConfigError):
  """No checkpoint can be resumed; the message names the step directory and what to do."""


class CheckpointSettings(Protocol):
  """The settings of a run that :func:`manager` reads (the trainer's ``Config`` has them)."""

  @property
  def checkpoint_every(self) -> int: ...  # updates between checkpoints; 0: none

  @property
  def keep_checkpoints(self) -> int: ...

  @property
  def damaged_checkpoints(self) -> str: ...  # one of ON_DAMAGE


# ----------------------------------------------------------------------------------------------
# Saving and resuming
# ----------------------------------------------------------------------------------------------


def _step_dirs(directory: Path) -> list[Path]:
  """Step directories (orbax's default names: the step), newest first; orbax's temporary
  ``<step>.orbax-checkpoint-tmp-*`` directories are not steps."""
  if not directory.is_dir():
    return []
  return sorted((p for p in directory.iterdir() if p.name.isdigit()), key=lambda p: -int(p.name))


def _sync(name: str) -> None:
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def _set_aside(step_dir: Path, reason: str, on_damage: str) -> None:
  """Moves an incomplete step to ``checkpoints_incomplete/``; for a damaged one, stops
  (``'error'``) or warns and moves it to ``checkpoints_damaged/``."""
  incomplete = reason in _INCOMPLETE
  if on_damage == "error" and not incomplete:
    raise DamagedCheckpointError(
      f"Checkpoint {step_dir} is damaged: {reason}. Delete that directory (or move it out of "
      f"{step_dir.parent}) to resume from the previous checkpoint, or set "
      "damaged_checkpoints=fallback to do so automatically."
    )
  target = step_dir.parent.parent / (INCOMPLETE_DIR if incomplete else DAMAGED_DIR) / step_dir.name
  n = 0
  while target.exists():
    n += 1
    target = target.with_name(f"{step_dir.name}-{n}")
  log.warning(
    "Checkpoint %s is %s: %s. Resuming from the checkpoint before it (if any); this one is "
    "moved to %s.",
    *(step_dir, "incomplete" if incomplete else "damaged", reason, target),
  )
  if jax.process_index() == 0:
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(step_dir, target)
  _sync(f"checkpoints:set_aside:{step_dir.name}")


def _no_good_checkpoint(directory: Path) -> DamagedCheckpointError:
  damaged = directory.parent / DAMAGED_DIR
  return DamagedCheckpointError(
    f"No usable checkpoint is left in {directory}: the damaged ones are in {damaged}. Delete "
    f"{damaged} (and {directory.parent / 'metrics.jsonl'}) to start afresh, or put back a "
    "checkpoint you trust."
  )


def manager(workdir: Path, config: CheckpointSettings) -> ocp.CheckpointManager | None:
  """Orbax manager of ``workdir/checkpoints`` keeping the last ``keep_checkpoints``; None when
  ``checkpoint_every`` is 0 (no checkpoints, no resuming).

  Step directories whose files do not match their digest are handled first, as
  ``config.damaged_checkpoints`` says, and those without one are set aside: orbax reads every
  step's metadata when it starts.

  Raises:
    DamagedCheckpointError: a damaged step with ``damaged_checkpoints='error'``, or no step left
      after earlier ones were found damaged.
  """
  if config.checkpoint_every <= 0:
    return None
  if config.damaged_checkpoints not in ON_DAMAGE:
    raise ConfigError(
      f"Unknown damaged_checkpoints {config.damaged_checkpoints!r}; valid: {', '.join(ON_DAMAGE)}."
    )
  directory = workdir.absolute() / "checkpoints"
  for step_dir in _step_dirs(directory):
    record, reason = check_files(step_dir)
    if record is None:
      _set_aside(step_dir, reason, config.damaged_checkpoints)
  if not _step_dirs(directory) and (directory.parent / DAMAGED_DIR).exists():
    raise _no_good_checkpoint(directory)
  options = ocp.CheckpointManagerOptions(max_to_keep=config.keep_checkpoints, create=True)
  return ocp.CheckpointManager(directory, options=options)


def save(mgr: ocp.CheckpointManager, step: int, tree: dict[str, Any]) -> None:
  """Saves ``tree`` as step ``step`` and, once the save has finished, its digest (process 0).

  The save is waited for so that the digest describes finished files: a crash leaves at worst
  one step without a digest, which resuming sets aside."""
  leaves = tree_digest(tree)
  mgr.save(step, args=ocp.args.StandardSave(tree))
  mgr.wait_until_finished()
  if jax.process_index() == 0:
    write_digest(Path(mgr.directory) / str(step), step, leaves)
  _sync(f"checkpoints:digest:{step}")


def checkpoint_tree(
  state: Any, seed: int, examples_seen: int, num_train: int, wall_time: float
) -> dict[str, Any]:
  """What a checkpoint holds: the state and where the data stream stands (after
  ``examples_seen`` examples of it)."""
  epoch, offset = divmod(examples_seen, num_train)
  data = {"seed": seed, "epoch": epoch, "example_in_epoch": offset}
  return {
    "state": state,
    "data": {k: np.array(v, np.int64) for k, v in data.items()},
    "wall_time": np.array(wall_time, np.float64),
  }


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text else type(e).__name__


def restore_latest(
  mgr: ocp.CheckpointManager,
  template: dict[str, Any],
  seed: int,
  on_damage: str = "fallback",
) -> dict[str, Any] | None:
  """The newest checkpoint that restores and matches its digest, in the layout of ``template``
  (:func:`checkpoint_tree`), or None when there is none.

  A step that fails (an orbax or TensorStore error, arrays unlike the digest) is named in a
  warning and moved to ``checkpoints_damaged/``, then the next older one is tried
  (``on_damage='fallback'``); ``'error'`` stops at the first.

  Raises:
    ConfigError: the checkpoint was written with another seed (another data stream).
    DamagedCheckpointError: a damaged step with ``on_damage='error'``, or every step damaged.
  """
  directory = Path(mgr.directory)
  tried = False
  for step_dir in _step_dirs(directory):
    tried = True
    record, reason = check_files(step_dir)
    restored = None
    if record is not None:
      try:
        restored = mgr.restore(int(step_dir.name), args=ocp.args.StandardRestore(template))
      except Exception as e:  # orbax and TensorStore raise many types; all mean "unusable"
        reason = f"it does not restore ({_first_line(e)})"
    # Every process decides alike (they read the same files); agree before any collective.
    ok = restored is not None
    if jax.process_count() > 1:
      ok = bool(np.all(multihost_utils.process_allgather(np.array(ok))))
    if ok and restored is not None and record is not None:
      reason = check_tree(record, restored)
      if not reason:
        if int(restored["data"]["seed"]) != seed:
          raise ConfigError(
            f"The checkpoint in {step_dir} was written with seed "
            f"{int(restored['data']['seed'])}, not {seed}."
          )
        return restored
    _set_aside(step_dir, reason or "another process could not restore it", on_damage)
    mgr.reload()
  if tried:
    raise _no_good_checkpoint(directory)
  return None


def restore_checkpoint(workdir: str | Path, step: int | None = None) -> dict[str, Any]:
  """A checkpoint of ``workdir`` (the latest if ``step`` is None) as nested dicts of NumPy arrays
  (``'state'``, ``'data'``, ``'wall_time'``), read without a template on one process, whatever
  the devices and processes that wrote it."""
  directory = Path(workdir).absolute() / "checkpoints"
  with ocp.CheckpointManager(directory, item_handlers=ocp.StandardCheckpointHandler()) as mgr:
    step = mgr.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"No checkpoint in {workdir}/checkpoints.")
    metadata = mgr.item_metadata(step)
    tree = getattr(metadata, "tree", metadata)
    # NumPy targets: the arrays come back on the host, not on the writers' device layout.
    template = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), tree)
    return mgr.restore(step, args=ocp.args.StandardRestore(template))
