"""The algorithm specs shared by the engines, and what a worker sends (``message``).

Lemma 1 of the paper (the global model is the average of the local models) holds with update
messages, for any workers' optimizer, and does not with gradient messages from momentum
workers; with plain-SGD workers the two messages are one algorithm.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from optax_lena import aladdin as al

RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.normal(size=(64, 5)), jnp.float32)
Y = jnp.asarray(X @ RNG.normal(size=5) + 0.1 * RNG.normal(size=64), jnp.float32)
PARAMS = {"w": jnp.zeros(5), "b": jnp.zeros([])}


def loss_fn(params, batch):
  x, y = batch
  return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def batch(worker, step):
  idx = (np.arange(8) + 8 * (3 * worker + step)) % 64
  return X[idx], Y[idx]


@pytest.mark.parametrize(
  ("name", "options", "error", "match"),
  [
    ("hogwild", {}, ValueError, r"Unknown algorithm 'hogwild'; choose one of \('aladdin'"),
    ("asp", {"tau": 2}, TypeError, r"asp has no option 'tau'; its options are"),
    ("aladdin", {"local_tx": None}, TypeError, r"no option 'local_tx'.*'worker_tx'"),
    ("aladdin", {"message": "grads"}, ValueError, r"message must be 'update' .* or 'gradient'"),
    ("aladdin", {"period": 0}, ValueError, r"period must be >= 1"),
    ("aladdin", {"alpha": 2.0}, ValueError, r"alpha must be in \[0, 1\]"),
    ("aladdin", {"normalise": "avg"}, ValueError, r"normalise must be one of"),
    ("aladdin", {"reply_every": 0}, ValueError, r"reply_every must be an int >= 1"),
    ("aladdin", {"worker_tx": "sgd"}, TypeError, r"worker_tx must be an Optax Gradient"),
    ("asp", {"server_tx": 0.1}, TypeError, r"server_tx must be an Optax GradientTransformation"),
    ("easgd", {"tau": 0}, ValueError, r"tau must be an int >= 1"),
    ("easgd", {"beta": 1.5}, ValueError, r"beta must be None \(0.9 / n"),
    ("sgp", {"overlap": 2}, ValueError, r"overlap must be 0 or 1"),
  ],
)
def test_bad_options_raise_at_construction_naming_the_fix(name, options, error, match):
  with pytest.raises(error, match=match):
    al.algorithm(name, **options)


def test_specs_are_frozen_and_training_needs_the_optimizers():
  spec = al.algorithm("aladdin", worker_tx=optax.sgd(0.1))
  with pytest.raises(AttributeError):
    spec.period = 2  # type: ignore[misc]
  spec.check_trainable()
  with pytest.raises(ValueError, match=r"needs the workers' optimizer: algorithm\('ar_sgd'"):
    al.algorithm("ar_sgd").check_trainable()
  with pytest.raises(ValueError, match=r"needs the server's optimizer: algorithm\('asp'"):
    al.algorithm("asp").check_trainable()
  printed = al.algorithm("aladdin", worker_tx=optax.sgd(0.1), message="gradient")
  with pytest.raises(ValueError, match=r"message='gradient' needs server_tx.*optax.sgd\(eta\)"):
    printed.check_trainable()
  assert set(al.ALGORITHMS) == {"aladdin", "ar_sgd", "asp", "easgd", "sgp"}


@pytest.mark.parametrize("name", ["aladdin", "ar_sgd", "asp", "easgd", "sgp"])
def test_any_spec_is_built_with_the_optimizer_that_trains_the_model(name):
  # One call for every algorithm: optimizer= lands in the spec's optimizer field (ASP's server).
  tx = optax.sgd(0.1)
  spec = al.algorithm(name, optimizer=tx)
  field = "server_tx" if name == "asp" else "worker_tx"
  assert spec.optimizer_field == field and getattr(spec, field) is tx
  assert spec == al.algorithm(name, **{field: tx})
  spec.check_trainable()
  with pytest.raises(TypeError, match=rf"{name}: optimizer= sets {field}; give one, not both"):
    al.algorithm(name, optimizer=tx, **{field: tx})


def test_aladdin_defaults_are_the_recipe_and_need_no_server_tx():
  spec = al.algorithm("aladdin", worker_tx=al.local_optimizer(0.1))
  assert (spec.message, spec.period, spec.normalise) == ("update", 4, "mean_of_locals")
  server = spec.server(2)
  state = server.init(PARAMS)
  u = {"w": jnp.arange(5.0), "b": jnp.asarray(2.0)}
  for worker in (0, 1, 0, 1, 0, 1, 0):
    state, reply = server.receive(state, u, worker)
  # Worker 1's 4th message triggers with 7 accumulated updates: x~ = 0 - (1/2) 7 u (sgd(1.0)).
  state, reply = server.receive(state, u, 1)
  assert bool(reply.ready)
  np.testing.assert_allclose(reply.params["w"], -4.0 * np.arange(5.0), rtol=1e-6)


@pytest.mark.parametrize("name", ["aladdin", "asp", "easgd"])
def test_every_server_answers_with_the_one_reply_type(name):
  options = {"aladdin": dict(period=1), "asp": dict(server_tx=optax.sgd(0.1))}.get(name, {})
  server = al.algorithm(name, **options).server(2)
  state = server.init(PARAMS)
  state, reply = jax.jit(server.receive)(state, {"w": jnp.ones(5), "b": jnp.ones([])}, 1)
  assert isinstance(reply, al.Reply) and bool(reply.ready)
  assert reply.alpha.dtype == jnp.float32
  merged = al.worker_merge(PARAMS, reply.params, reply.alpha)
  if name != "aladdin":  # weight 1: the worker adopts the answer exactly
    assert float(reply.alpha) == 1.0
    for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(reply.params), strict=True):
      np.testing.assert_array_equal(a, b)


def test_update_message_is_the_local_displacement_momentum_and_decay_included():
  tx = al.local_optimizer(0.1, weight_decay=1e-2)
  params = {
    "w": jnp.asarray(np.random.default_rng(1).normal(size=5), jnp.float32),
    "b": jnp.asarray(0.5),
  }
  update = jax.jit(al.local_step(loss_fn, tx, message="update"))
  gradient = jax.jit(al.local_step(loss_fn, tx, message="gradient"))
  state_u = state_g = tx.init(params)
  p_u = p_g = params
  for step in range(3):  # momentum builds up: the displacement is no longer eta * g
    before = p_u
    p_u, state_u, u, _ = update(p_u, state_u, batch(0, step))
    p_g, state_g, g, _ = gradient(p_g, state_g, batch(0, step))
    for key in params:
      np.testing.assert_array_equal(u[key], before[key] - p_u[key])
      np.testing.assert_array_equal(p_u[key], p_g[key])  # the same self-update
  assert not np.allclose(np.asarray(u["w"]), 0.1 * np.asarray(g["w"]), rtol=1e-2)


def _lemma1_distance(message: str, server_tx, num_workers=3, steps=8, period=4) -> float:
  """Round-robin workers with alpha 0; every worker sends a multiple of ``period`` messages,
  so the last message triggers and every message has been applied. Returns the largest
  |x~ - mean of the local models|."""
  tx = al.local_optimizer(0.05)
  step = jax.jit(al.local_step(loss_fn, tx, message=message))
  server = al.parameter_server(num_workers, server_tx, period=period, alpha=0.0)
  receive = jax.jit(server.receive)
  state = server.init(PARAMS)
  local = [(PARAMS, tx.init(PARAMS)) for _ in range(num_workers)]
  for t in range(steps):
    for i in range(num_workers):
      params, opt_state, msg, _ = step(*local[i], batch(i, t))
      local[i] = (params, opt_state)
      state, reply = receive(state, msg, jnp.int32(i))
      assert bool(reply.ready) == ((t + 1) % period == 0)
      local[i] = (al.worker_merge(params, reply.params, reply.alpha), opt_state)
  mean = jax.tree.map(lambda *v: sum(v) / len(v), *[p for p, _ in local])
  return max(
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(mean), strict=True)
  )


def test_lemma1_holds_with_update_messages_and_not_with_gradient_messages():
  # Update messages: x~ = x0 - (1/n) sum_i sum_t u_it = mean of the local models (float32
  # rounding of a few dozen additions).
  assert _lemma1_distance("update", optax.sgd(1.0)) < 1e-5
  # Gradient messages from momentum workers: the server's plain step on the raw gradients is
  # not what the momentum workers moved.
  assert _lemma1_distance("gradient", optax.sgd(0.05)) > 1e-2


def test_plain_sgd_workers_give_one_trajectory_in_both_modes():
  eta = 0.05
  tx = optax.sgd(eta)
  runs = {}
  for message, server_tx in (("update", optax.sgd(1.0)), ("gradient", optax.sgd(eta))):
    step = jax.jit(al.local_step(loss_fn, tx, message=message))
    server = al.parameter_server(2, server_tx, period=2, alpha="count")
    state = server.init(PARAMS)
    local = [(PARAMS, tx.init(PARAMS)) for _ in range(2)]
    trajectory = []
    for t in range(12):
      for i in (0, 1, 1):  # worker 1 twice as fast
        params, opt_state, msg, _ = step(*local[i], batch(i, t))
        state, reply = server.receive(state, msg, i)
        local[i] = (al.worker_merge(params, reply.params, reply.alpha), opt_state)
        trajectory.append(np.concatenate([np.ravel(x) for x in jax.tree.leaves(state.params)]))
    runs[message] = np.stack(trajectory)
  assert np.abs(runs["update"][-1]).max() > 0.1  # it moved
  np.testing.assert_allclose(runs["update"], runs["gradient"], rtol=1e-5, atol=1e-6)
