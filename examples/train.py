"""Large-batch data-parallel training with LENA, AdaScale and linear scaling (LSW).

Laid out like Flax's ``examples/imagenet/train.py``: :func:`create_train_state`,
:func:`train_step`, :func:`eval_step` and :func:`train_and_evaluate`, read top to bottom.

One update averages S per-worker gradients of ``per_worker_batch`` examples each. They are
computed on ``num_devices`` devices that each accumulate ``micro_batches`` of them
(``ol.accumulate_grad_stats``), so S = devices x micro-batches and any batch size runs on any
number of devices. ``config.parallel`` picks how the devices are used:

* ``'shard_map'``: ``jax.shard_map`` over the mesh axis ``'batch'``; gradients and their
  statistics are combined with ``ol.all_reduce_grad_stats``.
* ``'pmap'``: the same step body under ``jax.pmap``.
* ``'gspmd'``: plain ``jit``; the per-worker gradients are a ``vmap`` whose worker axis is
  sharded over the devices, combined with ``ol.stacked_grad_stats`` (XLA inserts the
  all-reduces).

Optimizers: ``sgd`` (the single-worker baseline: momentum SGD with coupled weight decay),
``lsw`` / ``adascale`` / ``lena`` (``optax_lena``; rate on the sample clock), ``lars`` and
``lamb`` (``optax``). Every run writes ``config.json`` and ``metrics.jsonl`` to its workdir and,
when ``checkpoint_every > 0``, resumes from the last checkpoint there.

Usage::

  python -m examples.train --config default --set optimizer=lena --set batch_scale=16 \\
      --workdir runs/lena_s16
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import flax
import flax.jax_utils
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import tqdm
import tqdm.contrib.logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import optax_lena as ol
from examples import configs as configs_lib
from examples import input_pipeline, models

log = logging.getLogger(__name__)
PyTree = Any
Batch = dict[str, np.ndarray]

AXIS = "batch"  # the mesh / pmap axis the workers are spread over
OPTIMIZERS = ("sgd", "lsw", "adascale", "lena", "lars", "lamb")
STATS_OPTIMIZERS = ("lsw", "adascale", "lena")  # those taking grad_stats=
WARMUPS = ("default", "none", "fixed", "state_aware")
PAPER_WARMUP = {"lsw": "fixed", "adascale": "none", "lena": "state_aware"}
PARALLEL = ("shard_map", "pmap", "gspmd")
DATASETS = ("mnist1d", "cifar10", "cifar100")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
GROUPINGS = {"leaf": None, "module": "module"}
RNG_IMPLS = {
  "default": None,
  "threefry2x32": "threefry2x32",
  "rbg": "rbg",
  "unsafe_rbg": "unsafe_rbg",
}
DIAGNOSTICS = ("lr_multiplier", "gain_ratio", "warmup_end_step")


class ConfigError(ValueError):
  """A configuration that cannot run; the message says what to change."""


# ----------------------------------------------------------------------------------------------
# Batch layout
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BatchLayout:
  """How one update's global batch is split: devices x micro-batches x per-worker batch."""

  per_worker_batch: int
  num_devices: int
  micro_batches: int

  @property
  def num_samples(self) -> int:
    """S, the number of per-worker gradients one update averages."""
    return self.num_devices * self.micro_batches

  @property
  def global_batch(self) -> int:
    return self.num_samples * self.per_worker_batch


def batch_layout(config: configs_lib.Config, local_device_count: int) -> BatchLayout:
  """Splits the global batch into devices x micro-batches x per-worker batch.

  Args:
    config: uses ``per_worker_batch``, ``batch_scale`` or ``global_batch_size``,
      ``num_devices`` and ``micro_batches`` (0 = automatic).
    local_device_count: devices available.

  Returns:
    The layout.

  Raises:
    ValueError: if the numbers do not multiply up (the message says what to change).
  """
  b = config.per_worker_batch
  if b < 1:
    raise ConfigError(f"per_worker_batch must be positive, got {b}.")
  if config.global_batch_size > 0:
    global_batch = config.global_batch_size
    if global_batch % b:
      raise ConfigError(
        f"global_batch_size {global_batch} is not a multiple of per_worker_batch {b}; "
        f"use e.g. global_batch_size={max(1, global_batch // b) * b}."
      )
    s = global_batch // b
  else:
    s = config.batch_scale
    if s < 1:
      raise ConfigError(f"batch_scale must be positive, got {s}.")
    global_batch = s * b
  if config.num_devices > local_device_count:
    raise ConfigError(
      f"num_devices={config.num_devices} but only {local_device_count} local devices are "
      "available (on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N simulates "
      "N devices)."
    )
  devices, micro = config.num_devices, config.micro_batches
  if devices <= 0 and micro > 0 and s % micro == 0 and s // micro <= local_device_count:
    devices = s // micro
  elif devices <= 0:
    # The largest divisor of S that fits: all devices when S is a multiple of their count.
    devices = max(d for d in range(1, min(s, local_device_count) + 1) if s % d == 0)
  if micro <= 0:
    micro = max(1, s // devices)
  if devices * micro != s:
    raise ConfigError(
      f"Global batch {global_batch} (per_worker_batch {b} x S={s} per-worker batches) is "
      f"not divisible across {devices} devices x {micro} micro-batches "
      f"(= {devices * micro * b} examples per update). Make batch_scale a multiple of "
      f"num_devices (e.g. batch_scale={max(1, s // devices) * devices} or "
      f"{(s // devices + 1) * devices}), or set num_devices "
      f"and micro_batches so that num_devices x micro_batches = {s} (micro_batches=0 picks "
      "S / num_devices)."
    )
  return BatchLayout(per_worker_batch=b, num_devices=devices, micro_batches=micro)


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------


def _epoch_seed(seed: int, epoch: int) -> int:
  """A seed for one epoch's data order: deterministic per (seed, epoch), so resumable."""
  return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def global_batches(
  data: Mnist1dData | CifarData, global_batch: int, start_step: int = 0
) -> Iterator[Batch]:
  """The training stream cut into global batches, starting with update ``start_step``.

  The stream is epoch 0, epoch 1, ... in the per-(seed, epoch) order of
  ``data.epoch_examples``, and a batch may straddle two epochs. So no example is dropped at
  any batch size (a 16k batch would otherwise skip 27% of CIFAR-10's 45k images every epoch),
  and the position of update ``t`` is simply example ``t * global_batch`` of the stream,
  which is what makes resuming exact.

  Args:
    data: the dataset.
    global_batch: examples per update.
    start_step: the first update to produce.

  Yields:
    ``{'x': [global_batch, ...], 'y': [global_batch]}``.
  """
  epoch, skip = divmod(start_step * global_batch, data.num_train)
  pending: collections.deque[tuple[np.ndarray, np.ndarray]] = collections.deque()
  have = 0
  while True:
    for x, y in data.epoch_examples(epoch):
      if skip:  # resuming mid-epoch: drop what the checkpointed run already used
        x, y, skip = x[skip:], y[skip:], max(0, skip - len(y))
      pending.append((x, y))
      have += len(y)
      while have >= global_batch:
        # Cut one batch off the front of the pending chunks (slices are views).
        xs, ys, need = [], [], global_batch
        while need:
          x0, y0 = pending[0]
          take = min(need, len(y0))
          xs.append(x0[:take])
          ys.append(y0[:take])
          if take == len(y0):
            pending.popleft()
          else:
            pending[0] = (x0[take:], y0[take:])
          need -= take
        have -= global_batch
        yield {"x": np.concatenate(xs), "y": np.concatenate(ys)}
    epoch += 1


def _padded_eval_batches(
  batches: Iterator[tuple[np.ndarray, np.ndarray]], size: int
) -> Iterator[Batch]:
  """Pads every evaluation batch to ``size`` rows with a 0/1 ``mask`` (static shapes)."""
  for x, y in batches:
    n = len(y)
    pad = size - n
    yield {
      "x": np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)]),
      "y": np.concatenate([y, np.zeros((pad,), y.dtype)]),
      "mask": np.concatenate([np.ones((n,), np.float32), np.zeros((pad,), np.float32)]),
    }


class Mnist1dData:
  """MNIST-1D, generated offline and cached (``input_pipeline.load_mnist1d``)."""

  num_classes = 10
  input_shape = (40,)

  def __init__(self, config: configs_lib.Config, eval_batch: int):
    d = input_pipeline.load_mnist1d(
      config.cache_dir,
      config.data_seed,
      num_samples=config.mnist1d_num_samples,
      num_validation=config.num_validation,
    )
    self.x_train, self.y_train = d["x_train"], d["y_train"]
    split = {"test": "test", "validation": "val"}[config.eval_split]
    self.x_eval, self.y_eval = d[f"x_{split}"], d[f"y_{split}"]
    if not len(self.y_eval):
      raise ConfigError("eval_split='validation' on MNIST-1D needs num_validation > 0.")
    self.eval_batch, self.seed = eval_batch, config.seed
    self.num_train = len(self.y_train)

  def epoch_examples(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch in an order fixed by (seed, epoch), as a single chunk."""
    order = np.random.default_rng(_epoch_seed(self.seed, epoch)).permutation(self.num_train)
    yield self.x_train[order], self.y_train[order]

  def eval_batches(self) -> Iterator[Batch]:
    batches = input_pipeline.numpy_batches(
      self.x_eval, self.y_eval, self.eval_batch, shuffle=False, drop_remainder=False
    )
    return _padded_eval_batches(batches, self.eval_batch)


class CifarData:
  """CIFAR-10/100 from a prepared TFDS ``data_dir`` (``input_pipeline.load_cifar``)."""

  input_shape = (32, 32, 3)
  chunk = 1024  # examples per tf.data batch; global batches are cut from these

  def __init__(self, config: configs_lib.Config, eval_batch: int):
    self.name, self.data_dir = config.dataset, config.data_dir or None
    self.num_classes = input_pipeline.CIFAR_NUM_CLASSES[self.name]
    self.num_train = input_pipeline.CIFAR_SPLIT_SIZES["train"]
    self.eval_batch, self.seed = eval_batch, config.seed
    self.eval_split = config.eval_split
    # Fail now, with the pipeline's instructions, if the dataset is not prepared.
    self.eval_batches()

  def epoch_examples(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch, shuffled and augmented with a seed fixed by (seed, epoch)."""
    it = input_pipeline.load_cifar(
      self.name,
      "train",
      self.chunk,
      train=True,
      data_dir=self.data_dir,
      num_epochs=1,
      drop_remainder=False,
      seed=_epoch_seed(self.seed, epoch),
    )
    for b in it:
      yield b["image"], b["label"]

  def eval_batches(self) -> Iterator[Batch]:
    it = input_pipeline.load_cifar(
      self.name, self.eval_split, self.eval_batch, train=False, data_dir=self.data_dir
    )
    return _padded_eval_batches(((b["image"], b["label"]) for b in it), self.eval_batch)


def create_dataset(config: configs_lib.Config, layout: BatchLayout) -> Mnist1dData | CifarData:
  """Builds the dataset of ``config.dataset``; evaluation batches are padded to a multiple of
  the device count so that they shard evenly."""
  eval_batch = -(-config.eval_batch_size // layout.num_devices) * layout.num_devices
  if config.dataset == "mnist1d":
    data: Mnist1dData | CifarData = Mnist1dData(config, eval_batch)
  else:
    data = CifarData(config, eval_batch)
  if data.num_train < layout.global_batch:
    raise ConfigError(
      f"The global batch {layout.global_batch} exceeds the {data.num_train} training "
      "examples; lower batch_scale or per_worker_batch."
    )
  return data


# ----------------------------------------------------------------------------------------------
# Model, optimizer and train state
# ----------------------------------------------------------------------------------------------


def create_model(config: configs_lib.Config, num_classes: int) -> flax.linen.Module:
  """The model of ``config.model``; ``config.width`` sets its channels (0 = default)."""
  kw: dict[str, Any] = {"dtype": DTYPES[config.dtype]}
  if config.width > 0:
    kw["features" if config.model.lower() == "cnn1d" else "width"] = config.width
  return models.create_model(config.model, num_classes, **kw)


def create_optimizer(
  config: configs_lib.Config, num_samples: int, total_steps: int
) -> tuple[optax.GradientTransformation, bool]:
  """The optimizer of ``config.optimizer`` with the paper's rate schedule and warm-up.

  The rate decays exponentially to ``lr_decay * eta0`` over the run. For LSW, AdaScale and
  LENA the schedule runs on base steps t * S (the paper's sample clock), so it is the same
  function of samples seen at every batch size; the other optimizers see their update count.
  Warm-up lengths are fractions of T1 = total_steps * S, the single-worker iterations of the
  same epoch budget: theta = warmup_alpha * T1, W = warmup_fraction * T1 base steps.

  Args:
    config: the configuration.
    num_samples: S.
    total_steps: updates of the run.

  Returns:
    ``(tx, needs_stats)``: the transformation and whether its update takes ``grad_stats=``.
  """
  name, s = config.optimizer, num_samples
  warmup = PAPER_WARMUP.get(name, "none") if config.warmup == "default" else config.warmup
  base_steps_total = total_steps * s  # T1
  eta0, decay = config.learning_rate, config.lr_decay

  if name in STATS_OPTIMIZERS:
    kw: dict[str, Any] = {
      "momentum": config.momentum,
      "weight_decay": config.weight_decay,
      "clock": "samples",
      "num_samples": s,
    }
    if warmup == "state_aware":
      kw["warmup_threshold"] = config.warmup_alpha * base_steps_total
    elif warmup == "fixed":
      kw["warmup_steps"] = config.warmup_fraction * base_steps_total
    schedule = lambda base_steps: eta0 * decay ** (base_steps / base_steps_total)
    if name == "lena":
      tx = ol.lena(schedule, grouping=GROUPINGS[config.grouping], **kw)
    elif name == "adascale":
      tx = ol.adascale(schedule, **kw)
    else:
      tx = ol.linear_scaling(schedule, **kw)
    return tx, True

  if warmup == "state_aware":
    raise ConfigError(
      f"warmup='state_aware' needs gradient statistics; optimizer {name!r} takes none. "
      f"Use warmup 'none' or 'fixed', or one of {', '.join(STATS_OPTIMIZERS)}."
    )
  warmup_updates = config.warmup_fraction * total_steps  # W / S updates

  def schedule(count: jax.Array) -> jax.Array:
    rate = eta0 * decay ** (count / total_steps)
    if warmup == "fixed":  # same factor as LSW's min(t S / W, 1), t = count + 1
      rate = rate * jnp.minimum((count + 1) / warmup_updates, 1.0)
    return rate

  if name == "sgd":
    tx = optax.chain(
      optax.add_decayed_weights(config.weight_decay), optax.sgd(schedule, momentum=config.momentum)
    )
  elif name == "lars":
    tx = optax.lars(schedule, weight_decay=config.weight_decay, momentum=config.momentum)
  else:
    tx = optax.lamb(schedule, weight_decay=config.weight_decay)
  return tx, False


@flax.struct.dataclass
class TrainState:
  """Everything that changes during training (and is checkpointed)."""

  step: jax.Array
  params: PyTree
  batch_stats: PyTree  # BatchNorm running statistics ({} for models without)
  opt_state: optax.OptState


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
  """Initialises parameters, BatchNorm statistics and optimizer state.

  Args:
    rng: initialisation key.
    model: the Flax module.
    tx: the optimizer.
    input_shape: one example's shape.

  Returns:
    The train state at step 0 (on the default device).
  """
  variables = _jitted_init(model)(rng, jnp.zeros((1, *input_shape), jnp.float32))
  params = variables["params"]
  # One compiled init instead of many small eager ops.
  opt_state = jax.jit(tx.init)(params)
  return TrainState(
    step=jnp.zeros([], jnp.int32),
    params=params,
    batch_stats=variables.get("batch_stats", {}),
    opt_state=opt_state,
  )


# ----------------------------------------------------------------------------------------------
# Steps
# ----------------------------------------------------------------------------------------------


def cross_entropy_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example softmax cross-entropy."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


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
    logits = model.apply(variables, batch["x"], train=True)
  loss = jnp.mean(cross_entropy_loss(logits, batch["y"]))
  accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["y"])
  return loss, (batch_stats, accuracy)


def apply_update(
  state: TrainState,
  grads: PyTree,
  stats: ol.GradStats,
  batch_stats: PyTree,
  tx: optax.GradientTransformation,
  needs_stats: bool,
) -> TrainState:
  """One optimizer update from the averaged gradients (and their statistics)."""
  extra = {"grad_stats": stats} if needs_stats else {}  # optax.lars / lamb take none
  updates, opt_state = tx.update(grads, state.opt_state, state.params, **extra)
  return state.replace(
    step=state.step + 1,
    params=optax.apply_updates(state.params, updates),
    batch_stats=batch_stats,
    opt_state=opt_state,
  )


def train_step(
  state: TrainState,
  batch: Batch,
  *,
  model: flax.linen.Module,
  tx: optax.GradientTransformation,
  needs_stats: bool,
  axis_name: str = AXIS,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One update, as run by every device inside ``pmap`` or ``shard_map``.

  Args:
    state: the (replicated) train state.
    batch: this device's ``K`` micro-batches, leaves shaped ``[K, per_worker_batch, ...]``.
    model: the Flax module.
    tx: the optimizer.
    needs_stats: pass ``grad_stats`` to ``tx.update``.
    axis_name: the device axis.

  Returns:
    The new state and the step's mean training loss and accuracy (identical on all devices).
  """
  loss = functools.partial(loss_fn, model=model)
  (value, (batch_stats, accuracy)), grads, stats = ol.accumulate_grad_stats(
    loss, state.params, batch, state.batch_stats, has_aux=True
  )
  # Replaces lax.pmean(grads): also all-reduces the per-layer squared norms, S = devices x K.
  grads, stats = ol.all_reduce_grad_stats(grads, axis_name, local_stats=stats)
  # Every device normalised with its own micro-batches (as PyTorch DDP does); keep one copy
  # of the running averages by averaging them.
  batch_stats = jax.lax.pmean(batch_stats, axis_name)
  metrics = jax.lax.pmean({"loss": value, "accuracy": accuracy}, axis_name)
  return apply_update(state, grads, stats, batch_stats, tx, needs_stats), metrics


def train_step_gspmd(
  state: TrainState,
  batch: Batch,
  *,
  model: flax.linen.Module,
  tx: optax.GradientTransformation,
  needs_stats: bool,
  worker_sharding: NamedSharding | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One update under plain ``jit``: per-worker gradients by ``vmap`` over the worker axis.

  Args:
    state: the train state (replicated).
    batch: leaves shaped ``[devices, K, per_worker_batch, ...]``, sharded on the first axis.
    model: the Flax module.
    tx: the optimizer.
    needs_stats: pass ``grad_stats`` to ``tx.update``.
    worker_sharding: sharding of the worker axis; keeps XLA from replicating the ``vmap``.

  Returns:
    The new state and the step's mean training loss and accuracy.
  """
  if worker_sharding is not None:
    batch = jax.lax.with_sharding_constraint(batch, worker_sharding)
  loss = functools.partial(loss_fn, model=model)

  def worker(micro_batches: Batch) -> Any:
    return ol.accumulate_grad_stats(
      loss, state.params, micro_batches, state.batch_stats, has_aux=True
    )

  (value, (batch_stats, accuracy)), grads, stats = jax.vmap(worker)(batch)
  grads, stats = ol.stacked_grad_stats(grads, stacked_stats=stats)
  mean = lambda t: jax.tree.map(lambda x: jnp.mean(x, axis=0), t)
  metrics = mean({"loss": value, "accuracy": accuracy})
  return apply_update(state, grads, stats, mean(batch_stats), tx, needs_stats), metrics


def eval_step(state: TrainState, batch: Batch, *, model: flax.linen.Module) -> dict[str, jax.Array]:
  """Sums of loss, correct predictions and examples over a padded evaluation batch."""
  variables = {"params": state.params}
  if state.batch_stats:
    variables["batch_stats"] = state.batch_stats
  logits = model.apply(variables, batch["x"], train=False)
  mask = batch["mask"]
  return {
    "loss": jnp.sum(mask * cross_entropy_loss(logits, batch["y"])),
    "correct": jnp.sum(mask * (jnp.argmax(logits, -1) == batch["y"])),
    "count": jnp.sum(mask),
  }


@functools.cache
def _jitted_eval(model: flax.linen.Module) -> Callable[..., dict[str, jax.Array]]:
  # Cached per model, like the initialiser: evaluation does not depend on the optimizer.
  return jax.jit(functools.partial(eval_step, model=model))


# ----------------------------------------------------------------------------------------------
# Parallel execution
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Parallel:
  """The compiled step for ``config.parallel`` and how to move states and batches for it."""

  mesh: jax.sharding.Mesh
  layout: BatchLayout
  kind: str
  step_fn: Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, P())

  def on_mesh(self, tree: PyTree) -> PyTree:
    """``tree`` replicated on the mesh (checkpoints and evaluation use this layout)."""
    return jax.device_put(tree, self.replicated)

  def to_device(self, state: TrainState) -> TrainState:
    """The step's state layout: one copy per device for pmap, replicated on the mesh else."""
    if self.kind == "pmap":
      return flax.jax_utils.replicate(state, devices=list(self.mesh.devices.flat))
    return jax.device_put(state, self.replicated)

  def from_device(self, state: TrainState) -> TrainState:
    """The step's state back in the mesh-replicated layout of :meth:`on_mesh`."""
    if self.kind == "pmap":
      state = flax.jax_utils.unreplicate(state)
    return self.on_mesh(state)

  def shard_batch(self, batch: Batch) -> Batch:
    """Splits a global batch ``[G, ...]`` into ``[devices, K, per_worker_batch, ...]``."""
    lay = self.layout
    batch = {
      k: v.reshape(lay.num_devices, lay.micro_batches, lay.per_worker_batch, *v.shape[1:])
      for k, v in batch.items()
    }
    if self.kind == "pmap":
      return batch  # pmap splits the leading axis over its devices
    return jax.device_put(batch, NamedSharding(self.mesh, P(AXIS)))


def make_parallel(
  config: configs_lib.Config,
  layout: BatchLayout,
  model: flax.linen.Module,
  tx: optax.GradientTransformation,
  needs_stats: bool,
) -> Parallel:
  """Compiles-on-first-call the train step for ``config.parallel`` on ``layout.num_devices``."""
  devices = jax.local_devices()[: layout.num_devices]
  mesh = jax.make_mesh(
    (layout.num_devices,), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,), devices=devices
  )
  kw = {"model": model, "tx": tx, "needs_stats": needs_stats}
  replicated = NamedSharding(mesh, P())
  if config.parallel == "pmap":
    step_fn = jax.pmap(
      functools.partial(train_step, **kw), axis_name=AXIS, devices=devices, donate_argnums=(0,)
    )
  elif config.parallel == "shard_map":

    def local_step(state: TrainState, batch: Batch) -> Any:
      # The device's block of the [devices, K, b, ...] batch is [1, K, b, ...].
      return train_step(state, jax.tree.map(lambda x: x[0], batch), **kw)

    # check_vma=False lets pmap and shard_map share one step body. With JAX's replication
    # checking on, the body would have to differentiate w.r.t.
    # jax.lax.pcast(params, AXIS, to="varying"): jax.grad of replicated params returns
    # gradients already summed over devices (ol.all_reduce_grad_stats rejects those).
    # All outputs are replicated by construction (pmean).
    step_fn = jax.jit(
      jax.shard_map(
        local_step, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=(P(), P()), check_vma=False
      ),
      donate_argnums=(0,),
    )
  else:
    step_fn = jax.jit(
      functools.partial(train_step_gspmd, worker_sharding=NamedSharding(mesh, P(AXIS)), **kw),
      out_shardings=replicated,
      donate_argnums=(0,),
    )
  return Parallel(mesh=mesh, layout=layout, kind=config.parallel, step_fn=step_fn)


# ----------------------------------------------------------------------------------------------
# Metrics, diagnostics and checkpoints
# ----------------------------------------------------------------------------------------------


class MetricsWriter:
  """Appends one JSON object per line to ``workdir/metrics.jsonl``."""

  def __init__(self, path: Path, resume_step: int):
    self.path = path
    if resume_step == 0:
      path.write_text("")
    elif path.exists():
      # Drop records written after the checkpoint we resume from: they will be redone.
      kept = [
        line
        for line in path.read_text().splitlines()
        if line and json.loads(line).get("iteration", 0) <= resume_step
      ]
      path.write_text("".join(f"{line}\n" for line in kept))

  def write(self, record: dict[str, Any]) -> None:
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")


def read_metrics(workdir: str | Path, kind: str | None = "eval") -> list[dict[str, Any]]:
  """Reads ``metrics.jsonl`` of a run.

  Args:
    workdir: the run's directory.
    kind: keep records of this ``type`` (``'eval'`` or ``'train'``); None keeps all.

  Returns:
    The records, in order.
  """
  lines = (Path(workdir) / "metrics.jsonl").read_text().splitlines()
  records = [json.loads(line) for line in lines if line]
  return [r for r in records if kind is None or r.get("type") == kind]


def layer_names(params: PyTree) -> list[str]:
  """``'Conv_0/kernel'``-style names of the parameter leaves, in ``jax.tree.leaves`` order."""
  return [
    jax.tree_util.keystr(path, simple=True, separator="/")
    for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
  ]


@jax.jit
def _diagnostics(opt_state: optax.OptState) -> dict[str, jax.Array]:
  d = ol.diagnostics(opt_state)
  return {k: d[k] for k in (*DIAGNOSTICS, "global_ratio", "num_skipped_steps")}


def diagnostics_record(opt_state: optax.OptState, names: list[str]) -> dict[str, Any]:
  """Per-layer rate multipliers, ratios and warm-up end steps as ``{layer: value}`` dicts."""
  d = jax.device_get(_diagnostics(opt_state))
  out: dict[str, Any] = {
    k: dict(zip(names, np.asarray(d[k]).tolist(), strict=True)) for k in DIAGNOSTICS
  }
  out["global_ratio"] = float(d["global_ratio"])
  out["num_skipped_steps"] = int(d["num_skipped_steps"])
  return out


def evaluate(
  state: TrainState,
  data: Mnist1dData | CifarData,
  par: Parallel,
  eval_fn: Callable[..., dict[str, jax.Array]],
) -> dict[str, float]:
  """Loss and accuracy on ``config.eval_split`` (batches sharded over the devices)."""
  sums = None
  for batch in data.eval_batches():
    out = eval_fn(state, jax.device_put(batch, NamedSharding(par.mesh, P(AXIS))))
    sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
  sums = jax.device_get(sums)
  count = max(float(sums["count"]), 1.0)
  return {"eval_loss": float(sums["loss"]) / count, "eval_accuracy": float(sums["correct"]) / count}


def checkpoint_manager(workdir: Path, config: configs_lib.Config) -> ocp.CheckpointManager:
  """Orbax manager of ``workdir/checkpoints`` keeping the last ``keep_checkpoints``."""
  options = ocp.CheckpointManagerOptions(max_to_keep=config.keep_checkpoints, create=True)
  return ocp.CheckpointManager(workdir.absolute() / "checkpoints", options=options)


def _checkpoint_tree(
  state: TrainState, seed: int, global_batch: int, num_train: int, wall_time: float
) -> dict[str, Any]:
  """What a checkpoint holds: the state and where the data stream stands."""
  # The stream is a function of (seed, epoch), so its position after `step` updates is all
  # that is needed to continue the same sequence of batches (see global_batches).
  epoch, offset = divmod(int(state.step) * global_batch, num_train)
  return {
    "state": state,
    "data": {
      "seed": np.array(seed, np.int64),
      "epoch": np.array(epoch, np.int64),
      "example_in_epoch": np.array(offset, np.int64),
    },
    "wall_time": np.array(wall_time, np.float64),
  }


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


def validate_config(config: configs_lib.Config) -> None:
  """Raises ValueError naming the valid choices for every unknown name in ``config``."""
  choices = {
    "optimizer": OPTIMIZERS,
    "warmup": WARMUPS,
    "parallel": PARALLEL,
    "dataset": DATASETS,
    "dtype": tuple(DTYPES),
    "grouping": tuple(GROUPINGS),
    "rng_impl": tuple(RNG_IMPLS),
    "eval_split": ("test", "validation"),
    "model": ("cnn1d", "resnet18"),
  }
  for key, valid in choices.items():
    value = getattr(config, key)
    if (value.lower() if key == "model" else value) not in valid:
      raise ConfigError(f"Unknown {key} {value!r}; valid {key}s: {', '.join(valid)}.")


def run_length(config: configs_lib.Config, num_train: int, layout: BatchLayout) -> tuple[int, int]:
  """Updates of the run and updates between evaluations.

  Args:
    config: uses ``num_steps`` (if > 0) or ``num_epochs``, and ``eval_every``.
    num_train: training examples.
    layout: the batch layout.

  Returns:
    ``(total_steps, eval_every)``: ``num_epochs`` epochs are ``num_epochs x num_train``
    examples (rounded down to whole updates); evaluation defaults to about once an epoch.
  """
  per_epoch = num_train / layout.global_batch
  total = config.num_steps if config.num_steps > 0 else int(config.num_epochs * per_epoch)
  every = config.eval_every if config.eval_every > 0 else max(1, round(per_epoch))
  return max(total, 1), every


def _write_config(workdir: Path, record: dict[str, Any], resuming: bool) -> None:
  """Writes ``config.json``; warns when a resumed run's configuration changed."""
  path = workdir / "config.json"
  if resuming and path.exists():
    old = json.loads(path.read_text())
    changed = sorted(k for k, v in record.items() if k != "progress_bar" and old.get(k) != v)
    if changed:
      log.warning(
        "Resuming with a changed configuration (%s): the result will differ "
        "from an uninterrupted run.",
        ", ".join(changed),
      )
  path.write_text(json.dumps(record, indent=2))


def train_and_evaluate(config: configs_lib.Config, workdir: str | Path) -> TrainState:
  """Trains (resuming from ``workdir`` if it holds a checkpoint) and evaluates.

  Args:
    config: the run's configuration.
    workdir: directory for ``config.json``, ``metrics.jsonl`` and ``checkpoints/``.

  Returns:
    The final train state (replicated on the devices' mesh).
  """
  validate_config(config)
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  layout = batch_layout(config, jax.local_device_count())
  s, global_batch = layout.num_samples, layout.global_batch
  data = create_dataset(config, layout)
  total_steps, eval_every = run_length(config, data.num_train, layout)
  log.info(
    "Global batch %d = %d devices x %d micro-batches x %d examples (S=%d); %d "
    "updates, %.2f per epoch; %s.",
    global_batch,
    layout.num_devices,
    layout.micro_batches,
    layout.per_worker_batch,
    s,
    total_steps,
    data.num_train / global_batch,
    config.parallel,
  )

  model = create_model(config, data.num_classes)
  tx, needs_stats = create_optimizer(config, s, total_steps)
  par = make_parallel(config, layout, model, tx, needs_stats)
  rng = jax.random.key(config.seed, impl=RNG_IMPLS[config.rng_impl])
  state = par.on_mesh(create_train_state(rng, model, tx, data.input_shape))
  names = layer_names(state.params)

  # Resume from the last checkpoint, if any.
  wall_offset = 0.0
  manager = checkpoint_manager(workdir, config) if config.checkpoint_every > 0 else None
  if manager is not None and manager.latest_step() is not None:
    template = _checkpoint_tree(state, config.seed, global_batch, data.num_train, 0.0)
    restored = manager.restore(manager.latest_step(), args=ocp.args.StandardRestore(template))
    if int(restored["data"]["seed"]) != config.seed:
      raise ConfigError(
        f"The checkpoint in {workdir} was written with seed "
        f"{int(restored['data']['seed'])}, not {config.seed}."
      )
    state, wall_offset = restored["state"], float(restored["wall_time"])
    log.info(
      "Resumed from checkpoint at step %d (epoch %d, example %d).",
      int(state.step),
      int(restored["data"]["epoch"]),
      int(restored["data"]["example_in_epoch"]),
    )
  start_step = int(state.step)
  _write_config(
    workdir,
    {
      **dataclasses.asdict(config),
      "layout": {**dataclasses.asdict(layout), "num_samples": s, "global_batch": global_batch},
      "total_steps": total_steps,
      "num_train": data.num_train,
    },
    resuming=start_step > 0,
  )
  writer = MetricsWriter(workdir / "metrics.jsonl", start_step)
  eval_fn = _jitted_eval(model)

  def record(step: int, kind: str, host_state: TrainState) -> dict[str, Any]:
    """A metrics record; train loss and accuracy average the updates since the last."""
    window = jax.device_get(train_metrics)
    mean = lambda k: float(np.mean([np.mean(m[k]) for m in window])) if window else None
    rec = {
      "type": kind,
      "iteration": step,
      "epoch": step * global_batch / data.num_train,
      "base_steps": step * s,
      "wall_time": wall_offset + time.perf_counter() - t0,
      "train_loss": mean("loss"),
      "train_accuracy": mean("accuracy"),
    }
    if needs_stats:
      rec.update(diagnostics_record(host_state.opt_state, names))
    return rec

  # The training loop.
  device_state = par.to_device(state)
  batches = global_batches(data, global_batch, start_step)
  train_metrics: list[dict[str, jax.Array]] = []
  t0 = time.perf_counter()
  bar = tqdm.tqdm(
    range(start_step, total_steps),
    initial=start_step,
    total=total_steps,
    desc=f"{config.optimizer} S={s}",
    unit="it",
    dynamic_ncols=True,
    disable=None if config.progress_bar else True,
  )  # None: off if not a tty
  for step in bar:
    device_state, metrics = par.step_fn(device_state, par.shard_batch(next(batches)))
    train_metrics.append(metrics)
    done = step + 1
    is_eval = done % eval_every == 0 or done == total_steps
    is_log = config.log_every > 0 and done % config.log_every == 0
    is_ckpt = manager is not None and (done % config.checkpoint_every == 0 or done == total_steps)
    if not (is_eval or is_log or is_ckpt):
      continue  # no host synchronisation: dispatch runs ahead
    host_state = par.from_device(device_state)
    if is_eval:
      rec = record(done, "eval", host_state)
      rec.update(evaluate(host_state, data, par, eval_fn), eval_split=config.eval_split)
      bar.set_postfix(loss=f"{rec['train_loss']:.3f}", acc=f"{rec['eval_accuracy']:.3f}")
      log.info(
        "step %d epoch %.2f: train loss %.4f, %s accuracy %.4f",
        done,
        rec["epoch"],
        rec["train_loss"],
        config.eval_split,
        rec["eval_accuracy"],
      )
    else:
      rec = record(done, "train", host_state) if is_log else None
    if rec is not None:
      writer.write(rec)
      train_metrics = []
    if is_ckpt:
      wall = wall_offset + time.perf_counter() - t0
      manager.save(
        done,
        args=ocp.args.StandardSave(
          _checkpoint_tree(host_state, config.seed, global_batch, data.num_train, wall)
        ),
      )
  bar.close()
  if manager is not None:
    manager.wait_until_finished()
    manager.close()
  return par.from_device(device_state)


def restore_checkpoint(workdir: str | Path, step: int | None = None) -> dict[str, Any]:
  """Reads a checkpoint of ``workdir`` without a template (e.g. to compare parameters).

  Args:
    workdir: the run's directory.
    step: the step to read; None reads the latest.

  Returns:
    The checkpoint as nested dicts of arrays (``'state'``, ``'data'``, ``'wall_time'``).
  """
  with ocp.CheckpointManager(Path(workdir).absolute() / "checkpoints") as manager:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"No checkpoint in {workdir}/checkpoints.")
    return manager.restore(step, args=ocp.args.StandardRestore())


def parse_args(argv: Sequence[str] | None = None) -> tuple[configs_lib.Config, str]:
  """Parses ``--config NAME --set key=value ... --workdir DIR``."""
  parser = argparse.ArgumentParser(
    prog="python -m examples.train",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog="Configs: "
    + ", ".join(configs_lib.available_configs())
    + ". Keys: "
    + ", ".join(f.name for f in dataclasses.fields(configs_lib.Config))
    + ".",
  )
  parser.add_argument(
    "--config",
    default="default",
    help="config module of examples/configs or a .py path (default: default)",
  )
  parser.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="override a config field (repeatable), e.g. --set batch_scale=16",
  )
  parser.add_argument("--workdir", required=True, help="directory for metrics and checkpoints")
  parser.add_argument(
    "--data_dir", help="TFDS data_dir with the prepared CIFAR (same as --set data_dir=DIR)"
  )
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
  log.addHandler(handler)
  log.setLevel(logging.INFO)
  log.propagate = False
  config, workdir = parse_args(argv)
  try:
    # Log lines go above the progress bar instead of through it.
    with tqdm.contrib.logging.logging_redirect_tqdm():
      train_and_evaluate(config, workdir)
  except (ConfigError, FileNotFoundError) as e:
    # Configuration and data problems: the message says what to change; no traceback.
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  main()
