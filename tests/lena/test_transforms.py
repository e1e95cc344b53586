"""Behaviour of the transformations: exact reductions, properties, composition with Optax."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import optax_lena as ol


def params_tree():
  return {
    "w": jnp.asarray(np.linspace(-1, 1, 12).reshape(3, 4), jnp.float32),
    "b": jnp.asarray([0.5, -0.5, 0.25], jnp.float32),
  }


def worker_grads(s, seed, scale=1.0):
  rng = np.random.RandomState(seed)
  return {
    "w": jnp.asarray(scale * (0.3 + rng.randn(s, 3, 4)), jnp.float32),
    "b": jnp.asarray(scale * rng.randn(s, 3), jnp.float32),
  }


def run(tx, steps, s, jit=True, seed=0, params=None):
  params = params_tree() if params is None else params
  state = tx.init(params)
  update = jax.jit(tx.update) if jit else tx.update
  for t in range(steps):
    mean, stats = ol.stacked_grad_stats(worker_grads(s, seed + t))
    updates, state = update(mean, state, params, grad_stats=stats)
    params = optax.apply_updates(params, updates)
  return params, state


# -- (c) S = 1 is exactly momentum SGD --------------------------------------------------------


def assert_single_worker_trajectory_equals(tx, sgd, steps=10):
  """Runs ``tx`` on S = 1 statistics and ``sgd`` on the same gradients; parameters must agree
  bitwise after every step. Returns the final ``tx`` state."""
  params = params_tree()
  state, sgd_state, sgd_params = tx.init(params), sgd.init(params), params
  for t in range(steps):
    mean, stats = ol.stacked_grad_stats(worker_grads(1, t))
    assert stats.num_samples == 1
    updates, state = tx.update(mean, state, params, grad_stats=stats)
    params = optax.apply_updates(params, updates)
    sgd_updates, sgd_state = sgd.update(mean, sgd_state, sgd_params)
    sgd_params = optax.apply_updates(sgd_params, sgd_updates)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(sgd_params), strict=True):
      np.testing.assert_array_equal(a, b)
  return state


@pytest.mark.parametrize("alias", [ol.lena, ol.adascale, ol.linear_scaling])
def test_single_worker_is_exactly_momentum_sgd(alias):
  state = assert_single_worker_trajectory_equals(
    alias(0.05, momentum=0.9), optax.sgd(0.05, momentum=0.9)
  )
  np.testing.assert_array_equal(ol.diagnostics(state)["gain_ratio"], 1.0)


def test_single_worker_with_weight_decay_is_exactly_coupled_sgd():
  assert_single_worker_trajectory_equals(
    ol.lena(0.05, momentum=0.9, weight_decay=1e-3),
    optax.chain(optax.add_decayed_weights(1e-3), optax.sgd(0.05, momentum=0.9)),
  )


# -- (e) jit and no-jit agree -------------------------------------------------------------------


@pytest.mark.parametrize(
  "make",
  [
    lambda: ol.lena(0.1, weight_decay=5e-4, warmup_threshold=25.0),
    lambda: ol.adascale(0.1, warmup_steps=40),
    lambda: ol.linear_scaling(0.1, warmup_steps=40),
    lambda: ol.lena(optax.exponential_decay(0.1, 100, 0.01), clock="samples", grouping="module"),
  ],
)
def test_jit_and_eager_agree(make):
  p_jit, s_jit = run(make(), 6, 8, jit=True)
  p_eager, s_eager = run(make(), 6, 8, jit=False)
  for a, b in zip(
    jax.tree.leaves((p_jit, s_jit)), jax.tree.leaves((p_eager, s_eager)), strict=True
  ):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


# -- (d) properties ---------------------------------------------------------------------------

floats = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)
jitted_stacked_grad_stats = jax.jit(ol.stacked_grad_stats)


# The property tests below run many small updates of fixed shapes: compiled once per eps and
# shape and shared by every example, instead of dispatched primitive by primitive.
@functools.cache
def lena_ratio_init(eps):
  return jax.jit(ol.scale_by_lena(eps=eps).init)


@functools.cache
def lena_ratio_step(eps):
  tx = ol.scale_by_lena(eps=eps)

  @jax.jit
  def step(g, state, params):
    mean, stats = ol.stacked_grad_stats(g)
    return tx.update(mean, state, params, grad_stats=stats)[1]

  return step


@settings(max_examples=60, deadline=None)
@given(s=st.integers(1, 256), seed=st.integers(0, 2**16), signal=floats, noise=floats)
def test_ratio_is_within_one_and_s(s, seed, signal, noise):
  rng = np.random.RandomState(seed)
  grads = {
    "a": (signal + noise * rng.randn(s, 5)).astype(np.float32),
    "b": (noise * rng.randn(s, 2, 2)).astype(np.float32),
  }
  params = jax.tree.map(lambda g: jnp.asarray(g[0]), grads)
  # Most draws bring a new S: one compiled program per S instead of one per eager primitive.
  mean, stats = jitted_stacked_grad_stats(grads)
  for tx in (
    ol.scale_by_lena(),
    ol.scale_by_adascale(),
    ol.scale_by_linear_scaling(),
    ol.scale_by_lena(eps=0.0),
  ):
    _, state = tx.update(mean, tx.init(params), params, grad_stats=stats)
    ratio = np.asarray(state.ratio)
    assert np.all(np.isfinite(ratio))
    assert np.all(ratio >= 1.0) and np.all(ratio <= s)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), log_c=st.floats(-2.0, 2.0))
def test_ratio_is_invariant_to_gradient_scale(seed, log_c):
  """With eps = 0 the ratio is invariant at any representable scale. The paper's absolute eps
  (1e-6) breaks invariance once the moving averages (~beta * ||g||^2, here ~0.04 c^2) come near
  eps, so that case is asserted only for c >= 1, where eps is below 3e-5 of them."""
  c = 10.0**log_c
  rng = np.random.RandomState(seed)
  base = {"a": 0.5 + rng.randn(8, 20), "b": rng.randn(8, 7) * 0.1 + 2.0}
  params = jax.tree.map(lambda g: jnp.zeros(g.shape[1:]), base)

  def ratios(scale, eps):
    state = lena_ratio_init(eps)(params)
    for t in range(3):
      g = jax.tree.map(lambda x, t=t: np.asarray(scale * x * (1 + 0.1 * t), np.float32), base)
      state = lena_ratio_step(eps)(g, state, params)
    return np.asarray(state.ratio)

  if c >= 1.0:
    np.testing.assert_allclose(ratios(c, 1e-6), ratios(1.0, 1e-6), rtol=1e-4)
  np.testing.assert_allclose(ratios(c, 0.0), ratios(1.0, 0.0), rtol=1e-5)


@pytest.mark.parametrize("scale", [1e-6, 1e12])
def test_ratio_with_zero_eps_is_invariant_at_extreme_scales(scale):
  grads = worker_grads(8, 3)
  params = params_tree()

  def ratios(c):
    tx = ol.scale_by_lena(eps=0.0)
    mean, stats = ol.stacked_grad_stats(jax.tree.map(lambda g: g * c, grads))
    _, state = tx.update(mean, tx.init(params), params, grad_stats=stats)
    return np.asarray(state.ratio)

  np.testing.assert_allclose(ratios(scale), ratios(1.0), rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(
  seed=st.integers(0, 2**16),
  theta=st.floats(1.0, 200.0),
  s=st.integers(1, 64),
  rule=st.sampled_from(["lena", "adascale", "linear_scaling"]),
)
def test_warmup_progress_never_decreases(seed, theta, s, rule):
  rng = np.random.RandomState(seed)
  params = {"a": jnp.zeros(4), "b": jnp.zeros(3)}
  tx = ol.layerwise_warmup(theta, rule=rule)
  state = tx.init(params)

  @jax.jit  # with the statistics: one program per draw, not one per eager primitive and S
  def update(g, state):
    mean, stats = ol.stacked_grad_stats(g)
    return tx.update(mean, state, params, grad_stats=stats)

  prev_progress, prev_end = np.zeros(2), np.full(2, -1)
  for _ in range(8):
    scale = rng.choice([0.0, 1e-3, 1.0, 50.0])
    g = {
      "a": jnp.asarray(rng.randn(s, 4) * scale + rng.randn(), jnp.float32),
      "b": jnp.asarray(rng.randn(s, 3) * scale, jnp.float32),
    }
    _, state = update(g, state)
    progress, factor = np.asarray(state.progress), np.asarray(state.factor)
    assert np.all(progress >= prev_progress + 1.0 - 1e-6)  # r >= 1 every update
    assert np.all((factor > 0) & (factor <= 1))
    end = np.asarray(state.end_step)
    assert np.all((prev_end < 0) | (end == prev_end))  # an end step, once set, stays
    prev_progress, prev_end = progress, end


# -- composition with Optax ---------------------------------------------------------------


def test_lena_around_adam_inner_update_uses_raw_gradient_statistics():
  params = params_tree()
  theta = 30.0
  tx = ol.skip_nonfinite_steps(
    optax.chain(
      optax.scale_by_adam(),
      ol.scale_by_lena(),
      ol.layerwise_warmup(theta),
      optax.scale_by_learning_rate(1e-3),
    )
  )
  reference = ol.lena(0.1, warmup_threshold=theta)
  state, ref_state = tx.init(params), reference.init(params)
  for t in range(5):
    mean, stats = ol.stacked_grad_stats(worker_grads(8, t))
    updates, state = tx.update(mean, state, params, grad_stats=stats)
    _, ref_state = reference.update(mean, ref_state, params, grad_stats=stats)
    assert all(np.all(np.isfinite(u)) for u in jax.tree.leaves(updates))
  diag, ref = ol.diagnostics(state), ol.diagnostics(ref_state)
  # The ratio and warm-up come from the raw gradients' statistics, not from Adam's output.
  np.testing.assert_allclose(diag["gain_ratio"], ref["gain_ratio"], rtol=1e-6)
  np.testing.assert_allclose(diag["warmup_factor"], ref["warmup_factor"], rtol=1e-6)


def test_lena_around_lamb_runs_and_scales_by_ratio():
  params = params_tree()
  lamb = optax.lamb(1e-3)
  tx = optax.chain(lamb, ol.scale_by_lena())
  state = tx.init(params)
  lamb_state = lamb.init(params)
  mean, stats = ol.stacked_grad_stats(worker_grads(8, 0))
  updates, state = tx.update(mean, state, params, grad_stats=stats)
  lamb_updates, _ = lamb.update(mean, lamb_state, params)
  ratio = ol.diagnostics(state)["gain_ratio"]
  for k, (u, lu) in enumerate(
    zip(jax.tree.leaves(updates), jax.tree.leaves(lamb_updates), strict=True)
  ):
    np.testing.assert_allclose(u, lu * ratio[k], rtol=1e-6)


def test_inject_hyperparams_changes_learning_rate_while_training():
  params = params_tree()
  tx = optax.inject_hyperparams(ol.lena)(learning_rate=0.1, weight_decay=5e-4)
  state = tx.init(params)
  mean, stats = ol.stacked_grad_stats(worker_grads(8, 0))
  step = jax.jit(tx.update)
  u1, state1 = step(mean, state, params, grad_stats=stats)
  state.hyperparams["learning_rate"] = jnp.asarray(0.05)
  u2, _ = step(mean, state, params, grad_stats=stats)
  for a, b in zip(jax.tree.leaves(u1), jax.tree.leaves(u2), strict=True):
    np.testing.assert_allclose(b, 0.5 * a, rtol=1e-6)
  assert float(ol.diagnostics(state1)["gain_ratio"][0]) > 1.0


def test_sample_clock_feeds_base_steps_to_the_schedule():
  seen = []
  sched = lambda count: 0.1 + 0.0 * count
  params = params_tree()

  def recording(count):
    seen.append(count)
    return sched(count)

  for clock, expected in (("samples", [0, 8, 16]), ("updates", [0, 1, 2])):
    seen.clear()
    tx = ol.lena(recording, clock=clock)
    state = tx.init(params)
    for t in range(3):
      mean, stats = ol.stacked_grad_stats(worker_grads(8, t))
      _, state = tx.update(mean, state, params, grad_stats=stats)
    assert [int(c) for c in seen[-3:]] == expected, clock


def test_schedule_on_sample_clock_gives_paper_exponential_decay():
  total_base_steps = 80
  sched = lambda b: 0.1 * 0.01 ** (b / total_base_steps)
  params = params_tree()
  tx = ol.linear_scaling(sched, momentum=None, clock="samples")
  state = tx.init(params)
  for t in range(4):
    mean, stats = ol.stacked_grad_stats(worker_grads(8, t))
    updates, state = tx.update(mean, state, params, grad_stats=stats)
    expected = -8 * sched(8 * t) * np.asarray(mean["b"])
    np.testing.assert_allclose(updates["b"], expected, rtol=1e-5)


@pytest.mark.parametrize(
  "grouping",
  [
    "module",
    ol.group_by_module,
    {"dense": {"kernel": "d", "bias": "d"}, "out": {"kernel": "o", "bias": "o"}},
  ],
)
def test_grouping_shares_ratio_and_progress_within_a_group(grouping):
  params = {
    "dense": {"kernel": jnp.zeros((4, 3)), "bias": jnp.zeros(3)},
    "out": {"kernel": jnp.zeros((3, 2)), "bias": jnp.zeros(2)},
  }
  rng = np.random.RandomState(0)
  grads = {
    "dense": {
      "kernel": jnp.asarray(rng.randn(8, 4, 3) + 1, jnp.float32),
      "bias": jnp.asarray(rng.randn(8, 3) * 5, jnp.float32),
    },
    "out": {
      "kernel": jnp.asarray(rng.randn(8, 3, 2), jnp.float32),
      "bias": jnp.asarray(rng.randn(8, 2) + 2, jnp.float32),
    },
  }
  tx = ol.lena(0.1, grouping=grouping, warmup_threshold=20.0)
  mean, stats = ol.stacked_grad_stats(grads)
  _, state = tx.update(mean, tx.init(params), params, grad_stats=stats)
  d = ol.diagnostics(state, params)
  for key in ("gain_ratio", "warmup_progress"):
    assert d[key]["dense"]["kernel"] == d[key]["dense"]["bias"]
    assert d[key]["out"]["kernel"] == d[key]["out"]["bias"]
  # the group ratio comes from the summed statistics of its members
  top = stats.sq_norm_mean["dense"]["kernel"] + stats.sq_norm_mean["dense"]["bias"]
  bot = stats.mean_grad_sq_norm["dense"]["kernel"] + stats.mean_grad_sq_norm["dense"]["bias"]
  beta = 8 / 1000
  expected = np.clip((beta * top + 1e-6) / (beta * bot + 1e-6), 1, 8)
  np.testing.assert_allclose(d["gain_ratio"]["dense"]["kernel"], expected, rtol=1e-5)


def test_masked_and_frozen_layers_give_ratio_one():
  params = {"frozen": jnp.ones((3,)), "live": jnp.ones((4,))}
  rng = np.random.RandomState(0)
  grads = {"frozen": jnp.zeros((8, 3)), "live": jnp.asarray(rng.randn(8, 4), jnp.float32)}
  mean, stats = ol.stacked_grad_stats(grads)
  for eps in (1e-6, 0.0):
    tx = ol.lena(0.1, eps=eps, warmup_threshold=10.0)
    updates, state = tx.update(mean, tx.init(params), params, grad_stats=stats)
    d = ol.diagnostics(state, params)
    assert float(d["gain_ratio"]["frozen"]) == 1.0
    assert np.all(updates["frozen"] == 0)
    assert 1.0 < float(d["gain_ratio"]["live"]) <= 8.0
  masked = optax.masked(ol.lena(0.1), {"frozen": False, "live": True})
  updates, state = masked.update(mean, masked.init(params), params, grad_stats=stats)
  assert np.all(np.isfinite(updates["live"]))
  multi = optax.multi_transform(
    {"sgd": ol.lena(0.1), "off": optax.set_to_zero()}, {"frozen": "off", "live": "sgd"}
  )
  updates, state = multi.update(mean, multi.init(params), params, grad_stats=stats)
  assert np.all(updates["frozen"] == 0) and np.all(np.isfinite(updates["live"]))
  inner = state.inner_states["sgd"].inner_state
  assert ol.diagnostics(inner)["gain_ratio"].shape == (1,)


def test_empty_parameter_tree():
  tx = ol.lena(0.1, warmup_threshold=5.0)
  state = tx.init({})
  updates, state = jax.jit(tx.update)({}, state, {}, grad_stats=ol.GradStats({}, 8, {}))
  assert updates == {}
  assert ol.diagnostics(state)["gain_ratio"].shape == (0,)


def test_diagnostics_is_jittable_and_reports_noise_scale():
  _, state = run(ol.lena(0.1, warmup_threshold=20.0), 4, 8)
  d = jax.jit(ol.diagnostics)(state)
  rs = next(x for x in state.inner_state if isinstance(x, ol.GainRatioState))
  s = 8
  top, bot = (
    np.asarray(rs.sq_norm_mean_avg, np.float64),
    np.asarray(rs.mean_grad_sq_norm_avg, np.float64),
  )
  g2 = (s * bot - top) / (s - 1)  # unbiased |G|^2 (per-worker batch b = 1 unit)
  tr_sigma = s * (top - bot) / (s - 1)  # unbiased tr(Sigma) * b
  np.testing.assert_allclose(d["noise_scale"], tr_sigma / g2, rtol=1e-4)
  np.testing.assert_allclose(d["lr_multiplier"], d["gain_ratio"] * d["warmup_factor"])
  assert int(d["num_updates"]) == 4 and int(d["num_samples"]) == 8


@pytest.mark.parametrize(
  "make",
  [
    lambda: ol.lena(0.1, warmup_threshold=5.0),
    lambda: ol.adascale(0.1, warmup_steps=10),
    lambda: ol.linear_scaling(0.1, clock="samples"),
  ],
)
def test_state_can_be_donated_to_a_jitted_step(make):
  """Every state field is its own buffer, so `donate_argnums` works (a shared zero array made
  XLA abort with 'donate the same buffer twice')."""
  tx = make()
  params = params_tree()
  state = tx.init(params)
  leaves = jax.tree.leaves(state)
  assert len({id(x) for x in leaves}) == len(leaves)

  def step(params, state, stacked):
    mean, stats = ol.stacked_grad_stats(stacked)
    updates, state = tx.update(mean, state, params, grad_stats=stats)
    return optax.apply_updates(params, updates), state

  donated = jax.jit(step, donate_argnums=(0, 1))
  params = jax.tree.map(jnp.copy, params)
  for t in range(3):
    params, state = donated(params, state, worker_grads(8, t))
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(params))


# -- per-leaf scalars without per-leaf kernels ------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, 5, 17, 130])
def test_unstack_scalars_is_bitwise_indexing(n):
  from optax_lena._src import tree_utils

  values = (np.random.RandomState(n).randn(n) * 10.0 ** (np.arange(n) % 20)).astype(np.float32)
  special = np.asarray([-0.0, np.inf, -np.inf, np.nan, 1e-45], np.float32)
  values[: min(n, 5)] = special[: min(n, 5)]
  out = jax.jit(tree_utils.unstack_scalars)(jnp.asarray(values))
  assert len(out) == n
  got = np.asarray([np.asarray(x) for x in out], np.float32).reshape(n)
  np.testing.assert_array_equal(got.view(np.uint32), values.view(np.uint32))  # bits, sign of 0


def distinct_fused_kernels(num_leaves):
  """Distinct fused computations in LENA's compiled update over leaves of one shape."""
  import re

  tx = ol.lena(0.1, weight_decay=5e-4, warmup_threshold=50.0)
  params = [jnp.zeros((8,))] * num_leaves
  stats = ol.GradStats([jnp.ones(())] * num_leaves, 4, [jnp.ones(())] * num_leaves)
  state = jax.eval_shape(tx.init, params)
  text = (
    jax.jit(lambda p, s, g: tx.update(g, s, p, grad_stats=stats))
    .lower(params, state, params)
    .compile()
    .as_text()
  )
  bodies = re.findall(r"^%fused\S* \(.*?\) -> .*? \{\n(.*?)\n\}", text, re.M | re.S)
  return len({re.sub(r"%[\w.\-]+", "%", re.sub(r", metadata=\{[^}]*\}", "", b)) for b in bodies})


def test_per_leaf_kernels_are_shared_by_leaves_of_one_shape():
  """The ratio and warm-up factor reach each leaf's kernel as its own scalar, not as a slice at
  a constant offset (which made every leaf's kernel distinct, one compile of each): tripling
  the leaves of one shape adds at most a few kernels (the split of the per-leaf vectors)."""
  assert distinct_fused_kernels(24) <= distinct_fused_kernels(8) + 4
