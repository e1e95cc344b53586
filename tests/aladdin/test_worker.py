"""ALADDIN worker (Eq. 3 merge, local step) and the baselines (AR-SGD, ASP, EASGD, SGP)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from optax_lena import aladdin as al
from tests.aladdin.reference import merge as reference_merge

RNG = np.random.default_rng(0)
F32_EPS = float(np.finfo(np.float32).eps)


@pytest.fixture(autouse=True)
def _same_draws_in_any_order():
  """Each test draws the same numbers whichever tests ran before it in its process (xdist
  spreads them differently from run to run)."""
  global RNG
  RNG = np.random.default_rng(0)


def test_worker_merge_float32_exact_vs_numpy():
  x = RNG.normal(size=(5, 7)).astype(np.float32)
  g = RNG.normal(size=(5, 7)).astype(np.float32)
  for alpha in [0.0, 0.25, 1 - 1 / np.sqrt(7), 1.0]:
    a = np.float32(alpha)
    # Eager: NumPy's float32 operations, (1 - a) * x + a * g, bit for bit.
    eager = al.worker_merge({"x": x}, {"x": g}, a)["x"]
    np.testing.assert_array_equal(eager, (np.float32(1) - a) * x + a * g)
    # Jitted, XLA fuses the expression and may contract a product into the add (fused
    # multiply-add: one rounding less), so the last bit can differ from NumPy's; both stay
    # within one rounding of the larger term of the exact (float64) value.
    out = jax.jit(al.worker_merge)({"x": x}, {"x": g}, a)["x"]
    exact = reference_merge({"x": x}, {"x": g}, float(a))["x"]
    terms = np.maximum(np.abs((np.float32(1) - a) * x), np.abs(a * g))
    assert np.all(np.abs(np.asarray(out, np.float64) - exact) <= np.spacing(terms))
  np.testing.assert_array_equal(al.worker_merge({"x": x}, {"x": g}, 0.0)["x"], x)
  np.testing.assert_array_equal(al.worker_merge({"x": x}, {"x": g}, 1.0)["x"], g)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_worker_merge_preserves_low_precision_dtypes(dtype):
  np_dtype = ml_dtypes.bfloat16 if dtype == jnp.bfloat16 else np.float16
  x = RNG.normal(size=(16,)).astype(np_dtype)
  g = RNG.normal(size=(16,)).astype(np.float32)  # e.g. a float32 global model
  params = {"low": jnp.asarray(x), "f32": jnp.ones(3)}
  out = al.worker_merge(params, {"low": jnp.asarray(g), "f32": jnp.zeros(3)}, 0.3)
  assert out["low"].dtype == dtype and out["f32"].dtype == jnp.float32
  a = np.float32(0.3)
  expected = ((np.float32(1) - a) * x.astype(np.float32) + a * g).astype(np_dtype)
  np.testing.assert_array_equal(np.asarray(out["low"]), expected)  # one rounding, at the end
  np.testing.assert_array_equal(out["f32"], np.full(3, np.float32(1) - a))


def test_local_step_returns_raw_gradient_and_self_update():
  loss_fn = lambda p, b: jnp.mean((b @ p["w"]) ** 2) + 0.0 * jnp.sum(p["b"])
  params = {"w": jnp.asarray(RNG.normal(size=(3, 2)), jnp.float32), "b": jnp.ones(2)}
  batch = jnp.asarray(RNG.normal(size=(4, 3)), jnp.float32)
  tx = al.local_optimizer(0.1)
  step = jax.jit(al.local_step(loss_fn, tx, message="gradient"))
  new_params, new_state, grads, loss = step(params, tx.init(params), batch)
  expected_grads = jax.grad(loss_fn)(params, batch)
  for k in params:
    np.testing.assert_allclose(grads[k], expected_grads[k], rtol=1e-6)  # raw, no weight decay
  np.testing.assert_allclose(loss, loss_fn(params, batch), rtol=1e-6)
  # The paper's optimizer: momentum 0.9, weight decay 1e-4 added to the gradient.
  reference = optax.chain(optax.add_decayed_weights(1e-4), optax.sgd(0.1, momentum=0.9))
  updates, _ = reference.update(expected_grads, reference.init(params), params)
  expected = optax.apply_updates(params, updates)
  for k in params:
    np.testing.assert_allclose(new_params[k], expected[k], rtol=1e-6)
  np.testing.assert_allclose(new_params["b"], 1 - 0.1 * 1e-4, rtol=1e-7)  # decay acted
  assert jax.tree.structure(new_state) == jax.tree.structure(tx.init(params))


def test_ar_sgd_mean_list_and_stacked():
  grads = [{"w": jnp.asarray(RNG.normal(size=(2, 3)), jnp.float32)} for _ in range(4)]
  expected = np.mean([np.asarray(g["w"], np.float64) for g in grads], axis=0)
  np.testing.assert_allclose(al.ar_sgd_mean(grads)["w"], expected, rtol=1e-6)
  stacked = {"w": jnp.stack([g["w"] for g in grads])}
  np.testing.assert_allclose(
    jax.jit(lambda s: al.ar_sgd_mean(s, stacked=True))(stacked)["w"], expected, rtol=1e-6
  )
  low = al.ar_sgd_mean([{"w": jnp.ones(2, jnp.bfloat16)}] * 3)
  assert low["w"].dtype == jnp.bfloat16


def test_asp_applies_every_gradient_at_once_and_rejects_nonfinite():
  tx = optax.sgd(0.1, momentum=0.9)
  server = al.asp_server(tx)
  receive = jax.jit(server.receive)
  params = {"w": jnp.asarray(RNG.normal(size=4), jnp.float32)}
  state = server.init(params)
  ref, ref_state = params, tx.init(params)
  for k in range(5):
    g = {"w": jnp.asarray(RNG.normal(size=4), jnp.float32)}
    state, reply = receive(state, g, jnp.int32(k % 2))
    updates, ref_state = tx.update(g, ref_state, ref)
    ref = optax.apply_updates(ref, updates)
    # Jitted (fused) against optax's eager steps: float32 rounding at the parameters' scale
    # (an entry near 0 left by cancellation has no meaningful relative error).
    atol = 4 * F32_EPS * float(np.abs(ref["w"]).max())
    np.testing.assert_allclose(reply.params["w"], ref["w"], rtol=1e-6, atol=atol)
    # The one reply type of every server: weight 1, so worker_merge adopts x~ exactly.
    assert bool(reply.ready) and float(reply.alpha) == 1.0
    merged = al.worker_merge({"w": jnp.full(4, 3.0)}, reply.params, reply.alpha)
    np.testing.assert_array_equal(merged["w"], reply.params["w"])
  before = state
  state, reply = receive(state, {"w": jnp.full(4, jnp.nan)}, jnp.int32(0))
  np.testing.assert_array_equal(reply.params["w"], before.params["w"])
  assert int(state.num_rejected) == 1 and int(state.num_updates) == 5


def test_easgd_elastic_exchange():
  server = al.easgd_server(4)
  assert server.beta == pytest.approx(0.9 / 4) and server.tau == 2
  center = {"w": jnp.asarray(RNG.normal(size=3), jnp.float32)}
  local = {"w": jnp.asarray(RNG.normal(size=3), jnp.float32)}
  state = server.init(center)
  state, new_local = jax.jit(server.exchange)(state, local, jnp.int32(3))
  d = 0.225 * (np.asarray(local["w"], np.float64) - np.asarray(center["w"], np.float64))
  np.testing.assert_allclose(new_local["w"], local["w"] - d, rtol=1e-6)
  np.testing.assert_allclose(state.params["w"], center["w"] + d, rtol=1e-6)
  # Symmetric: what the worker gives up, the center gains.
  np.testing.assert_allclose(
    new_local["w"] + state.params["w"], local["w"] + center["w"], rtol=1e-6
  )
  assert int(state.num_exchanges) == 1
  # receive: the same exchange, answered with the one reply type (weight 1).
  _, reply = jax.jit(server.receive)(server.init(center), local, jnp.int32(3))
  assert bool(reply.ready) and float(reply.alpha) == 1.0
  np.testing.assert_array_equal(reply.params["w"], new_local["w"])
  merged = al.worker_merge(local, reply.params, reply.alpha)
  np.testing.assert_array_equal(merged["w"], new_local["w"])


def test_sgp_peers_follow_the_exponential_graph():
  gossip = al.sgp(8)
  assert gossip.num_peers == 3
  assert [gossip.peer(0, k) for k in range(6)] == [1, 2, 4, 1, 2, 4]
  assert [gossip.peer(6, k) for k in range(3)] == [7, 0, 2]
  assert int(jax.jit(gossip.peer)(jnp.int32(6), jnp.int32(2))) == 2
  assert al.sgp(5).num_peers == 3 and al.sgp(2).num_peers == 1 and al.sgp(1).peer(0, 3) == 0


@pytest.mark.parametrize("overlap", [0, 1])
def test_sgp_push_sum_preserves_mass_and_reaches_consensus(overlap):
  n = 8
  gossip = al.sgp(n, overlap=overlap)
  x0 = RNG.normal(size=(n, 5)).astype(np.float32)
  state = gossip.init({"w": jnp.zeros(5)})
  state = state._replace(numerators={"w": jnp.asarray(x0)})
  total = x0.astype(np.float64).sum(axis=0)
  average = total / n
  step = jax.jit(gossip.gossip)
  for _ in range(60):
    state = step(state)
    mass = np.asarray(state.numerators["w"], np.float64).sum(0) + np.asarray(
      state.in_flight_numerators["w"], np.float64
    ).sum(0)
    np.testing.assert_allclose(mass, total, rtol=1e-5, atol=1e-5)
    weight = float(jnp.sum(state.weights) + jnp.sum(state.in_flight_weights))
    assert weight == pytest.approx(n, rel=1e-6)
  z = np.asarray(gossip.debiased(state)["w"])
  np.testing.assert_allclose(z, np.broadcast_to(average, z.shape), atol=1e-5)
  if overlap == 0:  # exact averaging after log2(n) rounds on the exponential graph
    state = gossip.init({"w": jnp.zeros(5)})._replace(numerators={"w": jnp.asarray(x0)})
    for _ in range(3):
      state = step(state)
    np.testing.assert_allclose(
      gossip.debiased(state)["w"], np.broadcast_to(average, z.shape), atol=1e-6
    )


def test_sgp_per_node_send_and_mix():
  gossip = al.sgp(4)
  x = {"w": jnp.asarray([1.0, 3.0])}
  (kept_x, kept_w), (msg_x, msg_w) = gossip.send(x, 1.0)
  np.testing.assert_array_equal(kept_x["w"] + msg_x["w"], x["w"])  # halving is exact
  assert float(kept_w) == float(msg_w) == 0.5
  mixed_x, mixed_w = gossip.mix(kept_x, kept_w, {"w": jnp.asarray([5.0, 5.0])}, 0.5)
  assert float(mixed_w) == 1.0
  np.testing.assert_array_equal(gossip.debias(mixed_x, mixed_w)["w"], [5.5, 6.5])
