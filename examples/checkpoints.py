"""Orbax checkpoints of the train state and of where the data stream stands.

A checkpoint holds the state (params, BatchNorm statistics, optimizer state, step), the data
stream's position and the wall time so far. The stream is a function of (seed, epoch)
(``input_pipeline.global_batches``), so its position after ``step`` updates is all that is
needed to continue the same sequence of batches: on the CPU a resumed run is bitwise identical
to an uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from examples.lena.configs import Config, ConfigError


def manager(workdir: Path, config: Config) -> ocp.CheckpointManager | None:
  """Orbax manager of ``workdir/checkpoints`` keeping the last ``keep_checkpoints``; None when
  ``checkpoint_every`` is 0 (no checkpoints, no resuming)."""
  if config.checkpoint_every <= 0:
    return None
  options = ocp.CheckpointManagerOptions(max_to_keep=config.keep_checkpoints, create=True)
  return ocp.CheckpointManager(workdir.absolute() / "checkpoints", options=options)


def checkpoint_tree(
  state: Any, seed: int, global_batch: int, num_train: int, wall_time: float
) -> dict[str, Any]:
  """What a checkpoint holds: the state and where the data stream stands."""
  epoch, offset = divmod(int(state.step) * global_batch, num_train)
  data = {"seed": seed, "epoch": epoch, "example_in_epoch": offset}
  return {
    "state": state,
    "data": {k: np.array(v, np.int64) for k, v in data.items()},
    "wall_time": np.array(wall_time, np.float64),
  }


def restore_latest(
  mgr: ocp.CheckpointManager, template: dict[str, Any], seed: int
) -> dict[str, Any] | None:
  """The latest checkpoint in the layout of ``template`` (:func:`checkpoint_tree`), or None.

  Raises:
    ConfigError: the checkpoint was written with another seed (another data stream).
  """
  step = mgr.latest_step()
  if step is None:
    return None
  restored = mgr.restore(step, args=ocp.args.StandardRestore(template))
  if int(restored["data"]["seed"]) != seed:
    raise ConfigError(
      f"The checkpoint in {mgr.directory} was written with seed "
      f"{int(restored['data']['seed'])}, not {seed}."
    )
  return restored


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
