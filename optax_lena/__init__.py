"""optax_lena: LENA (layer-wise adaptive learning-rate scaling for large-batch training) and
ALADDIN (asymmetric centralized training on a parameter server).

Composable Optax transformations for data-parallel training at large batch sizes: LENA's
layer-wise gain ratios and state-aware warm-up (Ko, Lee and Kim, WWW 2022), AdaScale and linear
scaling with warm-up, for momentum SGD and (on the square-root rule) AdamW, with the per-worker
gradient statistics they need computed inside ``pmap``, ``shard_map``, ``jit``/GSPMD and
gradient accumulation, and batch-size advice from the gradient noise scale. ALADDIN (Ko et al.,
CIKM 2021) and its baselines are in ``optax_lena.aladdin``: pure, jittable servers and worker
programs, a deterministic cluster simulator (``.simulator``) and a Ray runtime
(``.distributed``).
"""

from optax_lena._src.adamw import (
  adascale_adamw,
  large_batch_adamw,
  lena_adamw,
  linear_scaling_adamw,
)
from optax_lena._src.alias import adascale, large_batch_sgd, lena, linear_scaling
from optax_lena._src.batch_policy import advise_num_samples
from optax_lena._src.diagnostics import (
  diagnostics,
  expected_speedup,
  flat_diagnostics,
  noise_scale,
  per_layer_tree,
)
from optax_lena._src.gain_ratio import (
  GainRatioRule,
  GainRatioState,
  adascale_rule,
  lena_rule,
  linear_scaling_rule,
  scale_by_gain_ratio,
)
from optax_lena._src.grouping import group_by_module
from optax_lena._src.nonfinite import SkipNonFiniteState, skip_nonfinite_steps
from optax_lena._src.rule_blocks import scale_by_adascale, scale_by_lena, scale_by_linear_scaling
from optax_lena._src.schedule import ScaleBySampleClockState, scale_by_learning_rate
from optax_lena._src.stats import (
  GradStats,
  accumulate_grad_stats,
  all_reduce_grad_stats,
  stacked_grad_stats,
)
from optax_lena._src.warmup import (
  FixedWarmupState,
  LayerwiseWarmupState,
  fixed_warmup,
  layerwise_warmup,
)

__version__ = "0.1.0"

# Public names that were renamed: the old spelling raises an error naming the new one.
_RENAMED = {"linear_rule": "linear_scaling_rule"}


def __getattr__(name: str):
  if name in _RENAMED:
    raise AttributeError(
      f"optax_lena.{name} is now called optax_lena.{_RENAMED[name]} (one identifier for linear "
      "scaling: 'linear_scaling')."
    )
  raise AttributeError(f"module 'optax_lena' has no attribute {name!r}")


__all__ = [
  "FixedWarmupState",
  "GainRatioRule",
  "GainRatioState",
  "GradStats",
  "LayerwiseWarmupState",
  "ScaleBySampleClockState",
  "SkipNonFiniteState",
  "accumulate_grad_stats",
  "adascale",
  "adascale_adamw",
  "adascale_rule",
  "advise_num_samples",
  "all_reduce_grad_stats",
  "diagnostics",
  "expected_speedup",
  "fixed_warmup",
  "flat_diagnostics",
  "group_by_module",
  "large_batch_adamw",
  "large_batch_sgd",
  "layerwise_warmup",
  "lena",
  "lena_adamw",
  "lena_rule",
  "linear_scaling",
  "linear_scaling_adamw",
  "linear_scaling_rule",
  "noise_scale",
  "per_layer_tree",
  "scale_by_adascale",
  "scale_by_gain_ratio",
  "scale_by_learning_rate",
  "scale_by_lena",
  "scale_by_linear_scaling",
  "skip_nonfinite_steps",
  "stacked_grad_stats",
]
