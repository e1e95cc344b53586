"""The README's LENA quickstart, and the data-parallel and AdamW guides' blocks, run as printed
(on the 8 simulated CPU devices of conftest.py)."""

import jax
import numpy as np

from tests.docs.pages import GUIDES, README, block, marked_block, run


def test_readme_quickstart_steps_on_stacked_worker_gradients():
  ns = run(marked_block(README, "lena-quickstart"), "README-lena-quickstart")
  ol, params = ns["ol"], ns["params"]
  diag = ol.diagnostics(ns["opt_state"])
  assert int(diag["num_updates"]) == 1
  assert int(diag["num_samples"]) == ns["x"].shape[0] == 4
  ratios = np.asarray(diag["gain_ratio"])  # what the block prints: r_k in [1, S]
  assert ratios.shape == (2,) and np.all((ratios >= 1.0) & (ratios <= 4.0))
  assert float(jax.numpy.abs(params["w"]).sum()) > 0.0  # the step moved the parameters
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(params))


def test_guide_shard_map_and_gspmd_steps_run():
  page = GUIDES / "data_parallel.md"
  namespace = run(block(page, "jax.shard_map", "def local_step"), "guide-shard-map")
  params, opt_state = namespace["params"], namespace["opt_state"]
  ol, jnp, tx = namespace["ol"], namespace["jnp"], namespace["tx"]
  diag = ol.diagnostics(opt_state)
  assert int(diag["num_updates"]) == 1
  assert int(diag["num_samples"]) == jax.device_count()
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(params))

  run(block(page, "def gspmd_step", "NamedSharding"), "guide-gspmd", namespace)
  s = jax.device_count()
  x = jnp.ones((s, 16, 8)) * jnp.arange(s)[:, None, None]
  y = jnp.ones((s, 16, 1))
  step = jax.jit(namespace["gspmd_step"])
  params2, state2 = step(params, opt_state, x, y)
  assert int(ol.diagnostics(state2)["num_updates"]) == 2
  assert tx is namespace["tx"]
  assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(params2))


def test_adamw_guide_block_builds_the_rules_it_names():
  ns = run(block(GUIDES / "adamw.md", "ol.lena_adamw"), "guide-adamw")
  ol, params = ns["ol"], {"w": jax.numpy.ones((3, 2))}
  stacked = {"w": jax.random.normal(jax.random.key(0), (4, 3, 2))}
  grads, stats = ol.stacked_grad_stats(stacked)
  for tx, power in [(ns["tx"], 0.5), (ns["tx_linear"], 1.0)]:
    _, state = tx.update(grads, tx.init(params), params, grad_stats=stats)
    diag = ol.diagnostics(state)
    assert float(np.max(diag["gain_ratio"])) > 1.0  # else every power gives the same rate
    multiplier = np.asarray(diag["gain_ratio"]) ** power * np.asarray(diag["warmup_factor"])
    np.testing.assert_allclose(diag["lr_multiplier"], multiplier, rtol=1e-6)
