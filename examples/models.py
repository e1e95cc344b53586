"""Flax (linen) models used by the training examples.

* :class:`CNN1D` -- a small 1D convnet for MNIST-1D (inputs ``[batch, 40]``).
* :class:`ResNet1D` -- ResNet-18's layout in 1D with BatchNorm for MNIST-1D (62 leaves).
* :class:`ResNet18` -- the CIFAR variant of ResNet-18 (3x3 stem, no max-pool),
  as in the reference PyTorch CIFAR implementations (He et al. 2016, kuangliu/pytorch-cifar).
* :class:`PatchTransformer` -- a small pre-LayerNorm transformer on patches of MNIST-1D.

All take ``train`` in ``__call__``; only the ResNets have state (BatchNorm statistics),
so training code should treat ``batch_stats`` as optional. :func:`decay_mask` selects the
kernels of any of them, for weight decay on kernels only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

import optax_lena.flax as olf

ModuleDef = Any
# The partition name under which nn.scan records the layer axis of PatchTransformer's stacked
# blocks (MaxText's name for it).
LAYERS = "layers"

# He-normal with fan_out, as torchvision's ResNets use for their convolutions; it keeps the
# activations' scale stable through the ReLU stack better than Flax's lecun_normal default.
_conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


class CNN1D(nn.Module):
  """Small 1D CNN for MNIST-1D: ``num_layers`` x (Conv stride 2 + ReLU), flatten, Dense.

  With the defaults the sequence length goes 40 -> 20 -> 10 -> 5, so the classifier sees
  ``5 * features`` inputs (about 12k parameters in total). No normalisation layers, so the
  model is stateless and its gradients are a pure function of the batch.

  Attributes:
    num_classes: number of output logits.
    features: channels of every convolution.
    kernel_size: width of every convolution kernel.
    num_layers: number of stride-2 convolutions.
    dtype: computation dtype (parameters stay float32).
  """

  num_classes: int = 10
  features: int = 32
  kernel_size: int = 5
  num_layers: int = 3
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray, train: bool = False) -> jnp.ndarray:
    """Returns logits of shape ``[batch, num_classes]``.

    Args:
      x: ``[batch, length]`` signals (a trailing channel axis of size 1 is also accepted).
      train: unused (no dropout / BatchNorm); kept so all models share one signature.

    Returns:
      Logits, ``[batch, num_classes]``.
    """
    del train
    if x.ndim == 2:  # [B, L] -> [B, L, 1]: Flax convolutions want a channel axis.
      x = x[..., None]
    x = jnp.asarray(x, self.dtype)
    for _ in range(self.num_layers):
      x = nn.Conv(
        self.features, (self.kernel_size,), strides=(2,), padding="SAME", dtype=self.dtype
      )(x)
      x = nn.relu(x)
    x = x.reshape((x.shape[0], -1))
    x = nn.Dense(self.num_classes, dtype=self.dtype)(x)
    return jnp.asarray(x, jnp.float32)


class BasicBlock(nn.Module):
  """ResNet basic block: two 3x3 convs with BatchNorm, plus a projection shortcut when the
  shape changes (1x1 conv + BatchNorm, "option B" of He et al.); ``ndim`` spatial axes."""

  features: int
  conv: ModuleDef
  norm: ModuleDef
  strides: int = 1
  ndim: int = 2

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    residual = x
    kernel, strides = (3,) * self.ndim, (self.strides,) * self.ndim
    y = self.conv(self.features, kernel, strides=strides)(x)
    y = self.norm()(y)
    y = nn.relu(y)
    y = self.conv(self.features, kernel)(y)
    y = self.norm()(y)
    if residual.shape != y.shape:
      residual = self.conv(
        self.features, (1,) * self.ndim, strides=strides, padding="VALID", name="shortcut_conv"
      )(residual)
      residual = self.norm(name="shortcut_norm")(residual)
    return nn.relu(residual + y)


class ResNet18(nn.Module):
  """ResNet-18 for 32x32 inputs (CIFAR variant).

  3x3 stride-1 stem conv with ``width`` channels and no max-pool, four stages of
  ``stage_sizes`` basic blocks with ``width * (1, 2, 4, 8)`` channels (stride 2 at the start of
  stages 2-4), global average pooling and a Dense classifier. Convolutions have no bias (the
  following BatchNorm has one). With ``num_classes=10`` and the default width this has
  11,173,962 parameters in 62 leaves.

  Attributes:
    num_classes: number of output logits.
    width: channels of the stem and of the first stage (64 in the paper; tests use e.g. 4).
    stage_sizes: number of basic blocks per stage.
    dtype: computation dtype (parameters and BatchNorm statistics stay float32).
    axis_name: ``pmap``/``shard_map`` axis name over which BatchNorm averages batch
      statistics; ``None`` keeps per-device statistics (and works under plain ``jit``).
  """

  num_classes: int = 10
  width: int = 64
  stage_sizes: Sequence[int] = (2, 2, 2, 2)
  dtype: Any = jnp.float32
  axis_name: str | None = None

  @nn.compact
  def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
    """Returns logits of shape ``[batch, num_classes]``.

    Args:
      x: images, ``[batch, height, width, 3]``.
      train: if True BatchNorm normalises with batch statistics and updates its running
        averages (call ``apply`` with ``mutable=['batch_stats']``); if False it uses them.

    Returns:
      Logits, ``[batch, num_classes]``.
    """
    # Explicit symmetric padding 1 (as PyTorch) rather than "SAME": for stride-2 3x3 convs
    # SAME pads (0, 1), which misaligns the main path with the 1x1 stride-2 shortcut.
    conv: Callable[..., nn.Module] = partial(
      nn.Conv, use_bias=False, padding=((1, 1), (1, 1)), kernel_init=_conv_init, dtype=self.dtype
    )
    norm = partial(
      nn.BatchNorm,
      use_running_average=not train,
      momentum=0.9,
      epsilon=1e-5,
      dtype=self.dtype,
      axis_name=self.axis_name,
    )

    x = jnp.asarray(x, self.dtype)
    x = conv(self.width, (3, 3), name="stem_conv")(x)
    x = norm(name="stem_norm")(x)
    x = nn.relu(x)
    for i, num_blocks in enumerate(self.stage_sizes):
      for j in range(num_blocks):
        strides = 2 if i > 0 and j == 0 else 1
        x = BasicBlock(self.width * 2**i, conv=conv, norm=norm, strides=strides)(x)
    x = jnp.mean(x, axis=(1, 2))
    x = nn.Dense(self.num_classes, dtype=self.dtype)(x)
    return jnp.asarray(x, jnp.float32)


class BasicBlock1D(BasicBlock):
  """The 1D basic block of :class:`ResNet1D`: :class:`BasicBlock` with width-3 kernels."""

  ndim: int = 1


class ResNet1D(nn.Module):
  """ResNet-18's layout in 1D for MNIST-1D (inputs ``[batch, 40]``), with BatchNorm.

  Width-3 stem conv and four stages of ``stage_sizes`` basic blocks with ``width * (1, 2, 4,
  8)`` channels (stride 2 at the start of stages 2-4: length 40 -> 20 -> 10 -> 5), global
  average pooling and a Dense classifier; convolutions have no bias. Same leaf structure as
  :class:`ResNet18` (62 parameter leaves: 20 conv kernels, 20 BatchNorm scales and 20 biases,
  the Dense kernel and bias), so the per-layer gain ratios span the same kinds of layers as in
  the paper. With ``width=16`` it has 243,354 parameters (``width=8``: 61,778).

  Attributes:
    num_classes: number of output logits.
    width: channels of the stem and of the first stage.
    stage_sizes: number of basic blocks per stage.
    dtype: computation dtype (parameters and BatchNorm statistics stay float32).
    axis_name: axis over which BatchNorm averages batch statistics (``None``: per call, i.e.
      per worker under ``vmap``/``pmap`` without an axis name, as PyTorch DDP).
  """

  num_classes: int = 10
  width: int = 16
  stage_sizes: Sequence[int] = (2, 2, 2, 2)
  dtype: Any = jnp.float32
  axis_name: str | None = None

  @nn.compact
  def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
    """Returns logits ``[batch, num_classes]``; ``train`` as in :class:`ResNet18`.

    Args:
      x: ``[batch, length]`` signals (a trailing channel axis of size 1 is also accepted).
      train: BatchNorm with batch statistics (call ``apply`` with
        ``mutable=['batch_stats']``) if True, with the running averages if False.

    Returns:
      Logits, ``[batch, num_classes]``.
    """
    conv = partial(
      nn.Conv, use_bias=False, padding=((1, 1),), kernel_init=_conv_init, dtype=self.dtype
    )
    norm = partial(
      nn.BatchNorm,
      use_running_average=not train,
      momentum=0.9,
      epsilon=1e-5,
      dtype=self.dtype,
      axis_name=self.axis_name,
    )
    if x.ndim == 2:
      x = x[..., None]
    x = jnp.asarray(x, self.dtype)
    x = nn.relu(norm(name="stem_norm")(conv(self.width, (3,), name="stem_conv")(x)))
    for i, num_blocks in enumerate(self.stage_sizes):
      for j in range(num_blocks):
        strides = 2 if i > 0 and j == 0 else 1
        x = BasicBlock1D(self.width * 2**i, conv=conv, norm=norm, strides=strides)(x)
    x = jnp.mean(x, axis=1)
    x = nn.Dense(self.num_classes, dtype=self.dtype)(x)
    return jnp.asarray(x, jnp.float32)


def _unsharded(init: Callable[..., jax.Array]) -> Callable[..., nn.Partitioned]:
  """``init`` whose parameter carries a partition annotation (every axis unsharded), so that
  ``nn.scan(..., metadata_params=...)`` can record its layer axis (Flax records it only on
  annotated parameters); the values are ``init``'s."""

  def boxed(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> nn.Partitioned:
    return nn.Partitioned(init(key, shape, dtype), names=(None,) * len(shape))

  return boxed


class Block(nn.Module):
  """Pre-LayerNorm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``.

  ``annotated``: every parameter carries a partition annotation (:func:`_unsharded`, the same
  values), which the scanned stack of :class:`PatchTransformer` needs.
  """

  num_heads: int
  mlp_dim: int
  dtype: Any = jnp.float32
  annotated: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    box = _unsharded if self.annotated else lambda init: init
    kernel, zeros, ones = (
      nn.initializers.lecun_normal(),
      nn.initializers.zeros,
      nn.initializers.ones,
    )
    dense = partial(nn.Dense, dtype=self.dtype, kernel_init=box(kernel), bias_init=box(zeros))
    norm = partial(nn.LayerNorm, dtype=self.dtype, scale_init=box(ones), bias_init=box(zeros))
    y = norm()(x)
    attention = nn.MultiHeadDotProductAttention(
      num_heads=self.num_heads, dtype=self.dtype, kernel_init=box(kernel), bias_init=box(zeros)
    )
    x = x + attention(y, y)
    y = dense(self.mlp_dim)(norm()(x))
    return x + dense(x.shape[-1])(nn.gelu(y))


def _block_step(block: Block, x: jax.Array, _: None) -> tuple[jax.Array, None]:
  """One step of ``nn.scan`` over the stacked blocks: ``(carry, slice) -> (carry, output)``."""
  return block(x), None


class PatchTransformer(nn.Module):
  """A small attention model for MNIST-1D sequences (inputs ``[batch, 40]``).

  The signal is cut into patches of ``patch`` samples (tokens), embedded with a learned position
  embedding, run through ``depth`` pre-LayerNorm blocks (multi-head self-attention and an MLP)
  of width ``width``, then mean-pooled into the logits. Small enough to train dozens of runs on
  two CPU cores, but with the leaf types of a transformer (attention projections, MLP kernels,
  LayerNorm scales, biases, embeddings) whose gradient noise differs.

  Attributes:
    num_classes: number of output logits.
    patch: samples per token (must divide the signal's length).
    width: the model (embedding) dimension.
    depth: number of transformer blocks.
    num_heads: attention heads (must divide ``width``).
    mlp_dim: hidden units of each block's MLP.
    dtype: computation dtype (parameters stay float32).
    scan_layers: run the blocks with ``nn.scan`` (one compiled block whatever the depth), their
      parameters stacked on a leading layer axis of size ``depth`` under ``blocks`` and
      annotated, so that Flax records the axis as ``"layers"`` in their partition names (read
      it with ``optax_lena.flax.layer_axes``); :func:`stack_blocks` gives such parameters from
      the unscanned model's.
  """

  num_classes: int = 10
  patch: int = 4
  width: int = 24
  depth: int = 1
  num_heads: int = 2
  mlp_dim: int = 48
  dtype: Any = jnp.float32
  scan_layers: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    """Returns logits of shape ``[batch, num_classes]``.

    Args:
      x: ``[batch, length]`` signals, ``length`` a multiple of ``patch``.
      train: unused (no dropout / BatchNorm); kept so all models share one signature.

    Returns:
      Logits, ``[batch, num_classes]``.
    """
    del train
    x = jnp.asarray(x, self.dtype)
    tokens = x.reshape(*x.shape[:-1], x.shape[-1] // self.patch, self.patch)
    h = nn.Dense(self.width, dtype=self.dtype, name="embed")(tokens)
    position = self.param("position", nn.initializers.normal(0.02), h.shape[-2:])
    h = h + position
    if self.scan_layers:
      blocks = nn.scan(
        _block_step,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        length=self.depth,
        metadata_params={nn.PARTITION_NAME: LAYERS},
      )
      block = Block(self.num_heads, self.mlp_dim, dtype=self.dtype, annotated=True, name="blocks")
      h, _ = blocks(block, h, None)
    else:
      for _ in range(self.depth):
        h = Block(self.num_heads, self.mlp_dim, dtype=self.dtype)(h)
    h = nn.LayerNorm(dtype=self.dtype)(h)
    logits = nn.Dense(self.num_classes, dtype=self.dtype, name="head")(jnp.mean(h, axis=-2))
    return jnp.asarray(logits, jnp.float32)


def stack_blocks(params: Any) -> Any:
  """The parameters of :class:`PatchTransformer` with ``scan_layers=True`` from those of the
  unscanned model: ``Block_0`` ... ``Block_{depth-1}`` stacked on a new leading axis under
  ``blocks``, the other entries as they are. The scanned model computes exactly what the
  unscanned one does with them.

  Args:
    params: the unscanned model's parameters (``variables["params"]``).

  Returns:
    The scanned model's parameters, the same leaves' values.

  Raises:
    ValueError: ``params`` has no ``Block_0`` (not an unscanned :class:`PatchTransformer`).
  """
  depth = sum(1 for name in params if name.startswith("Block_"))
  if depth == 0:
    raise ValueError(
      "stack_blocks expects the parameters of an unscanned PatchTransformer (Block_0, ...); "
      f"got the entries {', '.join(params)}."
    )
  blocks = [params[f"Block_{i}"] for i in range(depth)]
  rest = {name: value for name, value in params.items() if not name.startswith("Block_")}
  return {"blocks": jax.tree.map(lambda *slices: jnp.stack(slices), *blocks), **rest}


def recorded_layer_axes(model: nn.Module, input_shape: Sequence[int]) -> Any:
  """The ``layer_axes`` that ``model``'s scans record for its stacked parameters.

  Reads, without computing anything (``jax.eval_shape``), the partition names of the
  parameters that ``model.init`` returns: the axis named :data:`LAYERS` is a parameter's layer
  axis (``optax_lena.flax.layer_axes``).

  Args:
    model: a model with scanned blocks (``PatchTransformer(scan_layers=True)``).
    input_shape: one example's shape (``[40]`` for MNIST-1D).

  Returns:
    A ``flax.core.FrozenDict`` shaped like the parameters, each leaf's layer axis or None:
    hashable, so that it can be a field of the optimizer registry's frozen ``Hyperparams``.

  Raises:
    ValueError: no parameter of ``model`` has a layer axis (an unscanned model).
  """
  x = jax.ShapeDtypeStruct((1, *input_shape), jnp.float32)
  boxed = jax.eval_shape(partial(model.init, train=False), jax.random.key(0), x)
  return flax.core.freeze(olf.layer_axes(boxed["params"], name=LAYERS))


def decay_mask(params: Any) -> Any:
  """Weight decay on kernels only (not biases, LayerNorm or BatchNorm scales, embeddings such
  as the position table): True for the leaves named ``kernel``, by name, so for any model."""
  return jax.tree_util.tree_map_with_path(
    lambda path, _: getattr(path[-1], "key", "") == "kernel", params
  )


MODELS: dict[str, type[nn.Module]] = {
  "cnn1d": CNN1D,
  "resnet18": ResNet18,
  "resnet1d": ResNet1D,
  "patch_transformer": PatchTransformer,
}


def create_model(name: str, num_classes: int, **kw: Any) -> nn.Module:
  """Builds a model by name.

  Args:
    name: a key of :data:`MODELS` (``'cnn1d'``, ``'resnet18'``, ``'resnet1d'``,
      ``'patch_transformer'``; case-insensitive).
    num_classes: number of output logits.
    **kw: further constructor fields (e.g. ``width=``, ``dtype=``, ``axis_name=``).

  Returns:
    The (unbound) Flax module.

  Raises:
    ValueError: for an unknown name.
  """
  try:
    cls = MODELS[name.lower()]
  except KeyError:
    raise ValueError(f"Unknown model {name!r}; valid names: {', '.join(sorted(MODELS))}.") from None
  return cls(num_classes=num_classes, **kw)
