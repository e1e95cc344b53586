"""Input pipelines for the training examples: every dataset behind one :class:`Dataset` protocol.

* MNIST-1D is *generated locally* with the ``mnist1d`` package (never downloaded) and cached as
  an ``.npz``; batches come from :func:`numpy_batches`. This is the default, offline dataset.
* CIFAR-10 / CIFAR-100 are read with TensorFlow Datasets from an already prepared ``data_dir``
  (``download=False``: nothing is fetched). Train/validation is the usual 45k/5k split of the
  official train split; the test split is the official one.

TensorFlow is imported lazily inside the CIFAR functions so that MNIST-1D users (and JAX tests)
never pay for, or get their devices touched by, a TensorFlow import.

The trainer sees a dataset only through :class:`Dataset` (:class:`Mnist1dData`,
:class:`CifarData`, built by :func:`create_dataset` from the fields of :class:`DataConfig`) and
cuts its training stream into global batches with ``examples.training_stream``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from examples.errors import ConfigError

Batch = dict[str, np.ndarray]
DATASETS = ("mnist1d", "cifar10", "cifar100")

# ----------------------------------------------------------------------------------------------
# MNIST-1D
# ----------------------------------------------------------------------------------------------

# Bump when the cached content or its layout changes, so stale caches are not picked up.
_MNIST1D_CACHE_VERSION = 1


def _mnist1d_args(seed: int, num_samples: int) -> dict[str, Any]:
  """The generation arguments: mnist1d's defaults with our seed / size."""
  from mnist1d.data import get_dataset_args

  args = get_dataset_args(as_dict=True)
  # The URL only matters to mnist1d's download path, which we never use; dropping it keeps
  # the cache key independent of where upstream hosts its pickle.
  args.pop("url", None)
  args.update(seed=int(seed), num_samples=int(num_samples))
  return args


def _mnist1d_cache_path(cache_dir: Path, args: dict[str, Any]) -> Path:
  blob = json.dumps({"version": _MNIST1D_CACHE_VERSION, **args}, sort_keys=True)
  digest = hashlib.sha256(blob.encode()).hexdigest()[:12]
  return cache_dir / f"mnist1d_seed{args['seed']}_n{args['num_samples']}_{digest}.npz"


def _generate_mnist1d(args: dict[str, Any]) -> dict[str, np.ndarray]:
  from mnist1d.data import make_dataset
  from mnist1d.utils import ObjectView

  # make_dataset seeds the *global* `random` and `np.random` states (mnist1d.utils.set_seed);
  # restore them so that generating data has no side effect on the caller's randomness.
  np_state, py_state = np.random.get_state(), random.getstate()
  try:
    data = make_dataset(ObjectView(dict(args)))
  finally:
    np.random.set_state(np_state)
    random.setstate(py_state)
  return {
    "x_train": np.asarray(data["x"], np.float32),
    "y_train": np.asarray(data["y"], np.int32),
    "x_test": np.asarray(data["x_test"], np.float32),
    "y_test": np.asarray(data["y_test"], np.int32),
  }


def load_mnist1d(
  cache_dir: str | Path,
  seed: int = 0,
  *,
  num_samples: int = 5000,
  num_validation: int = 0,
) -> dict[str, np.ndarray]:
  """Generates (or loads from the cache) the MNIST-1D dataset.

  The data are produced by ``mnist1d.data.make_dataset`` with the package's default
  generation arguments (sequence length 40, 10 classes, 80/20 train/test split) except for
  ``seed`` and ``num_samples``. Nothing is downloaded. Note that the published
  ``mnist1d_data.pkl`` corresponds to ``seed=42``; other seeds give other (equally hard)
  draws. The arrays are cached in ``cache_dir`` under a name derived from all generation
  arguments, so a second call with the same arguments only reads the ``.npz``.

  Args:
    cache_dir: directory for the ``.npz`` cache (created if missing).
    seed: generation seed (mnist1d's ``args.seed``).
    num_samples: total number of examples before the 80/20 train/test split (mnist1d draws
      ``num_samples // 10`` per class).
    num_validation: if positive, the last ``num_validation`` training examples (the
      generator already shuffled them) are moved to ``x_val``/``y_val``. Deterministic.

  Returns:
    A dict with ``x_train`` (float32 ``[N, 40]``), ``y_train`` (int32 ``[N]``), ``x_val``,
    ``y_val`` (possibly empty), ``x_test`` and ``y_test``; labels are in ``[0, 10)``.

  Raises:
    ValueError: if ``num_validation`` is negative or not smaller than the training set.
  """
  cache_dir = Path(cache_dir)
  cache_dir.mkdir(parents=True, exist_ok=True)
  args = _mnist1d_args(seed, num_samples)
  path = _mnist1d_cache_path(cache_dir, args)
  if path.exists():
    with np.load(path) as f:
      data = {k: f[k] for k in f.files}
  else:
    data = _generate_mnist1d(args)
    # Write to a unique temporary file and rename: concurrent writers (pytest-xdist,
    # several training processes) then never observe a half-written cache file.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
      np.savez(f, **cast("dict[str, Any]", data))
    os.replace(tmp, path)

  n_train = len(data["y_train"])
  if not 0 <= num_validation < n_train:
    raise ValueError(f"num_validation must be in [0, {n_train}), got {num_validation}.")
  split = n_train - num_validation
  return {
    "x_train": data["x_train"][:split],
    "y_train": data["y_train"][:split],
    "x_val": data["x_train"][split:],
    "y_val": data["y_train"][split:],
    "x_test": data["x_test"],
    "y_test": data["y_test"],
  }


def numpy_batches(
  x: np.ndarray,
  y: np.ndarray,
  batch_size: int,
  *,
  rng: np.random.Generator | None = None,
  shuffle: bool = True,
  drop_remainder: bool = True,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Iterates over one epoch of ``(x, y)`` in mini-batches.

  Every example appears at most once per epoch (exactly once unless ``drop_remainder``
  drops the last ``len(x) % batch_size`` examples of the permutation).

  Args:
    x: inputs, indexed along the first axis.
    y: labels, same first dimension as ``x``.
    batch_size: examples per batch.
    rng: numpy generator used for the permutation; required when ``shuffle``.
    shuffle: draw a fresh random permutation (else keep the data order).
    drop_remainder: skip a final, smaller batch (keeps shapes static for ``jit``).

  Yields:
    ``(x_batch, y_batch)`` pairs.

  Raises:
    ValueError: on mismatched lengths, a non-positive batch size, or ``shuffle`` without
      ``rng``.
  """
  n = len(x)
  if len(y) != n:
    raise ValueError(f"x and y lengths differ: {n} != {len(y)}.")
  if batch_size <= 0:
    raise ValueError(f"batch_size must be positive, got {batch_size}.")
  if shuffle:
    if rng is None:
      raise ValueError("shuffle=True needs an explicit rng (np.random.Generator).")
    order = rng.permutation(n)
  else:
    order = np.arange(n)
  stop = n - n % batch_size if drop_remainder else n
  for start in range(0, stop, batch_size):
    idx = order[start : start + batch_size]
    yield x[idx], y[idx]


# ----------------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 (TensorFlow Datasets)
# ----------------------------------------------------------------------------------------------

# Per-channel mean / std of the official *train* images, in [0, 1] units (RGB).
CIFAR_MEAN: dict[str, tuple[float, float, float]] = {
  "cifar10": (0.4914, 0.4822, 0.4465),
  "cifar100": (0.5071, 0.4865, 0.4409),
}
CIFAR_STD: dict[str, tuple[float, float, float]] = {
  "cifar10": (0.2470, 0.2435, 0.2616),
  "cifar100": (0.2673, 0.2564, 0.2762),
}
CIFAR_NUM_CLASSES: dict[str, int] = {"cifar10": 10, "cifar100": 100}

# Our split names -> TFDS split strings: 45k/5k train/validation out of the official 50k train.
CIFAR_SPLITS: dict[str, str] = {
  "train": "train[:45000]",
  "validation": "train[45000:]",
  "test": "test",
}
CIFAR_SPLIT_SIZES: dict[str, int] = {"train": 45_000, "validation": 5_000, "test": 10_000}

_CIFAR_PAD = 4  # zero padding before the random 32x32 crop
_CIFAR_SIZE = 32


def _import_tf() -> tuple[Any, Any]:
  """Imports TensorFlow / TFDS on first use and keeps TensorFlow off the accelerators."""
  # Quieten TF's C++ start-up logging unless the user asked for it.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # type: ignore[import-untyped, unused-ignore]
  import tensorflow_datasets as tfds

  # TF would otherwise grab (all of) the GPU memory that JAX needs; the pipeline is CPU-only.
  # RuntimeError: TF's devices were already initialised (e.g. hidden by an earlier call).
  with contextlib.suppress(RuntimeError):
    tf.config.set_visible_devices([], "GPU")
  return tf, tfds


def _check_cifar_name(name: str) -> str:
  if name not in CIFAR_MEAN:
    raise ValueError(f"Unknown dataset {name!r}; valid names: {', '.join(CIFAR_MEAN)}.")
  return name


def cifar_split(split: str) -> str:
  """Maps ``'train'``/``'validation'``/``'test'`` to the TFDS split string.

  Args:
    split: one of ``CIFAR_SPLITS``.

  Returns:
    The TFDS split string, e.g. ``'train[:45000]'``.

  Raises:
    ValueError: for an unknown split name.
  """
  try:
    return CIFAR_SPLITS[split]
  except KeyError:
    raise ValueError(f"Unknown split {split!r}; valid splits: {', '.join(CIFAR_SPLITS)}.") from None


def _missing_dataset_message(name: str, data_dir: str | None, err: Exception) -> str:
  where = data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets (default)"
  return (
    f"TFDS dataset {name!r} is not prepared in data_dir={where!r}, and this pipeline never "
    f"downloads data (download=False). To fix it, either:\n"
    f"  * on a machine with internet access run `tfds build {name} --data_dir=DIR` (or "
    f"`tfds.builder({name!r}, data_dir=DIR).download_and_prepare()`), copy DIR here and "
    f"pass it with --data_dir DIR (or set TFDS_DATA_DIR); or\n"
    f"  * use the default offline dataset, MNIST-1D (dataset name 'mnist1d'), which is "
    f"generated locally.\n"
    f"Original error: {type(err).__name__}: {err}"
  )


def load_cifar(
  name: str,
  split: str,
  batch_size: int,
  *,
  train: bool,
  data_dir: str | Path | None = None,
  seed: int = 0,
  drop_remainder: bool | None = None,
  num_epochs: int | None = 1,
  shuffle_buffer_size: int | None = None,
  keep: tuple[StreamPart, int] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
  """Returns an iterator of CIFAR-10/100 batches as numpy arrays.

  Training pipeline (``train=True``): shuffle (with ``seed``), random 32x32 crop of the image
  zero-padded by 4 pixels, random horizontal flip, per-channel normalisation. Evaluation
  pipeline: normalisation only, fixed order. Padding is applied to the raw pixels, so padded
  pixels are black (normalised to ``-mean / std``), as with torchvision's ``RandomCrop``.
  Random augmentation uses stateless ops keyed on ``(seed, example index)``, so a given seed
  reproduces the same batches.

  Args:
    name: ``'cifar10'`` or ``'cifar100'``.
    split: ``'train'`` (first 45k of the official train split), ``'validation'`` (last 5k)
      or ``'test'`` (official test split, 10k).
    batch_size: examples per batch.
    train: enable shuffling and augmentation.
    data_dir: TFDS data directory holding the prepared dataset (default: TFDS's default,
      ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).
    seed: seed for file/example shuffling and augmentation.
    drop_remainder: drop the last partial batch; defaults to ``train`` (static shapes for
      training, every example for evaluation).
    num_epochs: passes over the data; ``None`` repeats forever.
    shuffle_buffer_size: shuffle buffer in examples; default: the whole split (the images
      are cached in memory as uint8 anyway, about 150 MB for the train split).
    keep: ``(part, first_position)``: only the examples of a :class:`StreamPart` (stream
      position = ``first_position`` + running index), selected before augmentation.

  Returns:
    An iterator of dicts ``{'image': float32 [B, 32, 32, 3], 'label': int32 [B]}``.

  Raises:
    ValueError: unknown dataset or split name.
    FileNotFoundError: the dataset is not prepared in ``data_dir`` (message says how to fix).
  """
  _check_cifar_name(name)
  tfds_split = cifar_split(split)
  if batch_size <= 0:
    raise ValueError(f"batch_size must be positive, got {batch_size}.")
  if drop_remainder is None:
    drop_remainder = train
  tf, tfds = _import_tf()
  data_dir = None if data_dir is None else os.fspath(data_dir)

  try:
    ds = tfds.load(
      name,
      split=tfds_split,
      data_dir=data_dir,
      download=False,  # never touch the network; see the error message below.
      shuffle_files=train,
      read_config=tfds.ReadConfig(shuffle_seed=seed),
    )
  except (AssertionError, FileNotFoundError, tfds.core.DatasetNotFoundError) as e:
    # TFDS 4.9 raises a bare AssertionError ("could not find data in ...") for a registered
    # but unprepared dataset; turn it into an actionable message.
    raise FileNotFoundError(_missing_dataset_message(name, data_dir, e)) from e

  # Keep only what the models need (CIFAR-100 also has 'coarse_label', both have 'id').
  ds = ds.map(
    lambda ex: (ex["image"], tf.cast(ex["label"], tf.int32)), num_parallel_calls=tf.data.AUTOTUNE
  )
  mean = tf.constant(CIFAR_MEAN[name], tf.float32)
  std = tf.constant(CIFAR_STD[name], tf.float32)

  def normalize(image: Any) -> Any:
    return (tf.cast(image, tf.float32) / 255.0 - mean) / std

  if train:
    # Cache the decoded uint8 images (small) so later epochs skip decoding; shuffle before
    # augmenting so the buffer holds uint8 rather than float32 images.
    ds = ds.cache()
    buffer = shuffle_buffer_size or CIFAR_SPLIT_SIZES[split]
    ds = ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat(num_epochs)
    # The running example index (across epochs) keys the stateless random ops, which makes
    # augmentation deterministic even with parallel map.
    ds = ds.enumerate()
    if keep is not None:  # StreamPart.keep's arithmetic works on tf tensors too
      ds = ds.filter(lambda index, _: keep[0].keep(keep[1] + index))

    def augment(index: Any, example: tuple[Any, Any]) -> tuple[Any, Any]:
      image, label = example
      key = tf.stack([tf.cast(seed, tf.int64), index])
      crop_key, flip_key = tf.unstack(tf.random.experimental.stateless_split(key, 2))
      p = _CIFAR_PAD
      image = tf.pad(image, [[p, p], [p, p], [0, 0]])  # zeros = black pixels
      image = tf.image.stateless_random_crop(image, [_CIFAR_SIZE, _CIFAR_SIZE, 3], seed=crop_key)
      image = tf.image.stateless_random_flip_left_right(image, seed=flip_key)
      return normalize(image), label

    ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE)
  else:
    ds = ds.repeat(num_epochs)
    ds = ds.map(lambda image, label: (normalize(image), label), num_parallel_calls=tf.data.AUTOTUNE)

  ds = ds.batch(batch_size, drop_remainder=drop_remainder)
  ds = ds.map(lambda image, label: {"image": image, "label": label})
  ds = ds.prefetch(tf.data.AUTOTUNE)
  return iter(tfds.as_numpy(ds))


# ----------------------------------------------------------------------------------------------
# The datasets the trainer uses
# ----------------------------------------------------------------------------------------------


class DataConfig(Protocol):
  """The fields of a run's configuration that the datasets read (the trainer's ``Config``)."""

  @property
  def dataset(self) -> str: ...  # one of DATASETS

  @property
  def data_dir(self) -> str: ...  # CIFAR: the prepared TFDS data_dir ('' = TFDS's default)

  @property
  def cache_dir(self) -> str: ...  # MNIST-1D: the cache of generated draws

  @property
  def mnist1d_num_samples(self) -> int: ...

  @property
  def data_seed(self) -> int: ...  # MNIST-1D: the draw

  @property
  def num_validation(self) -> int: ...  # MNIST-1D: training examples held out

  @property
  def eval_split(self) -> str: ...  # 'test' or 'validation'

  @property
  def eval_batch_size(self) -> int: ...

  @property
  def seed(self) -> int: ...  # the training stream's order


class Dataset(Protocol):
  """What the trainer needs from a dataset.

  ``epoch_examples(epoch)`` yields one epoch of training examples as ``(x, y)`` chunks in an
  order fixed by ``(seed, epoch)`` (so a resumed run sees the same stream); ``eval_batches()``
  yields the evaluation split in batches padded to one size, with a 0/1 ``mask``.
  """

  num_classes: int
  input_shape: tuple[int, ...]
  num_train: int

  def epoch_examples(
    self, epoch: int, part: StreamPart | None = None
  ) -> Iterator[tuple[np.ndarray, np.ndarray]]: ...

  def eval_batches(self) -> Iterator[Batch]: ...


@dataclasses.dataclass(frozen=True)
class StreamPart:
  """One process's rows ``start:stop`` of every global batch. The stream does not depend on
  the number of processes: each keeps the rows its devices would hold in one process."""

  global_batch: int
  start: int
  stop: int

  @property
  def size(self) -> int:
    return self.stop - self.start

  def keep(self, positions: np.ndarray) -> np.ndarray:
    """Whether each stream position (example index counted from epoch 0) belongs here."""
    row = positions % self.global_batch
    return (row >= self.start) & (row < self.stop)


def process_part(global_batch: int, process_index: int, process_count: int) -> StreamPart | None:
  """Process ``process_index``'s block of ``global_batch / process_count`` rows (None: one
  process, the whole stream)."""
  size, rest = divmod(global_batch, process_count)
  if rest:
    raise ValueError(f"The global batch {global_batch} does not split over {process_count}.")
  return (
    None
    if process_count == 1
    else StreamPart(global_batch, process_index * size, (process_index + 1) * size)
  )


def _epoch_seed(seed: int, epoch: int) -> int:
  """A seed for one epoch's data order: deterministic per (seed, epoch), so resumable."""
  return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def _padded_eval_batches(
  batches: Iterator[tuple[np.ndarray, np.ndarray]], size: int
) -> Iterator[Batch]:
  """Pads every evaluation batch to ``size`` rows with a 0/1 ``mask`` (static shapes)."""
  for x, y in batches:
    n = len(y)
    pad = size - n
    yield {
      "x": np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)]),
      "y": np.concatenate([y, np.zeros((pad,), y.dtype)]),
      "mask": np.concatenate([np.ones((n,), np.float32), np.zeros((pad,), np.float32)]),
    }


class Mnist1dData:
  """MNIST-1D, generated offline and cached (:func:`load_mnist1d`)."""

  num_classes = 10
  input_shape: tuple[int, ...] = (40,)

  def __init__(self, config: DataConfig, eval_batch: int):
    d = load_mnist1d(
      config.cache_dir,
      config.data_seed,
      num_samples=config.mnist1d_num_samples,
      num_validation=config.num_validation,
    )
    self.x_train, self.y_train = d["x_train"], d["y_train"]
    split = {"test": "test", "validation": "val"}[config.eval_split]
    self.x_eval, self.y_eval = d[f"x_{split}"], d[f"y_{split}"]
    if not len(self.y_eval):
      raise ConfigError("eval_split='validation' on MNIST-1D needs num_validation > 0.")
    self.eval_batch, self.seed = eval_batch, config.seed
    self.num_train = len(self.y_train)

  def epoch_examples(
    self, epoch: int, part: StreamPart | None = None
  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch in an order fixed by (seed, epoch), as a single chunk (``part``: only the
    examples of that share of the stream are gathered)."""
    order = np.random.default_rng(_epoch_seed(self.seed, epoch)).permutation(self.num_train)
    if part is not None:
      order = order[part.keep(epoch * self.num_train + np.arange(self.num_train))]
    yield self.x_train[order], self.y_train[order]

  def eval_batches(self) -> Iterator[Batch]:
    batches = numpy_batches(
      self.x_eval, self.y_eval, self.eval_batch, shuffle=False, drop_remainder=False
    )
    return _padded_eval_batches(batches, self.eval_batch)


class CifarData:
  """CIFAR-10/100 from a prepared TFDS ``data_dir`` (:func:`load_cifar`)."""

  input_shape: tuple[int, ...] = (32, 32, 3)
  chunk = 1024  # examples per tf.data batch; global batches are cut from these

  def __init__(self, config: DataConfig, eval_batch: int):
    self.name, self.data_dir = config.dataset, config.data_dir or None
    self.num_classes = CIFAR_NUM_CLASSES[self.name]
    self.num_train = CIFAR_SPLIT_SIZES["train"]
    self.eval_batch, self.seed = eval_batch, config.seed
    self.eval_split = config.eval_split
    # Fail now, with the pipeline's instructions, if the dataset is not prepared.
    self.eval_batches()

  def epoch_examples(
    self, epoch: int, part: StreamPart | None = None
  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch, shuffled and augmented with a seed fixed by (seed, epoch) (``part``: only the
    examples of that share of the stream are augmented and returned)."""
    it = load_cifar(
      self.name,
      "train",
      self.chunk,
      train=True,
      data_dir=self.data_dir,
      num_epochs=1,
      drop_remainder=False,
      seed=_epoch_seed(self.seed, epoch),
      keep=None if part is None else (part, epoch * self.num_train),
    )
    for b in it:
      yield b["image"], b["label"]

  def eval_batches(self) -> Iterator[Batch]:
    it = load_cifar(
      self.name, self.eval_split, self.eval_batch, train=False, data_dir=self.data_dir
    )
    return _padded_eval_batches(((b["image"], b["label"]) for b in it), self.eval_batch)


def create_dataset(config: DataConfig, num_devices: int = 1) -> Dataset:
  """The dataset of ``config.dataset``; evaluation batches are padded to a multiple of
  ``num_devices`` so that they shard evenly."""
  eval_batch = -(-config.eval_batch_size // num_devices) * num_devices
  if config.dataset == "mnist1d":
    return Mnist1dData(config, eval_batch)
  return CifarData(config, eval_batch)
