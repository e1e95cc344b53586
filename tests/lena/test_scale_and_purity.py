"""Scale and purity: trees of many leaves, real Flax models, frozen layers, empty trees, and no
hidden state (one transformation in several jitted functions, under pmap and jit at once).

Complements test_reliability.py (non-finite steps, Optax wrappers, precision).
"""

import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_lena as ol
from tests.lena.small_model import (
  NUM_DEVICES,
  SCHEDULE,
  THETA,
  assert_trees_bitwise_equal,
  small_loss,
  small_params,
  stacked_grads,
  worker_batches,
)

# -- 4. scale and shape -------------------------------------------------------------------------


def many_leaf_tree(num_blocks, width=4):
  """A transformer-like tree: 10 leaves per block (attention q/k/v/o kernels, MLP, norms)."""

  def block():
    dense = lambda: {"kernel": jnp.zeros((width, width)), "bias": jnp.zeros(width)}
    return {
      "attn": {
        "q": {"kernel": jnp.zeros((width, width))},
        "k": {"kernel": jnp.zeros((width, width))},
        "v": {"kernel": jnp.zeros((width, width))},
        "o": {"kernel": jnp.zeros((width, width))},
      },
      "mlp_in": dense(),
      "mlp_out": dense(),
      "norm": {"scale": jnp.ones(width), "bias": jnp.zeros(width)},
    }

  return {f"block_{i:04d}": block() for i in range(num_blocks)}


def synthetic_stats(params, s=8, seed=0):
  rng = np.random.RandomState(seed)
  leaves, treedef = jax.tree.flatten(params)
  grads = [jnp.asarray(rng.randn(*p.shape), jnp.float32) for p in leaves]
  top = [np.float32(10 + 10 * rng.rand()) for _ in leaves]
  bot = [np.float32(1 + rng.rand()) for _ in leaves]
  unflat = functools.partial(jax.tree.unflatten, treedef)
  return unflat(grads), ol.GradStats(unflat(top), s, unflat(bot))


def compiled_update_size(tx, params):
  grads, stats = synthetic_stats(params)
  compiled = jax.jit(tx.update).lower(grads, tx.init(params), params, grad_stats=stats).compile()
  return compiled.as_text().count("\n")


@pytest.mark.parametrize(
  "make",
  [
    lambda: ol.lena(0.1, weight_decay=5e-4, warmup_threshold=50.0),
    lambda: ol.adascale(0.1, warmup_steps=100),
  ],
)
def test_compiled_update_grows_linearly_with_the_number_of_leaves(make):
  """A scalar that depends on every leaf (the finiteness check, AdaScale's global ratio) must
  not be duplicated into every leaf's fused kernel: compiled size O(leaves), not O(leaves^2)."""
  small = compiled_update_size(make(), many_leaf_tree(2))  # 20 leaves
  large = compiled_update_size(make(), many_leaf_tree(8))  # 80 leaves
  assert large / small < 6.0, (small, large)  # 4x the leaves; quadratic growth gives ~16x


@pytest.mark.slow
@pytest.mark.skipif(
  not os.environ.get("OPTAX_LENA_BIG_TREE"),
  reason="minutes of XLA CPU compile time: set OPTAX_LENA_BIG_TREE=1",
)
def test_5000_leaf_tree_compiles_and_runs_one_step():
  params = many_leaf_tree(500)
  assert len(jax.tree.leaves(params)) == 5000
  tx = ol.lena(0.1, weight_decay=5e-4, warmup_threshold=50.0)
  grads, stats = synthetic_stats(params)
  state = tx.init(params)
  start = time.perf_counter()
  compiled = jax.jit(tx.update).lower(grads, state, params, grad_stats=stats).compile()
  compile_s = time.perf_counter() - start
  updates, state = compiled(grads, state, params, grad_stats=stats)
  print(f"5000 leaves: compile {compile_s:.1f} s")
  assert all(np.all(np.isfinite(u)) for u in jax.tree.leaves(updates))
  assert int(ol.diagnostics(state)["num_updates"]) == 1
  assert compile_s < 60.0


def test_real_flax_model_grouped_by_module():
  nn = pytest.importorskip("flax.linen")

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = nn.LayerNorm()(nn.Dense(8)(x))
      return x + nn.Dense(x.shape[-1])(nn.relu(h))

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.Dense(6)(x)
      x = Block()(Block()(x))
      return nn.Dense(1)(x)

  model = Model()
  rng = np.random.RandomState(0)
  x = jnp.asarray(rng.randn(8, 5, 3), jnp.float32)  # 8 workers x 5 examples
  y = jnp.asarray(rng.randn(8, 5, 1), jnp.float32)
  params = jax.jit(model.init)(jax.random.key(0), x[0])["params"]
  loss = lambda p, xb, yb: jnp.mean((model.apply({"params": p}, xb) - yb) ** 2)
  txs = [
    ol.lena(0.05, grouping=grouping, warmup_threshold=THETA, eps=0.0)
    for grouping in ("module", ol.group_by_module)
  ]

  @jax.jit
  def train(params):
    states = []
    for tx in txs:
      p, state = params, tx.init(params)
      for _ in range(2):
        mean, stats = ol.stacked_grad_stats(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(p, x, y))
        updates, state = tx.update(mean, state, p, grad_stats=stats)
        p = optax.apply_updates(p, updates)
      states.append(state)
    return states

  states = train(params)
  assert_trees_bitwise_equal(states[0], states[1])
  d = ol.diagnostics(states[0], params)
  rs = next(s for s in states[0].inner_state if isinstance(s, ol.GainRatioState))
  top = ol.per_layer_tree(rs.sq_norm_mean_avg, params)
  bot = ol.per_layer_tree(rs.mean_grad_sq_norm_avg, params)
  modules = []

  def visit(path, node):
    if all(not isinstance(v, dict) for v in node.values()):
      modules.append((path, node))
    else:
      for key, child in node.items():
        visit((*path, key), child)

  visit((), d["gain_ratio"])
  assert len(modules) == 8  # Dense_0, Dense_1 and 2 x (Dense_0, LayerNorm_0, Dense_1)
  for path, ratios in modules:
    sub = lambda tree, path=path: functools.reduce(lambda t, k: t[k], path, tree)
    values = {float(v) for v in ratios.values()}
    assert len(values) == 1, path  # kernel and bias (scale and bias) share one ratio
    progress = {float(v) for v in sub(d["warmup_progress"]).values()}
    assert len(progress) == 1, path
    expected = np.clip(
      sum(float(v) for v in sub(top).values()) / sum(float(v) for v in sub(bot).values()), 1.0, 8.0
    )
    np.testing.assert_allclose(values.pop(), expected, rtol=1e-5, err_msg=str(path))


def test_frozen_layers_give_ratio_one_over_many_steps():
  params = {"frozen": jnp.ones((3,)), "live": jnp.ones((4,)), "also_frozen": jnp.ones((2,))}
  rng = np.random.RandomState(0)

  def grads(t):
    return {
      "frozen": jnp.zeros((8, 3)),
      "also_frozen": jnp.zeros((8, 2)),
      "live": jnp.asarray(rng.randn(8, 4) + 0.1 * t, jnp.float32),
    }

  labels = {"frozen": "off", "live": "on", "also_frozen": "on"}
  for eps in (1e-6, 0.0):
    txs = {
      "plain": ol.lena(0.1, eps=eps, warmup_threshold=10.0),
      "masked": optax.masked(
        ol.lena(0.1, eps=eps, warmup_threshold=10.0),
        {"frozen": False, "live": True, "also_frozen": True},
      ),
      "multi": optax.multi_transform(
        {"on": ol.lena(0.1, eps=eps, warmup_threshold=10.0), "off": optax.set_to_zero()}, labels
      ),
    }
    for name, tx in txs.items():
      state = tx.init(params)
      update = jax.jit(tx.update)
      for t in range(4):
        mean, stats = ol.stacked_grad_stats(grads(t))
        updates, state = update(mean, state, params, grad_stats=stats)
        assert all(np.all(np.isfinite(u)) for u in jax.tree.leaves(updates)), name
        assert np.all(updates["also_frozen"] == 0), name
      inner = {
        "plain": state,
        "masked": getattr(state, "inner_state", None),
        "multi": getattr(state, "inner_states", {}).get("on"),
      }[name]
      inner = getattr(inner, "inner_state", inner)  # MaskedState of multi_transform
      d = ol.diagnostics(inner)
      ratio, progress = np.asarray(d["gain_ratio"]), np.asarray(d["warmup_progress"])
      assert np.all(np.isfinite(ratio)) and np.all(np.isfinite(progress)), name
      # leaves in tree order: also_frozen, (frozen,) live; zero gradient -> ratio 1 -> P = t
      assert ratio[0] == 1.0 and progress[0] == 4.0, (name, eps)
      assert 1.0 < ratio[-1] <= 8.0, (name, eps)
      assert not np.any(np.isnan(np.asarray(d["noise_scale"]))), name


def test_nan_in_a_frozen_layer_does_not_skip_the_live_layers():
  params = {"frozen": jnp.ones((3,)), "live": jnp.ones((4,))}
  rng = np.random.RandomState(0)
  g = {"frozen": jnp.full((8, 3), jnp.nan), "live": jnp.asarray(rng.randn(8, 4), jnp.float32)}
  mean, stats = ol.stacked_grad_stats(g)
  tx = optax.multi_transform(
    {"on": ol.lena(0.1), "off": optax.set_to_zero()}, {"frozen": "off", "live": "on"}
  )
  updates, state = jax.jit(tx.update)(mean, tx.init(params), params, grad_stats=stats)
  assert np.all(updates["frozen"] == 0)
  assert np.all(np.isfinite(updates["live"])) and np.any(updates["live"] != 0)
  assert int(ol.diagnostics(state.inner_states["on"].inner_state)["num_skipped_steps"]) == 0


def test_empty_parameter_tree_everywhere():
  empty_stats = ol.GradStats({}, 8, {})
  for tx in (
    ol.adascale(0.1, warmup_steps=10),
    ol.linear_scaling(0.1, warmup_threshold=3.0),
    ol.lena(optax.constant_schedule(0.1), clock="samples", grouping="module"),
    ol.lena(0.1, eps=0.0),
  ):
    state = tx.init({})
    updates, state = jax.jit(tx.update)({}, state, {}, grad_stats=empty_stats)
    updates, state = tx.update({}, state, {}, grad_stats=ol.GradStats({}, 8))  # no bot
    assert updates == {}
    d = ol.diagnostics(state, {})
    assert d["gain_ratio"] == {} and float(d["global_ratio"]) == 1.0
    assert int(d["num_updates"]) == 2 and int(d["num_skipped_steps"]) == 0
  loss, grads, stats = ol.accumulate_grad_stats(lambda p, b: jnp.sum(b), {}, jnp.ones((3, 2)))
  assert grads == {} and stats.num_samples == 3 and float(loss) == 2.0
  reduced = jax.pmap(lambda x: ol.all_reduce_grad_stats({}, "i")[1].num_samples * x, axis_name="i")(
    jnp.ones(NUM_DEVICES)
  )
  np.testing.assert_array_equal(reduced, NUM_DEVICES)


# -- 6. no hidden state -------------------------------------------------------------------------


def test_one_transformation_in_two_jitted_functions_and_eagerly():
  params0 = small_params()
  tx = ol.lena(SCHEDULE, weight_decay=1e-3, warmup_threshold=THETA)

  def apply_step(params, state, mean, stats):
    updates, state = tx.update(mean, state, params, grad_stats=stats)
    return optax.apply_updates(params, updates), state

  update_only = jax.jit(tx.update)
  full_step = jax.jit(apply_step)
  inputs = [ol.stacked_grad_stats(stacked_grads(params0, t, s=8)) for t in range(6)]

  def run_update_only(tx_update, count):
    p, s = params0, tx.init(params0)
    for mean, stats in inputs[:count]:
      u, s = tx_update(mean, s, p, grad_stats=stats)
      p = optax.apply_updates(p, u)
    return p, s

  alone = run_update_only(update_only, 6)
  # Interleave: the same object drives a second jitted function and eager calls in between.
  p, s = params0, tx.init(params0)
  q, r = params0, tx.init(params0)
  for t, (mean, stats) in enumerate(inputs):
    u, s = update_only(mean, s, p, grad_stats=stats)
    p = optax.apply_updates(p, u)
    q, r = full_step(q, r, mean, stats)
    if t == 2:
      tx.update(mean, tx.init(params0), params0, grad_stats=stats)  # eager, result discarded
  assert_trees_bitwise_equal((p, s), alone)
  for a, b in zip(jax.tree.leaves((q, r)), jax.tree.leaves(alone), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
  # A fresh object with the same arguments, and the same call repeated, agree bitwise.
  tx2 = ol.lena(SCHEDULE, weight_decay=1e-3, warmup_threshold=THETA)
  assert_trees_bitwise_equal(tx.init(params0), tx2.init(params0))
  mean, stats = inputs[0]
  first = update_only(mean, alone[1], alone[0], grad_stats=stats)
  again = jax.jit(tx2.update)(mean, alone[1], alone[0], grad_stats=stats)
  assert_trees_bitwise_equal(first, again)


def test_one_transformation_under_pmap_and_jit_at_once():
  params0 = small_params()
  tx = ol.adascale(0.05, weight_decay=1e-3, warmup_threshold=THETA)
  assert jax.device_count() == NUM_DEVICES

  @functools.partial(jax.pmap, axis_name="batch", in_axes=(None, None, 0, 0))
  def pmap_step(params, state, x, y):
    grads = jax.grad(small_loss)(params, x, y)
    grads, stats = ol.all_reduce_grad_stats(grads, "batch")
    updates, state = tx.update(grads, state, params, grad_stats=stats)
    return optax.apply_updates(params, updates), state

  @jax.jit
  def jit_step(params, state, x, y):
    stacked = jax.vmap(jax.grad(small_loss), in_axes=(None, 0, 0))(params, x, y)
    mean, stats = ol.stacked_grad_stats(stacked)
    updates, state = tx.update(mean, state, params, grad_stats=stats)
    return optax.apply_updates(params, updates), state

  y, x = worker_batches(np.random.RandomState(11), 5, s=NUM_DEVICES)
  first = lambda tree: jax.tree.map(lambda a: a[0], tree)

  def run(which):
    out = {}
    if "pmap" in which:
      out["pmap"] = (params0, tx.init(params0))
    if "jit" in which:
      out["jit"] = (params0, tx.init(params0))
    # Each step is waited for: "at once" means one transformation object in both programs, not
    # concurrent executions. With the pmap's 8 CPU participants dispatched asynchronously next
    # to other work, XLA:CPU's all-reduce rendezvous can wait for a participant that never
    # starts on a loaded machine, and aborts the process after 40 s (reproduced under load: 1
    # run in 5 with three CPU-bound processes beside it).
    for t in range(5):
      if "pmap" in out:
        out["pmap"] = jax.block_until_ready(first(pmap_step(*out["pmap"], x[t], y[t])))
      if "jit" in out:
        out["jit"] = jax.block_until_ready(jit_step(*out["jit"], x[t], y[t]))
    return out

  together = run(("pmap", "jit"))
  pmap_alone, jit_alone = run(("pmap",))["pmap"], run(("jit",))["jit"]
  assert_trees_bitwise_equal(together["pmap"], pmap_alone)
  assert_trees_bitwise_equal(together["jit"], jit_alone)
  for a, b in zip(jax.tree.leaves(pmap_alone), jax.tree.leaves(jit_alone), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert int(ol.diagnostics(pmap_alone[1])["num_samples"]) == NUM_DEVICES
