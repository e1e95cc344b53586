"""Training configurations for ``examples/lena/train.py``.

``ml_collections`` is not a dependency, so a configuration is a plain frozen dataclass,
:class:`Config`. Each module of this package (``default``, ``cifar10_resnet18``, ``tiny_test``)
defines ``get_config() -> Config``; the command line picks one with ``--config NAME`` (or a path
to such a module) and changes fields with ``--set key=value``, converted to the field's type.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from examples.errors import ConfigError

__all__ = ["Config", "ConfigError", "available_configs", "get_config", "override"]


@dataclasses.dataclass(frozen=True)
class Config:
  """Everything ``train_and_evaluate`` needs; the defaults are the MNIST-1D example.

  Batch layout: the global batch is ``per_worker_batch x batch_scale`` examples and one update
  averages ``S = batch_scale`` per-worker gradients, computed on ``num_devices`` devices that
  each accumulate ``micro_batches`` of them (``S = num_devices x micro_batches``).
  """

  # Data.
  dataset: str = "mnist1d"  # 'mnist1d' (generated offline), 'cifar10' or 'cifar100' (TFDS)
  data_dir: str = ""  # TFDS data_dir holding the prepared CIFAR ('' = TFDS default)
  cache_dir: str = "data_cache"  # MNIST-1D cache directory
  mnist1d_num_samples: int = 10_000  # before mnist1d's 80/20 train/test split
  data_seed: int = 0  # MNIST-1D generation seed
  num_validation: int = 0  # MNIST-1D: training examples held out as a validation split
  eval_split: str = "test"  # 'test' or 'validation'

  # Model.
  model: str = "cnn1d"  # 'cnn1d', 'resnet18', 'resnet1d' or 'patch_transformer'
  width: int = 0  # CNN1D features / ResNet-18 stem width; 0 = the model's default
  dtype: str = "float32"  # computation dtype: 'float32' or 'bfloat16' (parameters stay f32)
  depth: int = 0  # patch_transformer's blocks; 0 = the model's default (1)
  # patch_transformer only: its blocks under nn.scan, their parameters stacked on a layer axis
  # (one compiled block whatever the depth), initialised as the unscanned model's (the same
  # numbers for the same seed).
  scan_layers: bool = False

  # Optimizer.
  optimizer: str = "lena"  # a name of the registry examples/optimizers.py (sgd, lena, ...)
  # 'none', 'fixed' (W base steps), 'state_aware' (theta) or 'default' = the paper's choice
  # for the optimizer (its registry entry's paper_warmup: linear_scaling fixed, lena
  # state_aware, ...).
  warmup: str = "default"
  learning_rate: float = 0.1  # eta0, the rate of one worker at the per-worker batch ...
  # ... or at this batch b0, if > 0: the rate was tuned at b0 examples, so an update of S
  # per-worker batches b has scale k = S b / b0 (LSW's factor, the gain ratio's cap, the sample
  # clock and the warm-ups count k); linear_scaling, adascale and lena only; S b must be a
  # multiple of b0. 0 = per_worker_batch (k = S).
  reference_batch_size: int = 0
  momentum: float = 0.9
  weight_decay: float = 5e-4  # coupled (PyTorch SGD), except for lars / lamb
  lr_decay: float = 0.01  # exponential decay: eta0 * lr_decay ** (progress in [0, 1])
  warmup_alpha: float = 0.05  # state-aware warm-up: theta = alpha * T1
  warmup_fraction: float = 0.055  # fixed warm-up: W = fraction x single-worker iterations
  grouping: str = "leaf"  # LENA ratios per 'leaf' (the paper) or per 'module'
  # What a layer is in a scanned stack (scan_layers): 'model' (the layer axes the model
  # records: each block's slice a layer, as in the unscanned model) or 'none' (one layer per
  # parameter leaf: one ratio and warm-up per stack, LENA's rule before per-slice statistics).
  layer_axes: str = "model"

  # Batch layout and parallelism.
  per_worker_batch: int = 32
  batch_scale: int = 1  # S: per-worker batches per update
  global_batch_size: int = 0  # if > 0, overrides batch_scale (must be S x per_worker_batch)
  num_devices: int = 0  # data-parallel devices (all processes); 0 = the largest that divides S
  micro_batches: int = 0  # per device; 0 = S / num_devices
  parallel: str = "shard_map"  # 'shard_map', 'pmap', 'gspmd' or 'vmap'
  # Devices per worker over which the kernels are split (mesh axis 'model'; 1 = replicated):
  # the mesh is num_devices x model_parallel devices.
  model_parallel: int = 1
  # How S changes during the run: 'none', 'steps:U0:S0,U1:S1,...', 'noise[:...]' or
  # 'seesaw[:max=M]': the batch schedule (examples/lena/batch_schedule.py).
  batch_ramp: str = "none"
  # 'auto' (XLA propagates the shardings) or 'explicit' (gspmd / vmap: a mesh of explicit axes,
  # the shardings in the arrays' types, as under jax.set_mesh).
  sharding_mode: str = "auto"

  # Schedule of the run.
  num_epochs: int = 30
  num_steps: int = 0  # if > 0, train for this many updates instead of num_epochs
  eval_every: int = 0  # updates between evaluations; 0 = once per epoch
  eval_batch_size: int = 1000
  log_every: int = 0  # updates between train-loss / optimizer-diagnostics records; 0 = off
  checkpoint_every: int = 0  # updates between checkpoints; 0 = none (and no resuming)
  keep_checkpoints: int = 2
  # A checkpoint that fails its digest or does not restore: 'fallback' (warn, move it to
  # checkpoints_damaged/, resume from the previous one) or 'error' (stop, naming it).
  damaged_checkpoints: str = "fallback"
  seed: int = 0  # parameter initialisation and data order
  # PRNG of the initialisation: 'default' (JAX's, threefry), or 'rbg' / 'unsafe_rbg', whose
  # initialisers compile much faster on CPU (seconds saved per run for a ResNet).
  rng_impl: str = "default"
  progress_bar: bool = True  # tqdm bars (also off when stderr is not a terminal)


def get_config(name_or_path: str) -> Config:
  """Loads a configuration by module name (``'default'``) or path (``'my_config.py'``).

  Args:
    name_or_path: a module of ``examples.lena.configs`` or a path to a Python file; either must
      define ``get_config() -> Config``.

  Returns:
    The configuration.

  Raises:
    ValueError: unknown configuration name.
  """
  if name_or_path.endswith(".py"):
    path = Path(name_or_path)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None or not path.exists():
      raise ValueError(f"Configuration file {name_or_path!r} not found.")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  else:
    valid = available_configs()
    if name_or_path not in valid:
      raise ValueError(
        f"Unknown config {name_or_path!r}; valid names: {', '.join(valid)} (or a path "
        "to a .py file defining get_config())."
      )
    module = importlib.import_module(f"{__name__}.{name_or_path}")
  return module.get_config()


def available_configs() -> list[str]:
  """Names of the configuration modules of this package."""
  here = Path(__file__).parent
  return sorted(p.stem for p in here.glob("*.py") if not p.stem.startswith("_"))


def _convert(key: str, text: str, current: object) -> object:
  """Converts ``text`` to the type of the field's current value."""
  if isinstance(current, bool):  # before int: bool is an int subclass
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
      return True
    if lowered in ("0", "false", "no", "off"):
      return False
    raise ValueError(f"--set {key}={text}: expected a boolean (true/false).")
  try:
    if isinstance(current, int):
      return int(text)
    if isinstance(current, float):
      return float(text)
  except ValueError:
    raise ValueError(f"--set {key}={text}: expected {type(current).__name__}.") from None
  return text


def override(config: Config, assignments: Iterable[str]) -> Config:
  """Applies ``key=value`` assignments, type-converted from the fields' current types.

  Args:
    config: the base configuration.
    assignments: strings ``'key=value'`` (e.g. ``'batch_scale=16'``, ``'progress_bar=false'``).

  Returns:
    A new configuration.

  Raises:
    ValueError: malformed assignment, unknown key or value of the wrong type.
  """
  names = [f.name for f in dataclasses.fields(config)]
  changes: dict[str, Any] = {}
  for assignment in assignments:
    key, sep, text = assignment.partition("=")
    key = key.strip()
    if not sep:
      raise ValueError(f"--set expects key=value, got {assignment!r}.")
    if key not in names:
      raise ValueError(f"Unknown config key {key!r}; valid keys: {', '.join(names)}.")
    changes[key] = _convert(key, text, getattr(config, key))
  return dataclasses.replace(config, **changes)
