"""benchmarks/aladdin/receive_cost still measures (a tiny tree, one round)."""

import math

from benchmarks.aladdin.receive_cost import runner as receive_cost


def test_receive_cost_report_runs():
  shapes = {"w": (8, 4), "b": (4,)}
  lines = receive_cost.lines(receive_cost.tree_result("tiny", shapes, repeats=1, period=2))
  text = "\n".join(lines)
  rows = ["optax.sgd step", "receive: non-trigger", "receive: trigger", "amortised over 2"]
  rows += ["serve: trigger", "serve_flat: non-trigger", "serve_flat_verified: non-trigger"]
  rows += ["accumulate_only", "check_only"]
  for row in rows:
    assert row in text
  assert len(receive_cost.resnet50_shapes()) == 161
  n_params = sum(math.prod(s) for s in receive_cost.resnet50_shapes().values())
  assert 23.4e6 < n_params < 23.6e6
