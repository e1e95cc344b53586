"""Misuse raises an error that names the fix, at construction or trace time: one place for the
whole catalogue (the README's "Misuse" table), grouped by the module that raises."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_lena as ol
from tests.lena.misuse_fixtures import PARAMS, stats_for

# -- the ready optimizers and the most common mistakes -----------------------------------------


@pytest.mark.parametrize(
  "tx",
  [
    ol.lena(0.1),
    ol.adascale(0.1),
    ol.linear_scaling(0.1),
    ol.scale_by_lena(),
    ol.layerwise_warmup(5.0),
    ol.scale_by_adascale(),
  ],
)
def test_missing_grad_stats_names_the_functions(tx):
  mean, _ = stats_for(PARAMS)
  with pytest.raises(ValueError, match=r"stacked_grad_stats.*all_reduce_grad_stats"):
    tx.update(mean, tx.init(PARAMS), PARAMS)


def test_wrong_grad_stats_type():
  mean, _ = stats_for(PARAMS)
  tx = ol.lena(0.1)
  with pytest.raises(TypeError, match=r"ol\.GradStats"):
    tx.update(mean, tx.init(PARAMS), PARAMS, grad_stats={"w": 1.0, "b": 1.0})


def test_mismatched_statistics_structure_raises_at_trace_time():
  mean, _ = stats_for(PARAMS)
  _, other = stats_for({"w": jnp.ones((2, 3)), "c": jnp.zeros(3)})
  tx = ol.lena(0.1)
  with pytest.raises(ValueError, match="does not match the gradients"):
    jax.jit(tx.update).lower(mean, tx.init(PARAMS), PARAMS, grad_stats=other)
  _, extra = stats_for({**PARAMS, "extra": jnp.zeros(1)})
  with pytest.raises(ValueError, match="does not match the gradients"):
    tx.update(mean, tx.init(PARAMS), PARAMS, grad_stats=extra)


def test_state_initialised_for_other_params():
  mean, stats = stats_for(PARAMS)
  tx = ol.scale_by_lena()
  with pytest.raises(ValueError, match=r"call tx\.init with the same parameter tree"):
    tx.update(mean, tx.init({"w": jnp.ones(2)}), PARAMS, grad_stats=stats)


def test_statistics_with_unexpected_num_samples():
  mean, stats = stats_for(PARAMS, s=8)
  tx = ol.lena(0.1, num_samples=16)
  with pytest.raises(ValueError, match=r"S=8 .* num_samples=16"):
    tx.update(mean, tx.init(PARAMS), PARAMS, grad_stats=stats)


@pytest.mark.parametrize("bad", [0.0, -0.1])
def test_non_positive_learning_rate(bad):
  for alias in (ol.lena, ol.adascale, ol.linear_scaling):
    with pytest.raises(ValueError, match="learning_rate must be positive"):
      alias(bad)


@pytest.mark.parametrize("bad", [0.0, -3.0])
def test_non_positive_warmup_threshold(bad):
  with pytest.raises(ValueError, match=r"warmup_threshold must be positive.*None"):
    ol.lena(0.1, warmup_threshold=bad)
  with pytest.raises(ValueError, match="warmup_threshold must be positive"):
    ol.layerwise_warmup(bad)


def test_both_warmups_rejected():
  with pytest.raises(ValueError, match="Choose one warm-up"):
    ol.lena(0.1, warmup_threshold=10.0, warmup_steps=100)


def test_grouping_that_does_not_cover_the_tree():
  mean, stats = stats_for(PARAMS)
  tx = ol.lena(0.1, grouping={"w": "a"})
  with pytest.raises(ValueError, match="does not cover the parameter"):
    tx.update(mean, tx.init(PARAMS), PARAMS, grad_stats=stats)
  tx = ol.lena(0.1, grouping={"w": "a", "b": None})
  with pytest.raises(ValueError, match="does not cover the parameter"):
    tx.update(mean, tx.init(PARAMS), PARAMS, grad_stats=stats)
  tx = ol.lena(0.1, grouping={"w": "a", "b": "a", "zz": "b"})
  with pytest.raises(ValueError, match="do not have"):
    tx.update(mean, tx.init(PARAMS), PARAMS, grad_stats=stats)


def test_unknown_names():
  with pytest.raises(ValueError, match="Unknown grouping"):
    ol.lena(0.1, grouping="layers")
  with pytest.raises(ValueError, match="Unknown clock"):
    ol.lena(0.1, clock="epochs")
  with pytest.raises(ValueError, match="Unknown gain-ratio rule"):
    ol.layerwise_warmup(5.0, rule="lars")
  with pytest.raises(ValueError, match="grouping applies to the layer-wise rule"):
    ol.layerwise_warmup(5.0, rule="adascale", grouping="module")


@pytest.mark.parametrize("old", ["linear", "lsw", "LSW"])
def test_old_spellings_of_linear_scaling_name_the_new_one(old):
  with pytest.raises(ValueError, match=rf"{old!r} is now called 'linear_scaling'"):
    ol.layerwise_warmup(5.0, rule=old)
  with pytest.raises(AttributeError, match=r"now called optax_lena\.linear_scaling_rule"):
    ol.linear_rule  # noqa: B018
  with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
    ol.no_such_name  # noqa: B018


@pytest.mark.parametrize("alias", [ol.lena, ol.adascale, ol.linear_scaling])
def test_weight_decay_mask_of_another_structure(alias):
  tx = alias(0.1, weight_decay=1e-4, weight_decay_mask={"w": True})
  with pytest.raises(ValueError, match=r"weight_decay_mask must have the structure.*lambda p"):
    tx.init(PARAMS)
  tx = alias(0.1, weight_decay=1e-4, weight_decay_mask=lambda p: [True])
  with pytest.raises(ValueError, match="weight_decay_mask must have the structure"):
    tx.init(PARAMS)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"beta": 0.0}, "beta"),
    ({"beta": 1.5}, "beta"),
    ({"eps": -1.0}, "eps"),
    ({"num_samples": 0}, "num_samples"),
    ({"warmup_steps": -5}, "warmup_steps"),
  ],
)
def test_bad_hyperparameters(kwargs, match):
  with pytest.raises(ValueError, match=match):
    ol.lena(0.1, **kwargs)


def test_bad_stacked_gradients():
  with pytest.raises(ValueError, match="same leading"):
    ol.stacked_grad_stats({"a": jnp.ones((8, 2)), "b": jnp.ones((4, 2))})
  with pytest.raises(ValueError, match="same leading"):
    ol.stacked_grad_stats({"a": jnp.ones(()), "b": jnp.ones((4, 2))})
  with pytest.raises(ValueError, match="without leaves"):
    ol.stacked_grad_stats({})
  with pytest.raises(ValueError, match="positive Python int"):
    ol.GradStats({}, 0)


def test_sample_clock_without_statistics_asks_for_them():
  tx = ol.scale_by_learning_rate(optax.constant_schedule(0.1), clock="samples")
  with pytest.raises(ValueError, match="num_samples=S"):
    tx.update(PARAMS, tx.init(PARAMS), PARAMS)
  tx = ol.fixed_warmup(100)
  with pytest.raises(ValueError, match="grad_stats=stats"):
    tx.update(PARAMS, tx.init(PARAMS), PARAMS)


def test_diagnostics_without_optax_lena_state():
  state = optax.sgd(0.1).init(PARAMS)
  with pytest.raises(ValueError, match="exactly one optax_lena gain-ratio rule"):
    ol.diagnostics(state)


# -- hyper-parameter values (checks.py), on the building blocks and NaN values ----------------


@pytest.mark.parametrize(
  "build, match",
  [
    (lambda: ol.lena(float("nan")), "learning_rate must be positive"),
    (lambda: ol.scale_by_learning_rate(0.0), "learning_rate must be positive"),
    (lambda: ol.scale_by_learning_rate(-1.0, clock="samples"), "learning_rate must be positive"),
    (lambda: ol.layerwise_warmup(float("nan")), "warmup_threshold must be positive"),
    (lambda: ol.adascale(0.1, warmup_threshold=0.0), "warmup_threshold must be positive"),
    (lambda: ol.fixed_warmup(-1), "warmup_steps must be >= 0"),
    (lambda: ol.linear_scaling(0.1, warmup_steps=-8), "warmup_steps must be >= 0"),
    (lambda: ol.scale_by_adascale(eps=-1e-6), "eps must be >= 0"),
    (lambda: ol.layerwise_warmup(5.0, eps=float("nan")), "eps must be >= 0"),
    (lambda: ol.scale_by_lena(beta=0.0), "beta"),
    (lambda: ol.adascale(0.1, beta=float("nan")), "beta"),
    (lambda: ol.GainRatioRule(beta=2.0), "beta"),
    (lambda: ol.GainRatioRule(eps=-1.0), "eps must be >= 0"),
    (lambda: ol.lena(0.1, num_samples=True), "num_samples must be a positive int"),
    (lambda: ol.lena(0.1, num_samples=8.0), "num_samples must be a positive int"),
    (lambda: ol.fixed_warmup(10, num_samples=0), "num_samples must be a positive int"),
    (lambda: ol.scale_by_linear_scaling(num_samples=-2), "num_samples must be a positive int"),
    (lambda: ol.scale_by_learning_rate(0.1, clock="epochs"), "Unknown clock"),
    (lambda: ol.GainRatioRule(grouping="layer"), "Unknown grouping"),
    (lambda: ol.scale_by_lena(grouping="modules"), "Unknown grouping"),
    (lambda: ol.lena(0.1, momentum=1.5), r"momentum must be in \[0, 1\), got 1.5"),
    (lambda: ol.lena(0.1, momentum=-0.1), r"momentum must be in \[0, 1\)"),
    (lambda: ol.adascale(0.1, momentum=1.0), r"momentum must be in \[0, 1\)"),
    (lambda: ol.large_batch_sgd(0.1, ol.lena_rule(), momentum=2), r"momentum must be in \[0, 1"),
    (lambda: ol.lena(0.1, weight_decay=-1e-4), "weight_decay must be finite and >= 0"),
    (lambda: ol.linear_scaling(0.1, weight_decay=float("nan")), "weight_decay must be finite"),
    (lambda: ol.lena_adamw(1e-3, weight_decay=float("inf")), "weight_decay must be finite"),
    (
      lambda: ol.lena(0.1, warmup_threshold=float("inf")),
      "warmup_threshold must be positive and finite",
    ),
    (lambda: ol.layerwise_warmup(float("inf")), "warmup_threshold must be positive and finite"),
    (lambda: ol.lena_adamw(1e-3, b1=1.0), r"b1 must be in \[0, 1\), got 1.0"),
    (lambda: ol.adascale_adamw(1e-3, b2=1.5), r"b2 must be in \[0, 1\)"),
    (lambda: ol.linear_scaling_adamw(1e-3, b1=-0.1), r"b1 must be in \[0, 1\)"),
    (lambda: ol.large_batch_adamw(1e-3, ol.lena_rule(), b2=float("nan")), r"b2 must be in"),
  ],
)
def test_bad_hyperparameter_values_on_every_entry_point(build, match):
  with pytest.raises(ValueError, match=match):
    build()


def test_inject_hyperparams_needs_num_samples_static():
  """inject_hyperparams turns numbers into arrays; S must stay a Python int (static_args)."""
  with pytest.raises(ValueError, match="num_samples must be a positive int"):
    optax.inject_hyperparams(ol.lena)(learning_rate=0.1, num_samples=8).init(PARAMS)
  tx = optax.inject_hyperparams(ol.lena, static_args=("num_samples",))(0.1, num_samples=8)
  mean, stats = stats_for(PARAMS, s=8)
  jax.jit(tx.update)(mean, tx.init(PARAMS), PARAMS, grad_stats=stats)


@pytest.mark.parametrize(
  "build",
  [
    lambda: ol.lena(None),
    lambda: ol.adascale(None),
    lambda: ol.layerwise_warmup(None),
    lambda: ol.lena(0.1, warmup_steps=None),
    lambda: ol.scale_by_lena(eps=None),
  ],
)
def test_none_hyperparameters_are_rejected_at_construction(build):
  """None where a number is required must raise when the optimizer is built, not run: a
  ``learning_rate=None`` otherwise becomes Optax's identity (gradient ascent at rate 1)."""
  with pytest.raises((ValueError, TypeError)):
    build()


# -- statistics (stats.py, tree_utils.py, stats.check_grad_stats) -----------------------------


@pytest.mark.parametrize("num_samples", [True, 8.0, np.int64(8), jnp.asarray(8), -1])
def test_grad_stats_num_samples_must_be_a_python_int(num_samples):
  with pytest.raises(ValueError, match="positive Python int"):
    ol.GradStats({}, num_samples)


def test_stacked_stats_with_another_structure():
  stacked = jax.tree.map(lambda p: jnp.ones((2, *p.shape)), PARAMS)
  _, other = stats_for({"w": jnp.ones((2, 3))})
  with pytest.raises(ValueError, match="stacked_stats does not match the gradients"):
    ol.stacked_grad_stats(stacked, stacked_stats=other)


def test_all_reduce_local_stats_with_another_structure():
  _, other = stats_for({"w": jnp.ones((2, 3))}, s=2)

  def step(g):
    return ol.all_reduce_grad_stats(g, "i", local_stats=other)[1].num_samples

  with pytest.raises(ValueError, match="local_stats does not match the gradients"):
    jax.pmap(step, axis_name="i")(jax.tree.map(lambda p: jnp.ones((2, *p.shape)), PARAMS))


def test_accumulate_grad_stats_bad_micro_batches():
  loss = lambda p, b: jnp.sum(p["w"]) * jnp.sum(b[0])
  with pytest.raises(ValueError, match="leading axis of size K"):
    ol.accumulate_grad_stats(loss, PARAMS, ())
  with pytest.raises(ValueError, match="same leading axis K"):
    ol.accumulate_grad_stats(loss, PARAMS, (jnp.ones((4, 2)), jnp.ones((3, 2))))
  with pytest.raises(ValueError, match="same leading axis K"):
    ol.accumulate_grad_stats(loss, PARAMS, (jnp.ones(()), jnp.ones((3, 2))))


def test_statistics_without_an_entry_for_a_live_leaf():
  mean, stats = stats_for(PARAMS)
  holes = ol.GradStats({"w": stats.sq_norm_mean["w"], "b": None}, 8)
  tx = ol.scale_by_lena()
  with pytest.raises(ValueError, match="has no entry for some unmasked gradient leaves"):
    tx.update(mean, tx.init(PARAMS), PARAMS, grad_stats=holes)


def test_wrong_statistics_type_and_num_samples_on_building_blocks():
  mean, stats = stats_for(PARAMS, s=8)
  for tx in (
    ol.scale_by_lena(),
    ol.layerwise_warmup(5.0),
    ol.fixed_warmup(10),
    ol.skip_nonfinite_steps(optax.sgd(0.1)),
  ):
    with pytest.raises(TypeError, match=r"ol\.GradStats"):
      tx.update(mean, tx.init(PARAMS), PARAMS, grad_stats=(stats.sq_norm_mean, 8))
  for tx in (
    ol.fixed_warmup(10, num_samples=16),
    ol.scale_by_linear_scaling(num_samples=16),
    ol.layerwise_warmup(5.0, num_samples=16),
    ol.scale_by_learning_rate(optax.constant_schedule(0.1), clock="samples", num_samples=16),
  ):
    with pytest.raises(ValueError, match=r"S=8 .* num_samples=16"):
      tx.update(mean, tx.init(PARAMS), PARAMS, grad_stats=stats)


# -- rules and grouping (gain_ratio.py, grouping.py) ------------------------------------------


def test_rule_object_and_keywords_together():
  rule = ol.lena_rule(eps=0.0)
  for kwargs in ({"eps": 1e-6}, {"beta": 0.1}, {"grouping": "module"}, {"num_samples": 8}):
    with pytest.raises(ValueError, match="either inside the GainRatioRule or as keywords"):
      ol.layerwise_warmup(5.0, rule=rule, **kwargs)
  ol.layerwise_warmup(5.0, rule=rule)  # the rule alone is fine


def test_unhashable_group_label():
  mean, stats = stats_for(PARAMS)
  tx = ol.lena(0.1, grouping=lambda path, leaf: list(path[:-1]))
  with pytest.raises(ValueError, match="unhashable label"):
    tx.update(mean, tx.init(PARAMS), PARAMS, grad_stats=stats)


# -- diagnostics (diagnostics.py) -------------------------------------------------------------


def test_diagnostics_of_several_rules_asks_for_each_inner_state():
  labels = {"w": "a", "b": "b"}
  tx = optax.multi_transform({"a": ol.lena(0.1), "b": ol.adascale(0.1)}, labels)
  state = tx.init(PARAMS)
  with pytest.raises(ValueError, match="exactly one optax_lena gain-ratio rule"):
    ol.diagnostics(state)
  d = ol.diagnostics(state.inner_states["a"].inner_state)
  assert d["gain_ratio"].shape == (1,)
  two_warmups = optax.chain(ol.scale_by_lena(), ol.layerwise_warmup(5.0), ol.layerwise_warmup(9.0))
  with pytest.raises(ValueError, match="at most one warm-up"):
    ol.diagnostics(two_warmups.init(PARAMS))


def test_diagnostics_with_another_parameter_tree():
  tx = ol.lena(0.1)
  state = tx.init(PARAMS)
  with pytest.raises(ValueError, match="pass the parameter tree the optimizer was initialised"):
    ol.diagnostics(state, {"w": jnp.ones(2)})
  with pytest.raises(ValueError, match="pass the parameter tree the optimizer was initialised"):
    ol.per_layer_tree(jnp.ones(3), PARAMS)


# -- power and reference batch (checks.py, batch_scale.py) -------------------------------------


@pytest.mark.parametrize(
  "build, match",
  [
    (lambda: ol.lena(0.1, power=0.0), "power must be a positive float"),
    (lambda: ol.scale_by_adascale(power=-0.5), "power must be a positive float"),
    (lambda: ol.lena_adamw(1e-3, power=float("nan")), "power must be a positive float"),
    (lambda: ol.GainRatioRule(power=jnp.asarray(-0.5)), "power must be a positive float"),
    (lambda: ol.GainRatioRule(power=None), "power must be a positive float"),
    (lambda: ol.lena(0.1, reference_batch_size=256), "needs per_worker_batch_size"),
    (lambda: ol.fixed_warmup(8, per_worker_batch_size=32), "needs per_worker_batch_size"),
    (
      lambda: ol.linear_scaling_adamw(1e-3, per_worker_batch_size=0, reference_batch_size=8),
      "per_worker_batch_size must be a positive int",
    ),
  ],
)
def test_bad_power_and_batch_sizes_raise_at_construction(build, match):
  with pytest.raises(ValueError, match=match):
    build()


@pytest.mark.parametrize(
  "reference, match",
  [
    (100, r"not a multiple of reference_batch_size=100.*the nearest is 128"),
    (512, r"smaller than reference_batch_size=512.*reference_batch_size=32"),
  ],
)
def test_reference_batch_that_does_not_divide_names_the_fix(reference, match):
  mean, stats = stats_for(PARAMS, s=8)  # global batch 8 x 32 = 256
  for tx in (
    ol.lena(0.1, per_worker_batch_size=32, reference_batch_size=reference),
    ol.linear_scaling(
      0.1, warmup_steps=10, per_worker_batch_size=32, reference_batch_size=reference
    ),
    ol.scale_by_learning_rate(
      optax.constant_schedule(0.1),
      clock="samples",
      per_worker_batch_size=32,
      reference_batch_size=reference,
    ),
  ):
    with pytest.raises(ValueError, match=match):
      tx.update(mean, tx.init(PARAMS), PARAMS, grad_stats=stats)


# -- stacked layers (layer_axes.py) and the learning rate's type -------------------------------

STACKED = {
  "blocks": {"kernel": jnp.ones((4, 2, 3)), "bias": jnp.zeros((4, 3))},
  "head": jnp.ones(3),
}
BLOCKS_AT_0 = {"blocks": 0, "head": None}


@pytest.mark.parametrize(
  "layer_axes, match",
  [
    ({"blocks": 2, "head": None}, r"\['blocks'\]\['bias'\] of shape \(4, 3\).*axis 2.*rank 2"),
    (lambda path, leaf: -4 if path[0] == "blocks" else None, r"axis -4, outside its rank"),
    ({"blocks": 0, "head": None, "tail": 0}, r"does not have: \['tail'\]"),
    (
      {"blocks": {"kernel": 0}, "head": None},
      r"does not cover the parameter \['blocks'\]\['bias'\]",
    ),
    ({"blocks": 0}, r"does not cover the parameter \['head'\]"),
  ],
)
def test_layer_axes_that_do_not_fit_the_parameters(layer_axes, match):
  """Raised at init (naming the parameter and the fix), and by the statistics functions."""
  for tx in (ol.lena(0.1, layer_axes=layer_axes), ol.scale_by_adascale(layer_axes=layer_axes)):
    with pytest.raises(ValueError, match=match):
      tx.init(STACKED)
  stacked = jax.tree.map(lambda p: jnp.ones((2, *p.shape)), STACKED)
  with pytest.raises(ValueError, match=match):
    ol.stacked_grad_stats(stacked, layer_axes=layer_axes)


@pytest.mark.parametrize(
  "build", [lambda v: ol.lena(0.1, layer_axes=v), lambda v: ol.lena_rule(layer_axes=v)]
)
@pytest.mark.parametrize("bad", ["layers", 1.0, True, {"blocks": "0"}])
def test_layer_axes_of_the_wrong_type_raise_at_construction(build, bad):
  with pytest.raises(TypeError, match="layer_axes must hold Python ints"):
    build(bad)


def test_injected_layer_axes_name_static_args():
  with pytest.raises(ValueError, match=r"static_args=\('layer_axes',\)"):
    optax.inject_hyperparams(ol.lena)(learning_rate=0.1, layer_axes=0).init(STACKED)


@pytest.mark.parametrize(
  "stats_axes, tx_axes, match",
  [
    (BLOCKS_AT_0, None, r"has shape \(4,\) for the parameter \['blocks'\]\['bias'\].*one layer"),
    (None, BLOCKS_AT_0, r"has one value \(no layer axis\).*4 layers along axis 0"),
    (
      {"blocks": {"kernel": 1, "bias": 1}, "head": None},
      BLOCKS_AT_0,
      r"has shape \(3,\) for the parameter \['blocks'\]\['bias'\].*4 layers along axis 0",
    ),
  ],
)
def test_statistics_with_other_layer_axes_than_the_optimizer(stats_axes, tx_axes, match):
  mean, stats = stats_for(STACKED)
  stacked = jax.tree.map(lambda p: jnp.ones((2, *p.shape)), STACKED)
  _, stats = ol.stacked_grad_stats(stacked, layer_axes=stats_axes)
  for tx in (
    ol.lena(0.1, layer_axes=tx_axes),
    ol.layerwise_warmup(5.0, layer_axes=tx_axes),
    ol.scale_by_linear_scaling(layer_axes=tx_axes),
  ):
    with pytest.raises(ValueError, match=match + r".*Pass the same layer_axes"):
      jax.jit(tx.update).lower(mean, tx.init(STACKED), STACKED, grad_stats=stats)


def test_module_grouping_of_stacks_of_different_sizes():
  params = {"blocks": {"kernel": jnp.ones((4, 2, 3)), "bias": jnp.zeros((4, 3))}}
  for axes in ({"blocks": {"kernel": 0, "bias": 1}}, {"blocks": {"kernel": 0, "bias": None}}):
    tx = ol.lena(0.1, grouping="module", layer_axes=axes)
    with pytest.raises(ValueError, match=r"module 'blocks'.*\['blocks'\]\['bias'\] has .*layer"):
      tx.init(params)


def test_layer_axes_twice_and_diagnostics_without_them():
  with pytest.raises(ValueError, match="pass it once"):
    ol.large_batch_sgd(0.1, ol.lena_rule(layer_axes=0), layer_axes=0)
  state = ol.lena(0.1, layer_axes=BLOCKS_AT_0).init(STACKED)
  with pytest.raises(ValueError, match=r"9 layers but params has 3.*pass layer_axes="):
    ol.diagnostics(state, STACKED)
  with pytest.raises(ValueError, match=r"9 layers but params has 3"):
    ol.flat_diagnostics(state, STACKED)


@pytest.mark.parametrize(
  "alias",
  [
    ol.lena,
    ol.adascale,
    ol.linear_scaling,
    ol.lena_adamw,
    ol.adascale_adamw,
    ol.linear_scaling_adamw,
    lambda lr: ol.large_batch_sgd(lr, ol.lena_rule()),
    lambda lr: ol.large_batch_adamw(lr, ol.lena_rule(power=0.5)),
    lambda lr: ol.scale_by_learning_rate(lr),
  ],
)
@pytest.mark.parametrize("bad", ["0.1", b"0.1", True, [0.1]])
def test_learning_rate_that_is_not_a_number_or_a_schedule(alias, bad):
  with pytest.raises(TypeError, match=r"learning_rate must be a number .* or an Optax schedule"):
    alias(bad)
