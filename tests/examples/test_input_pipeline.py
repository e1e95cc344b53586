"""Tests for the examples' input pipelines (examples/input_pipeline.py) and models.

No data are downloaded: MNIST-1D is generated locally, CIFAR runs on `tfds.testing.mock_data`
(with small fake `_as_dataset` functions where a test needs to control the images). TensorFlow
is imported inside the CIFAR tests only, so collecting this module does not import it.
"""

import subprocess
import sys
from pathlib import Path

# `examples` is a top-level package of the repository, not part of the installed `optax_lena`
# distribution; make it importable when pytest is started from anywhere.
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
  sys.path.insert(0, _REPO_ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from examples import input_pipeline as ip  # noqa: E402
from examples import models  # noqa: E402

# ----------------------------------------------------------------------------------------------
# MNIST-1D
# ----------------------------------------------------------------------------------------------

# Smaller than the default 5000 to keep generation well under a second.
_N = 1000


@pytest.fixture(scope="module")
def mnist1d_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
  return tmp_path_factory.mktemp("mnist1d")


def test_mnist1d_shapes_dtypes_and_labels(mnist1d_cache: Path) -> None:
  d = ip.load_mnist1d(mnist1d_cache, seed=0, num_samples=_N)
  assert d["x_train"].shape == (800, 40) and d["x_train"].dtype == np.float32
  assert d["y_train"].shape == (800,) and d["y_train"].dtype == np.int32
  assert d["x_test"].shape == (200, 40) and d["x_test"].dtype == np.float32
  assert d["y_test"].shape == (200,) and d["y_test"].dtype == np.int32
  assert d["x_val"].shape == (0, 40) and d["y_val"].shape == (0,)
  for y in (d["y_train"], d["y_test"]):
    assert y.min() >= 0 and y.max() < 10
  assert set(np.unique(d["y_train"])) == set(range(10))
  assert np.isfinite(d["x_train"]).all()


def test_mnist1d_cache_hit_does_not_regenerate(
  tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
  import mnist1d.data

  first = ip.load_mnist1d(tmp_path, seed=3, num_samples=_N)
  files = list(tmp_path.iterdir())
  assert len(files) == 1 and files[0].suffix == ".npz"

  def fail(*args, **kwargs):
    raise AssertionError("make_dataset called although the cache exists")

  monkeypatch.setattr(mnist1d.data, "make_dataset", fail)
  second = ip.load_mnist1d(tmp_path, seed=3, num_samples=_N)
  for k in first:
    np.testing.assert_array_equal(first[k], second[k])
  # Different generation args must not hit that cache entry.
  with pytest.raises(AssertionError, match="make_dataset called"):
    ip.load_mnist1d(tmp_path, seed=4, num_samples=_N)


def test_mnist1d_deterministic_per_seed_and_no_global_rng_side_effect(tmp_path: Path) -> None:
  np.random.seed(123)
  before = np.random.get_state()[1].copy()
  a = ip.load_mnist1d(tmp_path / "a", seed=0, num_samples=_N)
  # mnist1d seeds the global numpy RNG; load_mnist1d must restore it.
  np.testing.assert_array_equal(np.random.get_state()[1], before)
  b = ip.load_mnist1d(tmp_path / "b", seed=0, num_samples=_N)  # fresh generation
  c = ip.load_mnist1d(tmp_path / "c", seed=1, num_samples=_N)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert not np.array_equal(a["x_train"], c["x_train"])


def test_mnist1d_validation_split(mnist1d_cache: Path) -> None:
  full = ip.load_mnist1d(mnist1d_cache, seed=0, num_samples=_N)
  d = ip.load_mnist1d(mnist1d_cache, seed=0, num_samples=_N, num_validation=100)
  assert d["x_train"].shape == (700, 40) and d["x_val"].shape == (100, 40)
  np.testing.assert_array_equal(np.concatenate([d["x_train"], d["x_val"]]), full["x_train"])
  np.testing.assert_array_equal(np.concatenate([d["y_train"], d["y_val"]]), full["y_train"])
  np.testing.assert_array_equal(d["x_test"], full["x_test"])
  with pytest.raises(ValueError, match="num_validation"):
    ip.load_mnist1d(mnist1d_cache, seed=0, num_samples=_N, num_validation=800)


# ----------------------------------------------------------------------------------------------
# numpy_batches
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("drop_remainder", [True, False])
def test_numpy_batches_cover_epoch_without_repetition(drop_remainder: bool) -> None:
  x = np.arange(103, dtype=np.float32)[:, None] * np.ones((1, 4), np.float32)
  y = np.arange(103, dtype=np.int32)
  batches = list(
    ip.numpy_batches(x, y, 10, rng=np.random.default_rng(0), drop_remainder=drop_remainder)
  )
  sizes = [len(yb) for _, yb in batches]
  assert sizes == ([10] * 10 if drop_remainder else [10] * 10 + [3])
  seen = np.concatenate([yb for _, yb in batches])
  assert len(np.unique(seen)) == len(seen)  # no repetition
  if not drop_remainder:
    np.testing.assert_array_equal(np.sort(seen), y)  # every example exactly once
  for xb, yb in batches:  # inputs stay paired with their labels
    np.testing.assert_array_equal(xb[:, 0], yb)
  assert not np.array_equal(seen, y[: len(seen)])  # actually shuffled


def test_numpy_batches_order_and_errors() -> None:
  x, y = np.arange(6), np.arange(6)
  got = [yb.tolist() for _, yb in ip.numpy_batches(x, y, 4, shuffle=False, drop_remainder=False)]
  assert got == [[0, 1, 2, 3], [4, 5]]
  a = [yb.tolist() for _, yb in ip.numpy_batches(x, y, 2, rng=np.random.default_rng(7))]
  b = [yb.tolist() for _, yb in ip.numpy_batches(x, y, 2, rng=np.random.default_rng(7))]
  assert a == b
  with pytest.raises(ValueError, match="rng"):
    next(ip.numpy_batches(x, y, 2))
  with pytest.raises(ValueError, match="lengths"):
    next(ip.numpy_batches(x, y[:5], 2, rng=np.random.default_rng(0)))


# ----------------------------------------------------------------------------------------------
# CIFAR (TFDS mock data)
# ----------------------------------------------------------------------------------------------


def _tfds():
  pytest.importorskip("tensorflow")
  return pytest.importorskip("tensorflow_datasets")


def _fake_as_dataset(images_fn, recorded=None):
  """A replacement for `FileReaderBuilder._as_dataset` under `tfds.testing.mock_data`.

  It honours TFDS's split slicing on a virtual dataset with the real split sizes (50k train,
  10k test), labels every example with its index in the official split and draws the image
  with `images_fn(index)`. (The stock mock ignores the split and yields `num_examples`
  random examples for any split string.)
  """
  from types import SimpleNamespace

  import tensorflow as tf
  import tensorflow_datasets as tfds

  sizes = {
    "train": SimpleNamespace(num_examples=50_000),
    "test": SimpleNamespace(num_examples=10_000),
  }

  def as_dataset(self, split, decoders=None, read_config=None, **kwargs):
    if recorded is not None:
      recorded.append(split)
    (instr,) = tfds.core.ReadInstruction.from_spec(split).to_absolute(sizes)
    # Python's slicing fills in open ends (`None`) the way TFDS does.
    indices = range(sizes[instr.splitname].num_examples)[instr.from_ : instr.to]
    return tf.data.Dataset.range(indices.start, indices.stop).map(
      lambda i: {"image": images_fn(i), "label": i, "id": tf.strings.as_string(i)}
    )

  return as_dataset


def _constant_image(i):
  import tensorflow as tf

  return tf.fill([32, 32, 3], tf.cast(i % 256, tf.uint8))


def _random_image(i):
  import tensorflow as tf

  return tf.random.stateless_uniform([32, 32, 3], seed=tf.stack([i, i]), maxval=256, dtype=tf.int64)


def _collect(it):
  batches = list(it)
  return (
    np.concatenate([b["image"] for b in batches]),
    np.concatenate([b["label"] for b in batches]),
  )


def test_cifar_batch_shapes_and_dtypes() -> None:
  tfds = _tfds()
  with tfds.testing.mock_data(num_examples=20):
    train = list(ip.load_cifar("cifar10", "train", 8, train=True))
    test = list(ip.load_cifar("cifar100", "test", 8, train=False))
  assert len(train) == 2  # drop_remainder defaults to True for training
  assert [len(b["label"]) for b in test] == [8, 8, 4]  # ... and to False for evaluation
  for b in train + test:
    assert set(b) == {"image", "label"}
    assert b["image"].dtype == np.float32 and b["image"].shape[1:] == (32, 32, 3)
    assert b["label"].dtype == np.int32 and b["image"].shape[0] == b["label"].shape[0]
  assert all(b["label"].min() >= 0 and b["label"].max() < 10 for b in train)
  assert all(b["label"].min() >= 0 and b["label"].max() < 100 for b in test)


def test_cifar_splits_are_45k_5k_of_train_and_official_test() -> None:
  tfds = _tfds()
  assert ip.cifar_split("train") == "train[:45000]"
  assert ip.cifar_split("validation") == "train[45000:]"
  assert ip.cifar_split("test") == "test"
  recorded: list = []
  fake = _fake_as_dataset(_constant_image, recorded)

  def labels(it):  # keep only labels: the 45k float32 train images alone are 550 MB
    return np.concatenate([b["label"] for b in it])

  with tfds.testing.mock_data(as_dataset_fn=fake):
    val = labels(ip.load_cifar("cifar10", "validation", 1000, train=False))
    test = labels(ip.load_cifar("cifar10", "test", 2000, train=False))
    train = labels(ip.load_cifar("cifar10", "train", 1000, train=True))
  assert recorded == ["train[45000:]", "test", "train[:45000]"]
  # Labels are the indices in the official split: train/validation partition its 50k.
  np.testing.assert_array_equal(val, np.arange(45_000, 50_000))
  np.testing.assert_array_equal(test, np.arange(10_000))
  assert len(train) == 45_000 and len(np.unique(train)) == 45_000 and train.max() < 45_000
  assert not np.array_equal(train, np.arange(45_000))  # shuffled
  assert {
    k: len(v) for k, v in [("train", train), ("validation", val), ("test", test)]
  } == ip.CIFAR_SPLIT_SIZES


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_eval_normalisation(name: str) -> None:
  tfds = _tfds()
  with tfds.testing.mock_data(as_dataset_fn=_fake_as_dataset(_constant_image)):
    it = ip.load_cifar(name, "test", 300, train=False)
    batch = next(it)
  v = (batch["label"] % 256).astype(np.float32)  # the constant pixel value of each image
  mean, std = np.array(ip.CIFAR_MEAN[name]), np.array(ip.CIFAR_STD[name])
  expected = (v[:, None, None, None] / 255.0 - mean) / std
  np.testing.assert_allclose(
    batch["image"], np.broadcast_to(expected, batch["image"].shape), rtol=1e-5, atol=1e-5
  )


def test_cifar_normalisation_constants_differ() -> None:
  assert ip.CIFAR_MEAN["cifar10"] != ip.CIFAR_MEAN["cifar100"]
  assert ip.CIFAR_STD["cifar10"] != ip.CIFAR_STD["cifar100"]


def _match_crop_flip(aug: np.ndarray, padded: np.ndarray):
  """Returns the (dy, dx, flipped) for which `aug` is a 32x32 crop of `padded`, or None."""
  for flipped in (False, True):
    src = padded[:, ::-1] if flipped else padded
    for dy in range(9):
      for dx in range(9):
        if np.allclose(aug, src[dy : dy + 32, dx : dx + 32], atol=1e-5):
          # A flip of the padded image at offset dx is the flip of the crop at 8-dx.
          return dy, (8 - dx if flipped else dx), flipped
  return None


def test_cifar_train_augmentation_is_pad_crop_flip() -> None:
  tfds = _tfds()
  fake = _fake_as_dataset(_random_image)
  name = "cifar10"
  with tfds.testing.mock_data(as_dataset_fn=fake):
    # The eval pipeline of the same split gives the normalised originals, indexed by label.
    ref_images, ref_labels = _collect(ip.load_cifar(name, "validation", 500, train=False))
    b1 = next(ip.load_cifar(name, "validation", 32, train=True, seed=1))
    b1_again = next(ip.load_cifar(name, "validation", 32, train=True, seed=1))
    b2 = next(ip.load_cifar(name, "validation", 32, train=True, seed=2))
  for k in b1:
    np.testing.assert_array_equal(b1[k], b1_again[k])  # deterministic given the seed
  assert not np.array_equal(b1["label"], b2["label"])
  assert b1["image"].shape == (32, 32, 32, 3)

  originals = dict(zip(ref_labels.tolist(), ref_images, strict=True))
  pad_value = -np.array(ip.CIFAR_MEAN[name]) / np.array(ip.CIFAR_STD[name])  # black pixel
  transforms = []
  for image, label in zip(b1["image"], b1["label"], strict=True):
    original = originals[int(label)]
    padded = np.broadcast_to(pad_value, (40, 40, 3)).copy()
    padded[4:36, 4:36] = original
    t = _match_crop_flip(image, padded)
    assert t is not None, "augmented image is not a flipped/shifted crop of the original"
    transforms.append(t)
  assert any(t != (4, 4, False) for t in transforms)  # augmentation changed some images
  assert len(set(transforms)) > 5  # ... with varying offsets
  assert {t[2] for t in transforms} == {False, True}  # ... and both flip states


def test_mnist1d_path_does_not_import_tensorflow(tmp_path: Path) -> None:
  # In a fresh interpreter: this process may already have imported TensorFlow.
  code = (
    "import sys\n"
    "from examples import input_pipeline as ip\n"
    f"ip.load_mnist1d({str(tmp_path)!r}, num_samples=100)\n"
    "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
  )
  subprocess.run([sys.executable, "-c", code], cwd=_REPO_ROOT, check=True, timeout=120)


def test_cifar_unknown_names() -> None:
  with pytest.raises(ValueError, match=r"cifar10.*cifar100"):
    ip.load_cifar("svhn", "train", 8, train=True)
  with pytest.raises(ValueError, match=r"train.*validation.*test"):
    ip.load_cifar("cifar10", "holdout", 8, train=False)


def test_cifar_missing_dataset_message(tmp_path: Path) -> None:
  _tfds()
  with pytest.raises(FileNotFoundError) as info:
    ip.load_cifar("cifar10", "train", 8, train=True, data_dir=tmp_path)
  msg = str(info.value)
  assert "tfds build cifar10" in msg
  assert "data_dir" in msg and str(tmp_path) in msg
  assert "mnist1d" in msg.lower()


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------


# Initialising with the default threefry key compiles one large RNG kernel per parameter shape,
# which dominates these tests on CPU (~10-20 s for the ResNet); XLA's RngBitGenerator ("rbg")
# compiles far faster and is just as valid for shape / plumbing checks.
def _key(seed: int = 0) -> jax.Array:
  return jax.random.key(seed, impl="rbg")


def test_cnn1d_output_shape() -> None:
  model = models.create_model("cnn1d", num_classes=10)
  x = jnp.ones((4, 40))
  variables = model.init(_key(), x)
  assert set(variables) == {"params"}
  assert model.apply(variables, x).shape == (4, 10)
  assert model.apply(variables, x, train=True).shape == (4, 10)


def test_resnet18_tiny_train_and_eval() -> None:
  model = models.create_model("resnet18", num_classes=7, width=4)
  x = jax.random.normal(_key(1), (2, 32, 32, 3))
  # Compiled: eagerly, every layer's primitives would compile one by one for each new shape.
  variables = jax.jit(lambda k, x: model.init(k, x, train=False))(_key(), x)
  train_apply = jax.jit(lambda v, x: model.apply(v, x, train=True, mutable=["batch_stats"]))
  logits, updates = train_apply(variables, x)
  assert logits.shape == (2, 7) and logits.dtype == jnp.float32
  # Training mode updates the running statistics.
  changed = jax.tree.map(
    lambda a, b: bool(jnp.any(a != b)), variables["batch_stats"], updates["batch_stats"]
  )
  assert all(jax.tree.leaves(changed))
  eval_logits = jax.jit(lambda v, x: model.apply(v, x, train=False))({**variables, **updates}, x)
  assert eval_logits.shape == (2, 7) and bool(jnp.all(jnp.isfinite(eval_logits)))


def test_resnet18_parameter_count() -> None:
  model = models.ResNet18(num_classes=10)
  shapes = jax.eval_shape(
    lambda: model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False)
  )
  leaves = jax.tree.leaves(shapes["params"])
  assert len(leaves) == 62  # 20 conv kernels (no bias), 20 BatchNorms x 2, Dense x 2
  assert sum(int(np.prod(p.shape)) for p in leaves) == 11_173_962
  assert len(jax.tree.leaves(shapes["batch_stats"])) == 40


def test_unknown_model_name() -> None:
  with pytest.raises(ValueError, match=r"cnn1d.*resnet18"):
    models.create_model("vgg16", num_classes=10)
