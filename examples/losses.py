"""The classifier loss and accuracy every example, study and benchmark shares.

``cross_entropy`` is the one definition of the training loss; ``ClassifierLoss`` and
``ClassifierAccuracy`` wrap a parameters-only Flax model as ``fn(params, (x, y))`` callables that
pickle (Ray ships them to its actors) and compare equal when they wrap equal models.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax


def per_example_cross_entropy(logits: jax.Array, labels: jax.typing.ArrayLike) -> jax.Array:
  """Softmax cross-entropy of integer labels, one value per example."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def cross_entropy(logits: jax.Array, labels: jax.typing.ArrayLike) -> jax.Array:
  """Mean softmax cross-entropy of integer labels."""
  return jnp.mean(per_example_cross_entropy(logits, labels))


def accuracy(logits: jax.Array, labels: jax.typing.ArrayLike) -> jax.Array:
  """Fraction of examples whose highest logit is the label."""
  return jnp.mean(jnp.argmax(logits, -1) == labels)


@dataclasses.dataclass(frozen=True)
class ClassifierLoss:
  """``loss(params, (x, y))``: mean cross-entropy of ``model.apply({"params": params}, x)``."""

  model: Any

  def __call__(self, params: Any, batch: tuple[Any, Any]) -> jax.Array:
    x, y = batch
    return cross_entropy(self.model.apply({"params": params}, x), y)


@dataclasses.dataclass(frozen=True)
class ClassifierAccuracy:
  """``accuracy(params, (x, y))`` of ``model.apply({"params": params}, x)``."""

  model: Any

  def __call__(self, params: Any, batch: tuple[Any, Any]) -> jax.Array:
    x, y = batch
    return accuracy(self.model.apply({"params": params}, x), y)
