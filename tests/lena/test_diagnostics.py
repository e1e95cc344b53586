"""ol.flat_diagnostics: finite floats keyed by parameter path, ready for metric writers."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optax_lena as ol

S = 4
# Layer "signal": every worker has the same gradient (ratio 1). Layer "noise": the workers'
# gradients cancel (mean 0: ratio S, noise-dominated, infinite noise scale).
PARAMS = {"dense": {"signal": jnp.zeros((3,)), "noise": jnp.zeros((2,))}}


def stacked_grads(step: int) -> dict:
  sign = np.array([1.0, -1.0, 1.0, -1.0])[:, None]
  return {
    "dense": {
      "signal": jnp.asarray(np.full((S, 3), 1.0 + step), jnp.float32),
      "noise": jnp.asarray(sign * np.array([[2.0, 1.0]]), jnp.float32),
    }
  }


def run(tx, steps: int):
  @jax.jit  # one compilation instead of op-by-op dispatch of every update
  def step(params, state, stacked):
    grads, stats = ol.stacked_grad_stats(stacked)
    updates, state = tx.update(grads, state, params, grad_stats=stats)
    return jax.tree.map(jnp.add, params, updates), state

  state = tx.init(PARAMS)
  params = PARAMS
  for t in range(steps):
    params, state = step(params, state, stacked_grads(t))
  return state


def test_keys_are_paths_values_are_finite_floats_and_match_diagnostics():
  state = run(ol.lena(0.1, warmup_threshold=6.0, eps=0.0), 3)
  flat = ol.flat_diagnostics(state, PARAMS)
  json.dumps(flat, allow_nan=False)  # raises on inf/NaN
  assert all(type(v) is float for v in flat.values())
  # jax.tree.leaves order of PARAMS: dense/noise, dense/signal.
  assert flat["gain_ratio/dense/noise"] == float(S)
  assert flat["gain_ratio/dense/signal"] == 1.0
  diag = ol.diagnostics(state)
  for key in ("gain_ratio", "warmup_progress", "warmup_factor", "lr_multiplier"):
    np.testing.assert_array_equal(
      [flat[f"{key}/dense/noise"], flat[f"{key}/dense/signal"]], np.asarray(diag[key])
    )
  assert flat["num_updates"] == 3.0 and flat["num_samples"] == float(S)
  assert flat["num_layers"] == 2.0 and flat["num_skipped_steps"] == 0.0
  # Without params the layers are named by their index in jax.tree.leaves order.
  unnamed = ol.flat_diagnostics(state, prefix="opt/")
  assert unnamed["opt/gain_ratio/0"] == float(S) and unnamed["opt/gain_ratio/1"] == 1.0
  assert set(unnamed) == {
    "opt/" + k.replace("dense/noise", "0").replace("dense/signal", "1") for k in flat
  }


def test_warmup_end_step_present_only_once_the_layer_has_ended():
  # theta = 6: the noisy layer advances by S = 4 per update and reaches full rate at update 2;
  # the signal layer advances by 1 and reaches it at update 6.
  tx = ol.lena(0.1, warmup_threshold=6.0, eps=0.0)
  expected = {1: {}, 2: {"noise": 2.0}, 5: {"noise": 2.0}, 6: {"noise": 2.0, "signal": 6.0}}
  for steps, ended in expected.items():
    flat = ol.flat_diagnostics(run(tx, steps), PARAMS)
    got = {k.split("/")[-1]: v for k, v in flat.items() if k.startswith("warmup_end_step/")}
    assert got == ended, steps
    assert flat["num_layers_warmed_up"] == float(len(ended))
    np.testing.assert_allclose(
      flat["warmup_progress/dense/signal"], float(steps), rtol=1e-6
    )  # P_k = sum of ratios = steps x 1
    np.testing.assert_allclose(flat["warmup_progress/dense/noise"], 4.0 * steps, rtol=1e-6)
  # ol.diagnostics keeps the documented int32 sentinel -1 for "not ended".
  assert np.asarray(ol.diagnostics(run(tx, 1))["warmup_end_step"]).tolist() == [-1, -1]


def test_non_finite_noise_scales_are_left_out_and_finite_ones_match_float64():
  state = run(ol.lena(0.1), 4)
  flat = ol.flat_diagnostics(state, PARAMS)
  assert "noise_scale/dense/noise" not in flat  # signal estimate <= 0: infinite
  assert np.isinf(np.asarray(ol.diagnostics(state)["noise_scale"])[0])
  # Signal layer: top = bot (identical workers) -> B_simple = 0 exactly.
  assert flat["noise_scale/dense/signal"] == 0.0
  # Global noise scale from the float64 moving averages: S (A - D) / (S D - A).
  beta = S / 1000.0
  a = d = 0.0
  for t in range(4):
    top = 3 * (1.0 + t) ** 2 + 5.0
    bot = 3 * (1.0 + t) ** 2
    a, d = beta * top + (1 - beta) * a, beta * bot + (1 - beta) * d
  np.testing.assert_allclose(flat["global_noise_scale"], S * (a - d) / (S * d - a), rtol=1e-5)
  json.dumps(flat, allow_nan=False)


def test_single_worker_has_no_noise_scale_keys():
  tx = ol.lena(0.1)
  state = tx.init(PARAMS)
  grads, stats = ol.stacked_grad_stats(jax.tree.map(lambda g: g[:1], stacked_grads(0)))
  _, state = tx.update(grads, state, PARAMS, grad_stats=stats)
  flat = ol.flat_diagnostics(state, PARAMS)
  assert not [k for k in flat if "noise_scale" in k]
  json.dumps(flat, allow_nan=False)


def test_other_parameter_tree_raises_with_the_fix():
  state = ol.lena(0.1).init(PARAMS)
  with pytest.raises(ValueError, match="pass the parameter tree the optimizer was initialised"):
    ol.flat_diagnostics(state, {"w": jnp.ones(2)})


def test_nnx_state_gives_named_plain_trees():
  nnx = pytest.importorskip("flax.nnx")

  class Model(nnx.Module):
    def __init__(self, rngs):
      self.hidden = nnx.Linear(2, 3, rngs=rngs)
      self.out = nnx.Linear(3, 1, rngs=rngs)

    def __call__(self, x):
      return self.out(jax.nn.tanh(self.hidden(x)))

  model = Model(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, ol.lena(0.1, warmup_threshold=5.0), wrt=nnx.Param)
  graphdef, params = nnx.split(model, nnx.Param)
  loss = lambda p, x: jnp.mean(nnx.merge(graphdef, p)(x) ** 2)
  x = jax.random.normal(jax.random.key(0), (S, 5, 2))
  grads, stats = jax.jit(
    lambda p, x: ol.stacked_grad_stats(jax.vmap(jax.grad(loss), in_axes=(None, 0))(p, x))
  )(params, x)
  nnx.jit(lambda o, m, g, s: o.update(m, g, grad_stats=s))(optimizer, model, grads, stats)
  param_state = nnx.state(model, nnx.Param)
  # nnx.Optimizer wraps its state in OptArray / OptVariable: diagnostics returns plain arrays.
  plain = ol.diagnostics(optimizer.opt_state)
  assert all(type(v) is type(jnp.zeros(1)) for v in plain.values()), plain
  np.testing.assert_array_equal(plain["num_samples"], S)
  diag = ol.diagnostics(optimizer.opt_state, param_state)
  leaves = jax.tree.leaves(diag["gain_ratio"], is_leaf=lambda v: isinstance(v, nnx.Variable))
  assert leaves and not any(isinstance(v, nnx.Variable) for v in leaves)
  assert set(diag["gain_ratio"]["hidden"]) == {"kernel", "bias"}
  flat = ol.flat_diagnostics(optimizer.opt_state, param_state)
  assert {k for k in flat if k.startswith("gain_ratio/")} == {
    "gain_ratio/hidden/bias",
    "gain_ratio/hidden/kernel",
    "gain_ratio/out/bias",
    "gain_ratio/out/kernel",
  }
  json.dumps(flat, allow_nan=False)


# -- batch-size advice: the critical batch size and the expected speed-up ----------------------

DIM, NUM_GRADS, STEPS_NOISE, BETA = 2000, 16, 300, 0.02


def noise_scale_problem(true_noise_scale: float, seed: int):
  """Per-worker gradients ``u + sigma z_i``, |u| = 1, z_i ~ N(0, I): B_simple = sigma^2 DIM.

  Returns the final optimizer state and the a-priori relative standard deviation of the
  estimate (the signal estimate dominates it: per update ``bot`` has variance
  ``4 sigma^2 / S + 2 sigma^4 DIM / S^2``; the moving average keeps ``beta / (2 - beta)`` of it).
  """
  sigma = np.sqrt(true_noise_scale / DIM)
  rng = np.random.RandomState(seed)
  u = rng.randn(DIM)
  u /= np.linalg.norm(u)
  tx = ol.scale_by_lena(beta=BETA, eps=0.0)
  params = {"w": jnp.zeros(DIM)}
  state = tx.init(params)

  @jax.jit
  def step(state, stacked):
    grads, stats = ol.stacked_grad_stats(stacked)
    return tx.update(grads, state, params, grad_stats=stats)[1]

  for _ in range(STEPS_NOISE):
    g = u + sigma * rng.randn(NUM_GRADS, DIM)
    state = step(state, {"w": jnp.asarray(g, jnp.float32)})
  s = NUM_GRADS
  per_update = np.sqrt(4 * sigma**2 / s + 2 * sigma**4 * DIM / s**2) * s / (s - 1)
  return state, per_update * np.sqrt(BETA / (2 - BETA))


@pytest.mark.parametrize("true_noise_scale", [4.0, 64.0])
def test_critical_batch_size_and_speedup_on_a_closed_form_noise_scale(true_noise_scale):
  state, rel_std = noise_scale_problem(true_noise_scale, seed=0)
  candidates = [1.0, 4.0, 16.0, 64.0, 256.0]
  diag = ol.diagnostics(state, candidate_scales=candidates)
  crit = float(diag["critical_batch_size"])
  # Five standard deviations of the estimate, fixed before looking at the result.
  np.testing.assert_allclose(crit, true_noise_scale, rtol=5 * rel_std)
  assert crit == float(diag["global_noise_scale"])  # one leaf: the layer's noise scale
  # The speed-up follows from the estimate with McCandlish et al.'s steps ~ 1 + B_crit / B ...
  s = NUM_GRADS
  want = (1 + crit / s) / (1 + crit / np.asarray(candidates))
  np.testing.assert_allclose(np.asarray(diag["expected_speedup"]), want, rtol=1e-6)
  # ... and is the closed form up to the estimate's error, 1 at the current scale.
  closed = (1 + true_noise_scale / s) / (1 + true_noise_scale / np.asarray(candidates))
  np.testing.assert_allclose(np.asarray(diag["expected_speedup"]), closed, rtol=5 * rel_std)
  assert float(diag["expected_speedup"][2]) == pytest.approx(1.0, rel=1e-6)
  # Below B_crit a larger batch nearly divides the updates; far above it, it hardly helps.
  speedup = dict(zip(candidates, np.asarray(diag["expected_speedup"]).tolist(), strict=True))
  if true_noise_scale < s:
    assert speedup[256.0] < 1.3
  else:
    assert speedup[64.0] > 2.0
  flat = ol.flat_diagnostics(state, candidate_scales=candidates)
  assert flat["critical_batch_size"] == pytest.approx(crit)
  assert flat["expected_speedup/256"] == pytest.approx(speedup[256.0])
  assert flat["expected_speedup/1"] == pytest.approx(speedup[1.0])


def test_speedup_when_noise_dominates_is_linear_and_critical_batch_is_left_out():
  state = run(ol.adascale(0.1), 3)  # the "noise" layer cancels, the "signal" has no noise
  diag = ol.diagnostics(ol.scale_by_linear_scaling().init(PARAMS), candidate_scales=[8.0])
  assert np.isnan(float(diag["critical_batch_size"]))  # no statistics yet (S = 0)
  assert np.isnan(float(diag["expected_speedup"][0]))
  noise_only = {"noise": jnp.zeros((2,))}
  tx = ol.scale_by_lena(eps=0.0)
  st = tx.init(noise_only)
  for t in range(3):
    grads, stats = ol.stacked_grad_stats({"noise": stacked_grads(t)["dense"]["noise"]})
    _, st = tx.update(grads, st, noise_only, grad_stats=stats)
  diag = ol.diagnostics(st, candidate_scales=[2.0, 8.0])
  assert np.isinf(float(diag["critical_batch_size"]))
  np.testing.assert_allclose(np.asarray(diag["expected_speedup"]), [2.0 / S, 8.0 / S])
  flat = ol.flat_diagnostics(st, candidate_scales=[8.0])
  assert "critical_batch_size" not in flat and flat["expected_speedup/8"] == 8.0 / S
  assert "critical_batch_size" in ol.flat_diagnostics(state)
