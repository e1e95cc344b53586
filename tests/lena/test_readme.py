"""The README's quickstart runs as printed (on the 8 simulated CPU devices of conftest.py)."""

import pathlib
import re

import jax
import numpy as np

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_blocks():
  return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_quickstart_shard_map_and_gspmd_variants_run():
  quickstart, gspmd = python_blocks()[:2]
  namespace: dict = {}
  exec(compile(quickstart, "README-quickstart", "exec"), namespace)
  params, opt_state = namespace["params"], namespace["opt_state"]
  ol, jnp, tx = namespace["ol"], namespace["jnp"], namespace["tx"]
  diag = ol.diagnostics(opt_state)
  assert int(diag["num_updates"]) == 1
  assert int(diag["num_samples"]) == jax.device_count()
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(params))

  exec(compile(gspmd, "README-gspmd", "exec"), namespace)
  s = jax.device_count()
  x = jnp.ones((s, 16, 8)) * jnp.arange(s)[:, None, None]
  y = jnp.ones((s, 16, 1))
  step = jax.jit(namespace["gspmd_step"])
  params2, state2 = step(params, opt_state, x, y)
  assert int(ol.diagnostics(state2)["num_updates"]) == 2
  assert tx is namespace["tx"]
  assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(params2))
