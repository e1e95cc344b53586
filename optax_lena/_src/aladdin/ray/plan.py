"""How a worker's messages travel to the parameter-server shards: the transport plan that an
algorithm's iteration derives from its spec (``Iteration.plan``), once, on the driver."""

from __future__ import annotations

import dataclasses

# ALADDIN's calls carry up to this many periods of a worker's messages: a worker that outruns
# its calls folds what it queued into the next one instead of waiting (back-pressure).
FOLD_PERIODS = 8
# A shard applies a call's messages in blocks of up to this many periods, one compiled call
# each: it compiles every block size before the run, and a larger one costs seconds more.
BLOCK_PERIODS = 4


@dataclasses.dataclass(frozen=True)
class Plan:
  """How a worker's messages travel to the PS shards.

  Computed once, on the driver, from the spec (``Iteration.plan(spec)``) and shipped in the
  ``Config`` to every worker and shard.

  Attributes:
    period: messages of a worker per reply at most (ALADDIN's period pi; 1 for the others); a
      call of more than ``period`` messages carries a multiple of it.
    max_fold: messages one call may carry.
    block: messages a shard applies in one compiled call (``max_fold`` at most).
  """

  period: int
  max_fold: int
  block: int

  def __post_init__(self) -> None:
    object.__setattr__(self, "block", min(self.block, self.max_fold))

  @property
  def reply_slots(self) -> int:
    """Replies one call may bring back: a worker triggers at most once per ``period``."""
    return -(-self.max_fold // self.period)

  def block_sizes(self) -> list[int]:
    """The call sizes a shard compiles: up to a period (flushes, slow steps) and whole
    periods up to a block."""
    p, b = self.period, self.block
    return sorted({*range(1, min(p, b) + 1), *range(p, b + 1, p)})

  def call_size(self, queued: int) -> int:
    """Messages the next call carries when ``queued`` are waiting: at most ``max_fold``, and
    whole periods when more than one period."""
    take = min(queued, self.max_fold)
    return take - take % self.period if take > self.period else take
