"""optax_lena.flax: linen TrainState, NNX and linen per-worker gradients with statistics.

Per-worker gradients are checked against an independent computation (one jax.grad per worker in
a Python loop, norms in float64 NumPy); sharding the worker axis on the 8 simulated devices of
conftest.py gives the same step as the unsharded one.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_lena as ol

flax = pytest.importorskip("flax")
from flax import linen as nn  # noqa: E402
from flax import nnx  # noqa: E402
from flax.training import train_state  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import optax_lena.flax as olf  # noqa: E402

S = 8  # workers: one per simulated device
B = 4  # per-worker batch


def leaves64(tree):
  def as64(x):
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    return np.asarray(x, np.float64)

  return [as64(x) for x in jax.tree.leaves(tree)]


def reference_stats(per_worker_grads):
  """Float64 mean gradient, mean squared norm and squared norm of the mean, per leaf."""
  per_leaf = list(zip(*[leaves64(g) for g in per_worker_grads], strict=True))
  mean = [np.mean(np.stack(ws), axis=0) for ws in per_leaf]
  top = [np.mean([np.sum(w**2) for w in ws]) for ws in per_leaf]
  bot = [np.sum(m**2) for m in mean]
  return mean, top, bot


def assert_matches_reference(grads, stats, per_worker_grads):
  mean, top, bot = reference_stats(per_worker_grads)
  assert stats.num_samples == len(per_worker_grads)
  for got, want in zip(leaves64(grads), mean, strict=True):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)
  np.testing.assert_allclose(leaves64(stats.sq_norm_mean), top, rtol=2e-5, atol=1e-9)
  np.testing.assert_allclose(leaves64(stats.mean_grad_sq_norm), bot, rtol=2e-5, atol=1e-9)


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
  for x, y in zip(leaves64(a), leaves64(b), strict=True):
    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def worker_data(seed=0, features=6):
  rng = np.random.RandomState(seed)
  x = jnp.asarray(rng.normal(size=(S, B, features)), jnp.float32)
  y = jnp.asarray(rng.normal(size=(S, B, 1)), jnp.float32)
  return x, y


def mesh_and_shardings():
  mesh = jax.make_mesh((S,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
  return NamedSharding(mesh, P("batch")), NamedSharding(mesh, P())


# -- NNX ----------------------------------------------------------------------------------------


class MLP(nnx.Module):
  def __init__(self, rngs):
    self.hidden = nnx.Linear(6, 8, rngs=rngs)
    self.out = nnx.Linear(8, 1, rngs=rngs)

  def __call__(self, x):
    return self.out(jax.nn.tanh(self.hidden(x)))


class CNN(nnx.Module):
  """Conv -> BatchNorm -> relu -> Dropout -> mean pool -> Linear."""

  def __init__(self, rngs):
    self.conv = nnx.Conv(1, 4, (3,), rngs=rngs)
    self.bn = nnx.BatchNorm(4, momentum=0.5, rngs=rngs)
    self.drop = nnx.Dropout(0.3, rngs=rngs)
    self.out = nnx.Linear(4, 1, rngs=rngs)

  def __call__(self, x):
    h = self.drop(jax.nn.relu(self.bn(self.conv(x[..., None]))))
    return self.out(jnp.mean(h, axis=1))


def mse(model, batch):
  x, y = batch
  return jnp.mean((model(x) - y) ** 2)


# Compiled once per model type (the eager path is exercised by test_nnx_has_aux_...).
JIT_NNX_GRAD_STATS = nnx.jit(olf.nnx_grad_stats, static_argnums=0)


def nnx_reference(model, x, y):
  """Worker i: a copy of the model whose RNG streams start from fold_in(key, i); one nnx.grad
  each (one jitted function, called per worker). Returns the per-worker gradients, losses and
  BatchStat states."""
  graphdef, params, keys, rest = nnx.split(nnx.clone(model), nnx.Param, nnx.RngKey, ...)

  @jax.jit
  def one_worker(params, keys, rest, batch, i):
    keys = jax.tree.map(lambda k: jax.random.fold_in(k, i), keys)
    local = nnx.merge(graphdef, params, keys, rest)
    loss, g = nnx.value_and_grad(mse)(local, batch)
    return loss, g, nnx.state(local, nnx.BatchStat)

  grads, losses, batch_stats = [], [], []
  for i in range(S):
    loss, g, bn = one_worker(params, keys, rest, (x[i], y[i]), i)
    grads.append(g)
    losses.append(float(loss))
    batch_stats.append(bn)
  return grads, losses, batch_stats


@pytest.mark.parametrize("make", [MLP, CNN])
def test_nnx_grad_stats_match_per_worker_loop(make):
  model = make(nnx.Rngs(0, dropout=1))
  model.train()
  x, y = worker_data()
  before = nnx.clone(model)
  ref_grads, ref_losses, ref_bn = nnx_reference(before, x, y)
  loss, grads, stats = JIT_NNX_GRAD_STATS(mse, model, (x, y))
  assert_matches_reference(grads, stats, ref_grads)
  np.testing.assert_allclose(float(loss), np.mean(ref_losses), rtol=1e-5)
  # The mean gradient has the structure nnx.Optimizer takes, i.e. nnx.state(model, nnx.Param).
  assert jax.tree.structure(grads) == jax.tree.structure(nnx.state(model, nnx.Param))
  if make is CNN:
    # BatchStat: the mean over workers of each worker's updated running statistics.
    bn_mean = [np.mean(np.stack(ws), axis=0) for ws in zip(*map(leaves64, ref_bn), strict=True)]
    assert_trees_close(nnx.state(model, nnx.BatchStat), bn_mean, rtol=1e-5)
    assert not np.allclose(leaves64(nnx.state(model, nnx.BatchStat))[0], 0.0)
    # The RNG counter advanced once, as for one forward pass; the key is unchanged.
    count = nnx.state(model, nnx.RngCount)
    assert [int(c) for c in jax.tree.leaves(count)] == [
      int(c) + 1 for c in jax.tree.leaves(nnx.state(before, nnx.RngCount))
    ]


def test_nnx_workers_draw_different_dropout_masks():
  model = CNN(nnx.Rngs(0, dropout=1))
  x, y = worker_data()
  same = (jnp.broadcast_to(x[:1], x.shape), jnp.broadcast_to(y[:1], y.shape))
  _, _, stats = JIT_NNX_GRAD_STATS(mse, model, same)
  top = np.asarray(stats.sq_norm_mean["conv"]["kernel"])
  bot = np.asarray(stats.mean_grad_sq_norm["conv"]["kernel"])
  assert top > bot * (1 + 1e-3)  # identical data: only the dropout masks make workers differ
  model.eval()  # no dropout, running statistics: the workers agree exactly
  before = leaves64(nnx.state(model, nnx.BatchStat))
  _, _, stats = JIT_NNX_GRAD_STATS(mse, model, same)
  np.testing.assert_allclose(
    stats.sq_norm_mean["conv"]["kernel"], stats.mean_grad_sq_norm["conv"]["kernel"], rtol=1e-5
  )
  # Unchanged running statistics stay bitwise unchanged, also for S = 3 (not a power of two).
  three = jax.tree.map(lambda a: a[:3], same)
  _, _, stats = JIT_NNX_GRAD_STATS(mse, model, three)
  assert stats.num_samples == 3
  for a, b in zip(before, leaves64(nnx.state(model, nnx.BatchStat)), strict=True):
    np.testing.assert_array_equal(a, b)


def nnx_train(make, steps=3, jit="nnx", sharded=False, seed=0):
  model = make(nnx.Rngs(0, dropout=1))
  optimizer = nnx.Optimizer(model, ol.lena(0.05, warmup_threshold=10.0), wrt=nnx.Param)

  def step_body(model, optimizer, x, y):
    loss, grads, stats = olf.nnx_grad_stats(mse, model, (x, y))
    optimizer.update(model, grads, grad_stats=stats)
    return loss

  if jit == "nnx":
    step = nnx.jit(step_body)
  else:  # jax.jit on the split state, the functional pattern
    graphdef, state = nnx.split((model, optimizer))

    @jax.jit
    def pure_step(state, x, y):
      model, optimizer = nnx.merge(graphdef, state)
      loss = step_body(model, optimizer, x, y)
      return loss, nnx.state((model, optimizer))

    def step(model, optimizer, x, y):
      nonlocal state
      loss, state = pure_step(state, x, y)
      nnx.update((model, optimizer), state)
      return loss

    if sharded:
      data_sharding, replicated = mesh_and_shardings()
      state = jax.device_put(state, replicated)
  losses = []
  for t in range(steps):
    x, y = worker_data(seed + t)
    if sharded:
      x, y = jax.device_put((x, y), data_sharding)
    losses.append(float(step(model, optimizer, x, y)))
  return model, optimizer, losses


@pytest.mark.parametrize("make", [MLP, CNN])
def test_nnx_optimizer_under_nnx_jit_jax_jit_and_sharded_agree(make):
  m1, o1, l1 = nnx_train(make, jit="nnx")
  m2, _, l2 = nnx_train(make, jit="jax")
  m3, _, l3 = nnx_train(make, jit="jax", sharded=True)
  np.testing.assert_allclose(l1, l2, rtol=1e-5)
  np.testing.assert_allclose(l1, l3, rtol=1e-5)
  assert_trees_close(nnx.state(m1), nnx.state(m2))
  assert_trees_close(nnx.state(m1), nnx.state(m3))
  assert l1[-1] != l1[0]
  diag = ol.flat_diagnostics(o1.opt_state, nnx.state(m1, nnx.Param))
  assert diag["num_updates"] == 3.0 and diag["num_samples"] == float(S)
  assert "gain_ratio/out/kernel" in diag


def test_nnx_optimizer_step_equals_optax_on_pure_arrays():
  """nnx.Optimizer + nnx_grad_stats is ol.lena's update on the same mean gradient and stats."""
  model = MLP(nnx.Rngs(3))
  tx = ol.lena(0.05, warmup_threshold=10.0)
  params = nnx.as_pure(nnx.state(model, nnx.Param))
  opt_state = tx.init(params)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  x, y = worker_data(5)
  _, grads, stats = olf.nnx_grad_stats(mse, model, (x, y))
  optimizer.update(model, grads, grad_stats=stats)
  pure_grads = nnx.as_pure(grads)
  pure_stats = ol.GradStats(
    nnx.as_pure(stats.sq_norm_mean), S, nnx.as_pure(stats.mean_grad_sq_norm)
  )
  updates, _ = tx.update(pure_grads, opt_state, params, grad_stats=pure_stats)
  assert_trees_close(nnx.state(model, nnx.Param), optax.apply_updates(params, updates), 1e-6)


def test_nnx_has_aux_and_bad_worker_axis():
  model = MLP(nnx.Rngs(0))
  x, y = worker_data()

  def loss_aux(model, batch):
    loss = mse(model, batch)
    return loss, {"loss_times_two": 2 * loss}

  (loss, aux), _, _ = olf.nnx_grad_stats(loss_aux, model, (x, y), has_aux=True)
  np.testing.assert_allclose(aux["loss_times_two"], 2 * loss, rtol=1e-6)
  with pytest.raises(ValueError, match=r"same leading worker axis.*Reshape"):
    olf.nnx_grad_stats(mse, model, (x, y[:3]))
  with pytest.raises(ValueError, match="has_aux=True"):
    olf.nnx_grad_stats(loss_aux, model, (x, y))


# -- linen --------------------------------------------------------------------------------------


class LinenNet(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool):
    h = nn.Dense(8)(x)
    h = nn.BatchNorm(use_running_average=not train, momentum=0.5)(h)
    h = nn.Dropout(0.3, deterministic=not train)(nn.relu(h))
    return nn.Dense(1)(h)


LINEN = LinenNet()


def linen_loss(params, batch_stats, batch, rng):
  x, y = batch
  out, updates = LINEN.apply(
    {"params": params, "batch_stats": batch_stats},
    x,
    train=True,
    mutable=["batch_stats"],
    rngs={"dropout": rng},
  )
  return jnp.mean((out - y) ** 2), updates["batch_stats"]


class BNTrainState(olf.TrainState):
  batch_stats: dict


def linen_init(tx):
  variables = LINEN.init(jax.random.key(0), jnp.ones((B, 6)), train=False)
  return BNTrainState.create(
    apply_fn=LINEN.apply,
    params=variables["params"],
    tx=tx,
    batch_stats=variables["batch_stats"],
  )


def test_linen_grad_stats_match_per_worker_loop():
  state = linen_init(ol.lena(0.1))
  x, y = worker_data()
  rng = jax.random.key(7)
  loss, grads, stats, batch_stats = olf.linen_grad_stats(
    linen_loss, state.params, state.batch_stats, (x, y), rng
  )
  per_worker, bn, losses = [], [], []
  one_worker = jax.jit(jax.value_and_grad(linen_loss, has_aux=True))
  for i in range(S):
    (li, bi), gi = one_worker(
      state.params, state.batch_stats, (x[i], y[i]), jax.random.fold_in(rng, i)
    )
    per_worker.append(gi)
    bn.append(bi)
    losses.append(float(li))
  assert_matches_reference(grads, stats, per_worker)
  np.testing.assert_allclose(float(loss), np.mean(losses), rtol=1e-5)
  bn_mean = [np.mean(np.stack(ws), axis=0) for ws in zip(*map(leaves64, bn), strict=True)]
  assert_trees_close(batch_stats, bn_mean)


def linen_train(sharded=False, steps=3):
  state = linen_init(ol.lena(0.05, warmup_threshold=10.0))

  @jax.jit
  def step(state, x, y, rng):
    loss, grads, stats, batch_stats = olf.linen_grad_stats(
      linen_loss, state.params, state.batch_stats, (x, y), rng
    )
    return state.apply_gradients(grads=grads, grad_stats=stats, batch_stats=batch_stats), loss

  if sharded:
    data_sharding, replicated = mesh_and_shardings()
    state = jax.device_put(state, replicated)
  losses = []
  for t in range(steps):
    x, y = worker_data(t)
    if sharded:
      x, y = jax.device_put((x, y), data_sharding)
    state, loss = step(state, x, y, jax.random.key(t))
    losses.append(float(loss))
  return state, losses


def test_linen_train_state_jit_and_sharded_agree():
  s1, l1 = linen_train()
  s2, l2 = linen_train(sharded=True)
  np.testing.assert_allclose(l1, l2, rtol=1e-5)
  assert_trees_close(s1.params, s2.params)
  assert_trees_close(s1.batch_stats, s2.batch_stats)
  assert int(s1.step) == 3 and int(ol.diagnostics(s1.opt_state)["num_updates"]) == 3


def test_train_state_passes_stats_like_tx_update():
  state = linen_init(ol.lena(0.1, warmup_threshold=5.0))
  x, y = worker_data()
  _, grads, stats, _ = olf.linen_grad_stats(
    linen_loss, state.params, state.batch_stats, (x, y), jax.random.key(0)
  )
  new = state.apply_gradients(grads=grads, grad_stats=stats)
  updates, opt_state = state.tx.update(grads, state.opt_state, state.params, grad_stats=stats)
  assert_trees_close(new.params, optax.apply_updates(state.params, updates), 0, 0)
  assert_trees_close(new.opt_state, opt_state, 0, 0)
  # A plain Optax optimizer still works without statistics (drop-in).
  plain = BNTrainState.create(
    apply_fn=LINEN.apply, params=state.params, tx=optax.sgd(0.1), batch_stats={}
  )
  assert int(plain.apply_gradients(grads=grads).step) == 1
  with pytest.raises(TypeError, match=r"grad_stats must be an ol\.GradStats"):
    state.apply_gradients(grads=grads, grad_stats={"x": 1})
  with pytest.raises(ValueError, match="needs the per-worker gradient statistics"):
    state.apply_gradients(grads=grads)


def test_flax_train_state_error_names_optax_lena_train_state():
  state = linen_init(ol.lena(0.1))
  flax_state = train_state.TrainState.create(apply_fn=LINEN.apply, params=state.params, tx=state.tx)
  x, y = worker_data()
  _, grads, stats, _ = olf.linen_grad_stats(
    linen_loss, state.params, state.batch_stats, (x, y), jax.random.key(0)
  )
  with pytest.raises(
    ValueError, match=r"^flax\.training.*does not pass grad_stats.*optax_lena\.flax\.TrainState"
  ):
    flax_state.apply_gradients(grads=grads, grad_stats=stats)
  # Elsewhere the error still mentions it, after the general fix.
  with pytest.raises(ValueError, match=r"^This optax_lena.*optax_lena\.flax\.TrainState"):
    state.tx.update(grads, state.opt_state, state.params)


def test_layer_axes_read_from_partition_metadata_at_axis_1_and_errors():
  """MaxText's position: nn.scan stacking on axis 1 records "layers" there (read from the
  abstract init, no compute); unannotated parameters, unboxed ones or another name raise an
  error that names the fix."""

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, _):
      init = nn.with_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
      return nn.Dense(4, kernel_init=init, use_bias=False)(x), None

  class Scanned(nn.Module):
    @nn.compact
    def __call__(self, x):
      scan = nn.scan(
        Block,
        variable_axes={"params": 1},
        split_rngs={"params": True},
        length=3,
        metadata_params={nn.PARTITION_NAME: "layers"},
      )
      return scan(name="blocks")(nn.Dense(4)(x), None)[0]

  variables = jax.eval_shape(Scanned().init, jax.random.key(0), jnp.zeros((1, 4)))
  axes = olf.layer_axes(variables["params"])
  assert axes == {"Dense_0": {"bias": None, "kernel": None}, "blocks": {"Dense_0": {"kernel": 1}}}
  assert jax.tree.leaves(variables["params"]["blocks"])[0].shape == (4, 3, 4)
  with pytest.raises(ValueError, match=r"no parameter whose partition names include 'stage'"):
    olf.layer_axes(variables["params"], name="stage")
  with pytest.raises(ValueError, match=r"nn\.with_partitioning.*before nn\.unbox.*callable"):
    olf.layer_axes(nn.unbox(variables["params"]))
  plain = nnx.state(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), nnx.Param)
  with pytest.raises(ValueError, match=r"nnx\.with_partitioning.*nnx\.PARTITION_NAME"):
    olf.layer_axes(plain)
