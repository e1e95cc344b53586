"""The task the ALADDIN program trains: the MNIST-1D CNN (``examples.models.CNN1D``), each
worker on its own 1/n of the training set, with the shared classifier loss.

:func:`build_task` takes a typed :class:`TaskOptions`, so that benchmarks build the same task
as the program without going through its command line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class TaskOptions:
  """What to train.

  Attributes:
    workers: n (each worker trains on every n-th training example).
    batch_size: per worker.
    num_samples: MNIST-1D examples generated (train and test).
    data_dir: where the generated MNIST-1D is cached.
    seed: the model's initialisation.
  """

  workers: int = 4
  batch_size: int = 128
  num_samples: int = 5000
  data_dir: str = "data_cache"
  seed: int = 0


class Mnist1dBatches:
  """Picklable ``batches(worker, seed)``: worker i's endless mini-batches of its shard.

  The actors load the dataset from the ``.npz`` cache the driver generated, so nothing large is
  shipped through Ray.
  """

  def __init__(self, data_dir: str, num_workers: int, batch_size: int, num_samples: int):
    self.data_dir, self.num_workers = data_dir, num_workers
    self.batch_size, self.num_samples = batch_size, num_samples

  def __call__(self, worker: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    from examples.input_pipeline import load_mnist1d, numpy_batches

    data = load_mnist1d(self.data_dir, seed=0, num_samples=self.num_samples)
    x = data["x_train"][worker :: self.num_workers]
    y = data["y_train"][worker :: self.num_workers]
    rng = np.random.default_rng([seed, worker])
    while True:
      yield from numpy_batches(x, y, self.batch_size, rng=rng)


def build_task(options: TaskOptions) -> tuple[Any, Callable[[Any], float]]:
  """The Ray task (model, data) and the driver's test-accuracy function."""
  import jax
  import jax.numpy as jnp

  from examples.input_pipeline import load_mnist1d
  from examples.losses import ClassifierAccuracy, ClassifierLoss
  from examples.models import CNN1D
  from optax_lena.aladdin import distributed as ad

  data_dir = str(Path(options.data_dir).resolve())
  data = load_mnist1d(data_dir, seed=0, num_samples=options.num_samples)  # generates the cache
  model = CNN1D()
  params = model.init(jax.random.key(options.seed), jnp.zeros((1, data["x_train"].shape[1])))
  params = jax.tree.map(np.asarray, params["params"])
  task = ad.Task(
    loss_fn=ClassifierLoss(model),
    init_params=params,
    batches=Mnist1dBatches(data_dir, options.workers, options.batch_size, options.num_samples),
    batch_size=options.batch_size,
  )
  test = (jnp.asarray(data["x_test"]), jnp.asarray(data["y_test"]))
  accuracy = jax.jit(lambda p: ClassifierAccuracy(model)(p, test))
  return task, lambda p: float(accuracy(p))
