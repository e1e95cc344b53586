"""Command line of the training example (``python -m examples.main``), as in Flax's examples.

Usage::

  python -m examples.main --config default --set optimizer=lena --set batch_scale=16 \\
      --workdir runs/lena_s16

Multi-host: every process runs the same command; ``--coordinator_address HOST:PORT
--num_processes N --process_id I`` join them (or nothing, under SLURM, Open MPI or on a TPU
slice: see ``examples/lena/distributed.py``).

``--config`` names a module of ``examples/lena/configs`` or a ``.py`` file defining ``get_config()``
(which may also register its own optimizer: see ``examples/lena/configs/user_optimizer.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import jax
import tqdm.contrib.logging

from examples.lena import configs as configs_lib
from examples.lena import distributed, train


def parse_args(
  argv: Sequence[str] | None = None,
) -> tuple[configs_lib.Config, str, distributed.DistributedOptions]:
  """Parses ``--config NAME --set key=value ... --workdir DIR`` and the multi-host flags."""
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
  hosts = parser.add_argument_group("multi-host (every process runs the same command)")
  defaults = distributed.DistributedOptions()
  hosts.add_argument(
    "--distributed",
    choices=distributed.MODES,
    default=defaults.distributed,
    help="auto: join when the flags below or a cluster launcher (SLURM, Open MPI, TPU slice, "
    "JAX_COORDINATOR_ADDRESS) say so; on: always (JAX detects the cluster); off: one process",
  )
  hosts.add_argument("--coordinator_address", default="", help="HOST:PORT of process 0")
  hosts.add_argument("--num_processes", type=int, default=0, help="processes of the run")
  hosts.add_argument("--process_id", type=int, default=-1, help="this process, 0..N-1")
  hosts.add_argument(
    "--initialization_timeout",
    type=int,
    default=defaults.initialization_timeout,
    help="seconds to wait for every process to join",
  )
  hosts.add_argument(
    "--heartbeat_timeout",
    type=int,
    default=defaults.heartbeat_timeout,
    help="seconds after which a silent process counts as dead and the others stop",
  )
  args = parser.parse_args(argv)
  options = distributed.DistributedOptions(
    distributed=args.distributed,
    coordinator_address=args.coordinator_address,
    num_processes=args.num_processes,
    process_id=args.process_id,
    initialization_timeout=args.initialization_timeout,
    heartbeat_timeout=args.heartbeat_timeout,
  )
  try:
    distributed.validate(options)
  except distributed.DistributedError as e:
    parser.error(str(e))
  assignments = args.set + ([f"data_dir={args.data_dir}"] if args.data_dir else [])
  try:
    config = configs_lib.override(configs_lib.get_config(args.config), assignments)
  except ValueError as e:
    parser.error(str(e))
  return config, args.workdir, options


def main(argv: Sequence[str] | None = None) -> None:
  """Command-line entry point."""
  # Our own handler: the root logger belongs to absl (orbax), whose INFO output is noise here.
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
  train.log.addHandler(handler)
  train.log.setLevel(logging.INFO)
  train.log.propagate = False
  config, workdir, options = parse_args(argv)
  args = sys.argv[1:] if argv is None else list(argv)
  distributed.set_resume(
    shlex.join(["python", "-m", "examples.main", *args]), Path(workdir).absolute() / "checkpoints"
  )
  try:
    distributed.initialize(options)  # before anything touches a device
    with tqdm.contrib.logging.logging_redirect_tqdm():  # log lines above the progress bar
      train.train_and_evaluate(config, workdir)
    distributed.mark_finished()
  except (configs_lib.ConfigError, FileNotFoundError, distributed.DistributedError) as e:
    sys.exit(f"error: {e}")  # the message says what to change; no traceback
  except jax.errors.JaxRuntimeError as e:
    if jax.process_count() == 1:
      raise
    # A peer died (or was stopped): a collective lost it. Ends the process (status 1).
    distributed.end_run("a collective with it failed", str(e))


if __name__ == "__main__":
  main()
