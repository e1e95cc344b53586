"""A few updates of a small CNN on a small MNIST-1D draw: used by the tests."""

from examples.lena.configs import Config


def get_config() -> Config:
  """Returns a seconds-long configuration."""
  return Config(
    dataset="mnist1d",
    mnist1d_num_samples=1000,
    model="cnn1d",
    width=8,
    per_worker_batch=8,
    batch_scale=8,
    learning_rate=0.05,
    num_epochs=1,
    num_steps=6,
    eval_every=3,
    eval_batch_size=200,
    log_every=2,
    progress_bar=False,
    rng_impl="rbg",  # fast to compile; tests check plumbing, not initialisations
  )
