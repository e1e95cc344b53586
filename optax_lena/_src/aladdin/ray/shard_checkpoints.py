"""The parameter-server shards' Orbax checkpoints, numbered by a run-wide generation and each
sealed by a digest.

The driver has every shard save generation ``g`` at once (:class:`CheckpointClock`), so that
the shards hold the same generations whatever their own update counts; shard ``k`` saves into
``<checkpoint_dir>/shard_<k>/<g>``, then the step's ``digest.json``
(:mod:`optax_lena._src.checkpoint_digest`), and keeps :data:`KEEP` generations. Before any
actor starts, the driver checks the directory (:func:`prepare`), sets aside what a killed save
left (:func:`sweep_unfinished`) and what is damaged, and chooses the generation each shard
resumes from (:func:`agree`); a shard restarted by Ray resumes from its newest intact one
(:func:`restore`). ``docs/ALADDIN-ray.md`` ("Faults and security") says what is set aside
where.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

from optax_lena._src import checkpoint_digest as digest
from optax_lena._src.aladdin.ray.errors import CheckpointError

log = logging.getLogger("optax_lena.aladdin")

# Generations each shard keeps: the one being saved, the last one every shard completed (the
# driver starts a round only when the previous one has completed), and one more, so that a
# damaged file in one shard still leaves a generation in common.
KEEP = 3
# What Orbax names a save in progress (``<step>.orbax-checkpoint-tmp[-<timestamp>]``).
_UNFINISHED = re.compile(r"\d+\.orbax-checkpoint-tmp.*")


def shard_dir(checkpoint_dir: str | os.PathLike, shard: int) -> Path:
  return Path(checkpoint_dir) / f"shard_{shard}"


def _generations(directory: Path) -> list[int]:
  """Orbax's step directories (named by the generation), newest first."""
  if not directory.is_dir():
    return []
  return sorted((int(p.name) for p in directory.iterdir() if p.name.isdigit()), reverse=True)


def _move_aside(source: Path, target: Path, message: str) -> Path:
  n = 0
  while target.exists():
    n += 1
    target = target.with_name(f"{source.name}-{n}")
  log.warning("%s Moved to %s.", message, target)
  target.parent.mkdir(parents=True, exist_ok=True)
  os.replace(source, target)
  return target


def set_aside(checkpoint_dir: str | os.PathLike, shard: int, step: int, reason: str) -> None:
  """Moves a generation out of Orbax's directory, to ``<checkpoint_dir>/{damaged,incomplete,
  unmatched}/shard_<k>/<g>``, with a warning naming it and why."""
  kind = "incomplete" if reason in digest.INCOMPLETE else "damaged"
  kind = "unmatched" if reason.startswith("newer than") else kind
  source = shard_dir(checkpoint_dir, shard) / str(step)
  target = Path(checkpoint_dir) / kind / f"shard_{shard}" / str(step)
  _move_aside(source, target, f"Checkpoint {source} is set aside ({kind}): {reason}.")


def sweep_unfinished(checkpoint_dir: str | os.PathLike, shard: int) -> list[Path]:
  """Sets aside the saves that a killed process left unfinished in shard ``shard``'s directory
  (Orbax's ``<g>.orbax-checkpoint-tmp*``) to ``<checkpoint_dir>/incomplete/shard_<k>/``, with a
  warning; returns where they went."""
  directory = shard_dir(checkpoint_dir, shard)
  if not directory.is_dir():
    return []
  moved = []
  for path in sorted(p for p in directory.iterdir() if _UNFINISHED.fullmatch(p.name)):
    target = Path(checkpoint_dir) / "incomplete" / f"shard_{shard}" / path.name
    message = f"Checkpoint {path} is set aside (incomplete): a save that did not finish."
    moved.append(_move_aside(path, target, message))
  return moved


def prepare(checkpoint_dir: str | os.PathLike, num_shards: int) -> None:
  """Makes ``checkpoint_dir/shard_<k>`` for every shard and writes a probe file in each, on the
  driver before any actor starts.

  Raises:
    ValueError: a directory that cannot be made or written (a regular file where a directory
      should be, a read-only or special file system, no permission), naming the path and why.
  """
  for k in range(num_shards):
    directory = shard_dir(checkpoint_dir, k)
    probe = directory / f".probe-{uuid.uuid4().hex}"
    try:
      directory.mkdir(parents=True, exist_ok=True)
      probe.write_bytes(b"")
      probe.unlink()
    except OSError as err:
      raise ValueError(
        f"checkpoint_dir={os.fspath(checkpoint_dir)!r} cannot hold the shards' checkpoints: "
        f"{directory} cannot be made or written ({type(err).__name__}: {err.strerror or err}). "
        "Give a directory you can write (it is made if missing), e.g. "
        "Config(checkpoint_dir='checkpoints')."
      ) from err


def _intact(checkpoint_dir: str | os.PathLike, shard: int) -> list[int]:
  """Shard ``shard``'s generations whose files match their digest, newest first; the others
  are set aside."""
  good = []
  for step in _generations(shard_dir(checkpoint_dir, shard)):
    record, reason = digest.check_files(shard_dir(checkpoint_dir, shard) / str(step))
    if record is None:
      set_aside(checkpoint_dir, shard, step, reason)
    else:
      good.append(step)
  return good


def agree(checkpoint_dir: str | os.PathLike, num_shards: int) -> list[int] | None:
  """The generation each shard resumes from, chosen on the driver before the shards start; None
  when there are no checkpoints (a fresh run).

  Unfinished saves, and generations whose files do not match their digest (or that have none),
  are set aside. Every shard resumes from the newest generation intact in all of them (newer
  ones of some shards, a save round the crash interrupted, are set aside as unmatched); where
  they have none in common, each shard resumes from its own newest intact generation (as after
  a restart of one shard by Ray), with a warning.

  Raises:
    CheckpointError: some shards hold checkpoints and one of them has no intact generation left;
      the message names the directory to delete.
  """
  intact = []
  for k in range(num_shards):
    sweep_unfinished(checkpoint_dir, k)
    intact.append(_intact(checkpoint_dir, k))
  if not any(intact):
    return None
  empty = [k for k, good in enumerate(intact) if not good]
  if empty:
    held = "; ".join(f"shard {k}: {good or 'none'}" for k, good in enumerate(intact))
    raise CheckpointError(
      f"The parameter-server shards' checkpoints under {checkpoint_dir} cannot be resumed: "
      f"shard(s) {empty} have no intact generation left (intact generations by shard: {held}; "
      f"the damaged ones are under {Path(checkpoint_dir) / 'damaged'}). Delete "
      f"{checkpoint_dir} (or set another checkpoint_dir) to start afresh, or put back "
      "checkpoints you trust."
    )
  common = set.intersection(*map(set, intact))
  if not common:
    newest = [good[0] for good in intact]
    log.warning(
      "The shards under %s hold no generation in common; each resumes from its own newest "
      "intact one: %s.",
      checkpoint_dir,
      dict(enumerate(newest)),
    )
    return newest
  best = max(common)
  for k, good in enumerate(intact):
    for step in sorted(s for s in good if s > best):
      set_aside(checkpoint_dir, k, step, f"newer than {best}, the newest generation of every shard")
  return [best] * num_shards


def manager(checkpoint_dir: str | os.PathLike, shard: int) -> Any:
  """Orbax's manager of shard ``shard``'s generations (saves waited for, :data:`KEEP` kept)."""
  import orbax.checkpoint as ocp

  options = ocp.CheckpointManagerOptions(max_to_keep=KEEP, enable_async_checkpointing=False)
  return ocp.CheckpointManager(shard_dir(checkpoint_dir, shard), options=options)


def save(manager: Any, generation: int, payload: Any) -> None:
  """Saves ``payload`` as ``generation``, then its digest (a crash in between leaves an
  incomplete generation, which the next start sets aside)."""
  import orbax.checkpoint as ocp

  manager.save(generation, args=ocp.args.StandardSave(payload))
  manager.wait_until_finished()
  step_dir = Path(manager.directory) / str(generation)
  digest.write_digest(step_dir, generation, digest.tree_digest(payload))


def restore(
  manager: Any,
  checkpoint_dir: str | os.PathLike,
  shard: int,
  target: Any,
  generation: int | None = None,
) -> tuple[int, Any] | None:
  """``(generation, payload)``: ``generation`` (None: the newest) or, if it fails, the newest
  older one of ``shard`` that matches its digest and restores to the same arrays, in the layout
  of ``target``; None when the shard has none. A generation that fails is set aside.

  Raises:
    CheckpointError: the shard had checkpoints and every one failed.
  """
  import orbax.checkpoint as ocp

  tried = []
  for step in _generations(Path(manager.directory)):
    if generation is not None and step > generation:
      continue
    record, reason = digest.check_files(Path(manager.directory) / str(step))
    if record is not None:
      try:
        payload = manager.restore(step, args=ocp.args.StandardRestore(target))
        reason = digest.check_tree(record, payload)
      except Exception as e:  # orbax and TensorStore raise many types; all mean "unusable"
        reason = f"it does not restore ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
      if not reason:
        return step, payload
    tried.append(step)
    set_aside(checkpoint_dir, shard, step, reason)
    manager.reload()
  if tried:
    raise CheckpointError(
      f"Shard {shard} has no usable checkpoint left in {shard_dir(checkpoint_dir, shard)} "
      f"(set aside: {tried}, under {checkpoint_dir}). Delete {checkpoint_dir} to start afresh."
    )
  return None


class CheckpointClock:
  """The driver's side of the checkpoints: every shard saves the next run-wide generation at
  once, when shard 0 has made ``every`` global updates since the last save (read about twice a
  second, without waiting), and never while a previous round is still saving.

  Args:
    shards: the shard actors.
    every: global updates between rounds.
    generation: the newest generation so far (the one resumed from; 0: none).
    poll_seconds: seconds between reads of shard 0's count.
  """

  def __init__(self, shards: list[Any], every: int, generation: int, poll_seconds: float = 0.5):
    self.shards, self.every, self.generation = shards, every, generation
    self.poll_seconds = poll_seconds
    self.saved_at: int | None = None  # shard 0's count at the last round (None: unknown yet)
    self._poll: Any = None
    self._polled = 0.0
    self._saving: list[Any] = []

  def _saved(self) -> bool:
    """Whether the last round has completed (a failed save is logged, the run goes on)."""
    import ray

    if not self._saving:
      return True
    ready, _ = ray.wait(self._saving, num_returns=len(self._saving), timeout=0)
    if len(ready) < len(self._saving):
      return False
    for k, ref in enumerate(self._saving):
      try:
        ray.get(ref)
      except Exception as err:  # a full disk, a lost shard: the next round tries again
        log.warning("Shard %d could not save generation %d: %s", k, self.generation, err)
    self._saving = []
    return True

  def tick(self) -> None:
    """Starts a round when one is due; returns at once."""
    import ray

    if not self._saved():
      return
    if self._poll is not None:
      ready, _ = ray.wait([self._poll], timeout=0)
      if not ready:
        return
      updates, self._poll = ray.get(ready[0]), None
      if self.saved_at is None:
        self.saved_at = updates
      elif updates - self.saved_at >= self.every:
        self.start_round()
        self.saved_at = updates
    elif time.monotonic() - self._polled >= self.poll_seconds:
      self._poll, self._polled = self.shards[0].updates.remote(), time.monotonic()

  def start_round(self) -> list[Any]:
    """Every shard saves the next generation; returns the calls (also waited for by the next
    :meth:`tick`)."""
    self.generation += 1
    self._saving = [s.checkpoint.remote(self.generation) for s in self.shards]
    return self._saving

  def final(self, timeout: float) -> None:
    """The stop's round: waits for a round in progress, then every shard saves the next
    generation (within ``timeout`` seconds in all)."""
    import ray

    deadline = time.monotonic() + timeout
    if self._saving:
      ray.wait(self._saving, num_returns=len(self._saving), timeout=timeout)
    remaining = max(1.0, deadline - time.monotonic())
    ray.get(self.start_round(), timeout=remaining)
