"""Fixed simulator runs whose results were recorded before the simulator was restructured.

``python -m tests.aladdin.simulator_cases`` recomputes every case and rewrites
``data/simulator_golden.json`` (only ever done on a simulator known to be right: the file is the
record that a refactoring changed no event and no number). ``test_simulator_golden.py`` compares
a fresh run of every case with the record: exactly when jax, jaxlib and the CPU's vector
instructions are those the record was made with (``_recorded_with``); otherwise XLA may round a
float differently, so there the counts, times and event digests must still be equal and the
trained numbers equal to float32 rounding accumulated over the run.

The cases: the timing-only runs of the simulator tests (hand-checked clusters, shards, shared
NICs, send buffers, jitter, the paper's cluster) and one fixed-seed training run of every
algorithm (and of ALADDIN's ablation options) on a tiny softmax-regression problem.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import platform
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_lena.aladdin import simulator as sim

GOLDEN = pathlib.Path(__file__).resolve().parent / "data" / "simulator_golden.json"

TOY = dict(bandwidth=1000.0, latency=0.0, ps_cost_per_byte=0.0)
NBYTES = 100.0

# ALADDIN's defaults when the record was made (raw gradient messages, alpha "count"); the
# recommended recipe that replaced them as defaults is another algorithm.
PRINTED = {"message": "gradient", "alpha": "count"}


def _aladdin_options(options: dict[str, Any]) -> dict[str, Any]:
  return {**PRINTED, **options}


def timing_cases() -> dict[str, tuple[str, dict, dict, dict]]:
  """name -> (algorithm, options, cluster kwargs, simulate kwargs)."""
  toy = dict(compute_time=1.0, **TOY)
  paper = sim.PAPER_MODELS["ResNet-50"]
  cases: dict[str, tuple[str, dict, dict, dict]] = {
    "aladdin_he10": ("aladdin", {}, dict(toy, num_workers=4, slowdown=10.0), dict(until=1000.0)),
    "ar_sgd_latency": (
      "ar_sgd",
      {},
      dict(toy, num_workers=4, slowdown=3.0, latency=0.01),
      dict(until=1000.0),
    ),
    "asp_one": ("asp", {}, dict(toy, num_workers=1, ps_cost_per_byte=1e-3), dict(until=1000.0)),
    "asp_four": ("asp", {}, dict(toy, num_workers=4), dict(until=3000.0)),
    "easgd_one": ("easgd", {"tau": 2}, dict(toy, num_workers=1), dict(until=1000.0)),
    "easgd_four_tau3": (
      "easgd",
      {"tau": 3},
      dict(toy, num_workers=4, slowdown=2.0),
      dict(until=500.0),
    ),
    "sgp_ho": ("sgp", {}, dict(toy, num_workers=8), dict(until=1000.0)),
    "sgp_he": ("sgp", {}, dict(toy, num_workers=8, slowdown=10.0), dict(until=5000.0)),
    "aladdin_slow_ps": (
      "aladdin",
      {},
      dict(toy, num_workers=4, ps_cost_per_byte=1e-2),
      dict(until=2000.0),
    ),
    "asp_two_shards": (
      "asp",
      {},
      dict(toy, num_workers=4, ps_cost_per_byte=1e-2, num_shards=2),
      dict(until=2000.0),
    ),
    "asp_shared_nic": (
      "asp",
      {},
      dict(toy, num_workers=4, bandwidth=NBYTES / 0.75, num_shards=4, workers_per_machine=4),
      dict(until=3000.0),
    ),
    "aladdin_send_buffer": (
      "aladdin",
      {},
      dict(toy, num_workers=2, workers_per_machine=2, bandwidth=NBYTES / 0.75, send_buffer=1),
      dict(until=3000.0),
    ),
    "aladdin_jitter_reply_every": (
      "aladdin",
      {"period": 1, "reply_every": 4},
      dict(toy, num_workers=4, jitter=0.2),
      dict(until=200.0, seed=3),
    ),
  }
  for name, factor in sim.PAPER_SLOWDOWNS.items():
    for alg in ("aladdin", "ar_sgd", "sgp"):
      cases[f"paper_{alg}_{name}"] = (
        alg,
        {},
        dict(compute_time=paper.compute_time, slowdown=factor, paper=True),
        dict(
          until=30 * paper.compute_time * factor,
          batch_size=paper.batch_size,
          model_bytes=paper.nbytes,
        ),
      )
  return cases


def loss_fn(params, batch):
  x, y = batch
  logits = x @ params["w"] + params["b"]
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def accuracy_fn(params, batch):
  x, y = batch
  return jnp.mean(jnp.argmax(x @ params["w"] + params["b"], -1) == y)


def tiny_problem() -> sim.Problem:
  rng = np.random.default_rng(0)
  w_true = rng.normal(size=(10, 3))
  x = rng.normal(size=(700, 10)).astype(np.float32)
  y = np.argmax(x @ w_true + 0.3 * rng.normal(size=(700, 3)), 1).astype(np.int32)
  params = {"w": jnp.zeros((10, 3)), "b": jnp.zeros(3)}
  return sim.Problem(params, loss_fn, accuracy_fn, x[:500], y[:500], x[500:], y[500:])


def training_cases() -> dict[str, tuple[str, dict]]:
  local = optax.sgd(0.05, momentum=0.9)
  return {
    "train_aladdin": ("aladdin", dict(worker_tx=local, server_tx=optax.sgd(0.05))),
    "train_aladdin_momentum_npi": (
      "aladdin",
      dict(worker_tx=local, server_tx=optax.sgd(0.05, momentum=0.9), alpha="n_pi"),
    ),
    "train_aladdin_l2": (
      "aladdin",
      dict(worker_tx=local, server_tx=optax.sgd(0.05), period=1, reply_every=4, alpha=0.5),
    ),
    "train_aladdin_sum_alpha0": (
      "aladdin",
      dict(worker_tx=local, server_tx=optax.sgd(0.05), normalise="mean", alpha=0.0),
    ),
    "train_ar_sgd": ("ar_sgd", dict(worker_tx=optax.sgd(0.2, momentum=0.9))),
    "train_asp": ("asp", dict(server_tx=optax.sgd(0.05))),
    "train_easgd": ("easgd", dict(worker_tx=local)),
    "train_easgd_tau3": ("easgd", dict(worker_tx=local, tau=3, beta=0.2)),
    "train_sgp": ("sgp", dict(worker_tx=local)),
  }


def _cluster(kwargs: dict) -> sim.Cluster:
  kwargs = dict(kwargs)
  if kwargs.pop("paper", False):
    return sim.paper_cluster(kwargs.pop("compute_time"), kwargs.pop("slowdown"))
  n = kwargs.pop("num_workers")
  return sim.make_cluster(n, kwargs.pop("compute_time"), **kwargs)


def _floats(values) -> list[float | None]:
  return [None if math.isnan(float(v)) else float(v) for v in values]


def _events_digest(events) -> str:
  return hashlib.sha256(repr([(float(t).hex(), k, w) for t, k, w in events]).encode()).hexdigest()


def fingerprint(result: Any) -> dict[str, Any]:
  out = {
    "time": float(result.time),
    "samples": int(result.samples),
    "iterations": [int(i) for i in result.iterations],
    "wait_time": [float(w) for w in result.wait_time],
    "messages": [int(m) for m in result.messages],
    "num_events": int(result.num_events),
    "events": _events_digest(result.events),
  }
  if result.evals:
    out["evals"] = [
      _floats((p.time, p.samples, p.train_loss, p.test_loss, p.test_accuracy, p.local_accuracy))
      for p in result.evals
    ]
    out["params"] = {
      "/".join(str(k) for k in path): np.asarray(v, np.float64).ravel().tolist()
      for path, v in jax.tree_util.tree_flatten_with_path(result.params)[0]
    }
  return out


def run_timing(name: str) -> dict[str, Any]:
  alg, options, cluster, kwargs = timing_cases()[name]
  kwargs = dict(kwargs)
  if alg == "aladdin":
    options = _aladdin_options(options)
  result = sim.simulate(
    sim.algorithm(alg, **options),
    _cluster(cluster),
    batch_size=kwargs.pop("batch_size", 1),
    model_bytes=kwargs.pop("model_bytes", NBYTES),
    until_time=kwargs.pop("until"),
    seed=kwargs.pop("seed", 0),
    record_events=True,
  )
  return fingerprint(result)


def run_training(name: str, problem: sim.Problem) -> dict[str, Any]:
  alg, options = training_cases()[name]
  if alg == "aladdin":
    options = _aladdin_options(options)
  cluster = sim.make_cluster(4, 1.0, slowdown=3.0, bandwidth=1e5, latency=1e-3, jitter=0.1)
  result = sim.simulate(
    sim.algorithm(alg, **options),
    cluster,
    batch_size=16,
    problem=problem,
    num_samples=2400,
    num_evals=3,
    seed=7,
    record_events=True,
  )
  return fingerprint(result)


VERSIONS_KEY = "_recorded_with"


def versions() -> dict[str, str]:
  """What a float32 run's last bits depend on besides the code: the XLA build and the vector
  instructions XLA's CPU backend compiles for (it targets the host's)."""
  import jaxlib

  return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "cpu_isa": _cpu_isa()}


def _cpu_isa() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
  except OSError:
    flags = []
  vector = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c", "sse4")))
  return ",".join(vector) or platform.machine()


def record() -> dict[str, Any]:
  problem = tiny_problem()
  golden: dict[str, Any] = {VERSIONS_KEY: versions()}
  golden.update({name: run_timing(name) for name in timing_cases()})
  golden.update({name: run_training(name, problem) for name in training_cases()})
  return golden


if __name__ == "__main__":
  GOLDEN.parent.mkdir(exist_ok=True)
  GOLDEN.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
  print(f"wrote {GOLDEN}")
