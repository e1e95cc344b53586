"""MNIST-1D with the small attention model (``PatchTransformer``) and LENA around AdamW.

The model and the AdamW settings of ``benchmarks/adamw_scaling``: 10,000 examples (8,000 train
/ 2,000 test, generated offline), AdamW (b1 = ``momentum`` 0.9, Optax's b2 and eps), weight
decay 1e-4 on kernels only, and the rate that study tuned for a batch of 64 (1e-2), here one
worker's rate at per-worker batch 64, so that a single worker is that study's baseline and S
workers have scale k = S. The rate decays exponentially to 1/100 on the sample clock (the
trainer's schedule, which Seesaw's ramp halves against) rather than the study's cosine; the
state-aware warm-up's theta and the fixed warm-up are 5% of the run, as there. Large batch:
``--set batch_scale=16``; ramps: ``--set batch_ramp=seesaw --set batch_scale=2`` (see
benchmarks/batch_ramp/RESULTS.md). Deeper, with the blocks scanned and LENA's ratios per block:
``--set depth=4 --set scan_layers=true`` (``--set layer_axes=none``: one ratio per stack).
"""

from examples.lena.configs import Config


def get_config() -> Config:
  """Returns the attention-model configuration (single worker unless batch_scale is set)."""
  return Config(
    dataset="mnist1d",
    mnist1d_num_samples=10_000,
    model="patch_transformer",
    per_worker_batch=64,
    optimizer="lena_adamw",
    learning_rate=1e-2,
    momentum=0.9,
    weight_decay=1e-4,
    lr_decay=0.01,
    warmup_alpha=0.05,
    warmup_fraction=0.05,
    num_epochs=8,
  )
