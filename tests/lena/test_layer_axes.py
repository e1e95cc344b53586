"""Stacked layers (``layer_axes=``): each slice of a stacked leaf is a layer of its own, exactly
as in the unrolled model.

One tree stacks L = 4 layers in three leaves, with the layer axis at 0 (``blocks/kernel``), at 1
(``mlp/kernel``, MaxText's position) and at -2 (``blocks/bias``, i.e. 0), next to two leaves
without one (``head``). Every optimizer below runs on the stacked tree from the same per-worker
gradients, all in one compiled step, and is compared update by update with the float64 NumPy
reference (``reference.py``) run on the UNROLLED layers (each slice a leaf of its own): ratios,
warm-up progress, factors and ends, rate multipliers and parameters, for every rule with both
warm-ups, power, the reference batch and the sample clock, Nesterov, a weight-decay mask, AdamW,
``optax.inject_hyperparams`` and the three groupings, plus the per-slice statistics of the three
statistics functions. A last step with one non-finite slice must be skipped whole.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_lena as ol
from optax_lena._src import layer_axes as layer_axes_lib
from tests.lena.reference import ReferenceOptimizer

S = 8
L = 4
STEPS = 10
LR0 = 0.01
MOMENTUM = 0.9
WD = 5e-4
EPS = 1e-6
# The progress advances by 1 (pure signal) to 8 (pure noise) per update: the noisiest slices end
# their warm-up by update 4, the pure-signal ones never within the run (asserted below).
THETA = 30.5
WARMUP_STEPS = 52  # the fixed warm-up reaches full rate at update 7 (7 * 8 >= 52)
# float32 tolerances of test_numerics.py.
RTOL = 1e-5
ATOL = 1e-5
FAST_COMPILE = {"xla_backend_optimization_level": 0}

# name -> (stacked shape, layer axis as given, the axis it means).
LEAVES = {
  ("blocks", "bias"): ((L, 4), -2, 0),
  ("blocks", "kernel"): ((L, 3, 4), 0, 0),
  ("head", "bias"): ((2,), None, None),
  ("head", "kernel"): ((4, 2), None, None),
  ("mlp", "kernel"): ((4, L, 3), 1, 1),
}
LAYER_AXES = {"blocks": {"bias": -2, "kernel": 0}, "head": None, "mlp": {"kernel": 1}}
# (signal mu, noise sigma) of each slice, so that the slices' ratios differ: pure signal (ratio
# 1), pure noise (ratio at the cap S), and two mixtures.
SLICE_NOISE = ((1.0, 0.0), (0.0, 1.0), (0.5, 1.0), (1.0, 0.6))


def _tree(fn) -> dict[str, dict[str, Any]]:
  out: dict[str, dict[str, Any]] = {}
  for (mod, name), spec in LEAVES.items():
    out.setdefault(mod, {})[name] = fn((mod, name), *spec)
  return out


def _layers(tree: Any, lead: int = 0) -> list[np.ndarray]:
  """The unrolled layers of a stacked tree in the library's order (the layers of a stacked
  leaf consecutive); ``lead`` leading axes (the workers) are kept."""
  out = []
  for (mod, name), (_, _, axis) in LEAVES.items():
    x = np.asarray(tree[mod][name], np.float64)
    out.extend([x] if axis is None else [np.take(x, i, axis=axis + lead) for i in range(L)])
  return out


def _layer_labels(label) -> list[Any]:
  """One reference group label per unrolled layer: ``label(path)``, joined by the slice index
  for a stacked leaf."""
  out = []
  for path, (_, _, axis) in LEAVES.items():
    out.extend([label(path)] if axis is None else [(label(path), i) for i in range(L)])
  return out


@functools.cache
def problem() -> tuple[Any, list[Any]]:
  rng = np.random.RandomState(0)
  params = _tree(lambda _, shape, *__: (0.3 * rng.standard_normal(shape)).astype(np.float32))
  grads = []
  direction = _tree(lambda _, shape, *__: rng.standard_normal(shape))
  for t in range(1, STEPS + 1):
    c_t = 1.0 + 0.5 * math.sin(0.4 * t)

    def worker_grads(path, shape, _, axis, t=t, c_t=c_t):
      noise = rng.standard_normal((S, *shape))
      if axis is None:
        mu, sigma = (0.7, 1.0) if path[1] == "kernel" else (1.0, 0.2)
        return (mu * c_t * direction[path[0]][path[1]] + sigma * noise).astype(np.float32)
      # Slice i gets SLICE_NOISE[(i + offset) % 4]; the offset differs between leaves.
      offset = sorted(LEAVES).index(path)
      index = [slice(None)] * len(shape)
      out = np.empty((S, *shape))
      for i in range(L):
        index[axis] = i
        mu, sigma = SLICE_NOISE[(i + offset) % len(SLICE_NOISE)]
        where = (slice(None), *index)
        out[where] = mu * c_t * direction[path[0]][path[1]][tuple(index)] + sigma * noise[where]
      return out.astype(np.float32)

    grads.append(_tree(worker_grads))
  return params, grads


DECAY_MASK = {"blocks": {"bias": False, "kernel": True}, "head": {"bias": False, "kernel": True}}
DECAY_MASK["mlp"] = {"kernel": True}
LABELS = {"blocks": {"bias": "b", "kernel": "w"}, "head": {"bias": "b", "kernel": "w"}}
LABELS["mlp"] = {"kernel": "w"}
# 2 base steps per update: per-worker batch 4, learning rate tuned at batch 16 (k = 8 * 4 / 16).
BATCHES = {"per_worker_batch_size": 4, "reference_batch_size": 16}


def _decay_of_layer() -> list[bool]:
  """The weight-decay mask per unrolled layer (a stacked leaf's slices share its entry)."""
  out = []
  for (mod, name), (_, _, axis) in LEAVES.items():
    out.extend([DECAY_MASK[mod][name]] * (1 if axis is None else L))
  return out


def optimizers() -> dict[str, tuple[optax.GradientTransformationExtraArgs, ReferenceOptimizer]]:
  """name -> (the optimizer on the stacked tree, the reference on the unrolled layers)."""
  common = {"momentum": MOMENTUM, "weight_decay": WD, "layer_axes": LAYER_AXES}
  sa, fx = {"warmup_threshold": THETA}, {"warmup_steps": WARMUP_STEPS}
  total = STEPS * 2  # base steps of the run at k = 2

  def ref(rule, warmup, **kw):
    kw = {"lr0": LR0, "momentum": MOMENTUM, "weight_decay": WD, "eps": EPS, **kw}
    return ReferenceOptimizer(rule, warmup, warmup_threshold=THETA, warmup_steps=WARMUP_STEPS, **kw)

  module = _layer_labels(lambda path: path[0])
  label_tree = _layer_labels(lambda path: LABELS[path[0]][path[1]])
  by_rank = _layer_labels(lambda path: len(LEAVES[path][0]))
  adam = {"inner": "adamw", "power": 0.5, "lr0": 1e-3, "weight_decay": 1e-2}
  return {
    "lena_state_aware": (ol.lena(LR0, **common, **sa), ref("lena", "state_aware")),
    "lena_fixed": (ol.lena(LR0, **common, **fx), ref("lena", "fixed")),
    "adascale_state_aware": (ol.adascale(LR0, **common, **sa), ref("adascale", "state_aware")),
    "adascale_fixed": (ol.adascale(LR0, **common, **fx), ref("adascale", "fixed")),
    "linear_state_aware": (
      ol.linear_scaling(LR0, **common, **sa),
      ref("linear_scaling", "state_aware"),
    ),
    "linear_fixed": (ol.linear_scaling(LR0, **common, **fx), ref("linear_scaling", "fixed")),
    "lena_power_reference_batch_samples_clock": (
      ol.lena(
        lambda count: LR0 * 0.01 ** (count / total),
        power=0.5,
        clock="samples",
        **BATCHES,
        **common,
        **sa,
      ),
      ref(
        "lena",
        "state_aware",
        power=0.5,
        schedule=lambda count: 0.01 ** (count / total),
        clock="samples",
        **BATCHES,
      ),
    ),
    "lena_nesterov_decay_mask": (
      ol.lena(LR0, nesterov=True, weight_decay_mask=DECAY_MASK, **{**common, "weight_decay": 0.1}),
      ref("lena", "none", nesterov=True, weight_decay=0.1, decay_mask=_decay_of_layer()),
    ),
    "lena_adamw": (
      ol.lena_adamw(1e-3, weight_decay=1e-2, layer_axes=LAYER_AXES, **sa),
      ref("lena", "state_aware", **adam),
    ),
    "linear_scaling_adamw": (
      ol.linear_scaling_adamw(1e-3, weight_decay=1e-2, layer_axes=LAYER_AXES, **fx),
      ref("linear_scaling", "fixed", **adam),
    ),
    "lena_module": (
      ol.lena(LR0, grouping="module", **common, **sa),
      ref("lena", "state_aware", groups=module),
    ),
    "lena_labels": (
      ol.lena(LR0, grouping=LABELS, **common, **sa),
      ref("lena", "state_aware", groups=label_tree),
    ),
    "lena_callable": (
      ol.lena(LR0, grouping=lambda path, leaf: jnp.ndim(leaf), **common, **sa),
      ref("lena", "state_aware", groups=by_rank),
    ),
    "injected_lena": (
      optax.inject_hyperparams(ol.lena)(learning_rate=LR0, **common, **sa),
      ref("lena", "state_aware"),
    ),
  }


def _linear_loss(params: Any, batch: Any) -> jax.Array:
  """A loss whose gradient with respect to ``params`` is exactly ``batch``."""
  return sum(
    jnp.sum(p * b) for p, b in zip(jax.tree.leaves(params), jax.tree.leaves(batch), strict=True)
  )


def _step(current: dict[str, Any], states: dict[str, Any], stacked: Any) -> dict[str, Any]:
  txs = {name: tx for name, (tx, _) in optimizers().items()}
  mean, stats = ol.stacked_grad_stats(stacked, layer_axes=LAYER_AXES)
  out: dict[str, Any] = {"stats": stats, "params": {}, "states": {}, "updates": {}}
  for name in current:
    updates, out["states"][name] = txs[name].update(
      mean, states[name], current[name], grad_stats=stats
    )
    out["updates"][name] = updates
    out["params"][name] = optax.apply_updates(current[name], updates)
  # The same S gradients as K = S sequential micro-batches, and as S workers of a collective.
  zero = jax.tree.map(jnp.zeros_like, mean)
  _, _, out["accumulated"] = ol.accumulate_grad_stats(
    _linear_loss, zero, stacked, layer_axes=LAYER_AXES
  )
  for packed in (False, True):
    reduce = functools.partial(
      ol.all_reduce_grad_stats, axis_name="i", packed=packed, layer_axes=LAYER_AXES
    )
    per_worker = jax.vmap(reduce, axis_name="i")(stacked)[1]  # the same on every worker
    out[f"all_reduce_packed={packed}"] = jax.tree.map(lambda x: x[0], per_worker)
  return out


def _find(state: Any, kind: type) -> list[Any]:
  found = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, kind))
  return [x for x in found if isinstance(x, kind)]


def _per_layer(state: Any) -> dict[str, np.ndarray]:
  """Ratio, warm-up and rate multiplier per layer, read from the state (as ol.diagnostics)."""
  warm = _find(state, ol.LayerwiseWarmupState)
  rule = [s for s in _find(state, ol.GainRatioState) if not any(s is w.ratio_state for w in warm)]
  ratio = np.asarray(rule[0].ratio)
  factor, progress, end = np.ones_like(ratio), np.zeros_like(ratio), -np.ones(ratio.shape, int)
  if warm:
    factor, progress, end = (
      np.asarray(x) for x in (warm[0].factor, warm[0].progress, warm[0].end_step)
    )
  for fixed in _find(state, ol.FixedWarmupState):
    factor = factor * np.asarray(fixed.factor)
  power = float(np.asarray(rule[0].power))
  return {
    "gain_ratio": ratio,
    "warmup_factor": factor,
    "warmup_progress": progress,
    "warmup_end_step": end,
    "lr_multiplier": ratio**power * factor,
  }


@pytest.fixture(scope="module")
def trajectory() -> list[dict[str, Any]]:
  """The results of every update (the optimizers' states and parameters), then of a step whose
  gradients are non-finite in one slice of one stacked leaf."""
  params, grads = problem()
  txs = {name: tx for name, (tx, _) in optimizers().items()}
  current = dict.fromkeys(txs, jax.tree.map(jnp.asarray, params))
  states = {name: tx.init(current[name]) for name, tx in txs.items()}
  step = jax.jit(_step, compiler_options=FAST_COMPILE)
  bad = jax.tree.map(np.copy, grads[-1])
  bad["mlp"]["kernel"][3, 0, 2, 1] = np.nan  # worker 3, slice 2 of the layer axis at 1
  results = []
  for g in (*grads, bad):
    out = jax.device_get(step(current, states, g))
    current, states = out["params"], out["states"]
    results.append(out)
  return results


@pytest.mark.parametrize("name", list(optimizers()))
def test_stacked_layers_match_the_unrolled_reference(name: str, trajectory) -> None:
  params, grads = problem()
  ref = optimizers()[name][1]
  w = _layers(params)
  for t, (out, g) in enumerate(zip(trajectory, grads, strict=False), start=1):
    w = ref.step(w, _layers(g, lead=1))
    got = _per_layer(out["states"][name])
    at = f"{name}, update {t}"
    for key, value in got.items():
      want = getattr(ref.last, key)
      if key == "warmup_end_step":
        np.testing.assert_array_equal(value, want, err_msg=f"{key} at {at}")
      else:
        np.testing.assert_allclose(value, want, rtol=RTOL, atol=0, err_msg=f"{key} at {at}")
    for k, (a, b) in enumerate(zip(_layers(out["params"][name]), w, strict=True)):
      np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"layer {k} at {at}")
  history = ref.history
  if ref.warmup == "state_aware":
    gaps = np.abs(np.array([r.warmup_progress for r in history]) - THETA)
    assert np.all(gaps > 1e-3 * THETA)  # no progress so close to theta that float32 could flip
  if ref.rule == "lena" and ref.groups is None:
    # The slices differ: per-slice ratios from 1 to the cap, and per-slice warm-up ends.
    ratios = history[-1].gain_ratio
    assert ratios.min() == 1.0 and ratios.max() == history[-1].num_samples * (ref.batch or 1) / (
      ref.reference_batch or 1
    )
    if ref.warmup == "state_aware" and ref.reference_batch is None:
      assert len(set(history[-1].warmup_end_step.tolist())) >= 3
  # The non-finite slice skipped the whole step: no update, the state as before.
  skipped, before = trajectory[-1], trajectory[-2]
  assert all(np.all(u == 0) for u in jax.tree.leaves(skipped["updates"][name]))
  guard, guard_before = (
    _find(x["states"][name], ol.SkipNonFiniteState)[0] for x in (skipped, before)
  )
  for a, b in zip(
    jax.tree.leaves(guard.inner_state), jax.tree.leaves(guard_before.inner_state), strict=True
  ):
    np.testing.assert_array_equal(a, b)
  assert int(guard.num_skipped) == 1


def test_per_slice_statistics_of_the_three_functions(trajectory) -> None:
  _, grads = problem()
  ref = ReferenceOptimizer("lena")
  params = _layers(problem()[0])
  for out, g in zip(trajectory, grads, strict=False):
    ref.step(params, _layers(g, lead=1))
    for key in ("stats", "accumulated", "all_reduce_packed=False", "all_reduce_packed=True"):
      stats = out[key]
      assert stats.num_samples == S, key
      for leaf, (path, (_, _, axis)) in zip(
        jax.tree.leaves(stats.sq_norm_mean), LEAVES.items(), strict=True
      ):
        leaf = np.asarray(leaf)
        assert leaf.shape == (() if axis is None else (L,)) and leaf.dtype == np.float32, path
      flat = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])
      np.testing.assert_allclose(flat(stats.sq_norm_mean), ref.last.sq_norm_mean, rtol=RTOL)
      np.testing.assert_allclose(
        flat(stats.mean_grad_sq_norm), ref.last.mean_grad_sq_norm, rtol=RTOL, err_msg=key
      )


def test_the_forms_of_layer_axes_agree() -> None:
  """A prefix pytree, a full pytree, a callable and negative axes describe the same layout; an
  int alone covers every leaf."""
  shapes = _tree(lambda _, shape, *__: jax.ShapeDtypeStruct(shape, jnp.float32))
  full = _tree(lambda _, __, given, ___: given)
  by_path = {path: axis for path, (_, _, axis) in LEAVES.items()}
  forms = {
    "prefix": LAYER_AXES,
    "full": full,
    "callable": lambda path, leaf: by_path[path],
  }
  layouts = {k: layer_axes_lib.resolve(v, shapes) for k, v in forms.items()}
  for name, layout in layouts.items():
    assert layout.axes == (0, 0, None, None, 1), name
    assert layout.sizes == (L, L, 1, 1, L) and layout.total == 3 * L + 2, name
    assert layout.offsets == (0, L, 2 * L, 2 * L + 1, 2 * L + 2), name
  everywhere = layer_axes_lib.resolve(-1, {"a": jnp.zeros((2, 3)), "b": jnp.zeros(5)})
  assert everywhere.axes == (1, 0) and everywhere.sizes == (3, 5)
  assert layer_axes_lib.resolve(None, shapes).is_per_leaf


def test_diagnostics_per_slice(trajectory) -> None:
  """Trees shaped like the parameters hold a length-L vector for a stacked leaf; flat keys end
  with the slice index; the noise scales count every slice (float64 from the reference's
  statistics)."""
  params, grads = problem()
  state = trajectory[STEPS - 1]["states"]["lena_state_aware"]
  vectors = ol.diagnostics(state)
  trees = ol.diagnostics(state, params, layer_axes=LAYER_AXES)
  for key in ("gain_ratio", "warmup_progress", "lr_multiplier", "warmup_end_step", "noise_scale"):
    tree = trees[key]
    assert np.shape(tree["blocks"]["kernel"]) == (L,) and np.shape(tree["head"]["kernel"]) == ()
    assert np.shape(tree["mlp"]["kernel"]) == (L,), key
    flat = np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])
    np.testing.assert_array_equal(flat, np.asarray(vectors[key]), err_msg=key)
  # The moving averages of the reference's per-layer statistics, in float64.
  ref = ReferenceOptimizer("lena")
  w = _layers(params)
  avg_top = avg_bot = 0.0
  for g in grads:
    w = ref.step(w, _layers(g, lead=1))
    beta = ref.last.beta
    avg_top = beta * ref.last.sq_norm_mean + (1 - beta) * avg_top
    avg_bot = beta * ref.last.mean_grad_sq_norm + (1 - beta) * avg_bot
  noise = lambda top, bot: S * (top - bot) / (S * bot - top)
  expected = noise(avg_top, avg_bot)
  finite = (S * avg_bot - avg_top) > 0
  assert finite.sum() >= 3 and (~finite).sum() >= 1  # both kinds of layers are present
  np.testing.assert_allclose(
    np.asarray(vectors["noise_scale"])[finite], expected[finite], rtol=1e-3, atol=1e-6
  )
  assert np.all(np.isinf(np.asarray(vectors["noise_scale"])[~finite]))
  total = noise(avg_top.sum(), avg_bot.sum())
  np.testing.assert_allclose(float(vectors["global_noise_scale"]), total, rtol=1e-3)
  np.testing.assert_allclose(float(vectors["critical_batch_size"]), total, rtol=1e-3)

  flat = ol.flat_diagnostics(state, params, "lena/", layer_axes=LAYER_AXES)
  ratios = {k: v for k, v in flat.items() if k.startswith("lena/gain_ratio/")}
  names = [f"blocks/{n}/{i}" for n in ("bias", "kernel") for i in range(L)]
  names += ["head/bias", "head/kernel", *(f"mlp/kernel/{i}" for i in range(L))]
  assert list(ratios) == [f"lena/gain_ratio/{n}" for n in names]
  np.testing.assert_allclose(list(ratios.values()), np.asarray(vectors["gain_ratio"]))
  assert flat["lena/num_layers"] == 3 * L + 2
  ends = [k for k in flat if k.startswith("lena/warmup_end_step/")]
  assert len(ends) == flat["lena/num_layers_warmed_up"] >= 3
  by_index = [k for k in ol.flat_diagnostics(state) if k.startswith("gain_ratio/")]
  assert by_index == [f"gain_ratio/{k}" for k in range(3 * L + 2)]  # without params: by layer
