"""ALADDIN's parameter server (Algorithm 2) against an independent float64 NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from optax_lena import aladdin as al
from optax_lena._src.aladdin.server import all_finite
from tests.aladdin.reference import ReferenceServer

NUM_WORKERS = 3
LR = 0.1
# An interleaved order with uneven worker speeds (worker 0 fastest, worker 2 slowest).
ORDER = [0, 1, 0, 0, 2, 1, 0, 0, 1, 0, 2, 0, 1, 1, 0, 0, 2, 1, 0, 0, 1, 2, 0, 1, 0, 2, 0, 1, 2, 2]


def make_params():
  rng = np.random.default_rng(0)
  return {
    "w": rng.normal(size=(3, 4)).astype(np.float32),
    "b": rng.normal(size=(4,)).astype(np.float32),
  }


def make_grads(num):
  rng = np.random.default_rng(1)
  return [
    {"w": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=(4,)).astype(np.float32)}
    for _ in range(num)
  ]


def server_and_reference(normalise, alpha, server_momentum, period=3):
  """The parameters, the server and the float64 reference with the same options."""
  params = make_params()
  tx = optax.sgd(LR, momentum=server_momentum)
  server = al.parameter_server(NUM_WORKERS, tx, period=period, normalise=normalise, alpha=alpha)
  ref = ReferenceServer(
    params, num_workers=NUM_WORKERS, lr=LR, momentum=server_momentum, period=period,
    normalise=normalise, alpha=alpha,
  )  # fmt: skip
  return params, server, ref


def assert_tree_close(tree, ref, rtol=1e-5, atol=1e-6):
  for k in ref:
    np.testing.assert_allclose(np.asarray(tree[k], np.float64), ref[k], rtol=rtol, atol=atol)


@pytest.mark.parametrize("server_momentum", [None, 0.9])
@pytest.mark.parametrize("alpha", ["count", "n_pi", 0.3])
@pytest.mark.parametrize("normalise", ["sum", "mean", "mean_of_locals"])
def test_server_matches_float64_reference(normalise, alpha, server_momentum):
  params, server, ref = server_and_reference(normalise, alpha, server_momentum)
  receive = jax.jit(server.receive)
  state = server.init(jax.tree.map(jnp.asarray, params))
  num_ready = 0
  for worker, grads in zip(ORDER, make_grads(len(ORDER)), strict=True):
    state, reply = receive(state, grads, jnp.int32(worker))
    ready, ref_params, ref_alpha = ref.receive(grads, worker)
    assert bool(reply.ready) == ready
    assert reply.alpha.dtype == jnp.float32
    np.testing.assert_allclose(float(reply.alpha), ref_alpha, rtol=1e-6, atol=1e-7)
    assert_tree_close(reply.params, ref_params)
    assert_tree_close(state.params, ref.params)
    assert_tree_close(state.grad_sum, ref.acc)
    assert int(state.count) == ref.count
    assert state.worker_counts.tolist() == ref.worker_counts
    assert int(state.num_updates) == ref.num_updates
    assert int(state.num_rejected) == 0
    num_ready += ready
  assert num_ready >= 7  # the sequence exercises many global updates


def test_alpha_count_includes_trigger_before_reset():
  server = al.parameter_server(2, optax.sgd(LR), period=2)
  receive = jax.jit(server.receive)
  state = server.init({"w": jnp.zeros(2)})
  g = {"w": jnp.ones(2)}
  alphas = []
  for worker in [0, 1, 1, 0]:
    state, reply = receive(state, g, worker)
    alphas.append((bool(reply.ready), float(reply.alpha)))
  # c~ = 3 when worker 1 triggers (0, 1, 1), then c~ = 1 when worker 0 triggers.
  assert alphas == [(False, 0.0), (False, 0.0), (True, pytest.approx(1 - 1 / np.sqrt(3))),
                    (True, 0.0)]  # fmt: skip
  assert state.worker_counts.tolist() == [0, 0]


def test_reply_params_not_ready_are_current_global_model():
  server = al.parameter_server(2, optax.sgd(LR), period=4)
  params = {"w": jnp.arange(3.0)}
  state = server.init(params)
  state, reply = jax.jit(server.receive)(state, {"w": jnp.ones(3)}, 0)
  assert not bool(reply.ready)
  np.testing.assert_array_equal(reply.params["w"], params["w"])
  np.testing.assert_array_equal(
    al.worker_merge({"w": jnp.full(3, 7.0)}, reply.params, reply.alpha)["w"], jnp.full(3, 7.0)
  )


def test_one_worker_period_one_alpha_one_is_plain_sgd_bitwise():
  # One worker, pi = 1, alpha = 1, optax.sgd on both sides: the server computes x~ + (-eta g)
  # from the same x and g as the worker's own step, and Eq. 3 with alpha = 1 is 0 * x + x~ = x~,
  # so every step is plain SGD bit for bit (the same float32 operations in the same order).
  loss_fn = lambda p, batch: jnp.mean((batch[0] @ p["w"] + p["b"] - batch[1]) ** 2)
  tx = optax.sgd(0.05)
  step = jax.jit(al.local_step(loss_fn, tx, message="gradient"))
  server = al.parameter_server(1, optax.sgd(0.05), period=1, alpha=1.0)
  receive = jax.jit(server.receive)
  merge = jax.jit(al.worker_merge)
  rng = np.random.default_rng(2)
  x0 = {"w": jnp.asarray(rng.normal(size=(4, 1)), jnp.float32), "b": jnp.zeros((1,))}
  batches = [
    (jnp.asarray(rng.normal(size=(8, 4)), jnp.float32),
     jnp.asarray(rng.normal(size=(8, 1)), jnp.float32))
    for _ in range(15)
  ]  # fmt: skip

  @jax.jit
  def sgd_step(params, opt_state, batch):
    grads = jax.grad(loss_fn)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  local, local_state = x0, tx.init(x0)
  plain, plain_state = x0, tx.init(x0)
  state = server.init(x0)
  for batch in batches:
    local, local_state, grads, _ = step(local, local_state, batch)
    state, reply = receive(state, grads, 0)
    assert bool(reply.ready) and float(reply.alpha) == 1.0
    local = merge(local, reply.params, reply.alpha)
    plain, plain_state = sgd_step(plain, plain_state, batch)
    for k in x0:
      np.testing.assert_array_equal(local[k], plain[k])
      np.testing.assert_array_equal(state.params[k], plain[k])


def test_lemma1_global_model_is_average_of_local_models():
  # alpha = 0 (the merge leaves local models alone), plain SGD everywhere, normalise by n: once
  # every worker's count is back to 0 (all its gradients applied), x~ = mean_i x_i (Lemma 1).
  n, period, eta = 3, 2, 0.05
  loss_fn = lambda p, batch: jnp.sum((p["w"] * batch - 1.0) ** 2)
  tx = optax.sgd(eta)
  step = jax.jit(al.local_step(loss_fn, tx, message="gradient"))
  server = al.parameter_server(n, optax.sgd(eta), period=period, alpha=0.0)
  receive = jax.jit(server.receive)
  x0 = {"w": jnp.asarray([0.5, -1.0, 2.0], jnp.float32)}
  locals_ = [x0] * n
  opt_states = [tx.init(x0)] * n
  state = server.init(x0)
  rng = np.random.default_rng(3)
  # Blocks in which every worker sends pi = 2 gradients, interleaved differently each time.
  blocks = [[0, 1, 2, 1, 0, 2], [2, 0, 0, 1, 2, 1], [1, 1, 0, 2, 2, 0]]
  order = [w for block in blocks for w in block]
  checked = 0
  for worker in order:
    batch = jnp.asarray(rng.normal(size=3), jnp.float32)
    locals_[worker], opt_states[worker], grads, _ = step(locals_[worker], opt_states[worker], batch)
    state, reply = receive(state, grads, worker)
    locals_[worker] = al.worker_merge(locals_[worker], reply.params, reply.alpha)
    if int(state.count) == 0 and not state.worker_counts.any():
      average = np.mean([np.asarray(x["w"], np.float64) for x in locals_], axis=0)
      np.testing.assert_allclose(state.params["w"], average, rtol=1e-6, atol=1e-6)
      checked += 1
  assert checked == 4  # after each block, and after the first two messages of the last
  # Between flushes the local models have moved on and the global model lags behind.
  assert not np.allclose(state.params["w"], x0["w"])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_gradient_rejected_state_unchanged(bad):
  server = al.parameter_server(2, optax.sgd(LR, momentum=0.9), period=2)
  receive = jax.jit(server.receive)
  state = server.init({"w": jnp.ones((2, 2)), "b": jnp.zeros(2)})
  good = {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}
  for worker in [0, 1, 1, 0]:  # build up a momentum buffer, counters and an accumulator
    state, _ = receive(state, good, worker)
  state, _ = receive(state, good, 0)
  before = state
  bad_grads = {"w": jnp.ones((2, 2)).at[1, 0].set(bad), "b": jnp.ones(2)}
  state, reply = receive(state, bad_grads, 0)  # would trigger (c_0 = 2) if accepted
  assert not bool(reply.ready) and float(reply.alpha) == 0.0
  assert int(state.num_rejected) == int(before.num_rejected) + 1
  expected = before._replace(num_rejected=before.num_rejected + 1)
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(expected), strict=True):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(reply.params["w"], before.params["w"])


def test_traced_unknown_worker_is_rejected_not_written():
  server = al.parameter_server(2, optax.sgd(LR), period=1)
  receive = jax.jit(server.receive)
  state = server.init({"w": jnp.zeros(2)})
  for worker in [-1, 2, 7]:
    new_state, reply = receive(state, {"w": jnp.ones(2)}, jnp.int32(worker))
    assert not bool(reply.ready)
    assert int(new_state.num_rejected) == 1
    assert new_state.worker_counts.tolist() == [0, 0] and int(new_state.count) == 0
    np.testing.assert_array_equal(new_state.grad_sum["w"], np.zeros(2))


def test_jit_and_eager_agree_with_traced_worker():
  server = al.parameter_server(NUM_WORKERS, optax.sgd(LR, momentum=0.9), period=2, alpha="n_pi")
  params = jax.tree.map(jnp.asarray, make_params())
  eager_state, jit_state = server.init(params), server.init(params)
  receive = jax.jit(server.receive)
  for worker, grads in zip(ORDER[:12], make_grads(12), strict=True):
    eager_state, eager_reply = server.receive(eager_state, grads, worker)
    jit_state, jit_reply = receive(jit_state, grads, jnp.int32(worker))
    assert bool(eager_reply.ready) == bool(jit_reply.ready)
    assert float(eager_reply.alpha) == float(jit_reply.alpha)
    for a, b in zip(jax.tree.leaves(eager_state), jax.tree.leaves(jit_state), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert int(jit_state.num_updates) >= 4
  # One compilation serves every worker index.
  assert receive._cache_size() == 1


def test_low_precision_params_accumulate_in_float32():
  server = al.parameter_server(1, optax.sgd(1.0), period=4, normalise="sum")
  receive = jax.jit(server.receive)
  state = server.init({"w": jnp.ones(2, jnp.bfloat16)})
  assert state.grad_sum["w"].dtype == jnp.float32
  for _ in range(3):
    state, _ = receive(state, {"w": jnp.full(2, 1e-3, jnp.bfloat16)}, 0)
  state, reply = receive(state, {"w": jnp.full(2, 1e-3, jnp.bfloat16)}, 0)
  assert reply.params["w"].dtype == jnp.bfloat16
  assert bool(reply.ready)
  np.testing.assert_allclose(np.asarray(reply.params["w"], np.float32), 1 - 4e-3, rtol=4e-3)


def test_serve_is_receive_without_the_reply_copy():
  server = al.parameter_server(3, optax.sgd(0.1, momentum=0.9), period=2, alpha="n_pi")
  params = {"w": jnp.arange(4.0), "b": jnp.zeros(2)}
  receive, serve = jax.jit(server.receive), jax.jit(server.serve, donate_argnums=(0,))
  a, b = server.init(params), server.init(jax.tree.map(jnp.copy, params))
  rng = np.random.default_rng(1)
  for worker in (0, 1, 0, 2, 1, 2, 0, 0):
    g = {"w": jnp.asarray(rng.normal(size=4), jnp.float32), "b": jnp.ones(2)}
    a, reply = receive(a, g, jnp.int32(worker))
    b, ready, alpha = serve(b, g, jnp.int32(worker))
    assert bool(ready) == bool(reply.ready) and float(alpha) == float(reply.alpha)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
      np.testing.assert_array_equal(x, y)
  assert int(b.num_updates) == 4


def test_serve_with_the_senders_verdict_is_receive():
  # The verdict all_finite(message), computed by the sender, replaces the server's own check:
  # same states bitwise as receive, rejections included; a False verdict rejects a finite
  # message the same way (state unchanged but num_rejected).
  server = al.parameter_server(3, optax.sgd(0.1, momentum=0.9), period=2, alpha=0.5)
  params = {"w": jnp.arange(4.0), "b": jnp.zeros(2)}
  receive = jax.jit(server.receive)
  serve = jax.jit(server.serve, donate_argnums=(0,))
  verdict = jax.jit(all_finite)
  a, b = server.init(params), server.init(jax.tree.map(jnp.copy, params))
  rng = np.random.default_rng(3)
  for step, worker in enumerate((0, 1, 0, 2, 1, 2, 0, 0, 1, 1)):
    w = rng.normal(size=4).astype(np.float32)
    if step in (3, 6):
      w[step % 4] = np.nan if step == 3 else np.inf
    g = {"w": jnp.asarray(w), "b": jnp.ones(2)}
    a, reply = receive(a, g, jnp.int32(worker))
    b, ready, alpha = serve(b, g, jnp.int32(worker), verdict(g))
    assert bool(ready) == bool(reply.ready) and float(alpha) == float(reply.alpha)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
      np.testing.assert_array_equal(x, y)
  assert int(b.num_rejected) == 2 and int(b.num_updates) >= 3
  before = jax.tree.map(np.array, b)  # copies: b's buffers are donated next
  b, ready, _ = serve(b, {"w": jnp.ones(4), "b": jnp.ones(2)}, jnp.int32(0), False)
  assert not bool(ready)
  expected = before._replace(num_rejected=before.num_rejected + 1)
  for x, y in zip(jax.tree.leaves(b), jax.tree.leaves(expected), strict=True):
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(
  "normalise, alpha, server_momentum",
  [("mean_of_locals", 0.3, None), ("mean", "count", 0.9), ("sum", "count", None)],
)
def test_serve_many_is_the_messages_one_by_one(normalise, alpha, server_momentum):
  """``serve_many`` on each run of one worker's consecutive messages (up to 7, so that a call
  holds up to 3 triggers) against the float64 reference fed the same messages one by one; one
  message is refused by its sender's verdict and one holds a NaN (in a call without a verdict:
  the server's own check)."""
  params, server, ref = server_and_reference(normalise, alpha, server_momentum)
  serve_many = jax.jit(server.serve_many)
  state = server.init(jax.tree.map(jnp.asarray, params))
  grads = make_grads(len(ORDER))
  grads[4]["w"][1, 2] = np.nan
  runs = [(0, 7), (7, 8), (8, 9), (9, 12), (12, 14), (14, 20), (20, 21), (21, 30)]
  triggers = 0
  for start, stop in runs:
    worker = 0 if start == 21 else ORDER[start]  # the last run: worker 0 sends 9 messages
    stacked = jax.tree.map(lambda *g: jnp.stack(g), *grads[start:stop])
    verdict = np.asarray([bool(all_finite(g)) and i != 10 for i, g in enumerate(grads)])
    accept = None if start == 0 else verdict[start:stop]
    state, n, alphas, replies = serve_many(state, stacked, jnp.int32(worker), accept)
    expected = []
    for i in range(start, stop):
      message = grads[i] if verdict[i] else jax.tree.map(lambda g: g * np.nan, grads[i])
      ready, ref_params, ref_alpha = ref.receive(message, worker)
      if ready:
        expected.append((ref_params, ref_alpha))
    assert int(n) == len(expected) <= len(alphas)
    for j, (ref_params, ref_alpha) in enumerate(expected):
      np.testing.assert_allclose(float(alphas[j]), ref_alpha, rtol=1e-6, atol=1e-7)
      assert_tree_close(jax.tree.map(lambda r, j=j: r[j], replies), ref_params)
    assert_tree_close(state.params, ref.params)
    assert_tree_close(state.grad_sum, ref.acc)
    assert int(state.count) == ref.count
    assert state.worker_counts.tolist() == ref.worker_counts
    assert int(state.num_updates) == ref.num_updates
    assert int(state.num_rejected) == ref.num_rejected
    triggers += len(expected)
  assert triggers >= 5 and ref.num_rejected == 2


def test_serve_many_names_the_stacking_it_needs():
  server = al.parameter_server(2, optax.sgd(LR), period=2)
  state = server.init({"w": jnp.zeros(3)})
  with pytest.raises(ValueError, match="leading axis"):
    server.serve_many(state, {"w": jnp.zeros((0, 3))}, 0)
  with pytest.raises(ValueError, match="shape"):
    server.serve_many(state, {"w": jnp.zeros((2, 4))}, 0)
