"""The parameter-server shards' Orbax checkpoints, each step sealed by a digest.

Shard ``k`` saves into ``<checkpoint_dir>/shard_<k>/<global updates>``, then the step's
``digest.json`` (:mod:`optax_lena._src.checkpoint_digest`). The driver resumes every shard from
the newest step intact in all of them (:func:`agree`), a shard restarted mid-run from its newest
intact one (:func:`restore`); ``docs/ALADDIN-ray.md`` ("Faults") says what is set aside where.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from optax_lena._src import checkpoint_digest as digest
from optax_lena._src.aladdin.ray.errors import CheckpointError

log = logging.getLogger("optax_lena.aladdin")


def shard_dir(checkpoint_dir: str | os.PathLike, shard: int) -> Path:
  return Path(checkpoint_dir) / f"shard_{shard}"


def _steps(directory: Path) -> list[int]:
  """Orbax's step directories (named by the step), newest first; its temporary ones are not."""
  if not directory.is_dir():
    return []
  return sorted((int(p.name) for p in directory.iterdir() if p.name.isdigit()), reverse=True)


def set_aside(checkpoint_dir: str | os.PathLike, shard: int, step: int, reason: str) -> None:
  """Moves a step out of Orbax's directory, to ``<checkpoint_dir>/{damaged,incomplete,
  unmatched}/shard_<k>/<step>``, with a warning naming it and why."""
  kind = "incomplete" if reason in digest.INCOMPLETE else "damaged"
  kind = "unmatched" if reason.startswith("newer than") else kind
  source = shard_dir(checkpoint_dir, shard) / str(step)
  target = Path(checkpoint_dir) / kind / f"shard_{shard}" / str(step)
  n = 0
  while target.exists():
    n += 1
    target = target.with_name(f"{step}-{n}")
  log.warning("Checkpoint %s is set aside (%s): %s. Moved to %s.", source, kind, reason, target)
  target.parent.mkdir(parents=True, exist_ok=True)
  os.replace(source, target)


def agree(checkpoint_dir: str | os.PathLike, num_shards: int) -> int | None:
  """The update count every shard resumes from, chosen on the driver before the shards start;
  None when there are no checkpoints (a fresh run).

  Steps whose files do not match their digest (or that have none) are set aside, and so are
  the steps of some shards newer than the newest one intact in every shard.

  Raises:
    CheckpointError: the shards hold checkpoints but no update count is intact in all of them.
  """
  intact: list[set[int]] = []
  for k in range(num_shards):
    good = set()
    for step in _steps(shard_dir(checkpoint_dir, k)):
      record, reason = digest.check_files(shard_dir(checkpoint_dir, k) / str(step))
      if record is None:
        set_aside(checkpoint_dir, k, step, reason)
      else:
        good.add(step)
    intact.append(good)
  if not any(intact):
    return None
  common = set.intersection(*intact)
  if not common:
    held = "; ".join(f"shard {k}: {sorted(g) or 'none'}" for k, g in enumerate(intact))
    raise CheckpointError(
      f"The parameter-server shards' checkpoints under {checkpoint_dir} have no step intact in "
      f"every shard (intact steps by shard: {held}). Delete {checkpoint_dir} (or set another "
      "checkpoint_dir) to start afresh, or put back checkpoints you trust."
    )
  best = max(common)
  for k, good in enumerate(intact):
    for step in sorted(s for s in good if s > best):
      set_aside(checkpoint_dir, k, step, f"newer than {best}, the newest step of every shard")
  return best


def save(manager: Any, updates: int, payload: Any) -> None:
  """Saves ``payload`` as step ``updates``, then its digest (a crash in between leaves an
  incomplete step, which the next start sets aside)."""
  import orbax.checkpoint as ocp

  manager.save(updates, args=ocp.args.StandardSave(payload))
  manager.wait_until_finished()
  digest.write_digest(Path(manager.directory) / str(updates), updates, digest.tree_digest(payload))


def restore(manager: Any, checkpoint_dir: str | os.PathLike, shard: int, target: Any) -> Any:
  """The newest step of ``shard`` that matches its digest and restores to the same arrays, in
  the layout of ``target``, or None when it has none; a step that fails is set aside.

  Raises:
    CheckpointError: the shard had checkpoints and every one failed.
  """
  import orbax.checkpoint as ocp

  tried = []
  for step in _steps(Path(manager.directory)):
    record, reason = digest.check_files(Path(manager.directory) / str(step))
    if record is not None:
      try:
        payload = manager.restore(step, args=ocp.args.StandardRestore(target))
        reason = digest.check_tree(record, payload)
      except Exception as e:  # orbax and TensorStore raise many types; all mean "unusable"
        reason = f"it does not restore ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
      if not reason:
        return payload
    tried.append(step)
    set_aside(checkpoint_dir, shard, step, reason)
    manager.reload()
  if tried:
    raise CheckpointError(
      f"Shard {shard} has no usable checkpoint left in {shard_dir(checkpoint_dir, shard)} "
      f"(set aside: {tried}, under {checkpoint_dir}). Delete {checkpoint_dir} to start afresh."
    )
  return None
