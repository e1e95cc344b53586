"""The one place the studies call the example trainer (``examples.lena``): train a run into its
directory with a study's own optimizers registered, and evaluate its final state on a split."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from examples import lena, optimizers


def train(
  config: lena.Config, workdir: str | Path, entries: Sequence[optimizers.Optimizer] = ()
) -> lena.TrainState:
  """Trains ``config`` into ``workdir`` (``config.json``, ``metrics.jsonl``) with the study's
  own registry ``entries`` registered while it trains; returns the final state."""
  with optimizers.registered(*entries):
    return lena.train_and_evaluate(config, workdir)


def evaluate(config: lena.Config, state: lena.TrainState, split: str) -> dict[str, float]:
  """Loss and accuracy of a trained ``state`` on ``split`` (``'test'`` or ``'validation'``) of
  ``config``'s dataset (another ``data_seed``: another draw)."""
  return lena.evaluate_split(config, state, split)
