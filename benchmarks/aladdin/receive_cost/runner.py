"""Measures what one ALADDIN server message costs against an ``optax.sgd`` step (see the
package's docstring), on ResNet-50's and a small MLP's trees."""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import driver, harness
from benchmarks.aladdin.receive_cost.grid import ReceiveCost
from optax_lena import aladdin as al


def resnet50_shapes(num_classes: int = 10) -> dict[str, tuple[int, ...]]:
  """Parameter shapes of a ResNet-50 (bottleneck blocks 3-4-6-3, batch norm scale and bias)."""
  shapes: dict[str, tuple[int, ...]] = {}

  def conv_bn(name: str, k: int, cin: int, cout: int) -> None:
    shapes[f"{name}/kernel"] = (k, k, cin, cout)
    shapes[f"{name}/bn_scale"] = (cout,)
    shapes[f"{name}/bn_bias"] = (cout,)

  conv_bn("stem", 7, 3, 64)
  cin = 64
  for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512), strict=True)):
    for b in range(blocks):
      name = f"stage{stage}/block{b}"
      conv_bn(f"{name}/conv1", 1, cin, width)
      conv_bn(f"{name}/conv2", 3, width, width)
      conv_bn(f"{name}/conv3", 1, width, 4 * width)
      if b == 0:
        conv_bn(f"{name}/proj", 1, cin, 4 * width)
      cin = 4 * width
  shapes["fc/kernel"] = (cin, num_classes)
  shapes["fc/bias"] = (num_classes,)
  return shapes


def mlp_shapes() -> dict[str, tuple[int, ...]]:
  """A small MLP's parameter shapes (0.1 M parameters, 6 leaves)."""
  return {"l0/w": (256, 256), "l0/b": (256,), "l1/w": (256, 128), "l1/b": (128,),
          "l2/w": (128, 10), "l2/b": (10,)}  # fmt: skip


def make_tree(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, jax.Array]:
  """A tree of ``shapes`` with small normal entries drawn from ``seed``."""
  keys = jax.random.split(jax.random.key(seed), len(shapes))
  return {
    name: 0.01 * jax.random.normal(k, shape, jnp.float32)
    for k, (name, shape) in zip(keys, shapes.items(), strict=True)
  }


def block(tree):
  """``tree`` once every array of it is computed."""
  jax.tree.map(lambda x: x.block_until_ready(), tree)
  return tree


def measure(shapes, repeats: int, period: int) -> dict[str, tuple[float, float]]:
  """(best, median) seconds per call of each candidate, measured interleaved."""
  params = make_tree(shapes, 0)
  grads = make_tree(shapes, 1)
  flat_grads = jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(grads)])
  tx = optax.sgd(0.1)
  server = al.parameter_server(2, optax.sgd(0.1), period=period)

  def sgd_step(params, opt_state, grads):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  def accumulate_only(grad_sum, grads):
    return jax.tree.map(jnp.add, grad_sum, grads)

  def serve_verified(state, message, worker):
    grads, verdict = message  # the sender's verdict, computed in its own step
    return server.serve(state, grads, worker, verdict)

  copy = functools.partial(jax.tree.map, jnp.copy)
  worker = jnp.int32(0)
  flat_params = jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(params)])
  # The Ray shard's own compiled call: one period of one worker's messages, folded.
  fold = (jnp.broadcast_to(flat_grads, (period, flat_grads.size)), jnp.ones([period], bool))
  # name -> (jitted function, its donated state, the message, whether it is a server)
  candidates: dict[str, tuple[Any, Any, Any, bool]] = {
    "sgd": (jax.jit(sgd_step, donate_argnums=(0, 1)), None, grads, False),
    "accumulate_only": (
      jax.jit(accumulate_only, donate_argnums=(0,)),
      jax.tree.map(jnp.zeros_like, params),
      grads,
      False,
    ),
    "check_only": (jax.jit(al.all_finite), None, grads, False),
    "receive": (
      jax.jit(server.receive, donate_argnums=(0,)),
      server.init(copy(params)),
      grads,
      True,
    ),
    "serve": (jax.jit(server.serve, donate_argnums=(0,)), server.init(copy(params)), grads, True),
    "serve_flat": (
      jax.jit(server.serve, donate_argnums=(0,)),
      server.init(jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(params)])),
      flat_grads,
      True,
    ),
    "serve_flat_verified": (
      jax.jit(serve_verified, donate_argnums=(0,)),
      server.init(jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(params)])),
      (flat_grads, jnp.asarray(True)),
      True,
    ),
  }
  for name, recheck in (("shard_fold", False), ("shard_fold_recheck", True)):
    receive = al.folded_receive(server, period, recheck=recheck)
    candidates[name] = (
      jax.jit(lambda state, msgs, r=receive: r(state, *msgs, worker), donate_argnums=(0,)),
      server.init(jnp.copy(flat_params)),
      fold,
      False,
    )
  sgd_state = (copy(params), tx.init(params))
  states = {name: c[1] for name, c in candidates.items()}
  states["sgd"] = sgd_state
  times: dict[str, list[float]] = {}

  def timed(fn, *args):
    start = time.perf_counter()
    out = block(fn(*args))
    return out, time.perf_counter() - start

  for rnd in range(repeats + 2):  # two warm-up rounds
    record = rnd >= 2
    for name, (fn, _, message, is_server) in candidates.items():
      # A server sees one period of one worker per round: k = period - 1 triggers.
      for k in range(period if is_server else 1):
        key = f"{name}[{k}]" if is_server else name
        if name == "sgd":
          states[name], t = timed(fn, *states[name], message)
        elif name == "check_only":
          _, t = timed(fn, message)
        elif is_server:
          out, t = timed(fn, states[name], message, worker)
          states[name] = out[0]
          assert bool(out[1] if name != "receive" else out[1].ready) == (k == period - 1)
        elif name.startswith("shard_fold"):
          out, t = timed(fn, states[name], message)
          states[name] = out[0]
          assert int(out[1]) == 1  # the period's last message triggered
          t /= period  # per message
        else:
          states[name], t = timed(fn, states[name], message)
        if record:
          times.setdefault(key, []).append(t)
  return {name: (float(np.min(ts)), float(np.median(ts))) for name, ts in times.items()}


def rows(measured: dict[str, tuple[float, float]], period: int) -> list[dict[str, Any]]:
  """The report's rows: each candidate's (best, median) seconds per message and their ratios to
  the ``optax.sgd`` step's."""
  out: list[dict[str, Any]] = []
  b0, m0 = measured["sgd"]

  def row(what: str, best: float, median: float) -> None:
    out.append(
      {"what": what, "best_s": best, "median_s": median, "best": best / b0, "median": median / m0}
    )

  row("optax.sgd step (update + apply_updates)", *measured["sgd"])
  for variant in ("receive", "serve", "serve_flat", "serve_flat_verified"):
    per = [measured[f"{variant}[{k}]"] for k in range(period)]
    if period > 1:
      non_trigger = [float(np.median([p[i] for p in per[:-1]])) for i in range(2)]
      row(f"{variant}: non-trigger message", *non_trigger)
    row(f"{variant}: trigger message", *per[-1])
    row(
      f"{variant}: amortised over {period} messages",
      *(float(np.mean([p[i] for p in per])) for i in range(2)),
    )
  row("Ray shard's call, one period folded: per message", *measured["shard_fold"])
  row("  the same with recheck_messages=True", *measured["shard_fold_recheck"])
  row("accumulate_only (g~ += g, the floor)", *measured["accumulate_only"])
  row("check_only (the finiteness check alone)", *measured["check_only"])
  return [{k: float(v) if k != "what" else v for k, v in r.items()} for r in out]


def tree_result(label: str, shapes, repeats: int, period: int) -> dict[str, Any]:
  """One tree measured: its size and its rows."""
  n_params = sum(int(np.prod(s)) for s in shapes.values())
  measured = measure(shapes, repeats, period)
  return {
    "tree": label,
    "params": n_params,
    "leaves": len(shapes),
    "period": period,
    "rows": rows(measured, period),
  }


def lines(tree: dict[str, Any]) -> list[str]:
  """The printed lines of one measured tree: each candidate's times and ratios."""
  out = [
    f"{tree['tree']}: {tree['params'] / 1e6:.2f} M params, {tree['leaves']} leaves, "
    f"period {tree['period']}",
    f"  {'':48s} {'best':>9s} {'ratio':>6s}  {'median':>9s} {'ratio':>6s}",
  ]
  for r in tree["rows"]:
    out.append(
      f"  {r['what']:48s} {r['best_s'] * 1e3:7.3f}ms {r['best']:5.2f}x  "
      f"{r['median_s'] * 1e3:7.3f}ms {r['median']:5.2f}x"
    )
  return out


def run(cell: driver.Measurement, setup: ReceiveCost, context: driver.Context) -> dict[str, Any]:
  """Both trees measured (their lines printed as they finish)."""
  del cell, context
  print(f"jax {jax.__version__}, optax {optax.__version__}, device {jax.devices()[0]}")
  trees = []
  for label, shapes in (("ResNet-50 (CIFAR-10)", resnet50_shapes()), ("MLP", mlp_shapes())):
    trees.append(tree_result(label, shapes, setup.repeats, setup.period))
    print("\n".join(lines(trees[-1])), flush=True)
  return {
    "recorded": harness.recorded(),
    "machine": harness.machine_info(),
    "repeats": setup.repeats,
    "trees": trees,
  }
