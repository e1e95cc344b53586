"""What LENA costs over plain data-parallel SGD with momentum: time, memory and compile time.

Run from the repository root::

  python -m benchmarks.overhead [--quick] [--device cpu|gpu] [--out benchmarks/results]

Sections (every time is a RATIO candidate / baseline measured side by side in one run: each
function is jitted and warmed up, then the candidates run interleaved, in alternating order, for
N repeats, and the ratio of the medians is reported, with the absolute medians as context):

* (a) update only, statistics given: ``ol.lena`` / ``ol.adascale`` / ``optax.lars`` /
  ``optax.lamb`` vs SGD with momentum and coupled weight decay;
* (b) statistics plus update from S = 8 stacked worker gradients vs plain mean + SGD-momentum;
* (c) a full data-parallel step on 8 (simulated CPU) devices in ``pmap`` and ``shard_map``:
  local gradients -> ``ol.all_reduce_grad_stats`` + ``ol.lena`` vs ``lax.pmean`` + SGD-momentum,
  and vs ``ol.linear_scaling`` (which needs the same statistics);
* (d) a whole training step (forward, backward, all-reduce, update) of the example models;
* (e) optimizer-state memory vs SGD-momentum (bytes of the state pytree);
* (f) compile time (``jit(...).lower(...).compile()``) vs number of leaves.

Section (c) also times the two passes over the gradients that the statistics need (the local
squared norms, and the squared norm of the mean) one at a time, and section (f) counts the
distinct kernels XLA compiles: the profiles that explain the targets this machine misses.

Run as a script, the benchmark re-executes itself with glibc's allocator told to keep freed
memory (``GLIBC_TUNABLES``, see ``CACHING_MALLOC``): by default glibc maps and unmaps every
buffer over 32 MB on each step, and the page faults that follow moved the data-parallel ratios
by up to +-40% between runs. ``--system-malloc`` turns this off.

Writes ``overhead.md``, ``overhead.json`` and ``overhead.png`` to ``--out`` and prints PASS/FAIL
per target. The smoke test (tests/test_overhead_smoke.py) runs every section at toy sizes.
"""

from __future__ import annotations

import os
import sys


def _simulate_host_devices(count: int = 8) -> None:
  """Asks XLA for ``count`` CPU devices; only effective before jax is first imported."""
  flags = os.environ.get("XLA_FLAGS", "")
  if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


# Keep freed memory in the process (no munmap/trim) and one arena: every step then reuses the
# same pages, as a caching device allocator would, instead of page-faulting fresh ones.
CACHING_MALLOC = (
  "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736:glibc.malloc.arena_max=1"
)


def _reexec_with_caching_malloc() -> None:
  """Restarts this very command line with ``CACHING_MALLOC`` (glibc reads it at exec)."""
  if (
    __name__ != "__main__"
    or "--system-malloc" in sys.argv
    or os.environ.get("GLIBC_TUNABLES") == CACHING_MALLOC
    or "jax" in sys.modules
  ):
    return
  env = dict(os.environ, GLIBC_TUNABLES=CACHING_MALLOC)
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


_reexec_with_caching_malloc()
_simulate_host_devices()

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import optax_lena as ol  # noqa: E402
from examples import analysis  # noqa: E402
from examples import optimizers as registry  # noqa: E402

PyTree = Any
AXIS = "batch"
# A constant rate eta0, theta of LENA's state-aware warm-up and W of LSW's fixed one (base steps).
LR, MOMENTUM, WEIGHT_DECAY, THETA, WARMUP_STEPS = 0.1, 0.9, 5e-4, 50.0, 100.0
NUM_WORKERS = 8
TOTAL_STEPS = 1000  # the run length the warm-up fractions refer to (T1 = TOTAL_STEPS x S)
# This benchmark's names (in its tables and JSON) of the registry's optimizers.
OPTIMIZERS = {
  "sgd_momentum": "sgd",
  "lena": "lena",
  "adascale": "adascale",
  "linear_scaling": "lsw",
  "lars": "lars",
  "lamb": "lamb",
}

# Target id -> (what, limit on the ratio). "memory" is checked on bytes, see memory_rows.
TARGETS = {
  "update_only": ("update only (statistics given) vs SGD-momentum", 1.15),
  "stacked": ("stacked statistics + update (S=8) vs mean + SGD-momentum", 1.05),
  "pmap_step": ("data-parallel step vs pmean + SGD-momentum", 1.10),
  "train_step": ("whole training step vs linear scaling", 1.03),
  "memory": ("state = SGD-momentum + O(leaves) scalars (<= 64 B per leaf)", 64.0),
  "compile": ("compile time at the largest leaf count vs SGD-momentum", 1.5),
}


# ----------------------------------------------------------------------------------------------
# Parameter trees.


def resnet18_shapes(width: int = 64, num_classes: int = 10) -> PyTree:
  """Parameter shapes of examples/models.ResNet18 (62 leaves, 11.2M parameters at width 64)."""
  from examples.models import ResNet18

  model = ResNet18(num_classes=num_classes, width=width)
  x = jnp.zeros((1, 32, 32, 3), jnp.float32)
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x, train=False))["params"]


def transformer_shapes(num_layers: int, d_model: int, vocab: int = 8192) -> PyTree:
  """A GPT-style decoder tree: 12 leaves per block (many small leaves, repeated shapes)."""
  d = d_model
  block = {
    "ln1": {"scale": (d,), "bias": (d,)},
    "attn": {
      "qkv": {"kernel": (d, 3 * d), "bias": (3 * d,)},
      "out": {"kernel": (d, d), "bias": (d,)},
    },
    "ln2": {"scale": (d,), "bias": (d,)},
    "mlp": {
      "fc1": {"kernel": (d, 4 * d), "bias": (4 * d,)},
      "fc2": {"kernel": (4 * d, d), "bias": (d,)},
    },
  }
  tree = {f"block_{i:04d}": block for i in range(num_layers)}
  tree["embed"] = {"tokens": (vocab, d), "positions": (512, d)}
  tree["ln_f"] = {"scale": (d,), "bias": (d,)}
  return jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s, jnp.float32), tree, is_leaf=lambda x: isinstance(x, tuple)
  )


def leaves_tree(num_leaves: int, d_model: int = 16) -> PyTree:
  """A transformer-shaped tree with exactly ``num_leaves`` leaves (for the compile-time sweep)."""
  tree = transformer_shapes(max(num_leaves // 12, 1), d_model, vocab=64)
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  flat = flat[:num_leaves]
  while len(flat) < num_leaves:  # pad with biases
    flat.append(
      (
        (jax.tree_util.DictKey(f"extra_{len(flat)}"),),
        jax.ShapeDtypeStruct((d_model,), jnp.float32),
      )
    )
  return {jax.tree_util.keystr(path): leaf for path, leaf in flat}


def tree_info(shapes: PyTree) -> dict[str, int]:
  leaves = jax.tree.leaves(shapes)
  return {"leaves": len(leaves), "params": int(sum(np.prod(x.shape) for x in leaves))}


def materialize(shapes: PyTree, seed: int = 0, scale: float = 0.01, lead: Sequence[int] = ()):
  """Random float32 arrays for ``shapes`` (with optional leading axes), made on the host."""
  rng = np.random.default_rng(seed)

  def normal(x):
    return jnp.asarray(scale * rng.standard_normal((*lead, *x.shape), np.float32))

  return jax.tree.map(normal, shapes)


def grad_stats_for(grads: PyTree, num_samples: int = NUM_WORKERS) -> ol.GradStats:
  """Plausible statistics for ``grads`` (top = 3 x bot): per-leaf float32 scalars."""
  bot = jax.tree.map(lambda g: jnp.sum(jnp.square(g)), grads)
  top = jax.tree.map(lambda b: 3.0 * b, bot)
  return ol.GradStats(top, num_samples, bot)


# ----------------------------------------------------------------------------------------------
# Optimizers.


def optimizers(
  num_samples: int = NUM_WORKERS,
) -> dict[str, tuple[optax.GradientTransformation, bool]]:
  """name -> (transformation, whether its update takes grad_stats), from the example registry.

  Each optimizer with its paper warm-up (LENA: theta = THETA, LSW: W = WARMUP_STEPS base
  steps, AdaScale and the others none) and the constant rate LR; ``num_samples`` is the S the
  statistics will have (the number of devices in the data-parallel sections).
  """
  t1 = TOTAL_STEPS * num_samples
  hp = registry.Hyperparams(
    learning_rate=LR,
    num_samples=num_samples,
    total_steps=TOTAL_STEPS,
    momentum=MOMENTUM,
    weight_decay=WEIGHT_DECAY,
    lr_decay=None,  # constant: the timings are of the update, not of a schedule
    warmup_alpha=THETA / t1,
    warmup_fraction=WARMUP_STEPS / t1,
  )
  out = {}
  for name, entry_name in OPTIMIZERS.items():
    entry = registry.get(entry_name)
    tx = registry.build(entry_name, dataclasses.replace(hp, warmup=entry.paper_warmup))
    out[name] = (tx, entry.diagnostics)
  return out


def fresh(tree: PyTree) -> PyTree:
  """Own copies of every array: an optimizer's init may return one array in two places of its
  state, which cannot be donated twice."""
  return jax.tree.map(jnp.copy, tree)


def apply_update(tx, uses_stats, grads, opt_state, params, stats=None):
  if uses_stats:
    updates, opt_state = tx.update(grads, opt_state, params, grad_stats=stats)
  else:
    updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state


# ----------------------------------------------------------------------------------------------
# Timing.


class Stepper:
  """Runs ``fn(*carry, *consts) -> carry`` in place (the carry is donated, as in training)."""

  def __init__(self, fn: Callable[..., Any], carry: tuple, consts: tuple = ()):
    self.fn, self.carry, self.consts = fn, carry, consts

  def __call__(self) -> None:
    self.carry = self.fn(*self.carry, *self.consts)
    jax.block_until_ready(self.carry)


def time_interleaved(
  runners: dict[str, Callable[[], None]],
  repeats: int,
  warmup: int = 2,
  min_seconds: float = 0.0,
) -> dict[str, np.ndarray]:
  """Seconds per call of every runner: warm-up calls (compiles), then interleaved repeats.

  Candidates alternate in order A B C, C B A, ... so that slow drifts of the machine (other
  processes, frequency) hit all of them alike; compare medians. With ``min_seconds``, rounds
  continue past ``repeats`` until that much time is spent (at most 20 x ``repeats`` rounds):
  steps of a few milliseconds need hundreds of samples for a stable median on a shared machine.
  """
  names = list(runners)
  for i in range(warmup):
    for name in names:
      start = time.perf_counter()
      runners[name]()
      if i == 0:
        log(f"    first call (compile) of {name}: {time.perf_counter() - start:.1f} s")
  times: dict[str, list[float]] = {name: [] for name in names}
  start_all = time.perf_counter()
  i = 0
  while i < repeats or (time.perf_counter() - start_all < min_seconds and i < 20 * repeats):
    for name in names if i % 2 == 0 else names[::-1]:
      start = time.perf_counter()
      runners[name]()
      times[name].append(time.perf_counter() - start)
    i += 1
  return {name: np.asarray(t) for name, t in times.items()}


@dataclasses.dataclass
class Row:
  section: str
  tree: str
  candidate: str
  baseline: str
  candidate_ms: float
  baseline_ms: float
  ratio: float
  target: str | None = None

  @property
  def passed(self) -> bool | None:
    return None if self.target is None else self.ratio <= TARGETS[self.target][1]


def rows_from_times(section, tree, times, baseline, targets=None) -> list[Row]:
  """One row per non-baseline candidate: ratio of medians, with absolute medians."""
  targets = targets or {}
  base = float(np.median(times[baseline]))
  rows = []
  for name, t in times.items():
    if name == baseline:
      continue
    med = float(np.median(t))
    rows.append(
      Row(section, tree, name, baseline, 1e3 * med, 1e3 * base, med / base, targets.get(name))
    )
  return rows


def log(msg: str) -> None:
  print(msg, flush=True)


def log_rows(rows: list[Row]) -> None:
  for r in rows:
    verdict = "" if r.passed is None else ("  PASS" if r.passed else "  FAIL")
    log(
      f"    {r.candidate:>34} / {r.baseline:<28} {r.ratio:6.3f}x  "
      f"({r.candidate_ms:8.2f} ms vs {r.baseline_ms:8.2f} ms){verdict}"
    )


# ----------------------------------------------------------------------------------------------
# (a) Update only, statistics given.


def bench_update_only(
  tree_name: str,
  shapes: PyTree,
  repeats: int,
  names: Sequence[str] = ("sgd_momentum", "lena", "adascale", "lars", "lamb"),
) -> list[Row]:
  log(f"  (a) update only, statistics given: {tree_name} {tree_info(shapes)}")
  grads = materialize(shapes, seed=1)
  stats = grad_stats_for(grads)
  opts = optimizers()
  runners = {}
  for name in names:
    tx, uses_stats = opts[name]

    def step(params, opt_state, grads, stats, tx=tx, uses_stats=uses_stats):
      return apply_update(tx, uses_stats, grads, opt_state, params, stats)

    params = materialize(shapes, seed=0)
    runners[name] = Stepper(
      jax.jit(step, donate_argnums=(0, 1)), (params, fresh(tx.init(params))), (grads, stats)
    )
  rows = rows_from_times(
    "a. update only",
    tree_name,
    time_interleaved(runners, repeats),
    "sgd_momentum",
    {"lena": "update_only"},
  )
  log_rows(rows)
  return rows


# ----------------------------------------------------------------------------------------------
# (b) Statistics plus update from S stacked worker gradients.


def bench_stacked(
  tree_name: str, shapes: PyTree, repeats: int, num_workers: int = NUM_WORKERS
) -> list[Row]:
  log(f"  (b) stacked statistics + update, S={num_workers}: {tree_name} {tree_info(shapes)}")
  stacked = materialize(shapes, seed=1, lead=(num_workers,))
  opts = optimizers(num_workers)

  def baseline(params, opt_state, stacked):
    mean = jax.tree.map(lambda g: jnp.mean(g, axis=0), stacked)
    return apply_update(opts["sgd_momentum"][0], False, mean, opt_state, params)

  def lena(params, opt_state, stacked):
    mean, stats = ol.stacked_grad_stats(stacked)
    return apply_update(opts["lena"][0], True, mean, opt_state, params, stats)

  runners = {}
  for name, fn in (("mean+sgd_momentum", baseline), ("stacked_grad_stats+lena", lena)):
    tx = opts["sgd_momentum" if name.endswith("momentum") else "lena"][0]
    params = materialize(shapes, seed=0)
    runners[name] = Stepper(
      jax.jit(fn, donate_argnums=(0, 1)), (params, fresh(tx.init(params))), (stacked,)
    )
  rows = rows_from_times(
    "b. stacked stats + update",
    tree_name,
    time_interleaved(runners, repeats),
    "mean+sgd_momentum",
    {"stacked_grad_stats+lena": "stacked"},
  )
  log_rows(rows)
  return rows


# ----------------------------------------------------------------------------------------------
# (c) Data-parallel step in pmap and shard_map.


def dp_update(kind: str, tx: optax.GradientTransformation):
  """The per-device part of a data-parallel step after the local gradients: reduce + update."""

  def update(local_grads, params, opt_state):
    if kind == "stats":
      grads, stats = ol.all_reduce_grad_stats(local_grads, AXIS)
      return apply_update(tx, True, grads, opt_state, params, stats)
    summed = jax.lax.psum(local_grads, AXIS)
    grads = jax.tree.map(lambda g: g / jax.lax.axis_size(AXIS), summed)
    new_params, new_state = apply_update(tx, False, grads, opt_state, params)
    # Profile variants: one of the statistics' two passes over the gradients, as
    # all_reduce_grad_stats does it, its result folded into the parameters (times zero) so
    # that XLA cannot drop it.
    if kind == "pmean+local_sq":  # the local squared norms and their one small all-reduce
      extra = jax.lax.psum(_sq_norms(local_grads), AXIS)
    elif kind == "pmean+mean_sq":  # the squared norms of the mean, read from the all-reduced sum
      extra = _sq_norms(summed)
    else:
      return new_params, new_state
    zero = 0.0 * jnp.sum(extra)
    return jax.tree.map(lambda p: p + zero.astype(p.dtype), new_params), new_state

  return update


def _sq_norms(tree: PyTree) -> jax.Array:
  return jnp.stack([jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)])


DP_VARIANTS = {
  "pmean+sgd_momentum": ("pmean", "sgd_momentum"),
  "all_reduce_grad_stats+lena": ("stats", "lena"),
  "all_reduce_grad_stats+linear_scaling": ("stats", "linear_scaling"),
}
# The statistics' two passes over the gradients, each alone on top of the baseline.
PROFILE_VARIANTS = {
  "pmean+local_sq_norms+sgd_momentum": ("pmean+local_sq", "sgd_momentum"),
  "pmean+mean_sq_norms+sgd_momentum": ("pmean+mean_sq", "sgd_momentum"),
}


def replicate_pmap(tree: PyTree, devices) -> PyTree:
  """One copy of ``tree`` per device, laid out for ``pmap`` (leading device axis)."""
  n = len(devices)
  if not jax.tree.leaves(tree):
    return tree
  stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (n, *jnp.shape(x))), tree)
  return jax.pmap(lambda x: x, devices=devices)(stacked)


def bench_dp_step(
  tree_name: str,
  shapes: PyTree,
  repeats: int,
  devices: Sequence[Any],
  modes: Sequence[str] = ("pmap", "shard_map"),
) -> list[Row]:
  n = len(devices)
  log(f"  (c) data-parallel step on {n} devices: {tree_name} {tree_info(shapes)}")
  opts = optimizers(n)
  host_local = materialize(shapes, seed=1, lead=(n,))
  variants = {**DP_VARIANTS, **PROFILE_VARIANTS}
  rows = []
  for mode in modes:
    runners = {}
    if mode == "pmap":
      local = jax.pmap(lambda x: x, devices=devices)(host_local)
      for name, (kind, opt) in variants.items():
        tx = opts[opt][0]
        params = materialize(shapes, seed=0)
        fn = jax.pmap(
          lambda g, p, s, kind=kind, tx=tx: dp_update(kind, tx)(g, p, s),
          axis_name=AXIS,
          devices=devices,
          donate_argnums=(1, 2),
        )
        carry = (replicate_pmap(params, devices), replicate_pmap(tx.init(params), devices))
        runners[name] = Stepper(lambda p, s, g, fn=fn: fn(g, p, s), carry, (local,))
    else:
      mesh = jax.sharding.Mesh(
        np.asarray(devices), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,)
      )
      local = jax.device_put(host_local, NamedSharding(mesh, P(AXIS)))
      replicated = NamedSharding(mesh, P())
      for name, (kind, opt) in variants.items():
        tx = opts[opt][0]

        def body(g, p, s, kind=kind, tx=tx):
          return dp_update(kind, tx)(jax.tree.map(lambda x: x[0], g), p, s)

        fn = jax.jit(
          jax.shard_map(body, mesh=mesh, in_specs=(P(AXIS), P(), P()), out_specs=(P(), P())),
          donate_argnums=(1, 2),
        )
        params = jax.device_put(materialize(shapes, seed=0), replicated)
        carry = (params, jax.device_put(fresh(tx.init(params)), replicated))
        runners[name] = Stepper(lambda p, s, g, fn=fn: fn(g, p, s), carry, (local,))
    times = time_interleaved(runners, repeats)
    mode_rows = rows_from_times(
      f"c. {mode} step",
      tree_name,
      times,
      "pmean+sgd_momentum",
      {"all_reduce_grad_stats+lena": "pmap_step"},
    )
    lsw = "all_reduce_grad_stats+linear_scaling"
    mode_rows += rows_from_times(
      f"c. {mode} step", tree_name, {k: times[k] for k in ("all_reduce_grad_stats+lena", lsw)}, lsw
    )
    log(f"    {mode}:")
    log_rows(mode_rows)
    rows += mode_rows
  return rows


# ----------------------------------------------------------------------------------------------
# (d) Whole training step of the example models.


def model_and_batch(name: str, per_device_batch: int, width: int, num_devices: int):
  from examples.models import CNN1D, ResNet18

  rng = np.random.RandomState(0)
  if name == "cnn1d":
    model = CNN1D(num_classes=10)
    x = rng.randn(num_devices, per_device_batch, 40).astype(np.float32)
  else:
    model = ResNet18(num_classes=10, width=width)
    x = rng.randn(num_devices, per_device_batch, 32, 32, 3).astype(np.float32)
  y = rng.randint(0, 10, (num_devices, per_device_batch)).astype(np.int32)
  return model, x, y


def bench_train_step(
  model_name: str,
  repeats: int,
  devices: Sequence[Any],
  per_device_batch: int = 32,
  width: int = 16,
  min_seconds: float = 0.0,
) -> list[Row]:
  n = len(devices)
  model, x, y = model_and_batch(model_name, per_device_batch, width, n)
  init = jax.jit(functools.partial(model.init, train=False))  # eager init: many tiny compiles
  variables = init(jax.random.PRNGKey(0), jnp.asarray(x[0, :1]))
  params = variables["params"]
  extra = {k: v for k, v in variables.items() if k != "params"}  # BatchNorm statistics
  label = f"{model_name}" + (f" width {width}" if model_name == "resnet18" else "")
  log(f"  (d) training step, {label}, {n} devices x batch {per_device_batch}: {tree_info(params)}")
  opts = optimizers(n)

  def make_step(kind, tx):
    def step(params, extra, opt_state, x, y):
      def loss_fn(p):
        if extra:
          logits, new_extra = model.apply(
            {"params": p, **extra}, x, train=True, mutable=list(extra)
          )
        else:
          logits, new_extra = model.apply({"params": p}, x, train=True), {}
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, new_extra

      (_, new_extra), local_grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
      new_extra = jax.lax.pmean(new_extra, AXIS)
      params, opt_state = dp_update(kind, tx)(local_grads, params, opt_state)
      return params, new_extra, opt_state

    return jax.pmap(step, axis_name=AXIS, devices=devices, donate_argnums=(0, 1, 2))

  xs = jax.pmap(lambda a: a, devices=devices)(x)
  ys = jax.pmap(lambda a: a, devices=devices)(y)
  runners = {}
  for name, (kind, opt) in DP_VARIANTS.items():
    tx = opts[opt][0]
    carry = tuple(replicate_pmap(t, devices) for t in (params, extra, tx.init(params)))
    runners[name] = Stepper(make_step(kind, tx), carry, (xs, ys))
  times = time_interleaved(runners, repeats, min_seconds=min_seconds)
  lsw = "all_reduce_grad_stats+linear_scaling"
  rows = rows_from_times(
    "d. training step",
    label,
    {k: times[k] for k in ("all_reduce_grad_stats+lena", lsw)},
    lsw,
    {"all_reduce_grad_stats+lena": "train_step"},
  )
  rows += rows_from_times("d. training step", label, times, "pmean+sgd_momentum")
  log_rows(rows)
  return rows


# ----------------------------------------------------------------------------------------------
# (e) Optimizer-state memory.


def state_bytes(tx: optax.GradientTransformation, shapes: PyTree) -> int:
  state = jax.eval_shape(tx.init, shapes)
  return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(state)))


def memory_rows(trees: dict[str, PyTree]) -> list[dict[str, Any]]:
  log("  (e) optimizer-state memory")
  opts = optimizers()
  out = []
  for tree_name, shapes in trees.items():
    info = tree_info(shapes)
    base = state_bytes(opts["sgd_momentum"][0], shapes)
    for name in ("lena", "adascale", "linear_scaling", "lars", "lamb"):
      nbytes = state_bytes(opts[name][0], shapes)
      extra = nbytes - base
      row = {
        "tree": tree_name,
        **info,
        "optimizer": name,
        "bytes": nbytes,
        "sgd_momentum_bytes": base,
        "extra_bytes": extra,
        "extra_bytes_per_leaf": extra / info["leaves"],
      }
      if name in ("lena", "adascale", "linear_scaling"):
        row["passed"] = bool(extra <= TARGETS["memory"][1] * info["leaves"] + 64)
      out.append(row)
      log(
        f"    {tree_name:>24} {name:>15}: {nbytes / 2**20:9.2f} MiB, "
        f"+{extra} B (+{extra / info['leaves']:.1f} B/leaf)"
        + ("" if "passed" not in row else ("  PASS" if row["passed"] else "  FAIL"))
      )
  return out


# ----------------------------------------------------------------------------------------------
# (f) Compile time.


def kernel_counts(compiled_hlo: str) -> tuple[int, int]:
  """(kernels, distinct kernels) of a compiled module's text.

  XLA:CPU compiles a kernel once per distinct fused computation (names and metadata aside) and
  reuses it for identical ones, so the distinct count, not the leaf count, drives compile time.
  """
  bodies = re.findall(r"^%\S+ \(.*?\) -> .*? \{\n(.*?)\n\}", compiled_hlo, re.M | re.S)
  normalised = {re.sub(r"%[\w.\-]+", "%", re.sub(r", metadata=\{[^}]*\}", "", b)) for b in bodies}
  return len(bodies), len(normalised)


def compile_seconds(name: str, shapes: PyTree) -> tuple[float, int, int]:
  """Seconds to lower and compile the update step, and its (kernels, distinct kernels)."""
  tx, uses_stats = optimizers()[name]
  scalar = jax.ShapeDtypeStruct((), jnp.float32)
  stats = ol.GradStats(
    jax.tree.map(lambda _: scalar, shapes), NUM_WORKERS, jax.tree.map(lambda _: scalar, shapes)
  )
  state = jax.eval_shape(tx.init, shapes)

  def step(params, opt_state, grads, stats):
    return apply_update(tx, uses_stats, grads, opt_state, params, stats)

  start = time.perf_counter()
  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(shapes, state, shapes, stats).compile()
  seconds = time.perf_counter() - start
  return (seconds, *kernel_counts(compiled.as_text()))


def bench_compile(
  leaf_counts: Sequence[int], repeats: int = 1, names: Sequence[str] = ("sgd_momentum", "lena")
) -> list[dict[str, Any]]:
  log("  (f) compile time of the update step (jit(...).lower(...).compile())")
  out = []
  for count in leaf_counts:
    shapes = leaves_tree(count)
    times: dict[str, list[float]] = {name: [] for name in names}
    kernels: dict[str, tuple[int, int]] = {}
    for i in range(repeats):
      for name in names if i % 2 == 0 else names[::-1]:
        seconds, *kernels[name] = compile_seconds(name, shapes)
        times[name].append(seconds)
    med = {name: float(np.median(t)) for name, t in times.items()}
    row = {
      "leaves": count,
      "params": tree_info(shapes)["params"],
      **{f"{name}_s": med[name] for name in names},
      **{f"{name}_kernels": kernels[name][0] for name in names},
      **{f"{name}_distinct_kernels": kernels[name][1] for name in names},
      "ratio": med["lena"] / med["sgd_momentum"],
    }
    out.append(row)
    log(
      f"    {count:6d} leaves: lena {med['lena']:7.2f} s, sgd_momentum "
      f"{med['sgd_momentum']:7.2f} s, ratio {row['ratio']:.2f}x; distinct kernels "
      f"{kernels['lena'][1]} vs {kernels['sgd_momentum'][1]}"
    )
  if out:
    out[-1]["target"] = "compile"
    out[-1]["passed"] = bool(out[-1]["ratio"] <= TARGETS["compile"][1])
  return out


# ----------------------------------------------------------------------------------------------
# Report.


def machine_info(devices: Sequence[Any]) -> dict[str, Any]:
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  return {
    "cpu": cpu,
    "cpu_cores": os.cpu_count(),
    "python": platform.python_version(),
    "jax": jax.__version__,
    "optax": optax.__version__,
    "devices": f"{len(devices)} x {devices[0].platform} ({devices[0].device_kind})",
  }


def summary_targets(rows: list[Row], memory: list[dict], compile_rows: list[dict]):
  """(target id, what, limit, list of (label, value, passed))."""
  out = []
  for tid, (what, limit) in TARGETS.items():
    checks = [(f"{r.section} / {r.tree}", r.ratio, r.passed) for r in rows if r.target == tid]
    if tid == "memory":
      checks = [
        (f"{m['tree']} / {m['optimizer']}", m["extra_bytes_per_leaf"], m["passed"])
        for m in memory
        if "passed" in m
      ]
    if tid == "compile":
      checks = [
        (f"{c['leaves']} leaves", c["ratio"], c["passed"]) for c in compile_rows if "passed" in c
      ]
    out.append((tid, what, limit, checks))
  return out


def write_markdown(
  path: str, meta: dict, rows: list[Row], memory: list[dict], compile_rows: list[dict]
) -> None:
  lines = [
    "# LENA overhead benchmark",
    "",
    f"Command: `{meta['command']}`  ",
    f"Machine: {meta['machine']['cpu']}, "
    f"{meta['machine']['cpu_cores']} cores; {meta['machine']['devices']}; jax "
    f"{meta['machine']['jax']}, optax {meta['machine']['optax']}  ",
    f"Repeats: {meta['repeats']}, interleaved (ratios of medians); total {meta['seconds']:.0f} s",
    "",
    "## Targets",
    "",
    "| target | limit | measured | verdict |",
    "|---|---|---|---|",
  ]
  for _, what, limit, checks in summary_targets(rows, memory, compile_rows):
    for label, value, passed in checks:
      unit = " B/leaf" if "B per leaf" in what else "x"
      lines.append(
        f"| {what} ({label}) | {limit:g}{unit} | {value:.3f}{unit} | "
        f"{'PASS' if passed else 'FAIL'} |"
      )
  lines += [
    "",
    "## Time ratios",
    "",
    "| section | tree / model | candidate | baseline | candidate ms | baseline ms | ratio |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r.section} | {r.tree} | {r.candidate} | {r.baseline} | "
      f"{r.candidate_ms:.2f} | {r.baseline_ms:.2f} | **{r.ratio:.3f}** |"
    )
  lines += [
    "",
    "## Optimizer-state memory",
    "",
    "| tree | leaves | params | optimizer | state MiB | SGD-momentum MiB | extra bytes | "
    "extra B/leaf |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for m in memory:
    lines.append(
      f"| {m['tree']} | {m['leaves']} | {m['params']:,} | {m['optimizer']} | "
      f"{m['bytes'] / 2**20:.2f} | {m['sgd_momentum_bytes'] / 2**20:.2f} | "
      f"{m['extra_bytes']:,} | {m['extra_bytes_per_leaf']:.1f} |"
    )
  lines += [
    "",
    "## Compile time of the update step",
    "",
    "| leaves | params | lena s | SGD-momentum s | ratio | lena kernels (distinct) | "
    "SGD-momentum kernels (distinct) |",
    "|---|---|---|---|---|---|---|",
  ]
  for c in compile_rows:
    lines.append(
      f"| {c['leaves']} | {c['params']:,} | {c['lena_s']:.2f} | "
      f"{c['sgd_momentum_s']:.2f} | **{c['ratio']:.2f}** | "
      f"{c['lena_kernels']} ({c['lena_distinct_kernels']}) | "
      f"{c['sgd_momentum_kernels']} ({c['sgd_momentum_distinct_kernels']}) |"
    )
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def write_plot(path: str, rows: list[Row], compile_rows: list[dict]) -> None:
  plt = analysis.pyplot()
  fig, (ax1, ax2) = plt.subplots(
    1, 2, figsize=(15, 0.32 * max(len(rows), 8) + 1.5), gridspec_kw={"width_ratios": [2.2, 1]}
  )
  labels = [f"{r.section} | {r.tree} | {r.candidate} / {r.baseline}" for r in rows]
  colors = [
    "tab:gray" if r.passed is None else ("tab:green" if r.passed else "tab:red") for r in rows
  ]
  ypos = np.arange(len(rows))
  ax1.barh(ypos, [r.ratio for r in rows], color=colors)
  for y, r in zip(ypos, rows, strict=True):
    if r.target is not None:
      ax1.plot([TARGETS[r.target][1]] * 2, [y - 0.4, y + 0.4], color="black", lw=2)
  ax1.axvline(1.0, color="black", lw=0.5)
  ax1.set_yticks(ypos, labels, fontsize=7)
  ax1.invert_yaxis()
  ax1.set_xlabel("time ratio candidate / baseline (black tick: target)")
  ax1.set_title("Runtime overhead (green: meets target, red: misses)")
  if compile_rows:
    leaves = [c["leaves"] for c in compile_rows]
    ax2.plot(leaves, [c["lena_s"] for c in compile_rows], "o-", label="lena")
    ax2.plot(leaves, [c["sgd_momentum_s"] for c in compile_rows], "s-", label="SGD-momentum")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("parameter leaves")
    ax2.set_ylabel("compile seconds")
    ax2.legend()
    ax2.set_title("Compile time of the update step")
  analysis.save_figure(fig, Path(path), dpi=110)


# ----------------------------------------------------------------------------------------------
# Main.


@dataclasses.dataclass
class Config:
  resnet_width: int = 64
  transformer: tuple[int, int] = (16, 192)  # (blocks, d_model)
  repeats: int = 20  # update only
  step_repeats: int = 8  # the slower sections (stacked, data-parallel, training steps)
  train_models: tuple[tuple[str, int, int], ...] = (("cnn1d", 128, 0), ("resnet18", 16, 16))
  compile_leaves: tuple[int, ...] = (100, 1000, 5000)
  compile_repeats: int = 1
  train_min_seconds: float = 30.0  # per model in (d): the CNN1D step takes milliseconds


FULL = Config()
QUICK = Config(
  resnet_width=16,
  transformer=(4, 64),
  repeats=9,
  step_repeats=5,
  train_models=(("cnn1d", 32, 0),),
  compile_leaves=(50, 200),
  compile_repeats=1,
  train_min_seconds=0.0,
)


def run(config: Config, devices: Sequence[Any], out_dir: str, command: str) -> dict[str, Any]:
  start = time.perf_counter()
  trees = {
    f"ResNet-18 (width {config.resnet_width})": resnet18_shapes(config.resnet_width),
    "transformer ({} blocks, d={})".format(*config.transformer): transformer_shapes(
      *config.transformer
    ),
  }
  with jax.default_device(devices[0]):
    rows: list[Row] = []
    for name, shapes in trees.items():
      rows += bench_update_only(name, shapes, config.repeats)
    for name, shapes in trees.items():
      rows += bench_stacked(name, shapes, config.step_repeats)
    for name, shapes in trees.items():
      rows += bench_dp_step(name, shapes, config.step_repeats, devices)
    for model_name, batch, width in config.train_models:
      rows += bench_train_step(
        model_name, config.step_repeats, devices, batch, width, min_seconds=config.train_min_seconds
      )
    memory = memory_rows(trees)
    compile_rows = bench_compile(config.compile_leaves, config.compile_repeats)
  meta = {
    "command": command,
    "machine": machine_info(devices),
    "repeats": f"{config.repeats} (update only), {config.step_repeats} (steps; training "
    f"steps: at least {config.train_min_seconds:g} s of rounds per model)",
    "seconds": time.perf_counter() - start,
    "config": dataclasses.asdict(config),
  }
  return write_reports(out_dir, meta, rows, memory, compile_rows)


def write_reports(
  out_dir: str, meta: dict[str, Any], rows: list[Row], memory: list[dict], compile_rows: list[dict]
) -> dict[str, Any]:
  """Writes overhead.md, overhead.json and overhead.png and prints PASS/FAIL per target."""
  os.makedirs(out_dir, exist_ok=True)
  write_markdown(os.path.join(out_dir, "overhead.md"), meta, rows, memory, compile_rows)
  targets = summary_targets(rows, memory, compile_rows)
  result = {
    **meta,
    "rows": [dataclasses.asdict(r) | {"passed": r.passed} for r in rows],
    "memory": memory,
    "compile": compile_rows,
    "targets": [
      {
        "id": tid,
        "what": what,
        "limit": limit,
        "checks": [{"label": lb, "value": v, "passed": p} for lb, v, p in checks],
      }
      for tid, what, limit, checks in targets
    ],
  }
  with open(os.path.join(out_dir, "overhead.json"), "w") as f:
    json.dump(result, f, indent=1)
  write_plot(os.path.join(out_dir, "overhead.png"), rows, compile_rows)
  log("\nTargets:")
  for _, what, limit, checks in targets:
    for label, value, passed in checks:
      log(f"  {'PASS' if passed else 'FAIL'}  {what} [{label}]: {value:.3f} (limit {limit:g})")
  log(f"\nWrote {out_dir}/overhead.md, overhead.json, overhead.png ({meta['seconds']:.0f} s)")
  return result


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--quick", action="store_true", help="small trees and few repeats (< 2 min)")
  parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
  parser.add_argument("--out", default="benchmarks/results")
  parser.add_argument(
    "--system-malloc",
    action="store_true",
    help="do not re-execute with the caching glibc malloc settings",
  )
  args = parser.parse_args(argv)
  jax.config.update("jax_platforms", "cpu" if args.device == "cpu" else "cuda")
  devices = jax.devices()[:NUM_WORKERS]
  if args.device == "cpu" and len(devices) < NUM_WORKERS:
    log(
      f"warning: {len(devices)} CPU devices (set XLA_FLAGS before importing jax); the "
      f"data-parallel sections use S = {len(devices)}"
    )
  command = "python -m benchmarks.overhead " + " ".join(sys.argv[1:] if argv is None else argv)
  log(f"LENA overhead benchmark on {machine_info(devices)}")
  run(QUICK if args.quick else FULL, devices, args.out, command.strip())


if __name__ == "__main__":
  main()
