"""MNIST-1D with ResNet1D (62 parameter leaves, BatchNorm): the setting of the second study.

10,000 examples (8,000 train / 2,000 test, generated offline), per-worker batch 8, so that
S = 256 (batch 2048) still makes 3 updates per epoch, like the paper's 16.4k of 45k CIFAR
images. Width 8 (61,778 parameters) keeps a run on a CPU core in minutes. Large batch:
``--set batch_scale=256 --set optimizer=lena``; see benchmarks/large_batch_resnet/RESULTS.md.
"""

from examples.lena.configs import Config


def get_config() -> Config:
  """Returns the ResNet1D / MNIST-1D configuration (single worker unless batch_scale is set)."""
  return Config(
    dataset="mnist1d",
    mnist1d_num_samples=10_000,
    model="resnet1d",
    width=8,
    per_worker_batch=8,
    learning_rate=0.05,
    momentum=0.9,
    weight_decay=5e-4,
    num_epochs=20,
  )
