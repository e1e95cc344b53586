"""Command line of the training example (``python -m examples.main``), as in Flax's examples.

Usage::

  python -m examples.main --config default --set optimizer=lena --set batch_scale=16 \\
      --workdir runs/lena_s16

``--config`` names a module of ``examples/lena/configs`` or a ``.py`` file defining ``get_config()``
(which may also register its own optimizer: see ``examples/lena/configs/user_optimizer.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence

import tqdm.contrib.logging

from examples.lena import configs as configs_lib
from examples.lena import train


def parse_args(argv: Sequence[str] | None = None) -> tuple[configs_lib.Config, str]:
  """Parses ``--config NAME --set key=value ... --workdir DIR``."""
  parser = argparse.ArgumentParser(
    prog="python -m examples.main",
    description=(train.__doc__ or "").split("\n\n")[0],
    epilog=f"Configs: {', '.join(configs_lib.available_configs())}. Keys: "
    + ", ".join(f.name for f in dataclasses.fields(configs_lib.Config))
    + ".",
  )
  parser.add_argument("--config", default="default", help="config module or .py path")
  parser.add_argument(
    "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field"
  )
  parser.add_argument("--workdir", required=True, help="directory for metrics and checkpoints")
  parser.add_argument("--data_dir", help="TFDS data_dir with the prepared CIFAR")
  args = parser.parse_args(argv)
  assignments = args.set + ([f"data_dir={args.data_dir}"] if args.data_dir else [])
  try:
    config = configs_lib.override(configs_lib.get_config(args.config), assignments)
  except ValueError as e:
    parser.error(str(e))
  return config, args.workdir


def main(argv: Sequence[str] | None = None) -> None:
  """Command-line entry point."""
  # Our own handler: the root logger belongs to absl (orbax), whose INFO output is noise here.
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
  train.log.addHandler(handler)
  train.log.setLevel(logging.INFO)
  train.log.propagate = False
  config, workdir = parse_args(argv)
  try:
    with tqdm.contrib.logging.logging_redirect_tqdm():  # log lines above the progress bar
      train.train_and_evaluate(config, workdir)
  except (configs_lib.ConfigError, FileNotFoundError) as e:
    sys.exit(f"error: {e}")  # the message says what to change; no traceback


if __name__ == "__main__":
  main()
