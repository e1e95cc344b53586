"""Statistics and updates agree across the stacked, pmap, shard_map, GSPMD and accumulation paths.

Runs on 8 simulated CPU devices (see conftest.py).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import optax_lena as ol

NUM_DEVICES = 8


def auto_mesh(shape, names):
  """A mesh in JAX's automatic-sharding mode (shard_map and GSPMD, as most users run them)."""
  return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def make_params():
  return {
    "conv": {"kernel": jnp.full((3, 3, 2, 4), 0.1), "bias": jnp.zeros((4,))},
    "dense": {"kernel": jnp.full((16, 5), -0.05), "bias": jnp.full((5,), 0.2)},
  }


def make_worker_grads(s, seed=0):
  """Per-worker gradients with different signal and noise per leaf."""
  rng = np.random.RandomState(seed)
  params = make_params()
  signal = {"conv": {"kernel": 1.0, "bias": 0.0}, "dense": {"kernel": 0.1, "bias": 3.0}}
  return jax.tree.map(
    lambda p, mu: jnp.asarray(mu + rng.randn(s, *p.shape), jnp.float32), params, signal
  )


def assert_stats_close(a, b, rtol=2e-6):
  assert a.num_samples == b.num_samples
  for x, y in zip(
    jax.tree.leaves((a.sq_norm_mean, a.mean_grad_sq_norm)),
    jax.tree.leaves((b.sq_norm_mean, b.mean_grad_sq_norm)),
    strict=True,
  ):
    np.testing.assert_allclose(x, y, rtol=rtol)


def test_stacked_stats_match_numpy_float64():
  grads = make_worker_grads(NUM_DEVICES)
  mean, stats = ol.stacked_grad_stats(grads)
  assert stats.num_samples == NUM_DEVICES
  for g, m, top, bot in zip(
    jax.tree.leaves(grads),
    jax.tree.leaves(mean),
    jax.tree.leaves(stats.sq_norm_mean),
    jax.tree.leaves(stats.mean_grad_sq_norm),
    strict=True,
  ):
    g64 = np.asarray(g, np.float64).reshape(NUM_DEVICES, -1)
    np.testing.assert_allclose(m, g64.mean(0).reshape(m.shape), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(top, np.mean(np.sum(g64**2, axis=1)), rtol=1e-6)
    np.testing.assert_allclose(bot, np.sum(g64.mean(0) ** 2), rtol=1e-5)
    assert top.dtype == jnp.float32 and bot.dtype == jnp.float32


def _one_lena_update(mean, stats):
  params = make_params()
  tx = ol.lena(0.1, weight_decay=5e-4, warmup_threshold=30.0)
  state = tx.init(params)
  updates, state = tx.update(mean, state, params, grad_stats=stats)
  return updates, ol.diagnostics(state)["lr_multiplier"]


def test_pmap_matches_stacked():
  grads = make_worker_grads(NUM_DEVICES)
  ref_mean, ref_stats = ol.stacked_grad_stats(grads)
  ref_updates, ref_mult = _one_lena_update(ref_mean, ref_stats)

  @functools.partial(jax.pmap, axis_name="batch")
  def step(local):
    mean, stats = ol.all_reduce_grad_stats(local, "batch")
    updates, mult = _one_lena_update(mean, stats)
    return mean, stats, updates, mult

  mean, stats, updates, mult = step(grads)
  first = lambda t: jax.tree.map(lambda x: x[0], t)
  # every replica holds the same result
  for x in jax.tree.leaves((mean, stats, updates)):
    np.testing.assert_array_equal(x, np.broadcast_to(x[0], x.shape))
  assert_stats_close(first(stats), ref_stats)
  for a, b in zip(jax.tree.leaves(first(updates)), jax.tree.leaves(ref_updates), strict=True):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-8)
  np.testing.assert_allclose(mult[0], ref_mult, rtol=2e-5)


def test_shard_map_with_tuple_axis_matches_stacked():
  grads = make_worker_grads(NUM_DEVICES)
  ref_mean, ref_stats = ol.stacked_grad_stats(grads)
  ref_updates, ref_mult = _one_lena_update(ref_mean, ref_stats)
  mesh = auto_mesh((2, 4), ("hosts", "gpus"))

  def step(local):
    local = jax.tree.map(lambda x: x[0], local)  # this worker's gradient
    mean, stats = ol.all_reduce_grad_stats(local, ("hosts", "gpus"))
    updates, mult = _one_lena_update(mean, stats)
    return stats, updates, mult

  sharded = jax.jit(
    jax.shard_map(step, mesh=mesh, in_specs=P(("hosts", "gpus")), out_specs=P(), check_vma=False)
  )
  stats, updates, mult = sharded(grads)
  assert stats.num_samples == NUM_DEVICES
  assert_stats_close(stats, ref_stats)
  for a, b in zip(jax.tree.leaves(updates), jax.tree.leaves(ref_updates), strict=True):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-8)
  np.testing.assert_allclose(mult, ref_mult, rtol=2e-5)


@pytest.mark.parametrize("with_local_stats", [False, True])
def test_packed_all_reduce_matches_per_leaf_and_float64(with_local_stats):
  """packed=True sends one buffer per dtype; every element is summed over the same workers, so
  the mean gradients and the per-worker squared norms equal the per-leaf all-reduce bitwise, in
  each leaf's own dtype and shape. ||mean||^2 is a reduction XLA compiles differently over a
  slice of the buffer than over a leaf of its own: equal to float32 rounding."""
  grads = make_worker_grads(NUM_DEVICES)
  grads["dense"]["bias"] = grads["dense"]["bias"].astype(jnp.bfloat16)  # a second dtype
  mesh = auto_mesh((NUM_DEVICES,), ("batch",))

  def reduce(packed):
    def step(local):
      local = jax.tree.map(lambda x: x[0], local)
      local_stats = None
      if with_local_stats:  # as from K = 2 identical micro-batches: S doubles
        sq = jax.tree.map(lambda x: jnp.sum(jnp.square(x.astype(jnp.float32))), local)
        local_stats = ol.GradStats(sq, 2)
      return ol.all_reduce_grad_stats(local, "batch", local_stats=local_stats, packed=packed)

    return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=P("batch"), out_specs=P()))(grads)

  (mean, stats), (mean_ref, stats_ref) = reduce(True), reduce(False)
  assert stats.num_samples == stats_ref.num_samples == NUM_DEVICES * (2 if with_local_stats else 1)
  exact, exact_ref = (mean, stats.sq_norm_mean), (mean_ref, stats_ref.sq_norm_mean)
  for a, b in zip(jax.tree.leaves(exact), jax.tree.leaves(exact_ref), strict=True):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)
  rounded = zip(
    jax.tree.leaves(stats.mean_grad_sq_norm),
    jax.tree.leaves(stats_ref.mean_grad_sq_norm),
    strict=True,
  )
  for a, b in rounded:
    assert a.dtype == b.dtype == jnp.float32
    np.testing.assert_allclose(a, b, rtol=2e-7)
  for g, m, top in zip(
    jax.tree.leaves(grads), jax.tree.leaves(mean), jax.tree.leaves(stats.sq_norm_mean), strict=True
  ):
    g64 = np.asarray(g, np.float64).reshape(NUM_DEVICES, -1)
    tol = 1e-2 if g.dtype == jnp.bfloat16 else 1e-6
    np.testing.assert_allclose(np.asarray(m, np.float64).ravel(), g64.mean(0), rtol=tol, atol=tol)
    np.testing.assert_allclose(top, np.mean(np.sum(g64**2, axis=1)), rtol=1e-6)


@pytest.mark.parametrize("packed", [False, True])
def test_aux_is_averaged_with_the_gradients_in_one_collective(packed):
  """``aux`` (a step's metrics, BatchNorm statistics) is ``lax.pmean``-ed over the same workers;
  packed, the whole step is ONE all-reduce of ONE buffer when every leaf has one dtype (what
  lets a survivor of a killed process report it instead of aborting in gloo)."""
  grads = make_worker_grads(NUM_DEVICES)
  rng = np.random.RandomState(3)
  aux = {"loss": jnp.asarray(rng.rand(NUM_DEVICES), jnp.float32)}
  aux["bn_mean"] = jnp.asarray(rng.randn(NUM_DEVICES, 7), jnp.float32)
  mesh = auto_mesh((NUM_DEVICES,), ("batch",))

  def step(local, local_aux):
    local, local_aux = jax.tree.map(lambda x: x[0], (local, local_aux))
    mean, stats, mean_aux = ol.all_reduce_grad_stats(local, "batch", packed=packed, aux=local_aux)
    return mean, stats, mean_aux, jax.lax.pmean(local_aux, "batch")

  fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=P("batch"), out_specs=P()))
  mean, stats, mean_aux, pmean_aux = fn(grads, aux)
  mean_ref, stats_ref = ol.stacked_grad_stats(grads)
  for a, b in zip(jax.tree.leaves(mean_aux), jax.tree.leaves(pmean_aux), strict=True):
    np.testing.assert_array_equal(a, b)
  for got, x in zip(jax.tree.leaves(mean_aux), jax.tree.leaves(aux), strict=True):
    np.testing.assert_allclose(got, np.asarray(x, np.float64).mean(0), rtol=1e-6)
  assert_stats_close(stats, stats_ref)
  for a, b in zip(jax.tree.leaves(mean), jax.tree.leaves(mean_ref), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  # Without the pmean written beside it for the comparison, the step's collectives:
  one = jax.jit(
    jax.shard_map(lambda g, a: step(g, a)[:3], mesh=mesh, in_specs=P("batch"), out_specs=P())
  )
  hlo = one.lower(grads, aux).compile().as_text()
  reduces = [line for line in hlo.splitlines() if " all-reduce(" in line]
  if packed:
    assert len(reduces) == 1 and reduces[0].count("f32[") == 1, reduces
  else:
    assert len(reduces) >= 1 and sum(line.count("f32[") for line in reduces) > 1, reduces


def test_gspmd_sharded_stacked_axis_matches_unsharded():
  grads = make_worker_grads(NUM_DEVICES)
  ref_updates, ref_mult = _one_lena_update(*ol.stacked_grad_stats(grads))
  mesh = auto_mesh((NUM_DEVICES,), ("workers",))
  sharded_grads = jax.device_put(grads, NamedSharding(mesh, P("workers")))
  assert len(jax.tree.leaves(sharded_grads)[0].sharding.device_set) == NUM_DEVICES
  updates, mult = jax.jit(lambda g: _one_lena_update(*ol.stacked_grad_stats(g)))(sharded_grads)
  for a, b in zip(jax.tree.leaves(updates), jax.tree.leaves(ref_updates), strict=True):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-8)
  np.testing.assert_allclose(mult, ref_mult, rtol=2e-5)


# -- accumulation over K sequential micro-batches ---------------------------------------------


def _loss(params, batch):
  x, y = batch
  pred = jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"]
  return jnp.mean((pred - y) ** 2)


def _mlp_params(din=6, hidden=32):
  rng = np.random.RandomState(1)
  return {
    "w1": jnp.asarray(rng.randn(din, hidden) * 0.3, jnp.float32),
    "b1": jnp.zeros((hidden,), jnp.float32),
    "w2": jnp.asarray(rng.randn(hidden, 1) * 0.3, jnp.float32),
  }


def _batches(k, b, din=6, seed=2):
  rng = np.random.RandomState(seed)
  x = rng.randn(k, b, din).astype(np.float32)
  y = np.sin(x.sum(-1, keepdims=True)).astype(np.float32)
  return jnp.asarray(x), jnp.asarray(y)


def test_accumulation_matches_stacked_per_micro_batch_grads():
  params, batches = _mlp_params(), _batches(5, 4)
  loss, mean, stats = jax.jit(ol.accumulate_grad_stats, static_argnums=0)(_loss, params, batches)
  stacked = jax.vmap(jax.grad(_loss), in_axes=(None, 0))(params, batches)
  ref_mean, ref_stats = ol.stacked_grad_stats(stacked)
  assert stats.num_samples == 5
  assert_stats_close(stats, ref_stats, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(mean), jax.tree.leaves(ref_mean), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(loss, jnp.mean(jax.vmap(_loss, (None, 0))(params, batches)), rtol=1e-6)


def test_accumulation_with_aux_averages_aux():
  params, batches = _mlp_params(), _batches(3, 4)
  loss_aux = lambda p, b: (_loss(p, b), {"sq": _loss(p, b) ** 2})
  (loss, aux), _, stats = ol.accumulate_grad_stats(loss_aux, params, batches, has_aux=True)
  per = jax.vmap(_loss, (None, 0))(params, batches)
  np.testing.assert_allclose(aux["sq"], jnp.mean(per**2), rtol=1e-6)
  np.testing.assert_allclose(loss, jnp.mean(per), rtol=1e-6)
  assert stats.num_samples == 3


def test_accumulation_memory_does_not_grow_with_micro_batches():
  params = _mlp_params(din=64, hidden=512)

  def temp_bytes(k):
    batches = _batches(k, 8, din=64)
    compiled = (
      jax.jit(ol.accumulate_grad_stats, static_argnums=0).lower(_loss, params, batches).compile()
    )
    return compiled.memory_analysis().temp_size_in_bytes

  small, large = temp_bytes(2), temp_bytes(64)
  # 64 stacked float32 copies of the gradients would be ~8.5 MB more.
  assert large <= small * 1.05 + 64 * 1024, (small, large)


def test_pmap_with_accumulation_composes_to_devices_times_k():
  k, b = 3, 4
  params = _mlp_params()
  x, y = _batches(NUM_DEVICES * k, b)
  per_device = (x.reshape(NUM_DEVICES, k, b, -1), y.reshape(NUM_DEVICES, k, b, 1))

  @functools.partial(jax.pmap, axis_name="d", in_axes=(None, 0))
  def step(params, batches):
    _, mean, stats = ol.accumulate_grad_stats(_loss, params, batches)
    return ol.all_reduce_grad_stats(mean, "d", local_stats=stats)

  mean, stats = step(params, per_device)
  stacked = jax.vmap(jax.grad(_loss), in_axes=(None, 0))(params, (x, y))
  ref_mean, ref_stats = ol.stacked_grad_stats(stacked)
  assert stats.num_samples == NUM_DEVICES * k
  assert_stats_close(jax.tree.map(lambda s: s[0], stats), ref_stats, rtol=1e-5)
  for a, r in zip(jax.tree.leaves(mean), jax.tree.leaves(ref_mean), strict=True):
    np.testing.assert_allclose(a[0], r, rtol=1e-5, atol=1e-7)


def test_vmap_of_accumulation_composes_with_stacked_stats():
  workers, k, b = 4, 3, 4
  params = _mlp_params()
  x, y = _batches(workers * k, b)
  grouped = (x.reshape(workers, k, b, -1), y.reshape(workers, k, b, 1))
  _, means, stats = jax.vmap(ol.accumulate_grad_stats, in_axes=(None, None, 0))(
    _loss, params, grouped
  )
  mean, combined = ol.stacked_grad_stats(means, stacked_stats=stats)
  ref_mean, ref_stats = ol.stacked_grad_stats(
    jax.vmap(jax.grad(_loss), in_axes=(None, 0))(params, (x, y))
  )
  assert combined.num_samples == workers * k
  np.testing.assert_allclose(
    jax.tree.leaves(combined.sq_norm_mean), jax.tree.leaves(ref_stats.sq_norm_mean), rtol=1e-5
  )
  for a, r in zip(jax.tree.leaves(mean), jax.tree.leaves(ref_mean), strict=True):
    np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-7)


def test_grad_stats_crosses_jit_and_pmap_boundaries():
  grads = make_worker_grads(NUM_DEVICES)
  _, stats = ol.stacked_grad_stats(grads)
  doubled = jax.jit(lambda s: jax.tree.map(lambda x: 2 * x, s))(stats)
  assert isinstance(doubled, ol.GradStats) and doubled.num_samples == NUM_DEVICES
  per_device = jax.tree.map(lambda x: jnp.stack([x, 3 * x]), stats)
  mapped = jax.pmap(lambda s: jax.tree.map(lambda x: 2 * x, s))(per_device)
  assert isinstance(mapped, ol.GradStats) and mapped.num_samples == NUM_DEVICES
  first = jax.tree.leaves(stats.sq_norm_mean)[0]
  np.testing.assert_allclose(
    jax.tree.leaves(mapped.sq_norm_mean)[0], [2 * first, 6 * first], rtol=1e-6
  )


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_gradients_give_float32_statistics(dtype):
  # Elements of a few hundred: squares exceed the float16 range (65504).
  grads = jax.tree.map(lambda g: 300.0 * g, make_worker_grads(NUM_DEVICES))
  low = jax.tree.map(lambda g: g.astype(dtype), grads)
  mean, stats = ol.stacked_grad_stats(low)
  _, ref = ol.stacked_grad_stats(jax.tree.map(lambda g: g.astype(jnp.float32), low))
  assert all(m.dtype == dtype for m in jax.tree.leaves(mean))
  assert all(np.isfinite(x) for x in jax.tree.leaves(stats.sq_norm_mean))
  np.testing.assert_allclose(
    jax.tree.leaves(stats.sq_norm_mean), jax.tree.leaves(ref.sq_norm_mean), rtol=1e-6
  )
  np.testing.assert_allclose(
    jax.tree.leaves(stats.mean_grad_sq_norm), jax.tree.leaves(ref.mean_grad_sq_norm), rtol=1e-6
  )


def test_lena_trains_inside_pmap_with_optax_update_loop():
  """A few real steps of the quickstart pattern: params replicated, state replicated."""
  params = _mlp_params()
  tx = ol.lena(0.05, weight_decay=5e-4, warmup_threshold=20.0)

  @functools.partial(jax.pmap, axis_name="batch", in_axes=(None, None, 0))
  def train_step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(_loss)(params, batch)
    grads, stats = ol.all_reduce_grad_stats(grads, "batch")
    updates, opt_state = tx.update(grads, opt_state, params, grad_stats=stats)
    return optax.apply_updates(params, updates), opt_state, jax.lax.pmean(loss, "batch")

  opt_state = tx.init(params)
  losses = []
  for i in range(15):
    batch = _batches(NUM_DEVICES, 16, seed=100 + i)
    new_params, new_state, loss = train_step(params, opt_state, batch)
    params = jax.tree.map(lambda x: x[0], new_params)
    opt_state = jax.tree.map(lambda x: x[0], new_state)
    losses.append(float(loss[0]))
  assert losses[-1] < losses[0]
  assert int(ol.diagnostics(opt_state)["num_updates"]) == 15


def test_shard_map_with_vma_checking_needs_varying_params():
  """shard_map's default check_vma=True: jax.grad w.r.t. replicated params returns gradients
  already summed over devices. That must raise, and pcast-ing the params must work, with
  accumulation too."""
  k, b = 2, 4
  params = _mlp_params()
  x, y = _batches(NUM_DEVICES * k, b)
  mesh = auto_mesh((NUM_DEVICES,), ("batch",))
  per_device = (x.reshape(NUM_DEVICES, k, b, -1), y.reshape(NUM_DEVICES, k, b, 1))

  def reduced_by_grad(params, batches):
    grads = jax.grad(_loss)(params, jax.tree.map(lambda t: t[0, 0], batches))
    return ol.all_reduce_grad_stats(grads, "batch")

  with pytest.raises(ValueError, match=r"already reduced.*pcast"):
    jax.jit(jax.shard_map(reduced_by_grad, mesh=mesh, in_specs=(P(), P("batch")), out_specs=P()))(
      params, per_device
    )

  def varying(params, batches):
    params = jax.lax.pcast(params, "batch", to="varying")
    _, grads, stats = ol.accumulate_grad_stats(_loss, params, jax.tree.map(lambda t: t[0], batches))
    return ol.all_reduce_grad_stats(grads, "batch", local_stats=stats)

  mean, stats = jax.jit(
    jax.shard_map(varying, mesh=mesh, in_specs=(P(), P("batch")), out_specs=P())
  )(params, per_device)
  ref_mean, ref_stats = ol.stacked_grad_stats(
    jax.vmap(jax.grad(_loss), in_axes=(None, 0))(params, (x, y))
  )
  assert stats.num_samples == NUM_DEVICES * k
  assert_stats_close(stats, ref_stats, rtol=1e-5)
  for a, r in zip(jax.tree.leaves(mean), jax.tree.leaves(ref_mean), strict=True):
    np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-7)
