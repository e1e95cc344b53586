"""Statistics, optimizers, diagnostics and the Flax helpers under an explicit-axis mesh.

With ``jax.make_mesh(..., axis_types=(AxisType.Explicit, ...))`` and ``jax.set_mesh`` every
array carries its sharding in its type (``float32[2,8@x,4]``). These tests shard the parameters
along one axis of a 1-D mesh and along both axes of a 2-D mesh (the per-worker axis S sharded
too where the parameter leaves it free) and check that the sharding types of the states stay
those of (eager) ``init`` through jitted updates (one trace for every update), that every ready
optimizer's parameters and LENA's diagnostics equal the float64 reference (``reference.py``),
and that the statistics, their accumulation and the first optimizer of each mesh equal the same
program under an Auto mesh (float32 rounding). One compilation per mesh and mode keeps this
cheap (an eager update costs seconds of op-by-op compilation, so updates are jitted).
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import optax_lena as ol
from tests.lena.reference import ReferenceOptimizer

S = 4  # per-worker gradients per update
STEPS = 2
THETA = 20.0  # not reached in two updates (progress <= 2 S), so no factor sits near 1
WARMUP_STEPS = 16  # fixed warm-up factors 0.25 and 0.5
WD = 1e-2
# float32 tolerances of tests/lena/test_numerics.py (there for 40 updates, here for two).
RTOL = 1e-5
ATOL = 1e-5

# What is checked is decided before code generation (sharding types, the partitioned program);
# LLVM's optimisations would only make this test's compilations slower.
FAST_COMPILE = {"xla_backend_optimization_level": 0}

# name -> (mesh shape, axis names, parameter shapes and specs, per-worker gradient specs, the
# optimizers run there). "2d": a parameter sharded on both axes, and the worker axis sharded on
# "a" where the parameter leaves it free (data and model parallelism at once). Every ready
# optimizer runs on one of the meshes (one compilation per mesh and mode), LENA on both.
CASES = {
  "1d": (
    (8,),
    ("x",),
    {"b": ((8,), P("x")), "c": ((3,), P()), "w": ((2, 8, 4), P(None, "x"))},
    {"b": P(None, "x"), "c": P(), "w": P(None, None, "x")},
    ("lena", "linear_scaling", "lena_adamw", "adascale_adamw"),
  ),
  "2d": (
    (2, 4),
    ("a", "b"),
    {"c": ((3,), P()), "v": ((8, 3), P("b")), "w": ((4, 8), P("a", "b"))},
    {"c": P("a"), "v": P("a", "b"), "w": P(None, "a", "b")},
    ("guarded_lena", "adascale", "linear_scaling_adamw"),
  ),
}


def _mesh(case: str, axis_type: AxisType) -> jax.sharding.Mesh:
  shape, names = CASES[case][:2]
  return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))


def _problem(case: str) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
  rng = np.random.RandomState(3)
  params = {
    k: (0.3 * rng.standard_normal(shape)).astype(np.float32)
    for k, (shape, _) in CASES[case][2].items()
  }
  signal = {k: rng.standard_normal(v.shape) for k, v in params.items()}
  grads = [
    {
      k: (signal[k] * (1.0 + 0.5 * t) + rng.standard_normal((S, *v.shape))).astype(np.float32)
      for k, v in params.items()
    }
    for t in range(STEPS)
  ]
  return params, grads


def _put(case: str, mesh: jax.sharding.Mesh, params: Any, grads: Any) -> tuple[Any, Any, Any]:
  """Parameters, per-worker gradients and the first update's gradients as K = S sequential
  micro-batches (``lax.scan`` needs their leading axis unsharded)."""
  specs, grad_specs = CASES[case][2], CASES[case][3]
  put = lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec))
  return (
    {k: put(v, specs[k][1]) for k, v in params.items()},
    [{k: put(v, grad_specs[k]) for k, v in g.items()} for g in grads],
    {k: put(v, P(None, *specs[k][1])) for k, v in grads[0].items()},
  )


def _optimizers() -> dict[str, tuple[optax.GradientTransformationExtraArgs, ReferenceOptimizer]]:
  ref = lambda rule, warmup, **kw: ReferenceOptimizer(
    rule,
    warmup,
    lr0=kw.pop("lr0", 0.1),
    weight_decay=WD,
    warmup_threshold=THETA,
    warmup_steps=WARMUP_STEPS,
    **kw,
  )
  adam = {"inner": "adamw", "power": 0.5, "lr0": 1e-2}
  return {
    "lena": (ol.lena(0.1, weight_decay=WD, warmup_threshold=THETA), ref("lena", "state_aware")),
    "adascale": (
      ol.adascale(0.1, weight_decay=WD, warmup_steps=WARMUP_STEPS),
      ref("adascale", "fixed"),
    ),
    "linear_scaling": (
      ol.linear_scaling(0.1, weight_decay=WD, warmup_steps=WARMUP_STEPS),
      ref("linear_scaling", "fixed"),
    ),
    "lena_adamw": (
      ol.lena_adamw(1e-2, weight_decay=WD, warmup_threshold=THETA),
      ref("lena", "state_aware", **adam),
    ),
    "adascale_adamw": (
      ol.adascale_adamw(1e-2, weight_decay=WD, warmup_steps=WARMUP_STEPS),
      ref("adascale", "fixed", **adam),
    ),
    "linear_scaling_adamw": (
      ol.linear_scaling_adamw(1e-2, weight_decay=WD),
      ref("linear_scaling", "none", **adam),
    ),
    "guarded_lena": (
      ol.skip_nonfinite_steps(ol.lena(0.1, weight_decay=WD, warmup_threshold=THETA)),
      ref("lena", "state_aware"),
    ),
  }


def _linear_loss(params: Any, batch: Any) -> jax.Array:
  """A loss whose gradient with respect to ``params`` is exactly ``batch``."""
  return sum(
    jnp.sum(p * b) for p, b in zip(jax.tree.leaves(params), jax.tree.leaves(batch), strict=True)
  )


TRACES: list[Any] = []  # the state types _step was traced with


def _step(
  current: dict[str, Any], states: dict[str, Any], grads: Any, params: Any, micro: Any
) -> dict[str, Any]:
  """One update of every optimizer from the same per-worker gradients, with everything else
  under test: the statistics, their sequential accumulation and the diagnostics."""
  TRACES.append(jax.tree.map(jax.typeof, states))
  txs = _optimizers()
  mean, stats = ol.stacked_grad_stats(grads)
  out: dict[str, Any] = {"stats": (mean, stats), "updates": {}, "params": {}, "states": {}}
  for name in current:
    tx = txs[name][0]
    updates, out["states"][name] = tx.update(mean, states[name], current[name], grad_stats=stats)
    out["updates"][name] = updates
    out["params"][name] = optax.apply_updates(current[name], updates)
  # Diagnostics of the LENA states only: each costs as much compile time as an optimizer.
  out["diagnostics"] = {n: ol.diagnostics(s) for n, s in out["states"].items() if "lena" in n}
  out["accumulated"] = ol.accumulate_grad_stats(_linear_loss, params, micro)
  return out


def _spec(aval: Any) -> tuple[Any, ...]:
  spec = tuple(aval.sharding.spec)
  return spec + (None,) * (aval.ndim - len(spec))


def _typeof(tree: Any) -> Any:
  return jax.tree.map(jax.typeof, tree)


def _leaves64(tree: Any) -> list[np.ndarray]:
  return [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]


def _assert_close(a: Any, b: Any, what: str) -> None:
  for k, (x, y) in enumerate(zip(_leaves64(a), _leaves64(b), strict=True)):
    np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL, err_msg=f"{what}, leaf {k}")


def _updates(step: Any, states: dict[str, Any], grads: list[Any], params: Any, micro: Any) -> Any:
  """(parameters, states, results) after one ``step`` per entry of ``grads``, every optimizer
  starting from ``params``; ``TRACES`` is cleared first."""
  TRACES.clear()
  current, results = dict.fromkeys(states, params), []
  for g in grads:
    out = step(current, states, g, params, micro)
    current, states = out["params"], out["states"]
    results.append(out)
  return current, states, results


def _simulate(
  case: str, axis_type: AxisType, names: tuple[str, ...]
) -> tuple[Any, dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
  """(placed params, init state types, the STEPS results, a non-finite step's) in one mode."""
  params, grads = _problem(case)
  mesh = _mesh(case, axis_type)
  with jax.set_mesh(mesh):
    params, grads, micro = _put(case, mesh, params, grads)
    states = {name: _optimizers()[name][0].init(params) for name in names}
    init_types = _typeof(states)
    step = jax.jit(lambda *args: _step(*args), compiler_options=FAST_COMPILE)  # a fresh cache
    current, states, results = _updates(step, states, grads, params, micro)
    nan = jax.tree.map(lambda x: x * jnp.nan, grads[-1])
    skipped = step(current, states, nan, params, micro)
    # Types unchanged by the updates: the later calls reuse the first trace.
    assert len(TRACES) == 1
  return params, init_types, results, skipped


@pytest.mark.parametrize("case", sorted(CASES))
def test_explicit_mesh_matches_auto_mesh_and_reference(case: str) -> None:
  names = CASES[case][4]
  params, init_types, results, skipped = _simulate(case, AxisType.Explicit, names)
  # The sharding is in the types, and the parameters' shardings reach the states.
  w_spec = _spec(jax.typeof(params["w"]))
  assert any(w_spec)
  mu_types = [t for t in jax.tree.leaves(init_types[names[0]]) if t.shape == params["w"].shape]
  assert mu_types and all(_spec(t) == w_spec for t in mu_types)
  # State types after jitted updates are those of init; updates are typed like the params.
  for out in (*results, skipped):
    assert _typeof(out["states"]) == init_types
    for name, updates in out["updates"].items():
      assert _typeof(updates) == _typeof(params), name
    assert _typeof(out["accumulated"][1]) == _typeof(params)

  # The same program under an Auto mesh, for the statistics and the first optimizer (a second
  # compilation of all of them would double this test's time; each is checked against the
  # float64 reference below).
  _, _, auto, _ = _simulate(case, AxisType.Auto, names[:1])
  for k, (a, b) in enumerate(zip(results, auto, strict=True)):
    at = f"explicit vs auto mesh ({case}), update {k + 1}"
    _assert_close((a["stats"], a["accumulated"]), (b["stats"], b["accumulated"]), at)
    for key in ("updates", "params", "states", "diagnostics"):
      _assert_close(a[key][names[0]], b[key][names[0]], f"{at}, {names[0]} {key}")

  # The float64 reference, update by update.
  params64, grads = _problem(case)
  stats_leaves = lambda st: (_leaves64(st.sq_norm_mean), _leaves64(st.mean_grad_sq_norm))
  optimizers = _optimizers()
  for name in CASES[case][4]:
    ref = optimizers[name][1]
    w = _leaves64(params64)
    for out, g in zip(results, grads, strict=True):
      w = ref.step(w, _leaves64(g))
      at = f"{name}, update {ref.last.step}"
      if name in out["diagnostics"]:
        d = out["diagnostics"][name]
        for key in ("gain_ratio", "warmup_factor", "warmup_progress", "lr_multiplier"):
          np.testing.assert_allclose(d[key], getattr(ref.last, key), rtol=RTOL, err_msg=at)
        np.testing.assert_allclose(d["global_ratio"], ref.last.global_ratio, rtol=RTOL)
      _assert_close(out["params"][name], w, f"{at}: params vs float64 reference")
  for out, g in zip(results, grads, strict=True):
    mean, stats = out["stats"]
    g64 = _leaves64(g)
    top = [np.mean(np.sum(x.reshape(S, -1) ** 2, axis=1)) for x in g64]
    bot = [np.sum(x.mean(0) ** 2) for x in g64]
    _assert_close(mean, [x.mean(0) for x in g64], "mean gradient")
    np.testing.assert_allclose(stats_leaves(stats), (top, bot), rtol=RTOL)
  # K = S sequential micro-batches: the statistics of the same S gradients.
  _, acc_mean, acc_stats = results[0]["accumulated"]
  assert acc_stats.num_samples == S
  mean, stats = results[0]["stats"]
  _assert_close(acc_mean, mean, "accumulated mean")
  np.testing.assert_allclose(stats_leaves(acc_stats), stats_leaves(stats), rtol=RTOL)
  # The non-finite guard discarded the NaN step: zero updates, state as before it.
  if "guarded_lena" in skipped["states"]:
    guard, before = skipped["states"]["guarded_lena"], results[-1]["states"]["guarded_lena"]
    assert all(
      np.all(np.asarray(u) == 0) for u in jax.tree.leaves(skipped["updates"]["guarded_lena"])
    )
    assert int(guard.num_skipped) == 1
    for a, b in zip(
      jax.tree.leaves(guard.inner_state), jax.tree.leaves(before.inner_state), strict=True
    ):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_all_reduce_inside_shard_map_over_one_axis_of_an_explicit_mesh() -> None:
  """Data parallelism over "a" with shard_map, the parameters sharded over "b" (explicit inside
  the body): per-device gradients and their K = 2 local micro-batches, plain and packed."""
  mesh = _mesh("2d", AxisType.Explicit)
  rng = np.random.RandomState(5)
  k = 2
  per_sample = {  # [workers a=2, K, *shape]: S = 2 x 2 samples
    "v": rng.standard_normal((2, k, 8, 3)).astype(np.float32),
    "w": rng.standard_normal((2, k, 3, 8)).astype(np.float32),
  }
  specs = {"v": P("a", None, "b"), "w": P("a", None, None, "b")}
  param_specs = {"v": P("b"), "w": P(None, "b")}

  def body(params, micro):
    micro = jax.tree.map(lambda x: x[0], micro)  # this device's K micro-batches
    params = jax.lax.pcast(params, "a", to="varying")
    _, local, local_stats = ol.accumulate_grad_stats(_linear_loss, params, micro)
    single = jax.tree.map(lambda x: x[0], micro)
    return (
      ol.all_reduce_grad_stats(local, "a", local_stats=local_stats),
      ol.all_reduce_grad_stats(single, "a"),
      ol.all_reduce_grad_stats(single, "a", packed=True),
    )

  with jax.set_mesh(mesh):
    micro = {n: jax.device_put(x, NamedSharding(mesh, specs[n])) for n, x in per_sample.items()}
    params = {
      n: jax.device_put(np.zeros(x.shape[2:], np.float32), NamedSharding(mesh, param_specs[n]))
      for n, x in per_sample.items()
    }
    fn = jax.shard_map(body, in_specs=(P(), P("a")), out_specs=P(), axis_names={"a"})
    accumulated, single, packed = jax.jit(fn, compiler_options=FAST_COMPILE)(params, micro)
  for (mean, stats), samples in ((accumulated, (0, 1)), (single, (0,)), (packed, (0,))):
    assert _typeof(mean) == _typeof(params)
    g64 = [
      np.asarray(x, np.float64)[:, samples].reshape(-1, *x.shape[2:])
      for x in jax.tree.leaves(per_sample)
    ]
    assert stats.num_samples == g64[0].shape[0]
    _assert_close(mean, [g.mean(0) for g in g64], "mean gradient")
    top = [np.mean(np.sum(g.reshape(len(g), -1) ** 2, axis=1)) for g in g64]
    np.testing.assert_allclose(_leaves64(stats.sq_norm_mean), top, rtol=RTOL)
    np.testing.assert_allclose(
      _leaves64(stats.mean_grad_sq_norm), [np.sum(g.mean(0) ** 2) for g in g64], rtol=RTOL
    )
  for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(packed), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_flax_helpers_on_an_explicit_mesh() -> None:
  """optax_lena.flax's linen and NNX helpers with the parameters sharded over "b" and the
  worker axis of the batch over "a": gradients, statistics and the worker-mean batch statistics
  equal float64 NumPy, their types are the parameters', and the NNX optimizer's state types
  survive the update."""
  pytest.importorskip("flax")
  from flax import nnx

  import optax_lena.flax as olf

  mesh = _mesh("2d", AxisType.Explicit)
  rng = np.random.RandomState(7)
  x = rng.standard_normal((S, 3, 5)).astype(np.float32)  # S workers of batch 3
  w0 = (0.5 * rng.standard_normal((5, 8))).astype(np.float32)
  b0 = (0.5 * rng.standard_normal(8)).astype(np.float32)

  def forward(w, b, batch):
    y = batch @ w + b
    return 0.5 * jnp.mean(jnp.sum(y * y, axis=-1)), jnp.mean(y, axis=0)

  def linen_loss(params, batch_stats, batch, key):
    del key  # split per worker all the same: the keys' worker axis must match the batch's
    loss, y_mean = forward(params["w"], params["b"], batch)
    return loss, {"y_mean": 0.5 * batch_stats["y_mean"] + y_mean}

  class Linear(nnx.Module):
    def __init__(self, w, b):
      self.w, self.b = nnx.Param(w), nnx.Param(b)
      self.y_mean = nnx.BatchStat(jnp.zeros_like(b))
      self.rngs = nnx.Rngs(0)  # an RNG stream: per-worker keys go through the vmap

    def __call__(self, batch):
      loss, y_mean = forward(self.w.value, self.b.value, batch)
      self.y_mean.value = 0.5 * self.y_mean.value + y_mean
      return loss

  with jax.set_mesh(mesh):
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
    batches = put(x, P("a"))
    params = {"b": put(b0, P("b")), "w": put(w0, P(None, "b"))}
    batch_stats = {"y_mean": put(np.zeros(8, np.float32), P("b"))}
    model = Linear(params["w"], params["b"])
    tx = ol.lena(0.1, warmup_threshold=THETA)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    opt_types = _typeof(nnx.state(optimizer.opt_state))

    @nnx.jit
    def nnx_step(model, optimizer, batches):
      loss, grads, stats = olf.nnx_grad_stats(lambda m, b: m(b), model, batches)
      optimizer.update(model, grads, grad_stats=stats)
      return loss, grads, stats

    linen = jax.jit(
      lambda p, bs, xb: olf.linen_grad_stats(linen_loss, p, bs, xb, jax.random.key(1)),
      compiler_options=FAST_COMPILE,
    )(params, batch_stats, batches)
    nnx_out = nnx_step(model, optimizer, batches)
    assert _typeof(nnx.state(optimizer.opt_state)) == opt_types
    assert _typeof(model.y_mean.value) == _typeof(batch_stats["y_mean"])

  # Float64 NumPy: per-worker gradients of 0.5 mean_n ||x_n w + b||^2.
  x64, w64, b64 = (np.asarray(a, np.float64) for a in (x, w0, b0))
  y = x64 @ w64 + b64  # [S, 3, 8]
  per_worker = [np.einsum("sni,snj->sij", x64, y) / 3, y.mean(1)]  # w, b
  mean = [g.mean(0) for g in per_worker]
  top = [np.mean(np.sum(g.reshape(S, -1) ** 2, axis=1)) for g in per_worker]
  bot = [np.sum(m**2) for m in mean]
  y_mean = y.mean(1).mean(0)  # the workers' mean of their new statistics (old ones are 0)
  loss = np.mean(0.5 * np.mean(np.sum(y * y, axis=-1), axis=1))
  (linen_loss_value, linen_grads, linen_stats, new_batch_stats) = linen
  nnx_loss, nnx_grads, nnx_stats = nnx_out
  for got_loss, grads, stats in (
    (linen_loss_value, [linen_grads["w"], linen_grads["b"]], linen_stats),
    (nnx_loss, [nnx_grads["w"].value, nnx_grads["b"].value], nnx_stats),
  ):
    np.testing.assert_allclose(float(got_loss), loss, rtol=RTOL)
    assert [_spec(jax.typeof(g)) for g in grads] == [(None, "b"), ("b",)]
    _assert_close(grads, mean, "mean gradient")
    order = [jax.tree.leaves(stats.sq_norm_mean), jax.tree.leaves(stats.mean_grad_sq_norm)]
    # Leaves in key order (b, w): reorder to (w, b).
    np.testing.assert_allclose([_leaves64(t)[::-1] for t in order], [top, bot], rtol=RTOL)
  _assert_close(new_batch_stats["y_mean"], y_mean, "linen batch statistics")
  _assert_close(model.y_mean.value, y_mean, "NNX batch statistics")
  # The NNX optimizer applied LENA's first update, w - eta * r * warmup * g (no momentum yet).
  ref = ReferenceOptimizer("lena", "state_aware", lr0=0.1, warmup_threshold=THETA)
  w_ref = ref.step([b64, w64], [per_worker[1], per_worker[0]])
  _assert_close([model.b.value, model.w.value], w_ref, "NNX parameters after one LENA update")


# -- stacked layers with the layer axis on a mesh axis of its own (MaxText's "stage") ---------

STAGE_LAYER_AXES = {"blocks": 0, "head": None, "mlp": 1}
# name -> (shape, the parameter's spec): the layer axis (size 4) on "stage", at 0 and at 1.
STAGE_PARAMS = {
  "blocks": {"kernel": ((4, 3, 8), P("stage")), "bias": ((4, 8), P("stage"))},
  "head": {"kernel": ((8, 2), P())},
  "mlp": {"kernel": ((3, 4, 5), P(None, "stage"))},
}


def _stage_leaves(fn):
  return jax.tree.map(lambda spec: fn(*spec), STAGE_PARAMS, is_leaf=lambda x: isinstance(x, tuple))


def _stage_optimizers():
  return {
    "lena": ol.lena(0.1, weight_decay=WD, warmup_threshold=THETA, layer_axes=STAGE_LAYER_AXES),
    "lena_adamw": ol.lena_adamw(
      1e-2, grouping="module", warmup_steps=WARMUP_STEPS, layer_axes=STAGE_LAYER_AXES
    ),
  }


def _stage_step(current, states, grads, params, micro):
  """Every optimizer's update from the per-slice statistics of the three statistics functions
  (stacked over "data"; K = S sequential micro-batches; an all-reduce over "data" inside
  shard_map, plain and packed)."""
  TRACES.append(jax.tree.map(jax.typeof, states))
  mean, stats = ol.stacked_grad_stats(grads, layer_axes=STAGE_LAYER_AXES)
  out: dict[str, Any] = {"stats": stats, "params": {}, "states": {}}
  for name, tx in _stage_optimizers().items():
    updates, out["states"][name] = tx.update(mean, states[name], current[name], grad_stats=stats)
    out["params"][name] = optax.apply_updates(current[name], updates)
  out["diagnostics"] = ol.diagnostics(out["states"]["lena"], params, layer_axes=STAGE_LAYER_AXES)
  out["accumulated"] = ol.accumulate_grad_stats(
    _linear_loss, params, micro, layer_axes=STAGE_LAYER_AXES
  )[2]

  def body(grads):
    mine = jax.tree.map(lambda g: g[0], grads)
    reduce = lambda packed: ol.all_reduce_grad_stats(
      mine, "data", packed=packed, layer_axes=STAGE_LAYER_AXES
    )[1]
    return reduce(False), reduce(True)

  if jax.sharding.get_abstract_mesh().axis_names:
    mapped = jax.shard_map(body, in_specs=P("data"), out_specs=P(), axis_names={"data"})
    out["all_reduced"] = mapped(grads)
  return out


def _run_stage(axis_type: AxisType | None) -> tuple[Any, Any, list[dict[str, Any]]]:
  """(init state types, parameter types, the results of STEPS updates) on a 4 x 2 ("data",
  "stage") mesh of the given axis type, or on one device (None)."""
  rng = np.random.RandomState(11)
  params = _stage_leaves(lambda shape, _: (0.3 * rng.standard_normal(shape)).astype(np.float32))
  signal = jax.tree.map(lambda p: rng.standard_normal(p.shape), params)
  noise = [jax.tree.map(lambda p: rng.standard_normal((S, *p.shape)), params) for _ in range(STEPS)]
  grads = [
    jax.tree.map(lambda s, z, t=t: (s * (1.0 + t) + z).astype(np.float32), signal, noise[t])
    for t in range(STEPS)
  ]
  specs = _stage_leaves(lambda _, spec: spec)
  mesh = None if axis_type is None else jax.make_mesh((S, 2), ("data", "stage"), (axis_type,) * 2)
  with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
    if mesh is not None:
      put = lambda tree, specs: jax.tree.map(
        lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), tree, specs
      )
      grads = [put(g, jax.tree.map(lambda s: P("data", *s), specs)) for g in grads]
      params = put(params, specs)
    micro = jax.tree.map(lambda g: jnp.asarray(g), grads[0]) if mesh is None else None
    if mesh is not None:
      micro = put(jax.device_get(grads[0]), jax.tree.map(lambda s: P(None, *s), specs))
    states = {name: tx.init(params) for name, tx in _stage_optimizers().items()}
    init_types, param_types = _typeof(states), _typeof(params)
    step = jax.jit(lambda *args: _stage_step(*args), compiler_options=FAST_COMPILE)
    _, _, results = _updates(step, states, grads, params, micro)
    assert len(TRACES) == 1  # the states' types did not change: one trace for every update
  return init_types, param_types, results


def test_layer_axis_sharded_on_its_own_mesh_axis():
  """The layer axis on "stage" and the worker axis on "data": under an Explicit mesh every
  statistic and state keeps its type through init, jit and the updates; under an Explicit and an
  Auto mesh the numbers are those of one device, to float32 rounding."""
  init_types, param_types, explicit = _run_stage(AxisType.Explicit)
  assert [_spec(t) for t in jax.tree.leaves(param_types)] == [
    ("stage", None),
    ("stage", None, None),
    (None, None),
    (None, "stage", None),
  ]
  _, _, auto = _run_stage(AxisType.Auto)
  _, _, single = _run_stage(None)
  for out in explicit:
    assert _typeof(out["states"]) == init_types
    for name, p in out["params"].items():
      assert _typeof(p) == param_types, name
    # A stacked leaf's statistics are sharded like its layer axis.
    for stats in (out["stats"], out["accumulated"]):
      assert _spec(jax.typeof(stats.sq_norm_mean["blocks"]["kernel"])) == ("stage",)
      assert _spec(jax.typeof(stats.mean_grad_sq_norm["mlp"]["kernel"])) == ("stage",)
      assert jax.typeof(stats.sq_norm_mean["head"]["kernel"]).shape == ()
  for mode, results in (("explicit", explicit), ("auto", auto)):
    for k, (a, b) in enumerate(zip(results, single, strict=True)):
      at = f"{mode} mesh vs one device, update {k + 1}"
      for key in ("stats", "accumulated", "params", "states", "diagnostics"):
        _assert_close(a[key], b[key], f"{at}: {key}")
      for stats in a["all_reduced"]:
        _assert_close(stats, b["stats"], f"{at}: all_reduce_grad_stats")
  # The slices have their own ratios (the test is not of one ratio per stack).
  ratios = np.asarray(single[-1]["diagnostics"]["gain_ratio"]["blocks"]["kernel"])
  assert len(set(ratios.tolist())) == 4
