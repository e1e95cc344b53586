"""The attention model in the trainer: ``examples.models.PatchTransformer``, the AdamW entries of
the optimizer registry and ``--config mnist1d_attention``, its blocks unrolled or scanned
(``scan_layers``).

Tiny MNIST-1D runs on 8 simulated CPU devices (see conftest.py).
"""

import dataclasses
import functools
import re
import shutil
import sys
from pathlib import Path

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
  sys.path.insert(0, _REPO_ROOT)

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

import optax_lena as ol  # noqa: E402
from examples import metrics, models, optimizers  # noqa: E402
from examples.lena import configs, train  # noqa: E402

ADAMW = ("adamw", "linear_scaling_adamw", "adascale_adamw", "lena_adamw")
# The kernels of the embedding, the 4 attention projections, the 2 MLP layers and the head.
KERNELS = {
  "embed/kernel",
  "head/kernel",
  "Block_0/Dense_0/kernel",
  "Block_0/Dense_1/kernel",
  *(f"Block_0/MultiHeadDotProductAttention_0/{p}/kernel" for p in ("query", "key", "value", "out")),
}


def _tiny(cache_dir: str, **changes) -> configs.Config:
  """``mnist1d_attention`` at the tiny test configuration's sizes."""
  tiny = dict(
    mnist1d_num_samples=1000,
    width=8,
    per_worker_batch=8,
    batch_scale=4,
    num_epochs=1,
    num_steps=2,
    eval_every=2,
    eval_batch_size=200,
    progress_bar=False,
    rng_impl="rbg",
    cache_dir=cache_dir,
  )
  return dataclasses.replace(configs.get_config("mnist1d_attention"), **{**tiny, **changes})


def _name(path) -> str:
  return jax.tree_util.keystr(path, simple=True, separator="/")


def _names(tree) -> list[str]:
  return [_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


@functools.cache
def _params(width: int = 8, depth: int = 1):
  model = models.create_model("patch_transformer", 10, width=width, depth=depth)
  return model.init(jax.random.key(0), jnp.zeros((1, 40)))["params"]


def _grads_and_stats(params, s: int = 4):
  rng = np.random.RandomState(0)
  stacked = jax.tree.map(lambda p: jnp.asarray(rng.randn(s, *p.shape), jnp.float32), params)
  return jax.jit(ol.stacked_grad_stats)(stacked)  # one program: op by op costs seconds


def test_config_and_model() -> None:
  config = configs.get_config("mnist1d_attention")
  assert (config.model, config.optimizer, config.per_worker_batch) == (
    "patch_transformer",
    "lena_adamw",
    64,
  )
  assert train.create_model(config, 10).width == 24  # width 0: the model's default
  assert train.create_model(dataclasses.replace(config, width=8), 10).width == 8
  names = _names(_params())
  decayed = [
    n for n, d in zip(names, jax.tree.leaves(models.decay_mask(_params())), strict=True) if d
  ]
  # No bias, LayerNorm scale or the position table.
  assert set(decayed) == KERNELS and len(decayed) == len(KERNELS) and "position" in names


def test_scanned_model_and_its_config() -> None:
  """``scan_layers``: the blocks' parameters stacked under ``blocks`` (``models.stack_blocks``
  of the unscanned ones has the scanned model's structure and shapes), their layer axis 0 read
  from Flax's partition metadata, and the configuration fields that select it."""
  config = configs.override(
    configs.get_config("mnist1d_attention"), ["width=8", "depth=3", "scan_layers=true"]
  )
  model = train.create_model(config, 10)
  assert (model.depth, model.scan_layers) == (3, True)
  unscanned = _params(width=8, depth=3)  # the model above, unscanned
  stacked = models.stack_blocks(unscanned)
  boxed = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 40)))["params"]
  shapes = nn.unbox(boxed)
  assert jax.tree.structure(stacked) == jax.tree.structure(shapes)
  assert jax.tree.all(jax.tree.map(lambda a, b: a.shape == b.shape, stacked, shapes))
  np.testing.assert_array_equal(
    stacked["blocks"]["Dense_0"]["kernel"][2], unscanned["Block_2"]["Dense_0"]["kernel"]
  )
  axes = train.layer_axes(config, model, (40,))
  assert axes == train.layer_axes(config, model, (40,)) and hash(axes)  # a registry field
  recorded = jax.tree.leaves(axes, is_leaf=lambda x: x is None)
  assert recorded == [0 if k.startswith("blocks/") else None for k in _names(stacked)]
  assert train.layer_axes(dataclasses.replace(config, layer_axes="none"), model, (40,)) is None
  assert train.layer_axes(dataclasses.replace(config, scan_layers=False), model, (40,)) is None
  for bad, message in (
    ({"layer_axes": "per_slice"}, "Unknown layer_axes 'per_slice'; valid layer_axes: model, none"),
    (
      {"model": "cnn1d", "width": 0},
      "model='cnn1d' has no repeated blocks to set (depth=3, scan_layers=True)",
    ),
  ):
    with pytest.raises(configs.ConfigError, match=re.escape(message)):
      train.validate_config(dataclasses.replace(config, **bad))
  with pytest.raises(ValueError, match="unscanned PatchTransformer"):
    models.stack_blocks(stacked)


@pytest.mark.parametrize("name", [n for n in optimizers.names() if optimizers.get(n).diagnostics])
def test_every_large_batch_entry_takes_the_layer_axes(name: str) -> None:
  """Every registry entry that builds an ``optax_lena`` optimizer keeps one layer per block's
  slice of a stacked parameter given ``Hyperparams.layer_axes``, one per leaf without."""
  params = models.stack_blocks(_params(depth=3))
  scanned = models.create_model("patch_transformer", 10, width=8, depth=3, scan_layers=True)
  axes = models.recorded_layer_axes(scanned, (40,))
  hp = optimizers.Hyperparams(learning_rate=1e-2, num_samples=4, total_steps=10, layer_axes=axes)
  per_slice = optimizers.build(name, hp).init(params)
  per_leaf = optimizers.build(name, dataclasses.replace(hp, layer_axes=None)).init(params)
  stacked = sum(1 for k in _names(params) if k.startswith("blocks/"))
  leaves = len(jax.tree.leaves(params))
  assert ol.diagnostics(per_leaf)["lr_multiplier"].shape == (leaves,)
  assert ol.diagnostics(per_slice)["lr_multiplier"].shape == (leaves + 2 * stacked,)


def test_adamw_entry_against_numpy() -> None:
  """One update of the plain entry in float64: Adam's first step is g / (|g| + eps), plus the
  decoupled weight decay on kernels only, times the rate at update 0."""
  hp = optimizers.Hyperparams(learning_rate=1e-2, total_steps=10, weight_decay=0.1, momentum=0.8)
  tx = optimizers.build("adamw", hp)
  params = _params()
  grads, stats = _grads_and_stats(params)
  update = jax.jit(lambda g, st, p: tx.update(g, st, p, grad_stats=stats))
  updates, _ = update(grads, tx.init(params), params)
  mask = jax.tree.leaves(models.decay_mask(params))
  for u, g, w, m in zip(*(jax.tree.leaves(t) for t in (updates, grads, params)), mask, strict=True):
    g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
    expected = -1e-2 * (g / (np.abs(g) + 1e-8) + (0.1 * w if m else 0.0))
    np.testing.assert_allclose(np.asarray(u), expected, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("name", ADAMW[1:])
def test_large_batch_entries_are_the_library_aliases(name: str) -> None:
  """The registry passes the Hyperparams to ``ol.*_adamw`` as the SGD entries do: two updates
  equal to a direct call (b1 = momentum, decay masked to kernels, sample clock, warm-up)."""
  entry = optimizers.get(name)
  hp = optimizers.Hyperparams(
    learning_rate=1e-2,
    num_samples=4,
    total_steps=10,
    momentum=0.8,
    weight_decay=0.1,
    warmup=entry.paper_warmup,
  )
  alias = {
    "linear_scaling_adamw": ol.linear_scaling_adamw,
    "adascale_adamw": ol.adascale_adamw,
    "lena_adamw": ol.lena_adamw,
  }[name]
  mask = jax.tree_util.tree_map_with_path(lambda p, _: _name(p) in KERNELS, _params())
  direct = alias(
    hp.sample_schedule(),
    b1=0.8,
    weight_decay=0.1,
    weight_decay_mask=mask,
    clock="samples",
    num_samples=4,
    **hp.warmup_kwargs(),
  )
  registry = optimizers.build(name, hp)
  params = _params()
  grads, stats = _grads_and_stats(params)
  states = [tx.init(params) for tx in (direct, registry)]
  for _ in range(2):
    outs = [
      tx.update(grads, st, params, grad_stats=stats)
      for tx, st in zip((direct, registry), states, strict=True)
    ]
    for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1]), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    states = [o[1] for o in outs]
    params = optax.apply_updates(params, outs[0][0])
  assert entry.diagnostics and entry.takes_reference_batch


# ----------------------------------------------------------------------------------------------
# Scanned blocks (scan_layers): the unscanned model's updates, one LENA ratio per block
# ----------------------------------------------------------------------------------------------

DEPTH, SCAN_STEPS, CHECKPOINT_AT = 2, 20, 10
# The strategy each optimizer trains with, so that the paths of the statistics are covered:
# shard_map (each device's micro-batches accumulated, then all-reduced), GSPMD (the workers
# stacked) and, slow, pmap (its own per-device body) with the SGD family.
PARALLEL = {"lena_adamw": "shard_map", "adascale_adamw": "gspmd", "lena": "pmap"}
VARIANTS = {
  "unscanned": {},
  "per_slice": {"scan_layers": True},  # layer_axes='model', the default
  "per_stack": {"scan_layers": True, "layer_axes": "none"},
}
# The attention's key bias adds the same q . b_k to all the logits of a query, which the softmax
# ignores: its gradient is zero in exact arithmetic and float32 rounding noise in practice, a
# different noise in the scanned and the unrolled program. Adam divides that noise by its own
# root mean square (steps of up to the rate) and a gain ratio of noise is noise, so this leaf is
# not compared across the two programs (test_key_bias_gradient_is_rounding_noise checks why).
KEY_BIAS = "MultiHeadDotProductAttention_0/key/bias"
# One fixture for the module's trainer runs: every test that uses it on one xdist worker.
scanned_group = pytest.mark.xdist_group("scanned_attention")


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory: pytest.TempPathFactory, cache_dir: str):
  """``run(optimizer, variant) -> (config, workdir, final state)``, trained once on first use:
  ``SCAN_STEPS`` updates of S = 8 (4 devices x 2 micro-batches), every update logged, unscanned
  or scanned (per slice or per stack). The scanned LENA-AdamW run writes checkpoints."""
  root = tmp_path_factory.mktemp("attention_runs")
  done: dict[tuple[str, str], tuple] = {}

  def run(optimizer: str, variant: str) -> tuple:
    if (optimizer, variant) not in done:
      changes = dict(VARIANTS[variant])
      if (optimizer, variant) == ("lena_adamw", "per_slice"):
        changes["checkpoint_every"] = CHECKPOINT_AT
      config = _tiny(
        cache_dir,
        optimizer=optimizer,
        parallel=PARALLEL[optimizer],
        depth=DEPTH,
        batch_scale=8,
        num_devices=4,
        micro_batches=2,
        num_steps=SCAN_STEPS,
        eval_every=SCAN_STEPS,
        log_every=1,
        **changes,
      )
      workdir = root / f"{optimizer}_{variant}"
      done[optimizer, variant] = (config, workdir, train.train_and_evaluate(config, workdir))
    return done[optimizer, variant]

  return run


def _unscanned_name(layer: str) -> str:
  """A scanned model's layer as the unscanned model's: ``blocks/<path>/<i>`` (slice i of a
  stacked parameter) is ``Block_<i>/<path>``."""
  head, _, rest = layer.partition("/")
  if head != "blocks":
    return layer
  path, _, index = rest.rpartition("/")
  return f"Block_{index}/{path}"


def _named_leaves(tree) -> dict[str, np.ndarray]:
  leaves = jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]
  return {_name(path): np.asarray(x) for path, x in leaves}


def _max_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
  """The largest absolute difference between two models' parameters, the key bias left out."""
  return max(float(np.max(np.abs(a[k] - b[k]))) for k in a if not k.endswith(KEY_BIAS))


@scanned_group
def test_trains_through_the_trainer_with_lena_adamw(attention_run) -> None:
  _, workdir, state = attention_run("lena_adamw", "unscanned")
  assert int(state.step) == SCAN_STEPS
  assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(state.params))
  (record,) = metrics.read_metrics(workdir, "eval")
  assert 0.0 <= record["eval_accuracy"] <= 1.0 and np.isfinite(record["eval_loss"])
  assert set(record["lr_multiplier"]) == set(_names(state.params))
  assert all(1.0 <= v <= 8.0 for v in record["gain_ratio"].values())  # S = 8
  # What batch_ramp='noise' reads: a critical-batch estimate and the policy's advice.
  host = jax.device_get(state.opt_state)
  assert "critical_batch_size" in ol.flat_diagnostics(host)
  advice = int(ol.advise_num_samples(host, max_num_samples=32, min_num_samples=8))
  assert 8 <= advice <= 16  # never below S, at most max_growth = 2 times it


@scanned_group
@pytest.mark.parametrize(
  "optimizer", ["lena_adamw", "adascale_adamw", pytest.param("lena", marks=pytest.mark.slow)]
)
def test_scanned_blocks_take_the_unscanned_updates(attention_run, optimizer: str) -> None:
  """Same initial weights (the trainer stacks the unscanned model's blocks), same batches: after
  each of the 20 updates the scanned model's loss and per-layer ratios, rate multipliers and
  warm-up ends are the unscanned model's, slice by block, and its final parameters are the
  unscanned ones stacked, to float32 rounding (amplified by Adam and the ratios over 20 updates:
  at most a 2000th of the rate 1e-2)."""
  _, flat_dir, flat = attention_run(optimizer, "unscanned")
  _, scan_dir, scanned = attention_run(optimizer, "per_slice")
  want = _named_leaves(models.stack_blocks(jax.device_get(flat.params)))
  got = _named_leaves(scanned.params)
  assert set(got) == set(want) and got["blocks/Dense_0/kernel"].shape[0] == DEPTH
  print(f"{optimizer}: max |scanned - unscanned| after {SCAN_STEPS} updates:", end=" ")
  print(f"{_max_difference(got, want):.3g}")
  for name in got:
    if not name.endswith(KEY_BIAS):
      np.testing.assert_allclose(got[name], want[name], rtol=0, atol=5e-6, err_msg=name)
  flat_records, scan_records = (metrics.read_metrics(d, None) for d in (flat_dir, scan_dir))
  assert [r["iteration"] for r in scan_records] == list(range(1, SCAN_STEPS + 1))
  for a, b in zip(flat_records, scan_records, strict=True):
    np.testing.assert_allclose(b["train_loss"], a["train_loss"], rtol=1e-6)
    if not optimizers.get(optimizer).diagnostics:
      continue
    for metric in ("gain_ratio", "lr_multiplier", "warmup_end_step"):
      per_block = {_unscanned_name(k): v for k, v in b[metric].items()}
      assert set(per_block) == set(a[metric])  # one entry per block's slice
      for layer, value in per_block.items():
        if not layer.endswith(KEY_BIAS):
          np.testing.assert_allclose(value, a[metric][layer], rtol=5e-6, err_msg=layer)


@scanned_group
def test_per_stack_layer_axes_give_one_ratio_per_stack(attention_run) -> None:
  """``layer_axes='none'``: one ratio for all the blocks' slices of a stacked parameter (LENA's
  rule before per-slice statistics), which trains another model than per slice."""
  _, stack_dir, per_stack = attention_run("lena_adamw", "per_stack")
  _, _, per_slice = attention_run("lena_adamw", "per_slice")
  ratios = metrics.read_metrics(stack_dir)[-1]["gain_ratio"]
  assert set(ratios) == set(_names(per_stack.params))  # no slice index
  difference = _max_difference(_named_leaves(per_stack.params), _named_leaves(per_slice.params))
  print(f"max |per stack - per slice| after {SCAN_STEPS} updates: {difference:.3g}")
  assert difference > 1e-3  # 200 times the tolerance of the equality above


def test_key_bias_gradient_is_rounding_noise() -> None:
  """Why KEY_BIAS is left out above: its gradient is float32 rounding noise, a millionth of the
  largest."""
  model = models.create_model("patch_transformer", 10, width=8, depth=DEPTH)
  params = model.init(jax.random.key(0), jnp.zeros((1, 40)))["params"]
  x = jax.random.normal(jax.random.key(1), (16, 40))
  y = jnp.arange(16) % 10

  def loss(params):
    logits = model.apply({"params": params}, x)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))

  grads = _named_leaves(jax.jit(jax.grad(loss))(params))
  grads = {k: float(np.max(np.abs(g))) for k, g in grads.items()}
  noise = [k for k in grads if k.endswith(KEY_BIAS)]
  assert len(noise) == DEPTH
  assert max(grads[k] for k in noise) < 1e-6 * max(grads.values())


@scanned_group
def test_scanned_run_resumes_bitwise(attention_run) -> None:
  """Killed after its checkpoint at update 10, the scanned run resumed from what it left on disk
  ends bitwise as the uninterrupted run, records and all."""
  config, workdir, reference = attention_run("lena_adamw", "per_slice")
  resumed_dir = workdir.parent / "resumed"
  shutil.copytree(workdir, resumed_dir)
  shutil.rmtree(resumed_dir / "checkpoints" / str(SCAN_STEPS))
  resumed = train.train_and_evaluate(config, resumed_dir)
  leaves = lambda state: jax.tree.leaves(jax.device_get((state.params, state.opt_state)))
  for a, b in zip(leaves(resumed), leaves(reference), strict=True):
    assert np.array_equal(np.asarray(a), np.asarray(b))
  strip = lambda records: [{k: v for k, v in r.items() if k != "wall_time"} for r in records]
  assert strip(metrics.read_metrics(resumed_dir, None)) == strip(
    metrics.read_metrics(workdir, None)
  )
