"""The README's ALADDIN quickstart (the python block between its markers, which the site's
getting-started page includes) and the simulator guide's block run as printed."""

import jax
import numpy as np

from tests.docs.pages import GUIDES, README, block, marked_block, run


def test_aladdin_quickstart_runs_and_trains():
  source = marked_block(README, "aladdin-quickstart")
  assert len(source.strip().splitlines()) <= 20
  namespace = run(source, "README-aladdin-quickstart")
  state, workers = namespace["state"], namespace["workers"]
  # Worker 0 sent 20 gradients and worker 1 40: with period 2, 10 + 20 global updates.
  assert namespace["spec"].period == 2
  assert int(state.num_updates) == 30
  assert int(state.num_rejected) == 0
  assert float(namespace["loss"]) < 0.05  # the regression target sum(x) is learnt
  for params, _ in workers:
    assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(params))


def test_simulator_guide_times_the_paper_cluster():
  namespace = run(block(GUIDES / "aladdin_simulator.md", "sim.simulate"), "guide-simulator")
  sim, result = namespace["sim"], namespace["result"]
  again = sim.simulate(
    sim.algorithm("aladdin"),
    sim.paper_cluster(0.435, slowdown=10),
    batch_size=128,
    model_bytes=94e6,
    until_time=600,
  )
  assert np.isfinite(result.throughput) and result.throughput > 0
  assert result.throughput == again.throughput  # deterministic, as the guide says
  assert result.samples == result.throughput * 600  # samples per simulated second
