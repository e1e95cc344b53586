"""Sections (c) and (d): a data-parallel step in pmap and shard_map, and whole training steps."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import optax_lena as ol
from benchmarks.overhead.common import (
  AXIS,
  Row,
  Stepper,
  apply_update,
  fresh,
  log,
  log_rows,
  optimizers,
  rows_from_times,
  time_interleaved,
)
from benchmarks.overhead.trees import materialize, tree_info
from examples import losses

PyTree = Any


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
  model: Any
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
        loss = losses.cross_entropy(logits, y)
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
