"""Optax's conformance checks for its own optimizers, asked of every ready optimizer here.

Optax tests each optimizer it ships for: init from abstract shapes, extra keyword arguments to
``update`` without recompiling, convergence on small targets in a scanned run, ``tree.map_params``
on the state, ``inject_hyperparams``, the parameters' dtype in the updates, ``MultiSteps``,
state types through ``lax.cond`` for every float dtype, and a constant schedule in place of a
float rate. The same checks, written for this library's inputs: every optimizer here is fed the
S per-worker gradients of each step (their mean and ``ol.stacked_grad_stats``).

Cost: XLA's compile time is the whole cost, so the checks that do not train share one compiled
program per optimizer (``shared_run``), the four targets train side by side in one scanned loop
with the per-worker noise drawn on the host, and the type checks trace with ``jax.eval_shape``
and compile nothing.
"""

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_lena as ol

S = 4  # per-worker gradients of every update
NOISE = 0.3  # scale of the per-worker deviations from the exact gradient
LR_SGD = 4e-4  # eta0: plain SGD-m converges at eta0 and at S * eta0, the largest LENA rate
LR_ADAM = 2e-2  # eta0: optax.adamw converges at eta0 and at sqrt(S) * eta0 (power 0.5)
STEPS = 3000  # scanned steps of the convergence runs
TOL = 3e-2  # Optax's tolerance for its convergence checks

# Adam's decays near its defaults whose 1 - b is exact in float32: Python floats and the float32
# arrays of optax.inject_hyperparams then give the same arithmetic (with 0.9 and 0.999, 1 - b
# rounds differently in float32 than in float64, by up to 5e-5 relative for 1 - b2, as for
# optax.adamw itself).
ADAM = dict(b1=0.875, b2=1.0 - 2.0**-10)

# Every ready optimizer, with the options that put each of its blocks in the chain (weight decay,
# momentum or Adam, the rule, each warm-up, the rate).
OPTIMIZERS = {
  "lena": (ol.lena, dict(learning_rate=LR_SGD, weight_decay=1e-4, warmup_threshold=40.0)),
  "adascale": (ol.adascale, dict(learning_rate=LR_SGD, warmup_threshold=40.0)),
  "linear_scaling": (ol.linear_scaling, dict(learning_rate=LR_SGD, warmup_steps=40.0)),
  "lena_adamw": (ol.lena_adamw, dict(learning_rate=LR_ADAM, warmup_threshold=40.0, **ADAM)),
  "adascale_adamw": (ol.adascale_adamw, dict(learning_rate=LR_ADAM, **ADAM)),
  "linear_scaling_adamw": (
    ol.linear_scaling_adamw,
    dict(learning_rate=LR_ADAM, warmup_steps=40.0, **ADAM),
  ),
}
NAMES = list(OPTIMIZERS)


def make(name, **overrides):
  factory, kwargs = OPTIMIZERS[name]
  return factory(**{**kwargs, **overrides})


# -- targets (Optax's four) and their per-worker gradients ------------------------------------


def parabola(dtype):
  target = jnp.asarray([1.0, -1.0, 1.0], dtype)
  return jnp.asarray([-1.0, 10.0, 1.0], dtype), target, lambda p: jnp.sum(jnp.square(p - target))


def rosenbrock(dtype):
  def loss(p):
    return jnp.square(1.0 - p[0]) + 100.0 * jnp.square(p[1] - jnp.square(p[0]))

  return jnp.zeros((2,), dtype), jnp.ones((2,), dtype), loss


def matrix_parabola(dtype):
  target = jnp.asarray([[3.0, -2.0], [1.0, 4.0]], dtype)
  return jnp.zeros((2, 2), dtype), target, lambda p: jnp.sum(jnp.square(p - target))


def mixed_tree(dtype):
  target = (jnp.asarray([1.0, -1.0, 2.0], dtype), jnp.asarray([[1.0, 0.0], [-1.0, 1.0]], dtype))

  def loss(p):
    return sum(jnp.sum(jnp.square(x - t)) for x, t in zip(p, target, strict=True))

  init = (jnp.zeros((3,), dtype), jnp.zeros((2, 2), dtype))
  return init, target, loss


TARGETS = {
  "parabola": parabola,
  "rosenbrock": rosenbrock,
  "matrix_parabola": matrix_parabola,
  "mixed_tree": mixed_tree,
}


def worker_noise(params, steps, seed=0):
  """Deviations of the S per-worker gradients from the exact one, for ``steps`` steps: float32,
  ``[steps, S, *shape]`` per leaf, summing to zero over the workers (drawn on the host: random
  numbers in the compiled program would cost more compile time than the rest of it)."""
  rng = np.random.RandomState(seed)
  out = []
  for x in jax.tree.leaves(params):
    z = rng.randn(steps, S, *np.shape(x))
    out.append(jnp.asarray(NOISE * (z - z.mean(1, keepdims=True)), jnp.float32))
  return jax.tree.unflatten(jax.tree.structure(params), out)


def per_worker_grads(loss, params, noise):
  """S per-worker gradients stacked on axis 0: the exact gradient plus ``noise`` (one step of
  :func:`worker_noise`), so their mean is the exact gradient and the ratio sees noise."""
  return jax.tree.map(
    lambda g, z: (g[None].astype(jnp.float32) + z).astype(g.dtype), jax.grad(loss)(params), noise
  )


def lena_update(tx, params, state, stacked, **extra):
  mean, stats = ol.stacked_grad_stats(stacked)
  return tx.update(mean, state, params, grad_stats=stats, **extra)


def plain_update(tx, params, state, stacked, **extra):
  """A plain Optax optimizer fed the mean of the same per-worker gradients."""
  return tx.update(jax.tree.map(lambda g: jnp.mean(g, 0), stacked), state, params, **extra)


# -- small problem shared by the checks that do not train --------------------------------------


def small_params(dtype=jnp.float32):
  return [-jnp.ones((2, 3), dtype), jnp.ones((2, 5, 2), dtype)]


def small_grads(dtype=jnp.float32, seed=0):
  rng = np.random.RandomState(seed)
  return [
    jnp.asarray(1.0 + rng.randn(S, 2, 3), dtype),
    jnp.asarray(-1.0 + rng.randn(S, 2, 5, 2), dtype),
  ]


def inject_static_args(name):
  """The options left at their default 0 that decide whether a block is in the chain
  (``weight_decay``, ``warmup_steps``). Injected, they become arrays that may change under
  ``jit``, so the chain keeps a weight decay of 0 and a warm-up of length 0: the same updates,
  but a state with those two blocks more. Optax's own check keeps such options static."""
  factory, kwargs = OPTIMIZERS[name]
  defaults = {k: v.default for k, v in inspect.signature(factory).parameters.items()}
  return tuple(k for k in ("weight_decay", "warmup_steps") if k not in kwargs and defaults[k] == 0)


SHARED_STEPS = 3
VARIANTS = ("plain", "injected", "schedule")
MULTI_DTYPES = (jnp.bfloat16, jnp.float32)


@functools.cache
def shared_run(name):
  """The checks that do not train share one compiled program per optimizer, run for
  ``SHARED_STEPS`` steps on the small problem: the optimizer (``update`` given an unexpected
  keyword), ``optax.inject_hyperparams`` of it, the same with ``optax.constant_schedule`` for the
  rate, each on its own state, and the first call of ``optax.MultiSteps`` of it for bfloat16 and
  float32 parameters. Returns the per-step records and the number of traces of the program."""
  factory, kwargs = OPTIMIZERS[name]
  txs = {
    "plain": make(name),
    "injected": optax.inject_hyperparams(factory, static_args=inject_static_args(name))(**kwargs),
    "schedule": make(name, learning_rate=optax.constant_schedule(kwargs["learning_rate"])),
  }
  multi = optax.MultiSteps(make(name), every_k_schedule=4)
  traces = []

  @jax.jit
  def step(params, states, stacked, multi_inputs):
    traces.append(None)
    out = {}
    for k, tx in txs.items():
      updates, state = lena_update(tx, params[k], states[k], stacked, unexpected_keyword_for_lena=1)
      out[k] = (optax.apply_updates(params[k], updates), state, updates)
    first = [lena_update(multi, p, multi.init(p), g)[0] for p, g in multi_inputs]
    return out, first

  params = {k: small_params() for k in VARIANTS}
  states = {k: txs[k].init(params[k]) for k in VARIANTS}
  multi_inputs = [(small_params(d), small_grads(d)) for d in MULTI_DTYPES]
  records = []
  for seed in range(SHARED_STEPS):
    out, first = step(params, states, small_grads(seed=seed), multi_inputs)
    assert types(out) == types({k: (params[k], states[k], params[k]) for k in VARIANTS})
    params = {k: out[k][0] for k in VARIANTS}
    states = {k: out[k][1] for k in VARIANTS}
    records.append((out, first))
  return txs, records, len(traces)


def assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    assert jnp.asarray(x).dtype == jnp.asarray(y).dtype
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def assert_trees_close(a, b, rtol):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    assert jnp.asarray(x).dtype == jnp.asarray(y).dtype
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=0)


def types(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type), tree)


# -- the checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_init_from_abstract_shapes(name):
  """``jax.eval_shape(tx.init, ShapeDtypeStruct params)`` gives the concrete init's types, and
  an update traced on abstract inputs returns updates shaped like the parameters."""
  tx = make(name)
  params = small_params()
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  abstract_state = jax.eval_shape(tx.init, abstract)
  assert types(abstract_state) == types(tx.init(params))
  abstract_grads = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), small_grads())
  updates, new_state = jax.eval_shape(
    functools.partial(lena_update, tx), abstract, abstract_state, abstract_grads
  )
  assert types(updates) == types(params)
  assert types(new_state) == types(abstract_state)


@pytest.mark.parametrize("name", NAMES)
def test_unexpected_keyword_accepted_and_second_call_does_not_recompile(name):
  """``update(..., unexpected_keyword_for_lena=1)`` runs, and the jitted step is traced once
  for its three calls: the state it returns has the types it was given (checked per call)."""
  _, records, num_traces = shared_run(name)
  assert num_traces == 1
  params, state, _ = records[-1][0]["plain"]
  assert all(bool(jnp.all(jnp.isfinite(p))) for p in jax.tree.leaves(params))
  assert int(state.num_skipped) == 0


def run_targets(tx, update, steps=STEPS):
  """Trains ``tx`` (or a dict of optimizers) on the four targets side by side, each with its
  own state, in one scanned loop; the states go through ``optax.tree.map_params`` first, as in
  Optax's check. Returns the final parameters by optimizer key (if a dict) and target."""
  txs = tx if isinstance(tx, dict) else {None: tx}
  problems = {t: target(jnp.float32) for t, target in TARGETS.items()}

  def body(carry, noise):
    out = {}
    for (o, t), (params, state) in carry.items():
      stacked = per_worker_grads(problems[t][2], params, noise[t])
      updates, state = update(txs[o], params, state, stacked)
      out[o, t] = (optax.apply_updates(params, updates), state)
    return out, None

  @jax.jit
  def train(noise):
    carry = {}
    for o, tx in txs.items():
      for t, (params, _, _) in problems.items():
        carry[o, t] = (params, optax.tree.map_params(tx, lambda v: v, tx.init(params)))
    final, _ = jax.lax.scan(body, carry, noise)
    return {key: params for key, (params, _) in final.items()}

  noise = {t: worker_noise(p, steps, seed=i) for i, (t, (p, _, _)) in enumerate(problems.items())}
  finals = train(noise)
  return {t: finals[None, t] for t in TARGETS} if None in txs else finals


def assert_converged(finals, label=""):
  for t, target in TARGETS.items():
    _, expected, _ = target(jnp.float32)
    for x, y in zip(jax.tree.leaves(finals[t]), jax.tree.leaves(expected), strict=True):
      np.testing.assert_allclose(x, y, rtol=TOL, atol=TOL, err_msg=f"{label} {t}")


def test_baselines_converge_at_the_rates_used():
  """The rates of the checks below are ones where plain Optax converges too, at the base rate
  and at the largest rate a rule can reach (S * eta0 for SGD, sqrt(S) * eta0 for power 0.5)."""
  baselines = {
    "sgd-m": optax.sgd(LR_SGD, momentum=0.9),
    "sgd-m at S * eta0": optax.sgd(S * LR_SGD, momentum=0.9),
    "adamw": optax.adamw(LR_ADAM, **ADAM),
    "adamw at sqrt(S) * eta0": optax.adamw(np.sqrt(S) * LR_ADAM, **ADAM),
  }
  finals = run_targets(baselines, plain_update)
  for label in baselines:
    assert_converged({t: finals[label, t] for t in TARGETS}, label)


@pytest.mark.parametrize("name", NAMES)
def test_converges_on_optax_targets_in_a_scanned_run(name):
  assert_converged(run_targets(make(name), lena_update), name)


@pytest.mark.parametrize("name", NAMES)
def test_tree_map_params_reaches_exactly_the_parameter_shaped_state(name):
  """``optax.tree.map_params`` maps the leaves shaped like the parameters (momentum, Adam's
  moments) and leaves the per-layer vectors and counters alone."""
  txs, records, _ = shared_run(name)
  _, state, _ = records[0][0]["plain"]
  mapped = optax.tree.map_params(txs["plain"], lambda v: v + 1.0, state)
  changed = 0
  for old, new in zip(jax.tree.leaves(state), jax.tree.leaves(mapped), strict=True):
    if np.array_equal(np.asarray(old), np.asarray(new)):
      continue
    changed += 1
    assert old.shape in {x.shape for x in small_params()}
    np.testing.assert_array_equal(np.asarray(new), np.asarray(old) + 1.0)
  moments = 1 if name in ("lena", "adascale", "linear_scaling") else 2  # momentum / mu and nu
  assert changed == moments * len(small_params())


@pytest.mark.parametrize("name", NAMES)
def test_inject_hyperparams_gives_the_same_updates_and_inner_state(name):
  """``optax.inject_hyperparams(alias)(...)``: the same updates and inner state at every step
  (see :func:`inject_static_args` for the two options kept static). To float32 rounding: XLA
  fuses and folds a compile-time constant differently from the same value read from the state
  (a few ulp in the momentum and the warm-up factor; eager runs agree bitwise)."""
  _, records, _ = shared_run(name)
  for out, _ in records:
    _, state, updates = out["plain"]
    _, inj_state, inj_updates = out["injected"]
    assert_trees_close(inj_updates, updates, rtol=1e-6)
    assert_trees_close(inj_state.inner_state, state, rtol=1e-6)
  assert float(inj_state.hyperparams["learning_rate"]) == np.float32(
    OPTIMIZERS[name][1]["learning_rate"]
  )


@pytest.mark.parametrize("name", NAMES)
def test_constant_schedule_gives_the_same_run_as_the_float_rate(name):
  _, records, _ = shared_run(name)
  for out, _ in records:
    assert_trees_equal(out["schedule"][0], out["plain"][0])
    assert_trees_equal(out["schedule"][2], out["plain"][2])
  # The chains differ only in the rate's own state: the schedule keeps a count.
  state, s_sched = records[-1][0]["plain"][1], records[-1][0]["schedule"][1]
  assert_trees_equal(s_sched.inner_state[:-1], state.inner_state[:-1])
  assert int(s_sched.inner_state[-1].count) == SHARED_STEPS
  assert not np.array_equal(records[-1][0]["plain"][0][0], small_params()[0])


@pytest.mark.parametrize("name", NAMES)
def test_updates_keep_the_parameter_dtype(name):
  tx = make(name)
  for dtype in (jnp.bfloat16, jnp.float32):
    params, stacked = small_params(dtype), small_grads(dtype)
    state = jax.eval_shape(tx.init, params)
    updates, _ = jax.eval_shape(functools.partial(lena_update, tx), params, state, stacked)
    assert [u.dtype for u in updates] == [dtype, dtype]


@pytest.mark.parametrize("name", NAMES)
def test_multisteps_returns_exact_zeros_on_its_first_call(name):
  _, records, _ = shared_run(name)
  for _, first in records:
    for dtype, updates in zip(MULTI_DTYPES, first, strict=True):
      for u in updates:
        assert u.dtype == dtype
        np.testing.assert_array_equal(np.asarray(u, np.float32), 0.0)


@pytest.mark.parametrize("name", NAMES)
def test_state_types_stable_through_lax_cond(name):
  """Optax's check: the update inside ``lax.cond`` against ``(params, state)`` unchanged, for
  float16, bfloat16, float32 and float64 parameters; the types are those of tracing, so
  ``jax.eval_shape`` checks them without compiling (float64 under ``jax.enable_x64``)."""

  def check(dtype):
    tx = make(name)
    params, _, loss = parabola(dtype)
    noise = worker_noise(params, 1)

    def step(params, state, flip):
      stacked = per_worker_grads(loss, params, jax.tree.map(lambda z: z[0], noise))
      updates, state = jax.lax.cond(
        flip > 0,
        lambda: lena_update(tx, params, state, stacked),
        lambda: (params, state),
      )
      return optax.apply_updates(params, updates), state

    state = tx.init(params)
    for seed in range(2):
      new_params, new_state = jax.eval_shape(step, params, state, jnp.int32(seed))
      assert new_params.dtype == dtype
      assert types(new_state) == types(state)
      state = new_state  # abstract: the second step is traced on the first one's output types

  for dtype in (jnp.float16, jnp.bfloat16, jnp.float32):
    check(dtype)
  with jax.enable_x64(True):
    check(jnp.float64)
