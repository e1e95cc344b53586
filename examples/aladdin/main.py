"""ALADDIN (and AR-SGD, ASP, EASGD, SGP) on Ray: n workers train the MNIST-1D CNN for a time
budget.

Every worker and every parameter-server shard is a Ray actor (a process); a local Ray cluster
bound to 127.0.0.1 is started unless ``--address`` joins an existing one. MNIST-1D is generated
offline (cached in ``--data_dir``); each worker trains on its own 1/n of the training set.

Usage::

  python -m examples.aladdin --algorithm aladdin ar_sgd --workers 4 --time_budget 30 \\
      --slowdown 0:10 --json runs/aladdin/result.json --workdir runs/aladdin

Prints a table (throughput, test accuracy at the budget, per-worker iterations, wait and compute
fractions, replies merged), writes ``<workdir>/<algorithm>/metrics.jsonl`` (``examples.metrics``
records, read by ``examples.analysis``), ``accuracy_vs_time.png`` and ``iterations.png``.
``--json`` writes, per algorithm under ``runs.<name>``, ``throughput`` (samples per second over
the run), ``test_accuracy``, ``wait_fraction`` and ``compute_fraction`` (one value per worker)
and ``iterations``, with the rest of the measurements; with a single algorithm the first three
are also at the top level. Ctrl-C / SIGTERM stop everything and exit with 130 / 143.

Benchmarks build the same runs without the command line: :class:`Options` and :func:`run`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from examples.aladdin.task import TaskOptions

ALGORITHMS = ("aladdin", "ar_sgd", "asp", "easgd", "sgp")  # what the program offers


@dataclasses.dataclass(frozen=True)
class Options:
  """Everything one invocation runs (the command line's flags, typed).

  Attributes:
    algorithms: the algorithms to run, one after the other.
    task: the model and data.
    time_budget: seconds of training per algorithm.
    lr: the workers' learning rate (the paper's local optimizer: momentum SGD 0.9, weight decay
      1e-4); also ASP's server step and ALADDIN's with gradient messages.
    message: ALADDIN's message, ``"update"`` or ``"gradient"`` (None: the recipe's default).
    period: ALADDIN's pi (None: the recipe's default).
    alpha: ALADDIN's merge weight (None: the recipe's default).
    server_momentum: the server steps with momentum 0.9 (ASP; ALADDIN's server optimizer).
    slowdown: ``{worker: factor}`` stragglers.
    ps_shards: PS shard actors.
    fold: ALADDIN messages per call (None: the period).
    worker_gpus: accelerators per worker actor.
    worker_nice: the workers' CPU priority decrease (None: automatic).
    checkpoint_dir: the shards' checkpoints (None: none).
    checkpoint_every: global updates between checkpoints.
    eval_every: seconds between evaluations.
    chunk_seconds: wall time of one scheduled worker call.
    seed: the workers' data order.
    address: join this Ray cluster (None: a local one).
    num_cpus: CPUs of the local Ray node.
    ray_temp_dir: session root of the local Ray node.
    progress: show progress (a bar on a terminal).
    workdir: metrics and plots (None: write nothing).
  """

  algorithms: tuple[str, ...] = ("aladdin",)
  task: TaskOptions = dataclasses.field(default_factory=TaskOptions)
  time_budget: float = 30.0
  lr: float = 0.05
  message: str | None = None
  period: int | None = None
  alpha: str | float | None = None
  server_momentum: bool = False
  slowdown: Mapping[int, float] = dataclasses.field(default_factory=dict)
  ps_shards: int = 1
  fold: int | None = None
  worker_gpus: float = 0.0
  worker_nice: int | None = None
  checkpoint_dir: str | None = None
  checkpoint_every: int = 50
  eval_every: float = 2.0
  chunk_seconds: float = 0.5
  seed: int = 0
  address: str | None = None
  num_cpus: int | None = None
  ray_temp_dir: str | None = None
  progress: bool = True
  workdir: str | None = "runs/aladdin"


def algorithm_spec(name: str, options: Options) -> Any:
  """The spec of ``name`` with the program's optimizers; ALADDIN's unset options stay the
  recipe's."""
  import optax

  from optax_lena import aladdin as al

  momentum = 0.9 if options.server_momentum else None
  worker_tx = al.local_optimizer(options.lr, momentum=0.9, weight_decay=1e-4)
  if name != "aladdin":
    # The optimizer that trains the model: the workers' local one, or a plain (or momentum)
    # step where it sits on the server (ASP, whose workers only send gradients).
    on_server = al.algorithm(name).optimizer_field == "server_tx"
    tx = optax.sgd(options.lr, momentum=momentum) if on_server else worker_tx
    return al.algorithm(name, optimizer=tx)
  given = {"message": options.message, "period": options.period, "alpha": options.alpha}
  kwargs: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
  message = kwargs.get("message", al.Aladdin().message)
  if message == "gradient":  # the printed step on the accumulated gradients
    kwargs["server_tx"] = optax.sgd(options.lr, momentum=momentum)
  elif options.server_momentum:  # a server optimizer on the mean update (FedAvg's sense)
    kwargs["server_tx"] = optax.sgd(1.0, momentum=0.9)
  return al.algorithm("aladdin", worker_tx=worker_tx, **kwargs)


def runtime_config(name: str, options: Options) -> Any:
  """The runtime's configuration of one algorithm."""
  from optax_lena.aladdin import distributed as ad

  return ad.Config(
    algorithm=algorithm_spec(name, options),
    num_workers=options.task.workers,
    ps_shards=options.ps_shards,
    slowdown=dict(options.slowdown),
    fold=options.fold if name == "aladdin" else None,
    worker_gpus=options.worker_gpus,
    worker_nice=options.worker_nice,
    checkpoint_dir=options.checkpoint_dir,
    checkpoint_every=options.checkpoint_every,
    chunk_seconds=options.chunk_seconds,
    seed=options.seed,
  )


def run_one(name: str, options: Options, task: Any, accuracy: Any) -> dict[str, Any]:
  """Trains one algorithm for the time budget; returns its measurements."""
  import time

  from optax_lena.aladdin import distributed as ad

  config = runtime_config(name, options)
  t0 = time.time()
  with ad.Runtime(
    task,
    config,
    address=options.address,
    num_cpus=options.num_cpus,
    temp_dir=options.ray_temp_dir,
  ) as runtime:
    startup = time.time() - t0
    result = runtime.run(
      options.time_budget,
      eval_fn=accuracy,
      eval_every=options.eval_every,
      progress=options.progress,
    )
  row = result.summary()
  row.pop("workers")  # per worker: only its priority and devices are reported
  return {
    **row,
    "test_accuracy": result.curve[-1][1],
    "startup_s": startup,
    "slowdown": {str(k): v for k, v in config.slowdown.items()},
    "worker_nice": [w.nice for w in result.workers],
    "devices": [w.devices for w in result.workers],
  }


def run(options: Options) -> list[dict[str, Any]]:
  """Runs every algorithm of ``options``; writes the metrics and plots to ``options.workdir``."""
  from examples.aladdin import report
  from examples.aladdin.task import build_task

  task, accuracy = build_task(options.task)
  accuracy(task.init_params)  # compiles the evaluation before any clock starts
  rows = [run_one(name, options, task, accuracy) for name in options.algorithms]
  if options.workdir is not None:
    workdir = Path(options.workdir)
    for row in rows:
      report.write_metrics(row, workdir / row["algorithm"], options.task.batch_size)
    report.save_plots(rows, workdir, report.title(options.task.workers, options.slowdown))
  return rows


def parse_slowdown(values: Sequence[str]) -> dict[int, float]:
  """``["0:10", "2:3"]`` -> ``{0: 10.0, 2: 3.0}``."""
  out = {}
  for value in values:
    worker, _, factor = value.partition(":")
    try:
      out[int(worker)] = float(factor)
    except ValueError:
      raise SystemExit(f"--slowdown expects WORKER:FACTOR (e.g. 0:10), got {value!r}.") from None
  return out


def _alpha(value: str) -> str | float:
  return value if value in ("count", "n_pi") else float(value)


def parse_args(argv: Sequence[str] | None = None) -> tuple[Options, Path | None]:
  """The command line as :class:`Options` (and the ``--json`` path)."""
  p = argparse.ArgumentParser(
    prog="python -m examples.aladdin", description=(__doc__ or "").split("\n\n")[0]
  )
  p.add_argument("--algorithm", nargs="+", choices=ALGORITHMS, default=["aladdin"])
  p.add_argument("--workers", type=int, default=4)
  p.add_argument("--time_budget", type=float, default=30.0, help="seconds per algorithm")
  p.add_argument("--batch_size", type=int, default=128, help="per worker")
  p.add_argument("--slowdown", action="append", default=[], metavar="WORKER:FACTOR")
  p.add_argument("--quiet", action="store_true", help="no progress output")
  p.add_argument("--json", type=Path, default=None, metavar="FILE")
  p.add_argument("--workdir", default="runs/aladdin", help="metrics.jsonl per algorithm, plots")
  p.add_argument("--lr", type=float, default=0.05)
  p.add_argument("--message", choices=("update", "gradient"), default=None, help="ALADDIN's")
  p.add_argument("--period", type=int, default=None, help="ALADDIN's pi")
  p.add_argument("--alpha", type=_alpha, default=None, help="ALADDIN's: count, n_pi or a float")
  p.add_argument("--server_momentum", action="store_true", help="server: momentum 0.9")
  p.add_argument("--ps_shards", type=int, default=1, help="PS shard actors, exactly")
  p.add_argument("--fold", type=int, default=None, help="ALADDIN messages per call")
  p.add_argument("--worker_gpus", type=float, default=0.0, help="accelerators per worker")
  p.add_argument("--worker_nice", type=int, default=None, help="default: 5 if cores are short")
  p.add_argument("--num_samples", type=int, default=5000, help="MNIST-1D examples")
  p.add_argument("--data_dir", default="data_cache")
  p.add_argument("--checkpoint_dir", default=None)
  p.add_argument("--checkpoint_every", type=int, default=50, help="global updates")
  p.add_argument("--eval_every", type=float, default=2.0, help="seconds")
  p.add_argument("--chunk_seconds", type=float, default=0.5)
  p.add_argument("--address", default=None, help="join this Ray cluster (host:port)")
  p.add_argument("--num_cpus", type=int, default=None, help="CPUs of the local Ray node")
  p.add_argument("--ray_temp_dir", default=None, help="session root of the local Ray node")
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args(argv)
  task = TaskOptions(
    workers=a.workers, batch_size=a.batch_size, num_samples=a.num_samples, data_dir=a.data_dir
  )
  options = Options(
    algorithms=tuple(a.algorithm),
    task=task,
    time_budget=a.time_budget,
    lr=a.lr,
    message=a.message,
    period=a.period,
    alpha=a.alpha,
    server_momentum=a.server_momentum,
    slowdown=parse_slowdown(a.slowdown),
    ps_shards=a.ps_shards,
    fold=a.fold,
    worker_gpus=a.worker_gpus,
    worker_nice=a.worker_nice,
    checkpoint_dir=a.checkpoint_dir,
    checkpoint_every=a.checkpoint_every,
    eval_every=a.eval_every,
    chunk_seconds=a.chunk_seconds,
    seed=a.seed,
    address=a.address,
    num_cpus=a.num_cpus,
    ray_temp_dir=a.ray_temp_dir,
    progress=not a.quiet,
    workdir=a.workdir,
  )
  return options, a.json


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
  """Runs the command line; returns one measurement dict per algorithm."""
  from examples.aladdin import report

  options, json_path = parse_args(argv)
  rows = run(options)
  report.print_table(rows)
  if json_path is not None:
    payload: dict[str, Any] = {"options": json.loads(json.dumps(options, default=_jsonable))}
    payload["runs"] = {r["algorithm"]: r for r in rows}
    if len(rows) == 1:
      payload.update({k: rows[0][k] for k in ("throughput", "test_accuracy", "wait_fraction")})
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(payload, indent=2))
    print(f"wrote {json_path}")
  return rows


def _jsonable(value: Any) -> Any:
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return dataclasses.asdict(value)
  return str(value)


def cli(argv: Sequence[str] | None = None) -> int:
  """``python -m examples.aladdin``: the exit status (130 / 143 after Ctrl-C / SIGTERM)."""
  from optax_lena.aladdin.distributed import Interrupted, exit_on_stop_signals

  exit_on_stop_signals()
  try:
    main(argv)
  except Interrupted as err:
    return err.exit_code
  except KeyboardInterrupt:
    return 130
  return 0
