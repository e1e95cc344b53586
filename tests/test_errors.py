"""Misuse raises an error that names the fix."""

import jax
import jax.numpy as jnp
import optax
import pytest
from misuse_fixtures import PARAMS, stats_for

import optax_lena as ol


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
