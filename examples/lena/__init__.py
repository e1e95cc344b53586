"""The LENA trainer, laid out like Flax's examples: ``main.py`` (the command line), ``train.py``,
``parallel.py`` (batch layout and the shard_map / pmap / GSPMD strategies), ``configs/`` and
``demo.py`` (``make demo``).

Its public entry, part of the kit the benchmarks and the notebook import (see
``examples/__init__.py``)::

  from examples import lena

  config = lena.override(lena.get_config("tiny_test"), ["optimizer=lena"])
  state = lena.train_and_evaluate(config, "runs/tiny")

The trainer is imported on first use, so that ``from examples import lena`` for a
:class:`Config` stays light (no JAX).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from examples.lena.configs import Config, ConfigError, available_configs, get_config, override

if TYPE_CHECKING:
  from examples.lena.train import TrainState, evaluate_split, train_and_evaluate

__all__ = (
  "Config",
  "ConfigError",
  "TrainState",
  "available_configs",
  "evaluate_split",
  "get_config",
  "override",
  "train_and_evaluate",
)
_FROM_TRAIN = ("TrainState", "evaluate_split", "train_and_evaluate")


def __getattr__(name: str) -> Any:
  if name in _FROM_TRAIN:
    from examples.lena import train

    return getattr(train, name)
  raise AttributeError(f"module 'examples.lena' has no attribute {name!r}")
