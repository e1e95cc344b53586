"""The README's ALADDIN quickstart runs as printed (the python block after its marker)."""

import pathlib
import re

import jax
import numpy as np

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- aladdin-quickstart -->"


def test_aladdin_quickstart_runs_and_trains():
  text = README.read_text()
  assert MARKER in text, "The README lost its ALADDIN quickstart marker."
  block = re.search(r"```python\n(.*?)```", text.split(MARKER, 1)[1], flags=re.S).group(1)
  assert len(block.strip().splitlines()) <= 20
  namespace: dict = {}
  exec(compile(block, "README-aladdin-quickstart", "exec"), namespace)
  state, workers = namespace["state"], namespace["workers"]
  # Worker 0 sent 20 gradients and worker 1 40: with period 2, 10 + 20 global updates.
  assert int(state.num_updates) == 30
  assert int(state.num_rejected) == 0
  assert float(namespace["loss"]) < 0.05  # the regression target sum(x) is learnt
  for params, _ in workers:
    assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(params))
