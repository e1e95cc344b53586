"""Checkpoint and resume with Orbax: a restored run continues bitwise-identically (CPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_lena as ol

ocp = pytest.importorskip("orbax.checkpoint")

S = 8
STEPS = 40
THETA = 100.0  # state-aware warm-up: progress grows by r in [1, 8] per update
W = 20 * S  # fixed warm-up: 20 updates of S base steps


def init_params():
  rng = np.random.RandomState(0)
  return {
    "hidden": {
      "kernel": jnp.asarray(rng.randn(5, 6) * 0.4, jnp.float32),
      "bias": jnp.zeros(6, jnp.float32),
    },
    "head": {
      "kernel": jnp.asarray(rng.randn(6, 1) * 0.4, jnp.float32),
      "bias": jnp.zeros(1, jnp.float32),
    },
  }


def loss_fn(params, x, y):
  h = jax.nn.relu(x @ params["hidden"]["kernel"] + params["hidden"]["bias"])
  return jnp.mean((h @ params["head"]["kernel"] + params["head"]["bias"] - y) ** 2)


def data():
  rng = np.random.RandomState(1)
  x = rng.randn(STEPS, S, 8, 5).astype(np.float32)
  y = (x[..., :1] - 0.5 * x[..., 1:2] + 0.5 * rng.randn(STEPS, S, 8, 1)).astype(np.float32)
  return x, y


SCHEDULE = optax.exponential_decay(0.05, transition_steps=STEPS * S, decay_rate=0.1)
CONFIGS = {
  "lena-state-aware": lambda: ol.lena(
    SCHEDULE, weight_decay=5e-4, warmup_threshold=THETA, clock="samples"
  ),
  "adascale-fixed": lambda: ol.adascale(0.05, weight_decay=5e-4, warmup_steps=W),
  # static_args: inject_hyperparams would turn the default warmup_steps=0 into an array.
  "inject-lena-state-aware": lambda: optax.inject_hyperparams(
    ol.lena, static_args=("warmup_steps",)
  )(
    learning_rate=optax.linear_schedule(0.05, 0.01, STEPS),
    weight_decay=5e-4,
    warmup_threshold=THETA,
  ),
  "inject-adascale-fixed": lambda: optax.inject_hyperparams(ol.adascale)(
    learning_rate=0.05, momentum=0.9, warmup_steps=W
  ),
}


def make_step(tx):
  @jax.jit
  def step(params, opt_state, x, y):
    stacked = jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0))(params, x, y)
    grads, stats = ol.stacked_grad_stats(stacked)
    updates, opt_state = tx.update(grads, opt_state, params, grad_stats=stats)
    return optax.apply_updates(params, updates), opt_state

  return step


def assert_bitwise_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    u, v = np.asarray(u), np.asarray(v)
    assert u.dtype == v.dtype and u.shape == v.shape
    np.testing.assert_array_equal(u.view(f"u{u.dtype.itemsize}"), v.view(f"u{v.dtype.itemsize}"))


def in_warmup(opt_state) -> bool:
  d = ol.diagnostics(opt_state)
  return bool(np.any(np.asarray(d["warmup_factor"]) < 1.0))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_resume_at_ten_random_points_is_bitwise_identical(name, tmp_path):
  tx = CONFIGS[name]()
  step = make_step(tx)
  x, y = data()
  params = init_params()
  opt_state = tx.init(params)
  rng = np.random.RandomState(sorted(CONFIGS).index(name))
  # 10 resume points (after that many updates): 5 early (mid-warm-up), 5 anywhere later.
  points = sorted(
    set(rng.choice(np.arange(1, 15), 5, replace=False).tolist())
    | set(rng.choice(np.arange(15, STEPS), 5, replace=False).tolist())
  )
  assert len(points) == 10
  options = ocp.CheckpointManagerOptions(max_to_keep=None, enable_async_checkpointing=False)
  with ocp.CheckpointManager(tmp_path / "ckpt", options=options) as manager:
    warming_at = {}
    for t in range(STEPS):
      if t in points:
        manager.save(t, args=ocp.args.StandardSave({"params": params, "opt_state": opt_state}))
        warming_at[t] = in_warmup(opt_state)
      params, opt_state = step(params, opt_state, x[t], y[t])
    manager.wait_until_finished()
    final = {"params": params, "opt_state": opt_state}
    assert sum(warming_at.values()) >= 3, warming_at  # several resumes inside the warm-up
    # ... and some after (at least some layers') warm-up ended; LENA's low-noise layers may
    # still be warming up after 40 updates.
    assert np.any(np.asarray(ol.diagnostics(opt_state)["warmup_factor"]) == 1.0)
    # The target tree comes from tx.init, so NamedTuple state types come back.
    abstract = jax.tree.map(
      ocp.utils.to_shape_dtype_struct,
      {"params": init_params(), "opt_state": tx.init(init_params())},
    )
    for t in points:
      restored = manager.restore(t, args=ocp.args.StandardRestore(abstract))
      assert jax.tree.structure(restored) == jax.tree.structure(final)
      assert type(restored["opt_state"]) is type(opt_state)
      p, s = restored["params"], restored["opt_state"]
      for u in range(t, STEPS):
        p, s = step(p, s, x[u], y[u])
      assert_bitwise_equal({"params": p, "opt_state": s}, final)
  d = ol.diagnostics(opt_state)
  assert int(d["num_updates"]) == STEPS and int(d["num_skipped_steps"]) == 0


def test_standard_checkpointer_round_trip_mid_warmup(tmp_path):
  tx = ol.lena(0.05, momentum=0.9, warmup_threshold=THETA, grouping="module")
  step = make_step(tx)
  x, y = data()
  params, opt_state = init_params(), tx.init(init_params())
  for t in range(3):
    params, opt_state = step(params, opt_state, x[t], y[t])
  assert in_warmup(opt_state)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "state", {"params": params, "opt_state": opt_state})
  checkpointer.wait_until_finished()
  abstract = jax.tree.map(
    ocp.utils.to_shape_dtype_struct, {"params": init_params(), "opt_state": tx.init(init_params())}
  )
  restored = checkpointer.restore(tmp_path / "state", abstract)
  assert_bitwise_equal(restored, {"params": params, "opt_state": opt_state})
  inner = restored["opt_state"].inner_state
  assert isinstance(restored["opt_state"], ol.SkipNonFiniteState)
  assert any(isinstance(s, ol.LayerwiseWarmupState) for s in inner)
  assert any(isinstance(s, ol.GainRatioState) for s in inner)
  # Diagnostics work on the restored state and agree with the original.
  for key, value in ol.diagnostics(opt_state, params).items():
    for a, b in zip(
      jax.tree.leaves(value),
      jax.tree.leaves(ol.diagnostics(restored["opt_state"], params)[key]),
      strict=True,
    ):
      np.testing.assert_array_equal(a, b, err_msg=key)
