"""ALADDIN (and AR-SGD, ASP, EASGD) on Ray: n workers train the MNIST-1D CNN for a time budget.

Every worker and every parameter-server shard is a Ray actor (a process); a local Ray cluster
bound to 127.0.0.1 is started unless ``--address`` joins an existing one. MNIST-1D is generated
offline (cached in ``--data_dir``); each worker trains on its own 1/n of the training set.

Usage::

  python -m examples.aladdin --algorithm aladdin ar_sgd --workers 4 --time_budget 30 \\
      --slowdown 0:10 --json runs/aladdin/result.json --plot_dir runs/aladdin

Prints a table (throughput, test accuracy at the budget, per-worker iterations, per-worker
fraction of time spent waiting, replies merged) and writes ``accuracy_vs_time.png`` and
``iterations.png`` to ``--plot_dir``. ``--json`` writes, per algorithm, ``throughput`` (samples
per second over the run), ``test_accuracy`` and ``wait_fraction`` (one value per worker), with
the rest of the measurements; with a single algorithm these keys are also at the top level.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np


class Mnist1dBatches:
  """Picklable ``batches(worker, seed)`` factory: worker i's endless mini-batches of its shard.

  The actors load the dataset from the ``.npz`` cache the driver generated, so nothing large is
  shipped through Ray.
  """

  def __init__(self, data_dir: str, num_workers: int, batch_size: int, num_samples: int):
    self.data_dir, self.num_workers = data_dir, num_workers
    self.batch_size, self.num_samples = batch_size, num_samples

  def __call__(self, worker: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    from examples.input_pipeline import load_mnist1d, numpy_batches

    data = load_mnist1d(self.data_dir, seed=0, num_samples=self.num_samples)
    x = data["x_train"][worker :: self.num_workers]
    y = data["y_train"][worker :: self.num_workers]
    rng = np.random.default_rng([seed, worker])
    while True:
      yield from numpy_batches(x, y, self.batch_size, rng=rng)


class CrossEntropy:
  """Picklable ``loss_fn(params, batch)``: softmax cross-entropy of the CNN1D."""

  def __init__(self, model: Any):
    self.model = model

  def __call__(self, params: Any, batch: tuple[Any, Any]) -> Any:
    import optax

    x, y = batch
    logits = self.model.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def parse_slowdown(values: Sequence[str]) -> dict[int, float]:
  """``["0:10", "2:3"]`` -> ``{0: 10.0, 2: 3.0}``.

  Args:
    values: ``WORKER:FACTOR`` strings.

  Returns:
    The slowdown factor of each listed worker.
  """
  out = {}
  for value in values:
    worker, _, factor = value.partition(":")
    try:
      out[int(worker)] = float(factor)
    except ValueError:
      raise SystemExit(f"--slowdown expects WORKER:FACTOR (e.g. 0:10), got {value!r}.") from None
  return out


def build_task(args: argparse.Namespace) -> tuple[Any, Any]:
  """The training task (model, data, optimizers) and the driver's test-accuracy function."""
  import jax
  import jax.numpy as jnp
  import optax

  from examples.input_pipeline import load_mnist1d
  from examples.models import CNN1D
  from optax_lena import aladdin as al
  from optax_lena.aladdin import distributed as ad

  data = load_mnist1d(args.data_dir, seed=0, num_samples=args.num_samples)  # generates the cache
  model = CNN1D()
  params = model.init(jax.random.key(args.seed), jnp.zeros((1, data["x_train"].shape[1])))
  params = jax.tree.map(np.asarray, params["params"])
  task = ad.Task(
    loss_fn=CrossEntropy(model),
    init_params=params,
    batches=Mnist1dBatches(
      str(Path(args.data_dir).resolve()), args.workers, args.batch_size, args.num_samples
    ),
    local_tx=al.local_optimizer(args.lr, momentum=0.9, weight_decay=1e-4),
    # The printed plain step by default: on Ray, where up to max_inflight gradients per worker
    # can be queued at the PS, a momentum server was unstable in HO (benchmarks/aladdin/
    # RESULTS-ray.md), although the simulated study (RESULTS.md) prefers it.
    server_tx=optax.sgd(args.lr, momentum=0.9) if args.server_momentum else optax.sgd(args.lr),
    batch_size=args.batch_size,
  )
  x_test, y_test = jnp.asarray(data["x_test"]), jnp.asarray(data["y_test"])
  predict = jax.jit(
    lambda p: jnp.mean(jnp.argmax(jnp.asarray(model.apply({"params": p}, x_test)), -1) == y_test)
  )
  return task, lambda p: float(predict(p))


def run_one(algorithm: str, args: argparse.Namespace, task: Any, accuracy: Any) -> dict[str, Any]:
  """Trains one algorithm for the time budget; returns its measurements."""
  from optax_lena.aladdin import distributed as ad

  config = ad.Config(
    algorithm=algorithm,
    num_workers=args.workers,
    period=args.period,
    ps_shards=args.ps_shards,
    slowdown=parse_slowdown(args.slowdown),
    checkpoint_dir=args.checkpoint_dir,
    checkpoint_every=args.checkpoint_every,
    chunk_seconds=args.chunk_seconds,
    seed=args.seed,
    worker_nice=args.worker_nice,
  )
  t0 = time.time()
  with ad.Runtime(
    task, config, address=args.address, num_cpus=args.num_cpus, temp_dir=args.ray_temp_dir
  ) as runtime:
    startup = time.time() - t0
    result = runtime.run(
      args.time_budget, eval_fn=accuracy, eval_every=args.eval_every, progress=not args.quiet
    )
  return {
    "algorithm": algorithm,
    "throughput": result.throughput,
    "test_accuracy": result.curve[-1][1],
    "wait_fraction": result.wait_fraction,
    "iterations": result.iterations,
    "merges": result.merges,
    "samples": result.samples,
    "wall_s": result.wall_s,
    "startup_s": startup,
    "curve": result.curve,
    "shards": result.shards,
    "slowdown": {str(k): v for k, v in config.slowdown.items()},
  }


def print_table(rows: Sequence[dict[str, Any]]) -> None:
  """The summary table, one row per algorithm."""
  head = (
    f"{'algorithm':<9} {'samples/s':>10} {'test acc':>8}  {'iterations per worker':<24} "
    f"{'wait % per worker':<24} {'merged':<18}"
  )
  print(head)
  print("-" * len(head))
  for r in rows:
    its = " ".join(str(i) for i in r["iterations"])
    waits = " ".join(f"{100 * w:.1f}" for w in r["wait_fraction"])
    merged = " ".join(str(m) for m in r["merges"])
    print(
      f"{r['algorithm']:<9} {r['throughput']:>10.0f} {r['test_accuracy']:>8.3f}  {its:<24} "
      f"{waits:<24} {merged:<18}"
    )


def save_plots(rows: Sequence[dict[str, Any]], plot_dir: Path, title: str) -> list[Path]:
  """Accuracy vs wall time per algorithm, and per-worker iterations; returns the PNG paths."""
  from examples import analysis

  plt = analysis.pyplot()
  plot_dir.mkdir(parents=True, exist_ok=True)
  fig, ax = plt.subplots(figsize=(6, 4))
  for r in rows:
    t, acc = zip(*r["curve"], strict=True)
    ax.plot(t, acc, marker=".", label=r["algorithm"])
  ax.set(xlabel="wall time (s)", ylabel="test accuracy", title=title)
  ax.grid(alpha=0.3)
  ax.legend()
  paths = [analysis.save_figure(fig, plot_dir / "accuracy_vs_time.png")]

  fig, ax = plt.subplots(figsize=(6, 4))
  width = 0.8 / max(len(rows), 1)
  for k, r in enumerate(rows):
    x = np.arange(len(r["iterations"])) + k * width
    ax.bar(x, r["iterations"], width=width, label=r["algorithm"])
  ax.set(xlabel="worker", ylabel="iterations", title=title)
  ax.legend()
  paths.append(analysis.save_figure(fig, plot_dir / "iterations.png"))
  return paths


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
  """Command line entry point; returns one measurement dict per algorithm."""
  from optax_lena.aladdin import distributed as ad

  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--algorithm", nargs="+", choices=ad.ALGORITHMS, default=["aladdin"])
  parser.add_argument("--workers", type=int, default=4)
  parser.add_argument("--period", type=int, default=4, help="ALADDIN's pi")
  parser.add_argument("--slowdown", action="append", default=[], metavar="WORKER:FACTOR")
  parser.add_argument("--ps_shards", type=int, default=1)
  parser.add_argument("--time_budget", type=float, default=30.0, help="seconds per algorithm")
  parser.add_argument("--json", type=Path, default=None, metavar="OUT")
  parser.add_argument("--plot_dir", type=Path, default=Path("runs/aladdin"))
  parser.add_argument("--batch_size", type=int, default=128, help="per worker")
  parser.add_argument("--lr", type=float, default=0.05)
  parser.add_argument(
    "--server_momentum", action="store_true", help="server: SGD momentum 0.9 (default: plain)"
  )
  parser.add_argument("--num_samples", type=int, default=5000, help="MNIST-1D examples")
  parser.add_argument("--data_dir", default="data_cache")
  parser.add_argument("--checkpoint_dir", default=None)
  parser.add_argument("--checkpoint_every", type=int, default=50, help="global updates")
  parser.add_argument("--eval_every", type=float, default=2.0, help="seconds")
  parser.add_argument("--chunk_seconds", type=float, default=0.5)
  parser.add_argument("--address", default=None, help="join this Ray cluster (host:port)")
  parser.add_argument("--num_cpus", type=int, default=None, help="CPUs of the local Ray node")
  parser.add_argument("--ray_temp_dir", default=None, help="session root of the local Ray node")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--worker_nice", type=int, default=0, help="lower the workers' CPU priority (few cores)"
  )
  parser.add_argument("--quiet", action="store_true", help="no progress bar")
  args = parser.parse_args(argv)

  task, accuracy = build_task(args)
  accuracy(task.init_params)  # compiles the evaluation before any clock starts
  rows = []
  for algorithm in args.algorithm:
    rows.append(run_one(algorithm, args, task, accuracy))
  print_table(rows)
  slow = ", ".join(f"worker {k} x{v:g}" for k, v in parse_slowdown(args.slowdown).items())
  title = f"{args.workers} workers" + (f", {slow}" if slow else ", homogeneous")
  for path in save_plots(rows, args.plot_dir, title):
    print(f"wrote {path}")
  if args.json is not None:
    payload: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "json"}}
    payload["args"] = json.loads(json.dumps(payload["args"], default=str))
    payload["runs"] = {r["algorithm"]: r for r in rows}
    if len(rows) == 1:
      payload.update({k: rows[0][k] for k in ("throughput", "test_accuracy", "wait_fraction")})
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2))
    print(f"wrote {args.json}")
  return rows


if __name__ == "__main__":
  main()
