"""Second large-batch study (issue 13): a deep BatchNorm network, tuned LARS/LAMB, warm-up variants.

MNIST-1D with :class:`examples.models.ResNet1D` (ResNet-18's 62 parameter leaves, BatchNorm)
instead of the first study's 8-leaf CNN. Every optimizer comes from the examples' registry
(``examples.optimizers``); the study registers its own entries there (LENA with the warm-up
variants of ``ol.layerwise_warmup(progress=...)``), it never patches the trainer. The grid, in
the order it runs (the most informative cells first):

* ``core``: at ``ablation_scales`` (S = 256, 128), the paper's Table 2 in its shape, rules
  {LSW, AdaScale, LENA} x warm-ups {none, fixed, state-aware}, plus LENA with the two warm-up
  variants ``relative_to_max`` and ``relative_to_mean`` (the per-layer end times: Fig. 7).
* ``key``: the cells that decide the question (LSW fixed, AdaScale without / with the
  state-aware warm-up, LENA without / with the paper's warm-up / with each variant), run first
  with more seeds and at the second scale.
* ``table1``: Table 1's shape at every scale, {LSW (fixed), AdaScale (none), LENA
  (state-aware)} (the paper's), AdaScale (state-aware) and LENA (relative_to_max), 3 seeds.
* ``sweep``: ``optax.lars`` and ``optax.lamb`` with the fixed warm-up, the learning rate chosen
  by the same small sweep (seed 0) at each scale, then the best rate with every seed.
* ``long``: a 3x longer epoch budget at ``long_scale`` (the single worker included).

Each run trains in-process with a compact loop: the S per-worker gradients of an update are one
``vmap`` (per-worker BatchNorm, as data-parallel workers), in chunks of ``chunk`` workers
whose sums and squared norms are accumulated, so the statistics are exactly those of S
workers. Every run writes ``runs/<name>/config.json`` and, when it has finished,
``metrics.jsonl`` (evaluations, per-layer ratios and rate multipliers over time, per-layer
warm-up ends): a run with ``metrics.jsonl`` is skipped, so the sweep resumes. Every invocation
ends by writing ``tables.md``, ``summary.json`` and the plots of whatever has finished.

Usage::

  python -m benchmarks.large_batch.study_v2 --smoke --out /tmp/smoke     # seconds (CI)
  python -m benchmarks.large_batch.study_v2                              # the full grid
  python -m benchmarks.large_batch.study_v2 --groups core --scales 256 --seeds 0 1
  python -m benchmarks.large_batch.study_v2 --groups long --only lena_s256 adascale_s256_state
  python -m benchmarks.large_batch.study_v2 --shard 0/2 &                # two processes
  python -m benchmarks.large_batch.study_v2 --report_only
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optax_lena as ol
from examples import input_pipeline, models
from examples import optimizers as registry

PyTree = Any
TARGET_FRACTION = 0.98  # target = this fraction of the same seed's single-worker accuracy
LOOSE_FRACTION = 0.90
RULES = ("lsw", "adascale", "lena")
WARMUPS = ("none", "fixed", "state_aware")
# LENA with the warm-up variants of ol.layerwise_warmup(progress=...): registry names.
VARIANTS = {"lena_relmax": "relative_to_max", "lena_relmean": "relative_to_mean"}
TABLE1 = (
  ("lsw", "fixed"),
  ("adascale", "none"),
  ("lena", "state_aware"),
  ("adascale", "state_aware"),
  ("lena_relmax", "state_aware"),
)
# The cells that answer "when does layer-wise scaling win" (the first to get more seeds/scales).
KEY = (
  ("lsw", "fixed"),
  ("adascale", "none"),
  ("adascale", "state_aware"),
  ("lena", "none"),
  ("lena", "state_aware"),
  ("lena_relmax", "state_aware"),
  ("lena_relmean", "state_aware"),
)
GROUPS = ("core", "key", "table1", "sweep", "long", "lr")
# eta0 sensitivity (group "lr"): LENA's ratios sit above AdaScale's R for most layers, so the
# same eta0 is a larger rate for LENA; these runs vary eta0 at the first ablation scale.
LR_CELLS = (
  ("lena", "state_aware"),
  ("adascale", "state_aware"),
  ("lena", "none"),
  ("lena_relmax", "state_aware"),
)
LR_FACTORS = (0.5, 0.25, 2.0, 0.125)


# ----------------------------------------------------------------------------------------------
# The study's registry entries
# ----------------------------------------------------------------------------------------------


def lena_variant(progress: str) -> Callable[[registry.Hyperparams], optax.GradientTransformation]:
  """Builder of LENA whose state-aware warm-up advances by ``progress``.

  The same chain as ``ol.lena`` (momentum SGD with coupled weight decay, per-layer ratio,
  warm-up, rate on the sample clock, non-finite steps skipped) with
  ``ol.layerwise_warmup(theta, progress=progress)``.
  """

  def build(hp: registry.Hyperparams) -> optax.GradientTransformation:
    rule = ol.lena_rule(num_samples=hp.num_samples)
    return ol.skip_nonfinite_steps(
      optax.chain(
        optax.add_decayed_weights(hp.weight_decay),
        optax.trace(hp.momentum),
        ol.scale_by_gain_ratio(rule),
        ol.layerwise_warmup(**hp.warmup_kwargs(), rule=rule, progress=progress),
        ol.scale_by_learning_rate(
          hp.sample_schedule(), clock="samples", num_samples=hp.num_samples
        ),
      )
    )

  return build


STUDY_ENTRIES = tuple(
  registry.Optimizer(
    name,
    lena_variant(progress),
    f"LENA, warm-up {progress}",
    paper_warmup="state_aware",
    diagnostics=True,
    warmups=("state_aware",),
  )
  for name, progress in VARIANTS.items()
)
for _entry in STUDY_ENTRIES:
  registry.register(_entry, replace=True)


def label(opt: str) -> str:
  return registry.get(opt).label


# ----------------------------------------------------------------------------------------------
# Grid
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Preset:
  """Sizes of the study."""

  num_samples: int  # MNIST-1D examples before the 80/20 train/test split
  per_worker_batch: int
  width: int  # ResNet1D width
  num_epochs: int
  learning_rate: float  # eta0 of one worker (SGD, LSW, AdaScale, LENA)
  scales: tuple[int, ...]
  seeds: tuple[int, ...]
  ablation_scales: tuple[int, ...]
  ablation_seeds: tuple[int, ...]
  sweep_scales: tuple[int, ...]
  lars_lrs: tuple[float, ...]
  lamb_lrs: tuple[float, ...]
  long_scale: int
  long_epochs: int
  long_seeds: tuple[int, ...]
  weight_decay: float = 5e-4
  evals_per_epoch: int = 4
  chunk: int = 256  # workers per vmap chunk (memory / cache)
  ratio_records: int = 60  # per-layer diagnostics records per run (about)


PRESETS = {
  # 8k training examples and per-worker batch 8: S = 256 (batch 2048) makes 3 updates per
  # epoch (each epoch's permutation drops its remainder), like the paper's 16.4k of 45k CIFAR
  # images (2.7).
  "v2": Preset(
    num_samples=10_000,
    per_worker_batch=8,
    width=8,
    num_epochs=20,
    learning_rate=0.05,
    scales=(8, 32, 128, 256),
    seeds=(0, 1, 2),
    ablation_scales=(256, 128),
    ablation_seeds=(0, 1, 2),
    sweep_scales=(256, 128, 32, 8),
    lars_lrs=(1.0, 3.0, 10.0, 30.0),
    lamb_lrs=(0.003, 0.01, 0.03, 0.1),
    long_scale=256,
    long_epochs=60,
    long_seeds=(0, 1),
  ),
  "smoke": Preset(
    num_samples=600,
    per_worker_batch=4,
    width=2,
    num_epochs=2,
    learning_rate=0.05,
    scales=(4,),
    seeds=(0,),
    ablation_scales=(4,),
    ablation_seeds=(0,),
    sweep_scales=(4,),
    lars_lrs=(1.0,),
    lamb_lrs=(0.01,),
    long_scale=4,
    long_epochs=3,
    long_seeds=(0,),
    evals_per_epoch=2,
    chunk=2,
    ratio_records=5,
  ),
}


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One training run; ``name`` encodes everything that differs between runs."""

  optimizer: str  # a registry name
  batch_scale: int
  warmup: str
  seed: int
  learning_rate: float = 0.0  # 0 = the preset's eta0
  epochs: int = 0  # 0 = the preset's budget

  @property
  def name(self) -> str:
    parts = [self.optimizer, f"s{self.batch_scale}", self.warmup]
    if self.learning_rate:
      parts.append(f"lr{self.learning_rate:g}")
    if self.epochs:
      parts.append(f"ep{self.epochs}")
    return "_".join(parts) + f"_seed{self.seed}"


def best_rate(out: Path, opt: str, s: int, lrs: Sequence[float], seed: int) -> float | None:
  """The swept rate with the best final accuracy (seed ``seed``); None until all finished."""
  accs = {}
  for lr in lrs:
    r = load_run(out, RunSpec(opt, s, "fixed", seed, learning_rate=lr))
    if r is None:
      return None
    accs[lr] = r.final
  return max(accs, key=accs.get)


def build_grid(
  p: Preset,
  out: Path,
  groups: Sequence[str] = GROUPS,
  seeds: Sequence[int] | None = None,
  scales: Sequence[int] | None = None,
) -> list[RunSpec]:
  """The runs of ``groups``, deduplicated, most informative first.

  The tuned LARS/LAMB runs (the best swept rate with every seed) join the grid once their
  sweep has finished, so a second invocation runs them.
  """
  seeds = tuple(seeds or p.seeds)
  scales = tuple(scales or p.scales)
  first = seeds[:1]
  grid = [RunSpec("sgd", 1, "none", s) for s in seeds]
  if "core" in groups:
    abl = [s for s in p.ablation_scales if s in scales] or list(p.ablation_scales)
    for sd in [s for s in p.ablation_seeds if s in seeds]:
      for sc in abl:
        grid += [RunSpec(o, sc, w, sd) for o in RULES for w in WARMUPS]
        grid += [RunSpec(v, sc, "state_aware", sd) for v in VARIANTS]
  if "key" in groups:
    grid += [RunSpec(o, sc, w, sd) for sd in seeds for sc in scales for o, w in KEY]
  if "table1" in groups:
    grid += [RunSpec(o, sc, w, sd) for sd in seeds for sc in scales for o, w in TABLE1]
  if "sweep" in groups:
    sweep = [s for s in p.sweep_scales if s in scales]
    for sc in sweep:
      grid += [RunSpec("lars", sc, "fixed", first[0], learning_rate=lr) for lr in p.lars_lrs]
      grid += [RunSpec("lamb", sc, "fixed", first[0], learning_rate=lr) for lr in p.lamb_lrs]
    for sc in sweep:
      for opt, lrs in (("lars", p.lars_lrs), ("lamb", p.lamb_lrs)):
        lr = best_rate(out, opt, sc, lrs, first[0])
        if lr is not None:
          grid += [RunSpec(opt, sc, "fixed", sd, learning_rate=lr) for sd in seeds]
  if "long" in groups:
    for sd in [s for s in p.long_seeds if s in seeds]:
      grid += [
        RunSpec(o, p.long_scale, w, sd, epochs=p.long_epochs)
        for o, w in (
          ("lena", "state_aware"),
          ("adascale", "state_aware"),
          ("lena_relmax", "state_aware"),
          ("adascale", "none"),
        )
      ]
      grid.append(RunSpec("sgd", 1, "none", sd, epochs=p.long_epochs))
      grid.append(RunSpec("lena", p.long_scale, "none", sd, epochs=p.long_epochs))
  if "lr" in groups:
    sc = p.ablation_scales[0]
    grid += [
      RunSpec(o, sc, w, first[0], learning_rate=p.learning_rate * f)
      for f in LR_FACTORS
      for o, w in LR_CELLS
    ]
    # More seeds where LENA without warm-up does best (eta0 / 4), next to AdaScale there.
    grid += [
      RunSpec(o, sc, w, sd, learning_rate=p.learning_rate * 0.25)
      for sd in seeds[1:]
      for o, w in LR_CELLS
    ]
  return list(dict.fromkeys(grid))


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


def layer_names(params: PyTree) -> list[str]:
  flat, _ = jax.tree_util.tree_flatten_with_path(params)
  return ["/".join(str(getattr(k, "key", k)) for k in path) for path, _ in flat]


@functools.cache
def grad_fn(width: int, s: int, chunk: int) -> Callable[..., Any]:
  """The jitted per-worker gradients and their statistics, shared by every run of a process.

  The S per-worker gradients are a ``vmap`` (each worker normalises with its own BatchNorm
  batch) in chunks of ``chunk`` workers, each reduced at once to its sum and per-leaf squared
  norms, so memory holds one chunk and the statistics are those of S workers (Eq. 4). Compiled
  once per (width, S) and reused by every optimizer: on a loaded 2-core host compiling the
  ResNet's backward pass costs more than many runs' optimizer updates.
  """
  model = models.ResNet1D(width=width)

  def loss(params, batch_stats, x, y):
    logits, new = model.apply(
      {"params": params, "batch_stats": batch_stats}, x, train=True, mutable=["batch_stats"]
    )
    value = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))
    return value, new["batch_stats"]

  per_worker = jax.vmap(jax.value_and_grad(loss, has_aux=True), in_axes=(None, None, 0, 0))

  def grads_and_stats(params, batch_stats, x, y):
    acc = None
    for c in range(0, s, chunk):  # unrolled: lax.map over chunks compiles to a slow loop here
      (value, new_bs), g = per_worker(params, batch_stats, x[c : c + chunk], y[c : c + chunk])
      part = (
        jax.tree.map(lambda a: jnp.sum(a, 0), g),
        jax.tree.map(lambda a: jnp.sum(jnp.square(a)), g),
        jax.tree.map(lambda a: jnp.sum(a, 0), new_bs),
        jnp.sum(value),
      )
      acc = part if acc is None else jax.tree.map(jnp.add, acc, part)
    g_sum, sq_sum, bs_sum, loss_sum = acc
    grads = jax.tree.map(lambda a: a / s, g_sum)
    stats = ol.GradStats(
      sq_norm_mean=jax.tree.map(lambda a: a / s, sq_sum),
      num_samples=s,
      mean_grad_sq_norm=jax.tree.map(lambda a: jnp.sum(jnp.square(a)), grads),
    )
    # Workers normalised with their own batches; keep the average of their running statistics.
    return grads, stats, jax.tree.map(lambda a: a / s, bs_sum), loss_sum / s

  return jax.jit(grads_and_stats)


def update_fn(tx: optax.GradientTransformation, diag: bool) -> Callable[..., Any]:
  """The jitted optimizer update (compiled per run: small next to the gradients)."""

  def update(params, opt_state, grads, stats):
    updates, opt_state = tx.update(grads, opt_state, params, grad_stats=stats)
    params = optax.apply_updates(params, updates)
    return params, opt_state, (ol.diagnostics(opt_state) if diag else {})

  return jax.jit(update, donate_argnums=(0, 1))


@functools.cache
def eval_fn(width: int) -> Callable[..., Any]:
  model = models.ResNet1D(width=width)

  @jax.jit
  def evaluate(params, batch_stats, x, y):
    logits = model.apply({"params": params, "batch_stats": batch_stats}, x, train=False)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return jnp.sum(loss), jnp.sum(jnp.argmax(logits, -1) == y)

  return evaluate


def run_one(p: Preset, spec: RunSpec, workdir: Path, cache_dir: str) -> dict[str, Any]:
  """Trains one run and writes ``config.json`` then (at the end) ``metrics.jsonl``."""
  data = input_pipeline.load_mnist1d(cache_dir, seed=0, num_samples=p.num_samples)
  x_train, y_train = data["x_train"], data["y_train"]
  x_test, y_test = data["x_test"], data["y_test"]
  s, b = spec.batch_scale, p.per_worker_batch
  epochs = spec.epochs or p.num_epochs
  per_epoch = len(y_train) // (s * b)
  total = per_epoch * epochs
  entry = registry.get(spec.optimizer)
  hp = registry.Hyperparams(
    learning_rate=spec.learning_rate or p.learning_rate,
    num_samples=s,
    total_steps=total,
    momentum=0.9,
    weight_decay=p.weight_decay,
    warmup=spec.warmup,
    warmup_alpha=0.05,
    warmup_fraction=0.055,
  )
  tx = registry.build(spec.optimizer, hp)
  model = models.ResNet1D(width=p.width)
  variables = model.init(jax.random.key(spec.seed), jnp.zeros((2, 40)), train=False)
  params, batch_stats = variables["params"], variables["batch_stats"]
  opt_state = tx.init(params)
  names = layer_names(params)
  grads_and_stats = grad_fn(p.width, s, min(p.chunk, s))
  update = update_fn(tx, entry.diagnostics)
  evaluate = eval_fn(p.width)
  eval_every = max(1, round(per_epoch / p.evals_per_epoch)) if s > 1 else per_epoch
  ratio_every = max(1, total // p.ratio_records)
  config = {
    "spec": dataclasses.asdict(spec),
    "name": spec.name,
    "preset": dataclasses.asdict(p),
    "hyperparams": dataclasses.asdict(hp),
    "total_steps": total,
    "updates_per_epoch": per_epoch,
    "num_train": len(y_train),
    "num_test": len(y_test),
    "label": entry.label,
    "num_leaves": len(names),
    "num_params": int(sum(np.size(x) for x in jax.tree.leaves(params))),
  }
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "config.json").write_text(json.dumps(config, indent=1))

  def eval_record(it: int) -> dict[str, Any]:
    loss = correct = 0.0
    for i in range(0, len(y_test), 1000):
      lo, co = evaluate(params, batch_stats, x_test[i : i + 1000], y_test[i : i + 1000])
      loss, correct = loss + float(lo), correct + float(co)
    return {
      "kind": "eval",
      "iteration": it,
      "epoch": it / per_epoch,
      "eval_accuracy": correct / len(y_test),
      "eval_loss": loss / len(y_test),
      "wall_time": time.perf_counter() - t0,
    }

  records: list[dict[str, Any]] = []
  t0 = time.perf_counter()
  it = 0
  train_loss = float("nan")
  for epoch in range(epochs):
    perm = np.random.default_rng((spec.seed, epoch)).permutation(len(y_train))
    for j in range(per_epoch):
      idx = perm[j * s * b : (j + 1) * s * b]
      x = x_train[idx].reshape(s, b, -1)
      y = y_train[idx].reshape(s, b)
      grads, stats, batch_stats, loss = grads_and_stats(params, batch_stats, x, y)
      params, opt_state, d = update(params, opt_state, grads, stats)
      it += 1
      if d and (it % ratio_every == 0 or it == 1 or it == total):
        records.append(
          {
            "kind": "layers",
            "iteration": it,
            "gain_ratio": np.asarray(d["gain_ratio"]).round(3).tolist(),
            "lr_multiplier": np.asarray(d["lr_multiplier"]).round(3).tolist(),
            "global_ratio": round(float(d["global_ratio"]), 3),
          }
        )
      if it % eval_every == 0 or it == total:
        train_loss = float(loss)
        rec = eval_record(it)
        rec["train_loss"] = train_loss
        records.append(rec)
  final = {
    "kind": "final",
    "iteration": total,
    "layers": names,
    "wall_time": time.perf_counter() - t0,
  }
  if entry.diagnostics:
    d = ol.diagnostics(opt_state)
    final["warmup_end_step"] = np.asarray(d["warmup_end_step"]).tolist()
    final["num_skipped_steps"] = int(d["num_skipped_steps"])
  records.append(final)
  tmp = workdir / f"metrics.jsonl.{os.getpid()}.tmp"
  tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
  os.replace(tmp, workdir / "metrics.jsonl")  # written whole: its presence means finished
  return records[-2]


def run_grid(
  p: Preset, grid: list[RunSpec], out: Path, cache_dir: str, shard: tuple[int, int] = (0, 1)
) -> int:
  """Trains this shard's unfinished runs, printing progress; returns how many it trained."""
  index, count = shard
  mine = [sp for i, sp in enumerate(grid) if i % count == index]
  trained = 0
  start = time.perf_counter()
  for i, spec in enumerate(mine, 1):
    workdir = out / "runs" / spec.name
    head = f"[{i}/{len(mine)}] {spec.name}"
    if (workdir / "metrics.jsonl").exists():
      print(f"{head}: finished earlier, skipped", flush=True)
      continue
    t0 = time.perf_counter()
    last = run_one(p, spec, workdir, cache_dir)
    trained += 1
    print(
      f"{head}: acc {last['eval_accuracy']:.4f} after {last['iteration']} updates, "
      f"{time.perf_counter() - t0:.0f} s (study {time.perf_counter() - start:.0f} s)",
      flush=True,
    )
  return trained


# ----------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class RunResult:
  spec: RunSpec
  config: dict[str, Any]
  evals: list[dict[str, Any]]
  layers: list[dict[str, Any]]
  final_record: dict[str, Any]

  @property
  def final(self) -> float:
    return self.evals[-1]["eval_accuracy"]

  @property
  def total_steps(self) -> int:
    return self.config["total_steps"]

  def reach(self, target: float) -> int | None:
    for r in self.evals:
      if r["eval_accuracy"] >= target:
        return r["iteration"]
    return None

  def warmup_ends(self) -> list[int]:
    return self.final_record.get("warmup_end_step", [])


def load_run(out: Path, spec: RunSpec) -> RunResult | None:
  workdir = out / "runs" / spec.name
  try:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    config = json.loads((workdir / "config.json").read_text())
  except FileNotFoundError:
    return None
  recs = [json.loads(x) for x in lines]
  return RunResult(
    spec,
    config,
    [r for r in recs if r["kind"] == "eval"],
    [r for r in recs if r["kind"] == "layers"],
    recs[-1],
  )


def _ms(values: Sequence[float], fmt: str = ".4f") -> str:
  if not values:
    return "—"
  if len(values) == 1:
    return f"{values[0]:{fmt}}"
  return f"{statistics.mean(values):{fmt}} ± {statistics.stdev(values):{fmt}}"


class Summary:
  """Finished runs, looked up by fields; targets from the same seed's single-worker run."""

  def __init__(self, p: Preset, out: Path, grid: list[RunSpec]):
    self.p = p
    self.results = {sp: r for sp in grid if (r := load_run(out, sp)) is not None}

  def runs(self, seeds: Sequence[int], **fields: Any) -> list[RunResult]:
    fields = {"learning_rate": 0.0, "epochs": 0, **fields}
    return [
      r
      for sp, r in self.results.items()
      if sp.seed in seeds and all(getattr(sp, k) == v for k, v in fields.items())
    ]

  def baseline(self, seed: int, epochs: int = 0) -> float | None:
    r = self.runs([seed], optimizer="sgd", batch_scale=1, warmup="none", epochs=epochs)
    return r[0].final if r else None

  def cells(self, runs: list[RunResult]) -> dict[str, str]:
    def to(fraction: float) -> str:
      hits, n = [], 0
      for r in runs:
        base = self.baseline(r.spec.seed, r.spec.epochs)
        if base is None:
          continue
        n += 1
        if (it := r.reach(fraction * base)) is not None:
          hits.append(it)
      if not n:
        return "no baseline"
      if not hits:
        return "never"
      text = _ms(hits, ".0f")
      return text if len(hits) == n else f"{text} ({len(hits)}/{n})"

    return {
      "n": str(len(runs)),
      "acc": _ms([r.final for r in runs]),
      "best": _ms([max(e["eval_accuracy"] for e in r.evals) for r in runs]),
      "it": to(TARGET_FRACTION),
      "loose": to(LOOSE_FRACTION),
      "total": str(runs[0].total_steps) if runs else "—",
    }


def table1(sm: Summary, seeds: Sequence[int], scales: Sequence[int]) -> str:
  p = sm.p
  lines = [
    "| S | global batch | method | seeds | test acc @ budget | best acc | iterations to "
    f"target | iterations to {LOOSE_FRACTION:.0%} | updates in the run |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  c = sm.cells(sm.runs(seeds, optimizer="sgd", batch_scale=1, warmup="none"))
  lines.append(
    f"| 1 | {p.per_worker_batch} | SGD 1 worker | {c['n']} | {c['acc']} | {c['best']} | "
    f"{c['it']} | {c['loose']} | {c['total']} |"
  )
  for s in scales:
    rows = [(o, w, 0.0) for o, w in TABLE1] + [
      (o, "fixed", lr) for o in ("lars", "lamb") if (lr := sm.tuned(o, s, seeds))
    ]
    for o, w, lr in rows:
      c = sm.cells(sm.runs(seeds, optimizer=o, batch_scale=s, warmup=w, learning_rate=lr))
      name = f"{label(o)} ({w}{f', lr {lr:g}' if lr else ''})"
      lines.append(
        f"| {s} | {s * p.per_worker_batch} | {name} | {c['n']} | {c['acc']} | {c['best']} | "
        f"{c['it']} | {c['loose']} | {c['total']} |"
      )
  return "\n".join(lines)


def _tuned(self: Summary, opt: str, s: int, seeds: Sequence[int]) -> float:
  """The swept rate with the best seed-0 accuracy at S = s (0.0 if the sweep is unfinished)."""
  lrs = self.p.lars_lrs if opt == "lars" else self.p.lamb_lrs
  accs = {}
  for lr in lrs:
    r = self.runs(seeds[:1], optimizer=opt, batch_scale=s, warmup="fixed", learning_rate=lr)
    if not r:
      return 0.0
    accs[lr] = r[0].final
  return max(accs, key=accs.get)


Summary.tuned = _tuned


def table2(sm: Summary, seeds: Sequence[int]) -> str:
  blocks = []
  cols = (*WARMUPS, *VARIANTS.values())
  for s in sm.p.ablation_scales:
    lines = [
      f"S = {s} (batch {s * sm.p.per_worker_batch}); cell: test acc @ budget [iterations to "
      f"target / to {LOOSE_FRACTION:.0%}]; state_aware = the paper's progress rule",
      "",
      "| rule \\ warm-up | " + " | ".join(cols) + " |",
      "|---" * (len(cols) + 1) + "|",
    ]
    for o in RULES:
      row = []
      for w in WARMUPS:
        c = sm.cells(sm.runs(seeds, optimizer=o, batch_scale=s, warmup=w))
        row.append(f"{c['acc']} [{c['it']} / {c['loose']}] (n={c['n']})" if c["n"] != "0" else "—")
      for v in VARIANTS:
        if o == "lena":
          c = sm.cells(sm.runs(seeds, optimizer=v, batch_scale=s, warmup="state_aware"))
          row.append(
            f"{c['acc']} [{c['it']} / {c['loose']}] (n={c['n']})" if c["n"] != "0" else "—"
          )
        else:
          row.append("= fixed (theta base steps)")
      lines.append(f"| {label(o)} | " + " | ".join(row) + " |")
    blocks.append("\n".join(lines))
  return "\n\n".join(blocks)


def warmup_end_table(sm: Summary, seeds: Sequence[int]) -> str:
  """Fig. 7 in numbers: per warm-up rule, when the layers ended their warm-up."""
  lines = [
    "| S | warm-up progress rule | seeds | first layer ends (% of run) | median layer | last "
    "layer | layers not ended | test acc |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for s in sm.p.ablation_scales:
    for opt, rule in (("lena", "ratio (paper)"), *VARIANTS.items()):
      runs = sm.runs(seeds, optimizer=opt, batch_scale=s, warmup="state_aware")
      if not runs:
        continue
      firsts, meds, lasts, never = [], [], [], []
      for r in runs:
        ends = np.array(r.warmup_ends(), float)
        done = ends[ends > 0] / r.total_steps * 100
        never.append(int(np.sum(ends < 0)))
        fr = np.where(ends > 0, ends / r.total_steps * 100, 100.0)
        firsts.append(float(done.min()) if done.size else 100.0)
        meds.append(float(np.median(fr)))
        lasts.append(float(fr.max()))
      lines.append(
        f"| {s} | {rule} | {len(runs)} | {_ms(firsts, '.0f')} | {_ms(meds, '.0f')} | "
        f"{_ms(lasts, '.0f')} | {_ms(never, '.1f')} of {len(runs[0].warmup_ends())} | "
        f"{_ms([r.final for r in runs])} |"
      )
  return "\n".join(lines)


def sweep_table(sm: Summary, seeds: Sequence[int], scales: Sequence[int]) -> str:
  lines = [
    "| S | optimizer | " + " | ".join(["rate: acc (seed 0)"] * 1) + " | chosen | all seeds |",
    "|---|---|---|---|---|",
  ]
  for s in [x for x in sm.p.sweep_scales if x in scales]:
    for o in ("lars", "lamb"):
      lrs = sm.p.lars_lrs if o == "lars" else sm.p.lamb_lrs
      parts = []
      for lr in lrs:
        r = sm.runs(seeds[:1], optimizer=o, batch_scale=s, warmup="fixed", learning_rate=lr)
        parts.append(f"{lr:g}: {r[0].final:.3f}" if r else f"{lr:g}: —")
      lr = sm.tuned(o, s, seeds)
      c = sm.cells(sm.runs(seeds, optimizer=o, batch_scale=s, warmup="fixed", learning_rate=lr))
      lines.append(
        f"| {s} | {label(o)} | {', '.join(parts)} | {lr or 'sweep unfinished'} | "
        f"{c['acc']} (n={c['n']}) |"
      )
  return "\n".join(lines)


def long_table(sm: Summary, seeds: Sequence[int]) -> str:
  p = sm.p
  lines = [
    f"S = {p.long_scale} (batch {p.long_scale * p.per_worker_batch}); budget {p.num_epochs} vs "
    f"{p.long_epochs} epochs; target = 98% of the single worker at the same budget",
    "",
    "| method | epochs | seeds | test acc @ budget | iterations to target | iterations to "
    f"{LOOSE_FRACTION:.0%} | updates in the run |",
    "|---|---|---|---|---|---|---|",
  ]
  rows = [
    ("sgd", "none", 1),
    ("adascale", "none", p.long_scale),
    ("adascale", "state_aware", p.long_scale),
    ("lena", "state_aware", p.long_scale),
    ("lena_relmax", "state_aware", p.long_scale),
    ("lena", "none", p.long_scale),
  ]
  for ep in (0, p.long_epochs):
    for o, w, s in rows:
      runs = sm.runs(seeds, optimizer=o, batch_scale=s, warmup=w, epochs=ep)
      if not runs:
        continue
      c = sm.cells(runs)
      lines.append(
        f"| {label(o)} ({w}) | {ep or p.num_epochs} | {c['n']} | {c['acc']} | {c['it']} | "
        f"{c['loose']} | {c['total']} |"
      )
  return "\n".join(lines)


def lr_table(sm: Summary, seeds: Sequence[int]) -> str:
  """Accuracy against eta0 (seed 0) for the cells of ``LR_CELLS``."""
  p = sm.p
  sc = p.ablation_scales[0]
  rates = sorted({p.learning_rate, *(p.learning_rate * f for f in LR_FACTORS)})
  lines = [
    f"S = {sc} (batch {sc * p.per_worker_batch}), seed {seeds[0]}; eta0 = {p.learning_rate} is "
    "the single worker's rate used everywhere else",
    "",
    "| method | " + " | ".join(f"eta0 = {r:g}" for r in rates) + " |",
    "|---" * (len(rates) + 1) + "|",
  ]
  for o, w in LR_CELLS:
    row = []
    for r in rates:
      lr = 0.0 if r == p.learning_rate else r
      runs = sm.runs(seeds[:1], optimizer=o, batch_scale=sc, warmup=w, learning_rate=lr)
      row.append(f"{runs[0].final:.4f}" if runs else "—")
    lines.append(f"| {label(o)} ({w}) | " + " | ".join(row) + " |")
  lines += [
    "",
    f"All seeds at eta0 = {p.learning_rate * 0.25:g} and {p.learning_rate:g} (mean ± std):",
    "",
    f"| method | seeds | eta0 = {p.learning_rate * 0.25:g} | seeds | eta0 = {p.learning_rate:g} |",
    "|---|---|---|---|---|",
  ]
  for o, w in LR_CELLS:
    low = sm.runs(seeds, optimizer=o, batch_scale=sc, warmup=w, learning_rate=p.learning_rate / 4)
    base = sm.runs(seeds, optimizer=o, batch_scale=sc, warmup=w)
    lines.append(
      f"| {label(o)} ({w}) | {len(low)} | {_ms([r.final for r in low])} | {len(base)} | "
      f"{_ms([r.final for r in base])} |"
    )
  return "\n".join(lines)


def ratio_spread_table(sm: Summary) -> str:
  """Do the per-layer ratios spread out over training (paper Figs. 3-4)? LENA without warm-up."""
  lines = [
    "| S | run | at % of run | min ratio | 25% | median | 75% | max | max/min | AdaScale R |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for s in sm.p.ablation_scales:
    runs = sm.runs([0], optimizer="lena", batch_scale=s, warmup="none")
    if not runs:
      continue
    r = runs[0]
    for frac in (0.0, 0.1, 0.25, 0.5, 0.75, 1.0):
      rec = min(r.layers, key=lambda x: abs(x["iteration"] - max(1, frac * r.total_steps)))
      q = np.percentile(rec["gain_ratio"], [0, 25, 50, 75, 100])
      lines.append(
        f"| {s} | {r.spec.name} | {rec['iteration'] / r.total_steps:.0%} | "
        + " | ".join(f"{v:.1f}" for v in q)
        + f" | {q[4] / q[0]:.1f} | {rec['global_ratio']:.1f} |"
      )
  return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------


def depth_order(names: Sequence[str]) -> list[int]:
  """Leaf indices from the input to the output (the stem, blocks 0, 1, ..., the classifier);
  ``jax.tree.leaves`` orders Flax's module names alphabetically instead."""

  def key(i: int) -> tuple[int, str]:
    top = names[i].split("/")[0]
    if top.startswith("stem"):
      return (-1, names[i])
    if top.startswith("BasicBlock1D_"):
      return (int(top.rsplit("_", 1)[1]), names[i])
    return (1_000, names[i])

  return sorted(range(len(names)), key=key)


def _curve(runs: list[RunResult]) -> tuple[list[int], list[float]]:
  n = min(len(r.evals) for r in runs)
  its = [runs[0].evals[i]["iteration"] for i in range(n)]
  return its, [statistics.mean(r.evals[i]["eval_accuracy"] for r in runs) for i in range(n)]


def plot_all(sm: Summary, seeds: Sequence[int], scales: Sequence[int], out: Path) -> list[Path]:
  from examples import analysis

  plt = analysis.pyplot()
  p = sm.p
  paths = []
  base = sm.runs(seeds, optimizer="sgd", batch_scale=1, warmup="none")
  target = TARGET_FRACTION * statistics.mean(r.final for r in base) if base else None
  for s in scales:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if base:
      ax.plot(*_curve(base), color="k", label="SGD 1 worker")
    rows = [(o, w, 0.0) for o, w in TABLE1] + [
      (o, "fixed", lr) for o in ("lars", "lamb") if (lr := sm.tuned(o, s, seeds))
    ]
    for o, w, lr in rows:
      runs = sm.runs(seeds, optimizer=o, batch_scale=s, warmup=w, learning_rate=lr)
      if runs:
        ax.plot(*_curve(runs), label=f"{label(o)} ({w}, {len(runs)} seeds)")
    if target:
      ax.axhline(target, color="gray", ls=":", label="target (98% of 1 worker)")
    ax.set(
      xscale="log",
      xlabel="iterations (updates)",
      ylabel="test accuracy",
      title=f"MNIST-1D ResNet1D, S={s} (batch {s * p.per_worker_batch}), {p.num_epochs} epochs",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    paths.append(analysis.save_figure(fig, out / f"accuracy_vs_iterations_s{s}.png", dpi=110))

  series = {
    f"{label(o)} ({w})": [
      (
        s * p.per_worker_batch,
        [r.final for r in sm.runs(seeds, optimizer=o, batch_scale=s, warmup=w)],
      )
      for s in scales
    ]
    for o, w in TABLE1
  }
  fig = analysis.plot_accuracy_vs_scale(
    series,
    (statistics.mean(r.final for r in base), "SGD 1 worker") if base else None,
    num_epochs=p.num_epochs,
    title="Accuracy at the budget vs batch (mean ± std over seeds)",
    legend_size=7,
  )
  paths.append(analysis.save_figure(fig, out / "accuracy_vs_scale.png", dpi=110))

  # Figs. 3-4: per-layer ratios over the run (LENA without warm-up, seed 0).
  for s in p.ablation_scales:
    runs = sm.runs([0], optimizer="lena", batch_scale=s, warmup="none")
    if not runs or not runs[0].layers:
      continue
    r = runs[0]
    its = [x["iteration"] for x in r.layers]
    ratios = np.array([x["gain_ratio"] for x in r.layers])
    names = r.final_record["layers"]
    order = depth_order(names)
    fig, ax = plt.subplots(figsize=(8, 5))
    cmap = plt.get_cmap("viridis")
    for j, k in enumerate(order):
      ax.plot(its, ratios[:, k], color=cmap(j / len(order)), lw=0.8, alpha=0.8)
    ax.plot(its, [x["global_ratio"] for x in r.layers], "r--", lw=2, label="AdaScale R (global)")
    for k in (order[0], order[-1]):
      ax.annotate(names[k], (its[-1], ratios[-1, k]), fontsize=6)
    ax.set(
      yscale="log",
      xlabel="iteration",
      ylabel="gain ratio r_k",
      title=f"Per-layer gain ratios, LENA no warm-up, S={s} (colour: input -> output layer)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(analysis.save_figure(fig, out / f"layer_ratios_s{s}.png", dpi=110))

  # Fig. 7: per-layer warm-up end, paper rule vs variants (seed 0).
  for s in p.ablation_scales:
    runs = {
      rule: sm.runs([0], optimizer=o, batch_scale=s, warmup="state_aware")
      for o, rule in (("lena", "ratio (paper)"), *VARIANTS.items())
    }
    runs = {k: v[0] for k, v in runs.items() if v}
    if not runs:
      continue
    names = next(iter(runs.values())).final_record["layers"]
    order = depth_order(names)
    fig, ax = plt.subplots(figsize=(8, 0.16 * len(names) + 2))
    h = 0.8 / len(runs)
    for j, (rule, r) in enumerate(runs.items()):
      ends = np.array(r.warmup_ends(), float)[order]
      fr = np.where(ends > 0, ends / r.total_steps, 1.0)
      ax.barh(np.arange(len(names)) + j * h, fr, height=h, label=f"{rule}: acc {r.final:.3f}")
    ax.axvline(0.055, color="tab:red", ls="--", label="LSW fixed warm-up (5.5%)")
    ax.axvline(0.05, color="tab:gray", ls=":", label="alpha = 5%")
    ax.set_yticks(np.arange(len(names)) + 0.4 - h / 2, [names[k] for k in order], fontsize=5)
    ax.invert_yaxis()
    ax.set(
      xlabel="fraction of the run at which the layer's warm-up ended (1 = never)",
      title=f"LENA per-layer warm-up end, S={s}, seed 0, input (top) to output (cf. Fig. 7)",
    )
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=7)
    paths.append(analysis.save_figure(fig, out / f"warmup_end_s{s}.png", dpi=110))
  return paths


def report(
  p: Preset, grid: list[RunSpec], out: Path, seeds: Sequence[int], scales: Sequence[int], head: str
) -> str:
  sm = Summary(p, out, grid)
  text = "\n\n".join(
    [
      head,
      f"Finished runs: {len(sm.results)} of {len(grid)} in the grid. Target = "
      f"{TARGET_FRACTION:.0%} of the same seed's single-worker SGD test accuracy (loose "
      f"{LOOSE_FRACTION:.0%}); mean ± std over seeds; '(k/n)': only k of n seeds reached it.",
      "## Table 1: accuracy at the budget, iterations to target\n\n" + table1(sm, seeds, scales),
      "## Table 2: scaling rule x warm-up (with the warm-up variants)\n\n" + table2(sm, seeds),
      "## Per-layer warm-up end (Fig. 7 in numbers)\n\n" + warmup_end_table(sm, seeds),
      "## Per-layer ratios over the run (Figs. 3-4 in numbers, LENA no warm-up, seed 0)\n\n"
      + ratio_spread_table(sm),
      "## LARS / LAMB learning-rate sweep (fixed warm-up)\n\n" + sweep_table(sm, seeds, scales),
      "## Longer budget\n\n" + long_table(sm, seeds),
      "## Sensitivity to eta0\n\n" + lr_table(sm, seeds),
    ]
  )
  (out / "tables.md").write_text(text + "\n")
  plots = plot_all(sm, seeds, scales, out)
  summary = {
    "preset": dataclasses.asdict(p),
    "runs": {
      sp.name: {
        "final_accuracy": r.final,
        "total_steps": r.total_steps,
        "wall_time": r.final_record.get("wall_time"),
        "warmup_end_step": r.warmup_ends() or None,
      }
      for sp, r in sm.results.items()
    },
    "plots": [x.name for x in plots],
  }
  (out / "summary.json").write_text(json.dumps(summary, indent=1))
  return text


def compact(p: Preset, out: Path) -> int:
  """Drops the per-layer time series of the runs no table or plot reads (keeps the repository
  small): every run keeps its evaluations, its final record (warm-up ends) and its first and
  last per-layer records; LENA's runs at eta0 with seed 0 at the ablation scales (no warm-up
  and each warm-up rule) keep the whole series.

  Returns:
    The number of files rewritten.
  """
  changed = 0
  for path in sorted((out / "runs").glob("*/metrics.jsonl")):
    config = json.loads((path.parent / "config.json").read_text())
    spec = config["spec"]
    keep = (
      spec["seed"] == 0
      and spec["batch_scale"] in p.ablation_scales
      and not spec["epochs"]
      and not spec["learning_rate"]
      and spec["optimizer"] in ("lena", *VARIANTS)
    )
    if keep:
      continue
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    layers = [i for i, r in enumerate(recs) if r["kind"] == "layers"]
    drop = set(layers[1:-1])
    if drop:
      kept = [r for i, r in enumerate(recs) if i not in drop]
      tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
      tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
      os.replace(tmp, path)
      changed += 1
  return changed


def main(argv: Sequence[str] | None = None) -> str:
  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.large_batch.study_v2",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument("--smoke", action="store_true", help="a few-second plumbing check (CI)")
  parser.add_argument("--out", default="benchmarks/large_batch/results_v2")
  parser.add_argument("--groups", nargs="+", choices=GROUPS, default=list(GROUPS))
  parser.add_argument("--seeds", type=int, nargs="+")
  parser.add_argument("--scales", type=int, nargs="+")
  parser.add_argument("--cache_dir", default="data_cache")
  parser.add_argument("--shard", default="0/1", help="I/N: every N-th run from the I-th")
  parser.add_argument("--report_only", action="store_true")
  parser.add_argument(
    "--compact", action="store_true", help="drop per-layer series no table or plot reads"
  )
  parser.add_argument(
    "--only", nargs="+", help="train only the runs whose name starts with one of these prefixes"
  )
  args = parser.parse_args(argv)
  name = "smoke" if args.smoke else "v2"
  p = PRESETS[name]
  seeds, scales = tuple(args.seeds or p.seeds), tuple(args.scales or p.scales)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  grid = build_grid(p, out, args.groups, seeds, scales)
  if args.only:
    grid = [sp for sp in grid if sp.name.startswith(tuple(args.only))]
  index, count = (int(v) for v in args.shard.split("/"))
  print(f"Study v2 '{name}': {len(grid)} runs in the grid, shard {index}/{count}", flush=True)
  if not args.report_only:
    run_grid(p, grid, out, args.cache_dir, (index, count))
    # The tuned LARS/LAMB runs join once their sweep is complete: run them now.
    more = [
      sp
      for sp in build_grid(p, out, args.groups, seeds, scales)
      if sp not in grid and (not args.only or sp.name.startswith(tuple(args.only)))
    ]
    if more:
      grid += more
      run_grid(p, more, out, args.cache_dir, (index, count))
  if args.compact:
    print(f"Compacted {compact(p, out)} metrics files.", flush=True)
  full_grid = build_grid(p, out, GROUPS, tuple(p.seeds), tuple(p.scales))
  head = (
    f"# MNIST-1D large-batch study v2 ('{name}' preset)\n\n"
    f"{int(p.num_samples * 0.8)} training / {int(p.num_samples * 0.2)} test examples, "
    f"ResNet1D width {p.width} (62 parameter leaves, BatchNorm), per-worker batch "
    f"{p.per_worker_batch}, {p.num_epochs} epochs for every run unless stated, eta0 = "
    f"{p.learning_rate} (momentum 0.9, weight decay {p.weight_decay}, exponential decay to 1%)."
  )
  text = report(p, full_grid, out, tuple(p.seeds), tuple(p.scales), head)
  print("\n" + text, flush=True)
  return text


if __name__ == "__main__":
  main()
