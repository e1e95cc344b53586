"""Large-batch data-parallel training with LENA, AdaScale, linear scaling and friends.

Laid out like Flax's ``examples/imagenet/train.py``: :func:`create_train_state`, the step
functions and :func:`train_and_evaluate`, read top to bottom. The rest lives next door:
the shared ``examples.input_pipeline`` (datasets), ``examples.training_stream`` (the batches),
``examples.models``, ``examples.losses``, ``examples.optimizers`` (the registry
``config.optimizer`` names), ``examples.metrics`` (``config.json``, ``metrics.jsonl``) and
``examples.checkpoints`` (Orbax); this program's ``batch_schedule`` (the S of every update),
``parallel`` (batch layout and the shard_map / pmap / GSPMD strategies), ``configs`` and
``main`` (the command line).

One update averages S per-worker gradients of ``per_worker_batch`` examples each, computed on
``num_devices`` devices that each accumulate ``micro_batches`` of them
(``ol.accumulate_grad_stats``), so S = devices x micro-batches and any batch size runs on any
number of devices. One loop runs every run: before each update it asks the batch schedule of
``config.batch_ramp`` for that update's S, the same S throughout by default or a ramp (steps,
the gradient noise scale, Seesaw), and takes that many per-worker batches from the stream.
Every run writes ``config.json`` and ``metrics.jsonl`` to its workdir and, when
``checkpoint_every > 0``, resumes from the last checkpoint there.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

import optax_lena as ol
from examples import (
  checkpoints,
  input_pipeline,
  losses,
  metrics,
  models,
  optimizers,
  training_stream,
)
from examples.lena import batch_schedule, mesh, parallel
from examples.lena.batch_schedule import BatchSchedule, Plan, Progress
from examples.lena.configs import Config, ConfigError

log = logging.getLogger(__name__)
PyTree = Any
Batch = dict[str, np.ndarray]

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
RNG_IMPLS = ("default", "threefry2x32", "rbg", "unsafe_rbg")  # 'default': JAX's (threefry)


# ----------------------------------------------------------------------------------------------
# Model, optimizer and train state
# ----------------------------------------------------------------------------------------------


@flax.struct.dataclass
class TrainState:
  """Everything that changes during training (and is checkpointed)."""

  step: jax.Array
  params: PyTree
  batch_stats: PyTree  # BatchNorm running statistics ({} for models without)
  opt_state: optax.OptState


def create_model(config: Config, num_classes: int) -> flax.linen.Module:
  """The model of ``config.model``; ``config.width`` sets its channels (0 = default),
  ``config.depth`` its blocks (0 = default), ``config.scan_layers`` scans them."""
  kw: dict[str, Any] = {"dtype": DTYPES[config.dtype]}
  if config.width > 0:
    kw["features" if config.model.lower() == "cnn1d" else "width"] = config.width
  if config.depth > 0:
    kw["depth"] = config.depth
  if config.scan_layers:
    kw["scan_layers"] = True
  return models.create_model(config.model, num_classes, **kw)


def layer_axes(config: Config, model: flax.linen.Module, input_shape: Sequence[int]) -> Any:
  """The run's ``layer_axes`` (the one place that decides them, for the optimizer, the
  statistics and the diagnostics): those the model records for its scanned blocks (each
  block's slice a layer), None (one layer per parameter leaf) for an unscanned model or with
  ``config.layer_axes == 'none'``."""
  if not config.scan_layers or config.layer_axes == "none":
    return None
  return models.recorded_layer_axes(model, input_shape)


def hyperparams(
  config: Config, num_samples: int, total_steps: int, layer_axes: Any = None
) -> optimizers.Hyperparams:
  """What the registry's builders know of the run: ``config``'s optimizer fields, S, the run
  length, the per-worker batch, ``reference_batch_size`` (0: none, i.e. k = S) and the model's
  ``layer_axes`` (:func:`layer_axes`).

  ``warmup='default'`` is the entry's paper warm-up. Warm-up lengths are fractions of
  T1 = ``total_steps x k``, the reference-batch iterations of the same epoch budget (the
  single-worker iterations by default).
  """
  entry = optimizers.get(config.optimizer)
  reference = config.reference_batch_size
  if reference < 0:
    raise ConfigError(
      f"reference_batch_size must be >= 0 (0: learning_rate is the per-worker batch's), got "
      f"{reference}."
    )
  return optimizers.Hyperparams(
    learning_rate=config.learning_rate,
    num_samples=num_samples,
    total_steps=total_steps,
    momentum=config.momentum,
    weight_decay=config.weight_decay,
    lr_decay=config.lr_decay,
    warmup=entry.paper_warmup if config.warmup == "default" else config.warmup,
    warmup_alpha=config.warmup_alpha,
    warmup_fraction=config.warmup_fraction,
    grouping=config.grouping,
    per_worker_batch_size=config.per_worker_batch if reference else None,
    reference_batch_size=reference or None,
    layer_axes=layer_axes,
  )


def create_optimizer(
  config: Config, num_samples: int, total_steps: int, layer_axes: Any = None
) -> optax.GradientTransformationExtraArgs:
  """The registry's ``config.optimizer`` built from :func:`hyperparams`: the run's rate
  schedule, warm-up, reference batch and layer axes.

  Raises:
    ConfigError: a warm-up or a reference batch the optimizer does not take, or a reference
      batch that does not divide the global batch (the message names the fix).
  """
  return _build(config, hyperparams(config, num_samples, total_steps, layer_axes))


@functools.cache
def _jitted_init(model: flax.linen.Module) -> Callable[..., PyTree]:
  # One compiled initialiser per model: with the default threefry keys, compiling it costs
  # seconds on CPU, paid once per process rather than once per run.
  return jax.jit(functools.partial(model.init, train=False))


def create_train_state(
  rng: jax.Array,
  model: flax.linen.Module,
  tx: optax.GradientTransformation,
  input_shape: Sequence[int],
) -> TrainState:
  """Parameters, BatchNorm statistics and optimizer state at step 0 (default device); a model
  that scans its blocks starts from the unscanned model's, stacked (same seed, same numbers)."""
  scanned = getattr(model, "scan_layers", False)
  init_model = model.clone(scan_layers=False) if scanned else model
  variables = _jitted_init(init_model)(rng, jnp.zeros((1, *input_shape), jnp.float32))
  params = models.stack_blocks(variables["params"]) if scanned else variables["params"]
  opt_state = jax.jit(tx.init)(params)  # one compiled init instead of many small eager ops
  return TrainState(
    step=jnp.zeros([], jnp.int32),
    params=params,
    batch_stats=variables.get("batch_stats", {}),
    opt_state=opt_state,
  )


# ----------------------------------------------------------------------------------------------
# Steps (the parallel strategy runs `worker_grads` per worker, combines, then `apply_update`)
# ----------------------------------------------------------------------------------------------


def loss_fn(
  params: PyTree, batch: Batch, batch_stats: PyTree, model: flax.linen.Module
) -> tuple[jax.Array, tuple[PyTree, jax.Array]]:
  """Mean loss on one micro-batch, with the updated BatchNorm statistics and the accuracy."""
  variables = {"params": params}
  if batch_stats:
    logits, new_vars = model.apply(
      {**variables, "batch_stats": batch_stats}, batch["x"], train=True, mutable=["batch_stats"]
    )
    batch_stats = new_vars["batch_stats"]
  else:
    logits = cast(jax.Array, model.apply(variables, batch["x"], train=True))
  accuracy = losses.accuracy(logits, batch["y"])
  return losses.cross_entropy(logits, batch["y"]), (batch_stats, accuracy)


def worker_grads(
  state: TrainState, micro_batches: Batch, *, model: flax.linen.Module, layer_axes: Any = None
) -> tuple[PyTree, ol.GradStats, dict[str, Any]]:
  """One worker's gradient (mean over its ``[K, b, ...]`` micro-batches) and statistics (per
  slice of the stacked parameters with ``layer_axes``)."""
  loss = functools.partial(loss_fn, model=model)
  (value, (batch_stats, accuracy)), grads, stats = ol.accumulate_grad_stats(
    loss, state.params, micro_batches, state.batch_stats, has_aux=True, layer_axes=layer_axes
  )
  return (
    grads,
    stats,
    {"batch_stats": batch_stats, "metrics": {"loss": value, "accuracy": accuracy}},
  )


def apply_update(
  state: TrainState,
  grads: PyTree,
  stats: ol.GradStats,
  aux: dict[str, Any],
  *,
  tx: optax.GradientTransformationExtraArgs,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update from the workers' averaged gradients, statistics and ``aux``."""
  # Optax's chain hands grad_stats only to the members that take it: plain optimizers too.
  updates, opt_state = tx.update(grads, state.opt_state, state.params, grad_stats=stats)
  new_state = dataclasses.replace(  # flax.struct's .replace, spelled so that type checkers see it
    state,
    step=state.step + 1,
    params=optax.apply_updates(state.params, updates),
    batch_stats=aux["batch_stats"],
    opt_state=opt_state,
  )
  return new_state, aux["metrics"]


def eval_step(state: TrainState, batch: Batch, *, model: flax.linen.Module) -> dict[str, jax.Array]:
  """Sums of loss, correct predictions and examples over a padded evaluation batch."""
  variables = {"params": state.params}
  if state.batch_stats:
    variables["batch_stats"] = state.batch_stats
  logits = cast(jax.Array, model.apply(variables, batch["x"], train=False))
  mask = batch["mask"]
  return {
    "loss": jnp.sum(mask * losses.per_example_cross_entropy(logits, batch["y"])),
    "correct": jnp.sum(mask * (jnp.argmax(logits, -1) == batch["y"])),
    "count": jnp.sum(mask),
  }


@functools.cache
def _jitted_eval(model: flax.linen.Module) -> Callable[..., dict[str, jax.Array]]:
  # Cached per model, like the initialiser: evaluation does not depend on the optimizer.
  return jax.jit(functools.partial(eval_step, model=model))


def evaluate(
  state: TrainState,
  data: input_pipeline.Dataset,
  strategy: parallel.Strategy,
  model: flax.linen.Module,
) -> dict[str, float]:
  """Loss and accuracy on ``config.eval_split`` (batches sharded over the devices)."""
  eval_fn = _jitted_eval(model)
  means = _means(eval_fn(state, strategy.shard(batch)) for batch in data.eval_batches())
  return {"eval_loss": means["loss"], "eval_accuracy": means["accuracy"]}


def _means(sums_per_batch: Iterable[dict[str, jax.Array]]) -> dict[str, float]:
  """Loss and accuracy over every example from :func:`eval_step`'s sums per batch."""
  sums = None
  for out in sums_per_batch:
    sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
  sums = mesh.host_value(sums)
  count = max(float(sums["count"]), 1.0)
  return {"loss": float(sums["loss"]) / count, "accuracy": float(sums["correct"]) / count}


def evaluate_split(config: Config, state: TrainState, split: str = "test") -> dict[str, float]:
  """Loss and accuracy of a trained ``state`` on one split of ``config``'s dataset.

  For studies that choose on ``eval_split='validation'`` during training and report the
  test split once, after training, with the same model and the same padded batches.

  Args:
    config: the run's configuration (its dataset, model, width and dtype).
    state: a state :func:`train_and_evaluate` returned.
    split: ``'test'`` or ``'validation'``.

  Returns:
    ``{'loss': ..., 'accuracy': ...}`` over every example of the split.
  """
  if split not in ("test", "validation"):
    raise ConfigError(f"split must be 'test' or 'validation', got {split!r}.")
  data = input_pipeline.create_dataset(dataclasses.replace(config, eval_split=split), 1)
  eval_fn = _jitted_eval(create_model(config, data.num_classes))
  return _means(eval_fn(state, batch) for batch in data.eval_batches())


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


def validate_config(config: Config) -> None:
  """Raises ConfigError naming the valid choices for every unknown name in ``config``, and for
  a ``batch_ramp`` that does not parse."""
  choices = {
    "optimizer": optimizers.names(),
    "warmup": ("default", *optimizers.WARMUPS),
    "parallel": tuple(parallel.STRATEGIES),
    "dataset": input_pipeline.DATASETS,
    "dtype": tuple(DTYPES),
    "grouping": tuple(optimizers.GROUPINGS),
    "rng_impl": RNG_IMPLS,
    "eval_split": ("test", "validation"),
    "model": tuple(models.MODELS),  # the names models.create_model accepts
    "damaged_checkpoints": checkpoints.ON_DAMAGE,
    "layer_axes": ("model", "none"),
  }
  if config.model_parallel < 1:
    raise ConfigError(f"model_parallel must be >= 1, got {config.model_parallel}.")
  for key, valid in choices.items():
    value = getattr(config, key)
    if (value.lower() if key == "model" else value) not in valid:
      plural = key if key.endswith("s") else f"{key}s"
      raise ConfigError(f"Unknown {key} {value!r}; valid {plural}: {', '.join(valid)}.")
  blocks = [f"{k}={getattr(config, k)}" for k in ("depth", "scan_layers") if getattr(config, k)]
  if blocks and config.model.lower() != "patch_transformer":
    raise ConfigError(
      f"model={config.model!r} has no repeated blocks to set ({', '.join(blocks)}): depth and "
      "scan_layers are model='patch_transformer''s; leave them at 0 / false, or use "
      "model=patch_transformer."
    )
  batch_schedule.check_optimizer(batch_schedule.from_config(config), config)


def scheduled_hyperparams(
  config: Config, num_samples: int, schedule: BatchSchedule, plan: Plan, layer_axes: Any = None
) -> batch_schedule.ScheduledHyperparams:
  """:func:`hyperparams` for updates of ``num_samples`` per-worker gradients in a run of
  ``plan``: the rate schedule and warm-ups span the run's base steps, times the schedule's
  rate factor at that S (for a fixed S, exactly :func:`hyperparams`' values)."""
  hp = hyperparams(config, num_samples, plan.updates or 1, layer_axes)
  return batch_schedule.ScheduledHyperparams(
    **dataclasses.asdict(hp),
    run_base_steps=plan.base_steps,
    rate_factor=schedule.rate_factor(num_samples),
  )


def _build(config: Config, hp: optimizers.Hyperparams) -> optax.GradientTransformationExtraArgs:
  try:
    return optimizers.build(config.optimizer, hp)
  except ValueError as e:
    raise ConfigError(str(e)) from None


@functools.lru_cache(maxsize=8)
def _strategy(
  config: Config,
  entry: optimizers.Optimizer,
  hp: optimizers.Hyperparams,
  layout: parallel.BatchLayout,
  num_classes: int,
) -> parallel.Strategy:
  # One transformation and one compiled step per S of a run, made on first use and kept a while
  # for the process (like the initialiser): a run resumed in the same process, or a ramp that
  # returns to an S, compiles nothing. The registry entry is part of the key: a study may
  # register another optimizer under the same name. The statistics take the layer axes the
  # optimizer was built with (hp.layer_axes).
  del entry
  model = create_model(config, num_classes)
  return parallel.create(
    config.parallel,
    layout,
    functools.partial(worker_grads, model=model, layer_axes=hp.layer_axes),
    functools.partial(apply_update, tx=_build(config, hp)),
    config.sharding_mode,
    hp.layer_axes,
  )


def train_and_evaluate(config: Config, workdir: str | Path) -> TrainState:
  """Trains (resuming from ``workdir`` if it holds a checkpoint) and evaluates.

  Every update asks the batch schedule of ``config.batch_ramp`` (``batch_schedule``) for its S:
  the same S throughout by default, or a ramp.

  Args:
    config: the run's configuration.
    workdir: directory for ``config.json``, ``metrics.jsonl`` and ``checkpoints/``.

  On several processes (``jax.distributed`` initialized, e.g. by ``examples.main``) every
  process runs this with the same arguments: the mesh spans every process's devices, each
  process reads its own rows of every global batch, all write the checkpoints together and
  process 0 alone writes ``config.json``, ``metrics.jsonl``, the log and the progress bar.

  Returns:
    The final train state (on the devices' mesh: replicated, or its kernels split over the
    ``model`` axis with ``model_parallel > 1``).

  Raises:
    ConfigError: a setting that cannot run (the message names the fix).
  """
  validate_config(config)
  schedule = batch_schedule.from_config(config)
  workdir = Path(workdir)
  is_main = jax.process_index() == 0
  if is_main:
    workdir.mkdir(parents=True, exist_ok=True)
  info = log.info if is_main else lambda *args: None
  first = parallel.batch_layout(
    schedule.layout_config(config), jax.device_count(), jax.process_count()
  )
  b, devices = config.per_worker_batch, first.num_devices
  data = input_pipeline.create_dataset(config, devices)
  plan = schedule.plan(config, data.num_train, devices)
  if plan.updates is not None:
    length = f"{plan.updates} updates, {data.num_train / first.global_batch:.2f} per epoch"
  else:
    length = (
      f"batch_ramp {config.batch_ramp!r} up to S={plan.max_num_samples}, {plan.examples} examples"
    )
  info(
    "Global batch %d = %d devices x %d micro-batches x %d examples (S=%d); %s; %s%s.",
    *(first.global_batch, devices, first.micro_batches, b, first.num_samples, length),
    *(config.parallel, parallel.describe_placement(first)),
  )

  model = create_model(config, data.num_classes)
  entry = optimizers.get(config.optimizer)
  axes = layer_axes(config, model, data.input_shape)
  hp_at = functools.partial(
    scheduled_hyperparams, config, schedule=schedule, plan=plan, layer_axes=axes
  )
  for s in schedule.sizes():  # a warm-up or reference batch the optimizer refuses fails here
    _build(config, hp_at(s))
  if config.reference_batch_size:
    k = hp_at(first.num_samples).scale  # k = S b / b0: base steps per update
    info("learning_rate tuned at batch %d: scale k = %d.", config.reference_batch_size, k)
  strategies: dict[int, parallel.Strategy] = {}

  def strategy_for(s: int) -> parallel.Strategy:
    """The step of updates of S per-worker gradients: more micro-batches on the same devices."""
    if s not in strategies:
      layout = dataclasses.replace(first, micro_batches=s // devices)
      strategies[s] = _strategy(config, entry, hp_at(s), layout, data.num_classes)
    return strategies[s]

  rng = jax.random.key(config.seed, impl=None if config.rng_impl == "default" else config.rng_impl)
  tx = _build(config, hp_at(first.num_samples))
  strategy = strategy_for(first.num_samples)
  state = strategy.on_mesh(create_train_state(rng, model, tx, data.input_shape))
  progress = Progress(0, 0, first.num_samples)

  def checkpoint(state: Any, at: Progress, wall_time: float) -> dict[str, Any]:
    seen = at.samples_seen
    tree = checkpoints.checkpoint_tree(state, config.seed, seen, data.num_train, wall_time)
    if schedule.ramped:  # a fixed S's progress is its step
      tree["ramp"] = batch_schedule.progress_arrays(at)
    return tree

  # Resume from the last checkpoint, if any.
  wall_offset = 0.0
  manager = checkpoints.manager(workdir, config)
  restored = None
  if manager is not None:
    restored = checkpoints.restore_latest(
      manager, checkpoint(state, progress, 0.0), config.seed, config.damaged_checkpoints
    )
  if restored is not None:
    state, wall_offset = restored["state"], float(restored["wall_time"])
    step = int(state.step)
    if schedule.ramped:
      ramp = restored["ramp"]
      progress = Progress(step, int(ramp["samples_seen"]), int(ramp["num_samples"]))
    else:
      progress = Progress(step, step * first.global_batch, first.num_samples)
    info(
      "Resumed from checkpoint at step %d (epoch %d, example %d; S=%d).",
      *(step, int(restored["data"]["epoch"]), int(restored["data"]["example_in_epoch"])),
      progress.num_samples,
    )
  start_step = progress.updates
  layout_record = {
    **dataclasses.asdict(first),
    "num_samples": first.num_samples,
    "global_batch": first.global_batch,
  }
  metrics.write_config(
    workdir if is_main else None,
    {
      **dataclasses.asdict(config),
      "layout": layout_record,
      "total_steps": plan.updates,
      "budget_examples": plan.examples,
      "num_train": data.num_train,
    },
    resuming=start_step > 0,
  )
  writer = metrics.MetricsWriter(workdir if is_main else None, start_step)

  def record(kind: str, host_state: TrainState) -> dict[str, Any]:
    """A metrics record; train loss and accuracy average the updates since the last."""
    window = mesh.host_value(train_metrics)
    mean = lambda k: float(np.mean([np.mean(m[k]) for m in window])) if window else None
    rec = {
      "type": kind,
      "iteration": progress.updates,
      "epoch": progress.samples_seen / data.num_train,
      "base_steps": batch_schedule.base_steps(progress.samples_seen, config),
      "wall_time": wall_offset + time.perf_counter() - t0,
      "train_loss": mean("loss"),
      "train_accuracy": mean("accuracy"),
      "num_samples": progress.num_samples,  # S of the last update
      "samples_seen": progress.samples_seen,
    }
    if entry.diagnostics:
      rec.update(metrics.diagnostics_record(host_state.opt_state, host_state.params, axes))
      # Per-worker batches; None where the estimate is not finite.
      rec["critical_batch_size"] = ol.flat_diagnostics(host_state.opt_state).get(
        "critical_batch_size"
      )
    return rec

  # The training loop.
  device_state = strategy.to_device(state)

  def opt_state() -> optax.OptState:  # what a noise ramp reads, when it does
    return strategy.from_device(device_state).opt_state

  stream = training_stream.ExampleStream(
    data,
    progress.samples_seen,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
    batch_size=0 if schedule.ramped else first.global_batch,
  )
  train_metrics: list[dict[str, jax.Array]] = []
  # CPU processes joined over gloo: a collective that fails on some of this process's devices (a
  # peer died) lets those devices start the next queued program while the others still wait in
  # the failed one, and gloo aborts the process on the mismatched messages. One step in flight
  # keeps a failure inside one program, so the coordination service reports the dead peer. (GPU
  # and TPU collectives do not work this way: there dispatch keeps running ahead.)
  one_step_in_flight = mesh.collectives_over_gloo()
  t0 = time.perf_counter()
  bar = tqdm.tqdm(
    total=plan.examples,
    initial=min(progress.samples_seen, plan.examples),
    desc=f"{config.optimizer} S={progress.num_samples}",
    unit="ex",
    unit_scale=True,
    dynamic_ncols=True,
    disable=None if config.progress_bar and is_main else True,  # None: off if not a tty
  )
  while progress.samples_seen < plan.examples:
    s = schedule.next_num_samples(progress, plan, opt_state)
    if s != progress.num_samples:
      bar.set_description(f"{config.optimizer} S={s}", refresh=False)
    strategy = strategy_for(s)
    batch = strategy.shard_batch(stream.take(s * b))
    device_state, step_metrics = strategy.step(device_state, batch)
    if one_step_in_flight:
      jax.block_until_ready(device_state)
    train_metrics.append(step_metrics)
    epoch_before = progress.samples_seen // data.num_train
    progress = progress.after(s, b)
    bar.update(s * b)
    done, last = progress.updates, progress.samples_seen >= plan.examples
    if plan.eval_every > 0:
      is_eval = done % plan.eval_every == 0 or last
    else:
      is_eval = progress.samples_seen // data.num_train > epoch_before or last
    is_log = config.log_every > 0 and done % config.log_every == 0
    is_ckpt = manager is not None and (done % config.checkpoint_every == 0 or last)
    if not (is_eval or is_log or is_ckpt):
      continue  # no host synchronisation: dispatch runs ahead
    host_state = strategy.from_device(device_state)
    rec = None
    if is_eval:
      rec = record("eval", host_state)
      rec.update(evaluate(host_state, data, strategy, model), eval_split=config.eval_split)
      bar.set_postfix(loss=f"{rec['train_loss']:.3f}", acc=f"{rec['eval_accuracy']:.3f}")
      info(
        "step %d epoch %.2f S=%d: train loss %.4f, %s accuracy %.4f",
        *(done, rec["epoch"], s, rec["train_loss"], config.eval_split, rec["eval_accuracy"]),
      )
    elif is_log:
      rec = record("train", host_state)
    if rec is not None:
      writer.write(rec)
      train_metrics = []
    if manager is not None and is_ckpt:
      wall = wall_offset + time.perf_counter() - t0
      checkpoints.save(manager, done, checkpoint(host_state, progress, wall))  # then its digest
  bar.close()
  if manager is not None:
    manager.wait_until_finished()
    manager.close()
  return strategy.from_device(device_state)
