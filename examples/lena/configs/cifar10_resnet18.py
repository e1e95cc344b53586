"""The paper's setting: ResNet-18 on CIFAR-10 (45k/5k split), per-worker batch 128.

eta0 = 0.1, momentum 0.9, coupled weight decay 5e-4, exponential decay to 1% over the epoch
budget on the sample clock. Batch 16k is ``--set batch_scale=128``: on 8 devices that is 16
micro-batches of 128 per device per update.
"""

from examples.lena.configs import Config


def get_config() -> Config:
  """Returns the ResNet-18 / CIFAR-10 configuration (single worker by default)."""
  return Config(
    dataset="cifar10",
    eval_split="test",
    model="resnet18",
    optimizer="lena",
    per_worker_batch=128,
    batch_scale=1,
    learning_rate=0.1,
    momentum=0.9,
    weight_decay=5e-4,
    num_epochs=100,
    eval_batch_size=1000,
    log_every=50,
    checkpoint_every=500,
  )
