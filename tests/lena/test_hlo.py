"""The statistics cost one small extra all-reduce and never a host transfer (compiled HLO).

Compiles a data-parallel step (``ol.all_reduce_grad_stats`` + ``ol.lena``) and the usual one
(``lax.pmean`` + SGD with momentum) in ``pmap`` and in ``shard_map`` on 8 simulated CPU devices
(see conftest.py) and compares the all-reduces of the optimized HLO: LENA may add at most one,
of at most (number of leaves + 1) floats, and no device-to-host traffic at all.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import optax_lena as ol

AXIS = "batch"
NUM_DEVICES = 8

# Optimized-HLO signs of traffic between device and host: infeed/outfeed, host send/recv,
# Python callbacks and host-memory offloading.
HOST_TRANSFER = re.compile(
  r"\b(infeed|outfeed|send|recv|send-done|recv-done)\(|is_host_transfer=true|"
  r'custom_call_target="[^"]*(callback|host|Host)[^"]*"|S\(5\)'
)
# "%name = <shape or tuple of shapes> all-reduce(" (or all-reduce-start: async form).
ALL_REDUCE = re.compile(r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=\s*(.+?)\s+all-reduce(?:-start)?\(", re.M)


def make_params():
  return {
    "conv": {"kernel": jnp.full((3, 3, 2, 4), 0.1), "bias": jnp.zeros((4,))},
    "norm": {"scale": jnp.ones((4,)), "bias": jnp.zeros((4,))},
    "dense": {"kernel": jnp.full((16, 5), -0.05), "bias": jnp.full((5,), 0.2)},
  }


NUM_LEAVES = len(jax.tree.leaves(make_params()))


def sgd_momentum():
  return optax.chain(optax.add_decayed_weights(5e-4), optax.sgd(0.1, 0.9))


def step_fn(kind):
  """Local gradients -> reduce -> update, per device."""
  if kind == "pmean":
    tx = sgd_momentum()

    def step(local_grads, params, opt_state):
      grads = jax.lax.pmean(local_grads, AXIS)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state

  else:
    tx = ol.lena(0.1, weight_decay=5e-4, warmup_threshold=50.0)

    def step(local_grads, params, opt_state):
      grads, stats = ol.all_reduce_grad_stats(local_grads, AXIS)
      updates, opt_state = tx.update(grads, opt_state, params, grad_stats=stats)
      return optax.apply_updates(params, updates), opt_state

  return step, tx


def compiled_hlo(kind, mode, extra=None):
  step, tx = step_fn(kind)
  if extra is not None:
    step = extra(step)
  params = make_params()
  opt_state = tx.init(params)
  local = jax.tree.map(lambda p: jnp.stack([p] * NUM_DEVICES), params)
  if mode == "pmap":
    rep = lambda t: jax.tree.map(lambda x: jnp.stack([x] * NUM_DEVICES), t)
    lowered = jax.pmap(step, axis_name=AXIS).lower(local, rep(params), rep(opt_state))
  else:
    mesh = jax.make_mesh((NUM_DEVICES,), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,))

    def body(g, p, s):
      return step(jax.tree.map(lambda x: x[0], g), p, s)

    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(AXIS), P(), P()), out_specs=(P(), P())))
    lowered = fn.lower(local, params, opt_state)
  return lowered.compile().as_text()


def num_elements(shape_text):
  """Total elements of an HLO shape, e.g. ``f32[3,4]{1,0}`` or a tuple of such shapes (an
  all-reduce of several operands, as XLA's combiner makes)."""
  total = 0
  for dims in re.findall(r"\w+\[([\d,]*)\]", shape_text):
    total += int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
  return total


def all_reduces(hlo):
  """Element counts of every all-reduce (synchronous or async start) in the module."""
  return sorted(num_elements(m.group(1)) for m in ALL_REDUCE.finditer(hlo))


@pytest.fixture(scope="module", params=["pmap", "shard_map"])
def programs(request):
  mode = request.param
  return mode, compiled_hlo("pmean", mode), compiled_hlo("lena", mode)


def test_statistics_add_at_most_one_small_all_reduce(programs):
  mode, base, lena = programs
  base_ar, lena_ar = all_reduces(base), all_reduces(lena)
  assert base_ar, f"{mode}: the pmean step has no all-reduce; the HLO parser is broken"
  assert len(lena_ar) <= len(base_ar) + 1, (mode, base_ar, lena_ar)
  # The gradients travel as in the baseline (XLA may combine the statistics with them).
  extra_floats = sum(lena_ar) - sum(base_ar)
  assert 0 <= extra_floats <= NUM_LEAVES + 1, (mode, base_ar, lena_ar)


def test_no_host_transfer(programs):
  mode, base, lena = programs
  for name, hlo in (("pmean+sgd", base), ("lena", lena)):
    found = sorted({m.group(0) for m in HOST_TRANSFER.finditer(hlo)})
    assert not found, f"{mode} {name}: device-host transfer in the optimized HLO: {found}"


def test_host_transfer_detector_sees_a_callback():
  """Positive control: the pattern does flag a host callback in a step."""

  def with_callback(step):
    def wrapped(g, p, s):
      g = jax.tree.map(
        lambda x: jax.pure_callback(np.asarray, jax.ShapeDtypeStruct(x.shape, x.dtype), x), g
      )
      return step(g, p, s)

    return wrapped

  hlo = compiled_hlo("pmean", "pmap", extra=with_callback)
  assert HOST_TRANSFER.search(hlo)
