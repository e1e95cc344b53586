"""ALADDIN misuse: every bad input raises an error that names the fix."""

import jax
import jax.numpy as jnp
import optax
import pytest

from optax_lena import aladdin as al

PARAMS = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}


@pytest.fixture(scope="module")
def server_and_state():
  server = al.parameter_server(2, optax.sgd(0.1))
  return server, server.init(PARAMS)


@pytest.mark.parametrize(
  ("kwargs", "error", "match"),
  [
    ({"num_workers": 0}, ValueError, r"num_workers must be >= 1"),
    ({"num_workers": 2.0}, TypeError, r"num_workers must be a positive int"),
    ({"period": 0}, ValueError, r"period must be >= 1 .*period=1 replies to every message"),
    ({"period": 1.5}, TypeError, r"period must be a positive int"),
    ({"normalise": "avg"}, ValueError, r"normalise must be one of .*'mean_of_locals'"),
    ({"alpha": "counts"}, ValueError, r"alpha must be 'count' .* or a float in \[0, 1\]"),
    ({"alpha": 1.5}, ValueError, r"alpha must be in \[0, 1\] .*Use 'count' or 'n_pi'"),
    ({"alpha": -0.1}, ValueError, r"alpha must be in \[0, 1\]"),
    ({"alpha": None}, TypeError, r"alpha must be 'count', 'n_pi' or a float"),
    ({"server_tx": "sgd"}, TypeError, r"server_tx must be an Optax GradientTransformation"),
  ],
)
def test_bad_server_arguments(kwargs, error, match):
  args = {"num_workers": 2, "server_tx": optax.sgd(0.1)} | kwargs
  with pytest.raises(error, match=match):
    al.parameter_server(args.pop("num_workers"), args.pop("server_tx"), **args)


def test_wrong_gradient_structure(server_and_state):
  server, state = server_and_state
  with pytest.raises(ValueError, match=r"tree structure of grads .*same parameter pytree"):
    server.receive(state, {"w": jnp.zeros((2, 3))}, 0)


def test_wrong_gradient_shape_at_trace_time(server_and_state):
  server, state = server_and_state
  grads = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(3)}
  with pytest.raises(ValueError, match=r"\['w'\] has shape \(3, 2\) .*\(2, 3\)\. Send the"):
    jax.jit(server.receive)(state, grads, jnp.int32(0))


def test_wrong_gradient_dtype(server_and_state):
  server, state = server_and_state
  grads = {"w": jnp.zeros((2, 3), jnp.bfloat16), "b": jnp.zeros(3)}
  with pytest.raises(ValueError, match=r"dtype bfloat16 .*float32\. Cast it, e\.g\. jax\.tree"):
    server.receive(state, grads, 0)


@pytest.mark.parametrize("worker", [2, -1, 10])
def test_unknown_concrete_worker(server_and_state, worker):
  server, state = server_and_state
  grads = jax.tree.map(jnp.ones_like, PARAMS)
  with pytest.raises(IndexError, match=r"Unknown worker index .*num_workers=2.*\[0, 2\)"):
    server.receive(state, grads, worker)


def test_worker_must_be_an_integer(server_and_state):
  server, state = server_and_state
  grads = jax.tree.map(jnp.ones_like, PARAMS)
  with pytest.raises(TypeError, match=r"worker must be an integer scalar"):
    server.receive(state, grads, 0.5)
  with pytest.raises(TypeError, match=r"worker must be an integer scalar"):
    jax.jit(server.receive)(state, grads, jnp.float32(0))


def test_state_must_be_a_server_state(server_and_state):
  server, _ = server_and_state
  with pytest.raises(TypeError, match=r"ServerState returned by init"):
    server.receive(PARAMS, PARAMS, 0)


def test_worker_merge_mismatch():
  with pytest.raises(ValueError, match=r"Pass the reply's params"):
    al.worker_merge(PARAMS, {"w": jnp.zeros((2, 3))}, 0.5)
  with pytest.raises(ValueError, match=r"pass the reply of the server"):
    al.worker_merge(PARAMS, {"w": jnp.zeros((3, 2)), "b": jnp.zeros(3)}, 0.5)


@pytest.mark.parametrize(
  "name",
  [
    "ShardSpec",
    "ShardedParameterServer",
    "ShardedServerState",
    "shard_params",
    "sharded_parameter_server",
  ],
)
def test_removed_sharding_names_say_what_replaces_them(name):
  fix = r"removed: .*ad\.Config\(ps_shards=k\).*sim\.make_cluster\(\.\.\., num_shards=k\)"
  with pytest.raises(ImportError, match=fix):
    getattr(al, name)
  with pytest.raises(ImportError, match=fix):
    exec(f"from optax_lena.aladdin import {name}", {})
  with pytest.raises(AttributeError):
    al.no_such_name  # noqa: B018 - other names still raise AttributeError


def test_baseline_arguments():
  with pytest.raises(ValueError, match=r"beta must be in \(0, 1\] .*0\.9 / n"):
    al.easgd_server(4, beta=1.5)
  with pytest.raises(ValueError, match=r"tau must be an int >= 1"):
    al.easgd_server(4, tau=0)
  with pytest.raises(ValueError, match=r"overlap must be 0 or 1"):
    al.sgp(4, overlap=2)
  with pytest.raises(TypeError, match=r"stacked=True"):
    al.ar_sgd_mean(PARAMS)
  with pytest.raises(TypeError, match=r"tx must be an Optax GradientTransformation"):
    al.local_step(lambda p, b: 0.0, "sgd")
