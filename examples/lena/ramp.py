"""Batch ramps: the number S of per-worker gradients changes during a run (``config.batch_ramp``).

``batch_ramp`` is one of

* ``"none"`` (the default): a fixed S, trained by ``train.train_and_evaluate`` itself;
* ``"steps:U0:S0,U1:S1,..."``: from update U_i on (``U0 = 0``), S_i per-worker gradients
  (Megatron-LM's step batch-size schedule), e.g. ``steps:0:2,12:8``; it replaces
  ``batch_scale``;
* ``"noise"`` or ``"noise:every=N,factor=K,max=M,growth=G"``: every N updates (default 50) S
  becomes ``ol.advise_num_samples`` of the optimizer state: ``ceil(K * B_crit)`` (default K = 1,
  B_crit the state's critical-batch estimate) rounded up to a multiple of the data-parallel
  devices, never smaller than before, at most G (default 2) times the previous S and at most M;
  the first S is ``batch_scale``;
* ``"seesaw"`` or ``"seesaw:max=M"``: wherever the exponential rate decay
  ``eta0 * lr_decay ** progress`` has lost another factor 2, S doubles and the rate is
  multiplied by sqrt(2) instead, so each halving becomes a 1/sqrt(2) (Seesaw, Meterez et al.
  2025). The rate is the base rate of the rule, which multiplies it by its gain ratio as always.

The per-worker batch is fixed; the data-parallel devices are those of the first S and S grows
through more micro-batches per device (so every S must be a multiple of them). A ramped run's
length is in examples, the same at every S: ``num_epochs`` epochs, or with ``num_steps > 0``
``num_steps`` updates of the first S; it ends at the first update that reaches it, and the rate
schedule and warm-up count samples over exactly that length (their T1 is in base steps, as for
a fixed S). The optimizers are those on the sample clock (the registry's entries with
diagnostics); each distinct S gets its own transformation (same state, its S's clip and beta)
and its own compiled step, made on first use; the state carries over unchanged. Checkpoints add
the examples seen and the current S, so a run stopped mid-ramp and resumed ends bitwise
identical to an uninterrupted one. Every eval record carries ``num_samples`` (the S of the last
update), ``samples_seen`` (examples) and ``critical_batch_size`` (per-worker batches; None where
not finite). Single process only.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

import optax_lena as ol
from examples import checkpoints, input_pipeline, metrics, optimizers
from examples.lena import mesh, parallel
from examples.lena import train as train_lib
from examples.lena.configs import Config, ConfigError

KINDS = ("none", "steps", "noise", "seesaw")


@dataclasses.dataclass(frozen=True)
class Ramp:
  """A parsed ``batch_ramp``."""

  kind: str
  steps: tuple[tuple[int, int], ...] = ()  # (first update, S) for 'steps'
  every: int = 50  # 'noise': updates between readings of the estimate
  factor: float = 1.0  # 'noise': S = factor * B_crit
  max_num_samples: int = 0  # 'noise', 'seesaw': the largest S (0: the default)
  max_growth: float = 2.0  # 'noise': at most this factor per reading


def _options(kind: str, text: str, allowed: dict[str, type]) -> dict[str, Any]:
  out: dict[str, Any] = {}
  for item in filter(None, text.split(",")):
    key, sep, value = item.partition("=")
    if not sep or key not in allowed:
      raise ConfigError(
        f"batch_ramp '{kind}:{text}': expected key=value with keys {', '.join(allowed)}, got "
        f"{item!r}."
      )
    try:
      out[key] = allowed[key](value)
    except ValueError:
      raise ConfigError(
        f"batch_ramp {kind}: {key}={value!r} is not a {allowed[key].__name__}."
      ) from None
  return out


def parse(spec: str) -> Ramp:
  """Parses ``config.batch_ramp``; ConfigError naming the valid forms for anything else."""
  kind, _, rest = spec.strip().partition(":")
  if kind == "none" and not rest:
    return Ramp("none")
  if kind == "steps":
    pairs = []
    for item in rest.split(","):
      u, sep, s = item.partition(":")
      if not (sep and u.strip().isdigit() and s.strip().isdigit() and int(s) > 0):
        raise ConfigError(
          f"batch_ramp {spec!r}: each entry is UPDATE:S (S > 0), e.g. 'steps:0:2,12:8'."
        )
      pairs.append((int(u), int(s)))
    firsts = [u for u, _ in pairs]
    if firsts[0] != 0 or firsts != sorted(set(firsts)):
      raise ConfigError(
        f"batch_ramp {spec!r}: the updates must start at 0 and increase, e.g. 'steps:0:2,12:8'."
      )
    return Ramp("steps", steps=tuple(pairs))
  if kind == "noise":
    opts = _options(kind, rest, {"every": int, "factor": float, "max": int, "growth": float})
    ramp = Ramp(
      "noise",
      every=opts.get("every", 50),
      factor=opts.get("factor", 1.0),
      max_num_samples=opts.get("max", 0),
      max_growth=opts.get("growth", 2.0),
    )
    if ramp.every < 1 or ramp.factor <= 0 or ramp.max_growth < 1 or ramp.max_num_samples < 0:
      raise ConfigError(
        f"batch_ramp {spec!r}: needs every >= 1, factor > 0, growth >= 1 and max >= 0."
      )
    return ramp
  if kind == "seesaw":
    opts = _options(kind, rest, {"max": int})
    return Ramp("seesaw", max_num_samples=max(0, opts.get("max", 0)))
  raise ConfigError(
    f"Unknown batch_ramp {spec!r}; valid forms: 'none', 'steps:U0:S0,U1:S1,...' (e.g. "
    "'steps:0:2,12:8'), 'noise' or 'noise:every=N,factor=K,max=M,growth=G', 'seesaw' or "
    "'seesaw:max=M'."
  )


@dataclasses.dataclass(frozen=True)
class RampHyperparams(optimizers.Hyperparams):
  """The registry's hyperparameters with the run length in base steps (not updates x k) and a
  constant factor on the rate (Seesaw's sqrt(2) per doubling)."""

  run_base_steps: float = 1.0
  rate_factor: float = 1.0

  @property
  def base_steps_total(self) -> float:  # type: ignore[override]
    return self.run_base_steps

  def sample_schedule(self) -> optax.ScalarOrSchedule:
    base = super().sample_schedule()
    c = self.rate_factor
    if c == 1.0:
      return base  # exactly the fixed-S schedule
    if callable(base):
      return lambda t: c * base(t)
    return c * base


class StreamOfExamples:
  """``input_pipeline.global_batches``' stream (epoch 0, 1, ... in the (seed, epoch) order)
  cut into batches of any size, from any example on."""

  def __init__(self, data: input_pipeline.Dataset, start_example: int):
    self.data = data
    self.epoch, self.skip = divmod(start_example, data.num_train)
    self.pending: collections.deque[tuple[np.ndarray, np.ndarray]] = collections.deque()
    self.have = 0

  def take(self, n: int) -> dict[str, np.ndarray]:
    while self.have < n:
      for x, y in self.data.epoch_examples(self.epoch):
        if self.skip:
          x, y, self.skip = x[self.skip :], y[self.skip :], max(0, self.skip - len(y))
        self.pending.append((x, y))
        self.have += len(y)
      self.epoch += 1
    xs, ys, need = [], [], n
    while need:
      x0, y0 = self.pending[0]
      k = min(need, len(y0))
      xs.append(x0[:k])
      ys.append(y0[:k])
      if k == len(y0):
        self.pending.popleft()
      else:
        self.pending[0] = (x0[k:], y0[k:])
      need -= k
    self.have -= n
    return {"x": np.concatenate(xs), "y": np.concatenate(ys)}


def seesaw_num_samples(s0: int, examples_seen: int, budget: int, lr_decay: float, cap: int) -> int:
  """S of Seesaw at ``examples_seen``: ``s0`` doubled once per factor 2 the rate decay has lost
  (``lr_decay ** progress``), at most ``cap``."""
  halvings = math.floor(examples_seen / budget * math.log2(1.0 / lr_decay) + 1e-9)
  s = s0
  while halvings > 0 and 2 * s <= cap:
    s, halvings = 2 * s, halvings - 1
  return s


def ramp_optimizer(
  config: Config, s: int, s0: int, run_base_steps: float
) -> optax.GradientTransformationExtraArgs:
  """The registry's optimizer for updates of S per-worker gradients in a ramp from ``s0``: its
  clip and beta are S's, its rate schedule and warm-up span ``run_base_steps``, and under
  Seesaw its rate is multiplied by ``sqrt(S / s0)`` (sqrt(2) per doubling)."""
  hp = train_lib.hyperparams(config, s, 1)
  seesaw = parse(config.batch_ramp).kind == "seesaw"
  c = math.sqrt(s / s0) if seesaw else 1.0
  hp = RampHyperparams(**dataclasses.asdict(hp), run_base_steps=run_base_steps, rate_factor=c)
  try:
    return optimizers.build(config.optimizer, hp)
  except ValueError as e:
    raise ConfigError(str(e)) from None


@functools.cache
def _strategy(
  config: Config, layout: parallel.BatchLayout, s0: int, run_base_steps: float, num_classes: int
) -> parallel.Strategy:
  # One transformation and one compiled step per distinct S, made on first use and kept for the
  # process (like train's initialiser): a resumed run in the same process compiles nothing.
  model = train_lib.create_model(config, num_classes)
  tx = ramp_optimizer(config, layout.num_samples, s0, run_base_steps)
  worker = functools.partial(train_lib.worker_grads, model=model)
  update = functools.partial(train_lib.apply_update, tx=tx)
  return parallel.create(config.parallel, layout, worker, update)


def train_and_evaluate(
  config: Config, workdir: str | Path, *, stop_after: int | None = None
) -> train_lib.TrainState:
  """``train.train_and_evaluate`` with ``config.batch_ramp`` (see the module docstring).

  Args:
    config: the run's configuration (``batch_ramp`` not ``'none'``).
    workdir: directory for ``config.json``, ``metrics.jsonl`` and ``checkpoints/``.
    stop_after: stop after this many updates without a final checkpoint, as a crash would (a
      test hook); None: run to the end.

  Returns:
    The final train state.
  """
  ramp = parse(config.batch_ramp)
  if ramp.kind == "none":
    return train_lib.train_and_evaluate(config, workdir)
  train_lib.validate_config(config)
  entry = optimizers.get(config.optimizer)
  if not entry.diagnostics:
    valid = [n for n in optimizers.names() if optimizers.get(n).diagnostics]
    raise ConfigError(
      f"batch_ramp needs an optimizer on the sample clock with gradient statistics; "
      f"{config.optimizer!r} is not one: use one of {', '.join(valid)}."
    )
  if jax.process_count() > 1:
    raise ConfigError("batch_ramp runs on one process; leave batch_ramp='none' on several.")
  if ramp.kind == "seesaw" and not (config.lr_decay and 0 < config.lr_decay < 1):
    raise ConfigError("batch_ramp='seesaw' needs a decaying rate: lr_decay in (0, 1).")
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  log = train_lib.log
  b = config.per_worker_batch
  if ramp.kind == "steps":
    s0 = ramp.steps[0][1]
  else:
    s0 = config.global_batch_size // b if config.global_batch_size > 0 else config.batch_scale
  # The devices of the first S stay those of the run; later S add micro-batches.
  first = parallel.batch_layout(
    dataclasses.replace(config, batch_scale=s0, global_batch_size=0, micro_batches=0),
    jax.device_count(),
  )
  devices = first.num_devices
  data = input_pipeline.create_dataset(config, devices)
  budget = (
    config.num_steps * s0 * b if config.num_steps > 0 else int(config.num_epochs * data.num_train)
  )
  cap = ramp.max_num_samples or min(64 * s0, data.num_train // b)
  cap = max(s0, cap // devices * devices)
  for _, s in ramp.steps:
    if s % devices:
      raise ConfigError(
        f"batch_ramp {config.batch_ramp!r}: S={s} is not a multiple of the {devices} devices of "
        f"the first S={s0}; use multiples of {devices} (or set num_devices)."
      )
  if max(s for _, s in ramp.steps or ((0, s0),)) * b > data.num_train:
    raise ConfigError(f"batch_ramp {config.batch_ramp!r}: a batch exceeds the training set.")
  reference = config.reference_batch_size or b
  run_base_steps = budget / reference if budget % reference else budget // reference

  model = train_lib.create_model(config, data.num_classes)

  def strategy_for(s: int) -> parallel.Strategy:
    layout = dataclasses.replace(first, micro_batches=s // devices)
    return _strategy(config, layout, s0, run_base_steps, data.num_classes)

  base = strategy_for(s0)
  rng = jax.random.key(config.seed, impl=None if config.rng_impl == "default" else config.rng_impl)
  state = base.on_mesh(
    train_lib.create_train_state(
      rng, model, ramp_optimizer(config, s0, s0, run_base_steps), data.input_shape
    )
  )

  seen, s, wall_offset = 0, s0, 0.0
  manager = checkpoints.manager(workdir, config)

  def tree_of(st: Any, seen: int, s: int, wall: float) -> dict[str, Any]:
    epoch, offset = divmod(seen, data.num_train)
    position = {"seed": config.seed, "epoch": epoch, "example_in_epoch": offset}
    return {
      "state": st,
      "data": {k: np.array(v, np.int64) for k, v in position.items()},
      "ramp": {"samples_seen": np.array(seen, np.int64), "num_samples": np.array(s, np.int64)},
      "wall_time": np.array(wall, np.float64),
    }

  if manager is not None:
    template = tree_of(state, 0, s0, 0.0)
    restored = checkpoints.restore_latest(
      manager, template, config.seed, config.damaged_checkpoints
    )
    if restored is not None:
      state, wall_offset = restored["state"], float(restored["wall_time"])
      seen, s = int(restored["ramp"]["samples_seen"]), int(restored["ramp"]["num_samples"])
      log.info("Resumed from checkpoint at step %d (S=%d, %d examples).", int(state.step), s, seen)
  start = int(state.step)
  metrics.write_config(
    workdir,
    {
      **dataclasses.asdict(config),
      "layout": {**dataclasses.asdict(first), "num_samples": s0, "global_batch": s0 * b},
      "budget_examples": budget,
      "num_train": data.num_train,
    },
    resuming=start > 0,
  )
  writer = metrics.MetricsWriter(workdir, start)
  advise: Callable[[Any], jax.Array] = jax.jit(
    functools.partial(
      ol.advise_num_samples,
      max_num_samples=cap,
      multiple=devices,
      factor=ramp.factor,
      min_num_samples=s0,
      max_growth=ramp.max_growth,
    )
  )
  log.info("Batch ramp %r: S from %d, at most %d, %d examples.", config.batch_ramp, s0, cap, budget)

  def next_s(done: int, device_state: Any) -> int:
    if ramp.kind == "steps":
      return [si for ui, si in ramp.steps if ui <= done][-1]
    if ramp.kind == "seesaw":
      return seesaw_num_samples(s0, seen, budget, float(config.lr_decay), cap)
    if done and done % ramp.every == 0:
      return int(advise(base.from_device(device_state).opt_state))
    return s

  stream = StreamOfExamples(data, seen)
  device_state = base.to_device(state)
  window: list[dict[str, jax.Array]] = []
  done, t0 = start, time.perf_counter()
  while seen < budget:
    if stop_after is not None and done >= stop_after:
      return base.from_device(device_state)
    s = next_s(done, device_state)
    strategy = strategy_for(s)
    batch = strategy.shard_batch(stream.take(s * b))
    device_state, step_metrics = strategy.step(device_state, batch)
    window.append(step_metrics)
    epoch_before = seen // data.num_train
    done, seen = done + 1, seen + s * b
    last = seen >= budget
    if config.eval_every > 0:
      is_eval = done % config.eval_every == 0 or last
    else:
      is_eval = seen // data.num_train > epoch_before or last
    is_log = config.log_every > 0 and done % config.log_every == 0
    is_ckpt = manager is not None and (done % config.checkpoint_every == 0 or last)
    if not (is_eval or is_log or is_ckpt):
      continue
    host = base.from_device(device_state)
    if is_eval or is_log:
      values = mesh.host_value(window)
      mean = lambda k, v=values: float(np.mean([np.mean(m[k]) for m in v])) if v else None
      flat = ol.flat_diagnostics(host.opt_state)
      rec: dict[str, Any] = {
        "type": "eval" if is_eval else "train",
        "iteration": done,
        "epoch": seen / data.num_train,
        "base_steps": seen / reference,
        "wall_time": wall_offset + time.perf_counter() - t0,
        "train_loss": mean("loss"),
        "train_accuracy": mean("accuracy"),
        "num_samples": s,
        "samples_seen": seen,
        "critical_batch_size": flat.get("critical_batch_size"),
        **metrics.diagnostics_record(host.opt_state, host.params),
      }
      if is_eval:
        rec.update(train_lib.evaluate(host, data, strategy, model), eval_split=config.eval_split)
        log.info(
          "step %d S=%d epoch %.2f: train loss %.4f, %s accuracy %.4f",
          *(done, s, rec["epoch"], rec["train_loss"], config.eval_split, rec["eval_accuracy"]),
        )
      writer.write(rec)
      window = []
    if manager is not None and is_ckpt:
      wall = wall_offset + time.perf_counter() - t0
      checkpoints.save(manager, done, tree_of(host, seen, s, wall))  # then its digest
  if manager is not None:
    manager.wait_until_finished()
    manager.close()
  return base.from_device(device_state)
