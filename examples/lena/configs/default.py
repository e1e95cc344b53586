"""MNIST-1D with the small 1D CNN: the default, offline configuration (CPU friendly)."""

from examples.lena.configs import Config


def get_config() -> Config:
  """Returns the MNIST-1D configuration (single worker unless ``batch_scale`` is raised)."""
  return Config(
    dataset="mnist1d",
    model="cnn1d",
    per_worker_batch=32,
    learning_rate=0.05,
    weight_decay=5e-4,
    num_epochs=30,
  )
