"""LENA with parameters sharded over a model axis (FSDP / tensor parallel) on a 2-D mesh.

On a 4 x 2 mesh (``data`` x ``model``) of simulated CPU devices (see conftest.py), kernels are
split over ``model`` and the S = 4 per-worker gradients over ``data``. Five LENA updates must give
the parameters of the same updates on one device, to float32 rounding, and keep every
parameter's and every optimizer-state leaf's sharding; the per-layer statistics must equal a
float64 NumPy computation and count the data axis only (S = 4, not 8 devices). Two paths:

* GSPMD: plain ``jit`` of ``ol.stacked_grad_stats`` + ``ol.lena`` on sharded arrays (XLA adds
  the reductions over both axes);
* shard_map: manual over ``data`` only (``axis_names={'data'}``), ``ol.all_reduce_grad_stats``
  over ``'data'``, while the ``model`` axis stays automatic.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import optax_lena as ol

DATA, MODEL = 4, 2
SHAPES = {"dense_0": {"kernel": (8, 6), "bias": (6,)}, "dense_1": {"kernel": (6, 4), "bias": (4,)}}
STEPS = 5
# Sharded and unsharded steps reduce the same float32 numbers in different orders (partial sums
# per model shard): a few float32 ulps per update; observed 1.9e-7 of the leaf's largest entry
# after 5 updates on both paths.
# 2e-6 leaves room for the 5 updates' roundings; a wrong statistic (a missing model-axis or an
# extra data-axis reduction) changes the parameters by ~1e-2.
RTOL = 2e-6


def _tree(fn):
  return {
    layer: {k: fn(layer, k, s) for k, s in leaves.items()} for layer, leaves in SHAPES.items()
  }


def _params():
  rng = np.random.default_rng(0)
  return _tree(lambda _l, _k, s: rng.normal(size=s).astype(np.float32))


def _worker_grads(step: int):
  """[S, *shape] per-worker gradients of update ``step``: a shared signal plus worker noise."""
  rng = np.random.default_rng([1, step])
  return _tree(
    lambda _l, _k, s: (rng.normal(size=s) + 0.7 * rng.normal(size=(DATA, *s))).astype(np.float32)
  )


def _mesh():
  return jax.make_mesh(
    (DATA, MODEL), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2
  )


def _param_specs():
  # Kernels split their output features over 'model'; biases replicated.
  return _tree(lambda _l, k, _s: P(None, "model") if k == "kernel" else P())


def _tx():
  return ol.lena(0.1, momentum=0.9, weight_decay=1e-3, num_samples=DATA, warmup_threshold=8.0)


def _shardings(mesh, tx, params):
  params_sh = jax.tree.map(lambda spec: NamedSharding(mesh, spec), _param_specs())
  replicated = NamedSharding(mesh, P())
  opt_sh = optax.tree_map_params(
    tx,
    lambda _, sh: sh,
    jax.eval_shape(tx.init, params),
    params_sh,
    transform_non_params=lambda _: replicated,
    is_leaf=lambda x: isinstance(x, NamedSharding),
  )
  return params_sh, opt_sh


def _float64_stats(grads):
  g = jax.tree.map(lambda x: x.astype(np.float64), grads)
  top = jax.tree.map(lambda x: np.mean(np.sum(x.reshape(DATA, -1) ** 2, axis=1)), g)
  bot = jax.tree.map(lambda x: np.sum(x.mean(axis=0) ** 2), g)
  return top, bot


def _unsharded_run():
  tx = _tx()

  @jax.jit
  def step(params, opt_state, grads):
    mean, stats = ol.stacked_grad_stats(grads)
    updates, opt_state = tx.update(mean, opt_state, params, grad_stats=stats)
    return optax.apply_updates(params, updates), opt_state

  params = jax.tree.map(jnp.asarray, _params())
  opt_state = tx.init(params)
  for t in range(STEPS):
    params, opt_state = step(params, opt_state, _worker_grads(t))
  return jax.device_get(params)


def _gspmd_step(mesh, tx, params_sh, opt_sh):
  grads_sh = jax.tree.map(lambda spec: NamedSharding(mesh, P("data", *spec)), _param_specs())

  def step(params, opt_state, grads):
    mean, stats = ol.stacked_grad_stats(grads)
    updates, opt_state = tx.update(mean, opt_state, params, grad_stats=stats)
    return optax.apply_updates(params, updates), opt_state, stats

  stats_sh = NamedSharding(mesh, P())
  jitted = jax.jit(
    step,
    in_shardings=(params_sh, opt_sh, grads_sh),
    out_shardings=(params_sh, opt_sh, stats_sh),
  )
  return jitted, grads_sh


def _shard_map_step(mesh, tx, params_sh, opt_sh):
  grads_sh = jax.tree.map(lambda spec: NamedSharding(mesh, P("data", *spec)), _param_specs())

  def local(params, opt_state, grads):
    # This data-parallel worker's gradient (its model-axis shards stay automatic).
    mine = jax.tree.map(lambda x: x[0], grads)
    mean, stats = ol.all_reduce_grad_stats(mine, "data")
    updates, opt_state = tx.update(mean, opt_state, params, grad_stats=stats)
    return optax.apply_updates(params, updates), opt_state, stats

  mapped = jax.shard_map(
    local,
    mesh=mesh,
    in_specs=(P(), P(), P("data")),
    out_specs=(P(), P(), P()),
    axis_names={"data"},
    check_vma=False,
  )
  jitted = jax.jit(
    mapped,
    in_shardings=(params_sh, opt_sh, grads_sh),
    out_shardings=(params_sh, opt_sh, NamedSharding(mesh, P())),
  )
  return jitted, grads_sh


@pytest.fixture(scope="module")
def unsharded():
  return _unsharded_run()


@pytest.mark.parametrize("path", ["gspmd", "shard_map"])
def test_sharded_lena_matches_unsharded_and_keeps_shardings(path: str, unsharded) -> None:
  mesh, tx = _mesh(), _tx()
  params_sh, opt_sh = _shardings(mesh, tx, _params())
  build = {"gspmd": _gspmd_step, "shard_map": _shard_map_step}[path]
  step, grads_sh = build(mesh, tx, params_sh, opt_sh)
  params = jax.device_put(_params(), params_sh)
  opt_state = jax.jit(tx.init, out_shardings=opt_sh)(params)
  for t in range(STEPS):
    grads = _worker_grads(t)
    params, opt_state, stats = step(params, opt_state, jax.device_put(grads, grads_sh))
    # Statistics of the data axis only, equal to float64 NumPy on the same gradients.
    assert int(stats.num_samples) == DATA
    top, bot = _float64_stats(grads)
    for got, want in ((stats.sq_norm_mean, top), (stats.mean_grad_sq_norm, bot)):
      got = jax.device_get(got)
      assert jax.tree.structure(got) == jax.tree.structure(want)
      for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL)
  # Every parameter and optimizer-state leaf kept its sharding (kernels split over 'model').
  for leaf, sh in zip(jax.tree.leaves(params), jax.tree.leaves(params_sh), strict=True):
    assert leaf.sharding.is_equivalent_to(sh, leaf.ndim), (leaf.sharding, sh)
  kernel = params["dense_0"]["kernel"]
  assert {s.data.shape for s in kernel.addressable_shards} == {(8, 6 // MODEL)}
  for leaf, sh in zip(
    jax.tree.leaves(opt_state),
    jax.tree.leaves(opt_sh, is_leaf=lambda x: isinstance(x, NamedSharding)),
    strict=True,
  ):
    assert leaf.sharding.is_equivalent_to(sh, leaf.ndim), (leaf.sharding, sh)
  # The same parameters as the unsharded updates, to float32 rounding.
  got = jax.device_get(params)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(unsharded), strict=True):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * float(np.max(np.abs(b))))
  # ... and they moved: the comparison is not between two initialisations.
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(_params()), strict=True):
    assert np.max(np.abs(a - b)) > 1e-3
