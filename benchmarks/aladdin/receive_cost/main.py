"""What one ALADDIN server message costs, relative to one ``optax.sgd`` step of the same tree.

Run from the repository root::

  python -m benchmarks.aladdin.receive_cost.main [--quick] [--repeats N] [--period 4]
  python -m benchmarks.aladdin.receive_cost.main --report_only   # tables and plot from the JSON

It writes ``results/receive_cost.json`` (every candidate's best and median seconds per message
and their ratios; its ``recorded`` field holds the commit, date, load and command) and
``results/receive_cost.png`` beside it (``--out`` moves both).

Every number printed is a RATIO measured side by side in one run: each function is jitted with
its state donated (as a server would run it) and warmed up, then the candidates run interleaved
for N rounds; the ratios of the best times (the cost of the work itself) and of the medians (what
a shared machine adds) are printed, with the absolute times as context.

* baseline: one jitted ``optax.sgd(0.1)`` step, ``tx.update`` + ``optax.apply_updates``
  (reads the gradient and the parameters, writes the parameters);
* ``receive`` of :func:`al.parameter_server` with ``optax.sgd(0.1)``, jitted as it is: a
  message that does not trigger (finiteness check + accumulation), a triggering one (the lazy
  global update and the reply) and the mean over one period of ``period`` messages from one
  worker (``period - 1`` accumulations + 1 trigger: what the server pays per message on
  average). It returns x~ twice (state and reply), so XLA copies x~ on every message;
* ``serve``, the same step for a server loop (x~ read from the state, no copy);
* ``serve`` on the flattened tree (one contiguous float32 array per message, as a runtime that
  sends one buffer per message has it: one kernel per pass instead of one per leaf);
* ``serve_flat_verified``: the same with a trusted sender's finiteness verdict (``serve(...,
  accept=)``): the sender computes the verdict inside its own jitted step, so the server makes
  no pass of its own over the message to decide acceptance;
* ``shard_fold``: the exact compiled call of a Ray PS shard (``folded_receive``) on one period
  of one worker's messages (``period`` messages in one call, the last one triggering, its reply
  written to the call's output), per message: the shard applies the worker's verdict; and
  ``shard_fold_recheck``, the same with ``Config(recheck_messages=True)`` (the shard checks its
  slice too);
* the floor: one accumulation ``g~ += g`` alone, and the finiteness check alone.

Trees: ResNet-50 for CIFAR-10 (23.5 M float32 parameters in 161 leaves) and a small MLP
(0.1 M parameters, 6 leaves). The measured ratios and the machine are in
``benchmarks/aladdin/receive_cost/RESULTS.md``.

Like the overhead benchmark, the script re-executes itself with glibc told to keep freed memory
(``benchmarks.harness.reexec_with_caching_malloc``: otherwise every buffer over 32 MB is mapped
and unmapped at each call and the page faults move the ratios); ``--system-malloc`` turns this
off.
"""

from __future__ import annotations

from benchmarks import harness

if __name__ == "__main__":
  harness.reexec_with_caching_malloc()

import argparse
import functools
import json
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_lena import aladdin as al


def resnet50_shapes(num_classes: int = 10) -> dict[str, tuple[int, ...]]:
  """Parameter shapes of a ResNet-50 (bottleneck blocks 3-4-6-3, batch norm scale and bias)."""
  shapes: dict[str, tuple[int, ...]] = {}

  def conv_bn(name: str, k: int, cin: int, cout: int) -> None:
    shapes[f"{name}/kernel"] = (k, k, cin, cout)
    shapes[f"{name}/bn_scale"] = (cout,)
    shapes[f"{name}/bn_bias"] = (cout,)

  conv_bn("stem", 7, 3, 64)
  cin = 64
  for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512), strict=True)):
    for b in range(blocks):
      name = f"stage{stage}/block{b}"
      conv_bn(f"{name}/conv1", 1, cin, width)
      conv_bn(f"{name}/conv2", 3, width, width)
      conv_bn(f"{name}/conv3", 1, width, 4 * width)
      if b == 0:
        conv_bn(f"{name}/proj", 1, cin, 4 * width)
      cin = 4 * width
  shapes["fc/kernel"] = (cin, num_classes)
  shapes["fc/bias"] = (num_classes,)
  return shapes


def mlp_shapes() -> dict[str, tuple[int, ...]]:
  return {"l0/w": (256, 256), "l0/b": (256,), "l1/w": (256, 128), "l1/b": (128,),
          "l2/w": (128, 10), "l2/b": (10,)}  # fmt: skip


def make_tree(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, jax.Array]:
  keys = jax.random.split(jax.random.key(seed), len(shapes))
  return {
    name: 0.01 * jax.random.normal(k, shape, jnp.float32)
    for k, (name, shape) in zip(keys, shapes.items(), strict=True)
  }


def block(tree):
  jax.tree.map(lambda x: x.block_until_ready(), tree)
  return tree


def measure(shapes, repeats: int, period: int) -> dict[str, tuple[float, float]]:
  """(best, median) seconds per call of each candidate, measured interleaved."""
  params = make_tree(shapes, 0)
  grads = make_tree(shapes, 1)
  flat_grads = jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(grads)])
  tx = optax.sgd(0.1)
  server = al.parameter_server(2, optax.sgd(0.1), period=period)

  def sgd_step(params, opt_state, grads):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  def accumulate_only(grad_sum, grads):
    return jax.tree.map(jnp.add, grad_sum, grads)

  def serve_verified(state, message, worker):
    grads, verdict = message  # the sender's verdict, computed in its own step
    return server.serve(state, grads, worker, verdict)

  copy = functools.partial(jax.tree.map, jnp.copy)
  worker = jnp.int32(0)
  flat_params = jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(params)])
  # The Ray shard's own compiled call: one period of one worker's messages, folded.
  fold = (jnp.broadcast_to(flat_grads, (period, flat_grads.size)), jnp.ones([period], bool))
  # name -> (jitted function, its donated state, the message, whether it is a server)
  candidates: dict[str, tuple[Any, Any, Any, bool]] = {
    "sgd": (jax.jit(sgd_step, donate_argnums=(0, 1)), None, grads, False),
    "accumulate_only": (
      jax.jit(accumulate_only, donate_argnums=(0,)),
      jax.tree.map(jnp.zeros_like, params),
      grads,
      False,
    ),
    "check_only": (jax.jit(al.all_finite), None, grads, False),
    "receive": (
      jax.jit(server.receive, donate_argnums=(0,)),
      server.init(copy(params)),
      grads,
      True,
    ),
    "serve": (jax.jit(server.serve, donate_argnums=(0,)), server.init(copy(params)), grads, True),
    "serve_flat": (
      jax.jit(server.serve, donate_argnums=(0,)),
      server.init(jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(params)])),
      flat_grads,
      True,
    ),
    "serve_flat_verified": (
      jax.jit(serve_verified, donate_argnums=(0,)),
      server.init(jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(params)])),
      (flat_grads, jnp.asarray(True)),
      True,
    ),
  }
  for name, recheck in (("shard_fold", False), ("shard_fold_recheck", True)):
    receive = al.folded_receive(server, period, recheck=recheck)
    candidates[name] = (
      jax.jit(lambda state, msgs, r=receive: r(state, *msgs, worker), donate_argnums=(0,)),
      server.init(jnp.copy(flat_params)),
      fold,
      False,
    )
  sgd_state = (copy(params), tx.init(params))
  states = {name: c[1] for name, c in candidates.items()}
  states["sgd"] = sgd_state
  times: dict[str, list[float]] = {}

  def timed(fn, *args):
    start = time.perf_counter()
    out = block(fn(*args))
    return out, time.perf_counter() - start

  for rnd in range(repeats + 2):  # two warm-up rounds
    record = rnd >= 2
    for name, (fn, _, message, is_server) in candidates.items():
      # A server sees one period of one worker per round: k = period - 1 triggers.
      for k in range(period if is_server else 1):
        key = f"{name}[{k}]" if is_server else name
        if name == "sgd":
          states[name], t = timed(fn, *states[name], message)
        elif name == "check_only":
          _, t = timed(fn, message)
        elif is_server:
          out, t = timed(fn, states[name], message, worker)
          states[name] = out[0]
          assert bool(out[1] if name != "receive" else out[1].ready) == (k == period - 1)
        elif name.startswith("shard_fold"):
          out, t = timed(fn, states[name], message)
          states[name] = out[0]
          assert int(out[1]) == 1  # the period's last message triggered
          t /= period  # per message
        else:
          states[name], t = timed(fn, states[name], message)
        if record:
          times.setdefault(key, []).append(t)
  return {name: (float(np.min(ts)), float(np.median(ts))) for name, ts in times.items()}


def rows(measured: dict[str, tuple[float, float]], period: int) -> list[dict[str, Any]]:
  """The report's rows: each candidate's (best, median) seconds per message and their ratios to
  the ``optax.sgd`` step's."""
  out = []
  b0, m0 = measured["sgd"]

  def row(what: str, best: float, median: float) -> None:
    out.append(
      {"what": what, "best_s": best, "median_s": median, "best": best / b0, "median": median / m0}
    )

  row("optax.sgd step (update + apply_updates)", *measured["sgd"])
  for variant in ("receive", "serve", "serve_flat", "serve_flat_verified"):
    per = [measured[f"{variant}[{k}]"] for k in range(period)]
    if period > 1:
      non_trigger = [float(np.median([p[i] for p in per[:-1]])) for i in range(2)]
      row(f"{variant}: non-trigger message", *non_trigger)
    row(f"{variant}: trigger message", *per[-1])
    row(
      f"{variant}: amortised over {period} messages",
      *(np.mean([p[i] for p in per]) for i in range(2)),
    )
  row("Ray shard's call, one period folded: per message", *measured["shard_fold"])
  row("  the same with recheck_messages=True", *measured["shard_fold_recheck"])
  row("accumulate_only (g~ += g, the floor)", *measured["accumulate_only"])
  row("check_only (the finiteness check alone)", *measured["check_only"])
  return [{k: float(v) if k != "what" else v for k, v in r.items()} for r in out]


def tree_result(label: str, shapes, repeats: int, period: int) -> dict[str, Any]:
  """One tree measured: its size and its rows."""
  n_params = sum(int(np.prod(s)) for s in shapes.values())
  measured = measure(shapes, repeats, period)
  return {
    "tree": label,
    "params": n_params,
    "leaves": len(shapes),
    "period": period,
    "rows": rows(measured, period),
  }


def report(label: str, shapes, repeats: int, period: int) -> list[str]:
  """Measures one tree and returns its printed lines."""
  return lines(tree_result(label, shapes, repeats, period))


def lines(tree: dict[str, Any]) -> list[str]:
  out = [
    f"{tree['tree']}: {tree['params'] / 1e6:.2f} M params, {tree['leaves']} leaves, "
    f"period {tree['period']}",
    f"  {'':48s} {'best':>9s} {'ratio':>6s}  {'median':>9s} {'ratio':>6s}",
  ]
  for r in tree["rows"]:
    out.append(
      f"  {r['what']:48s} {r['best_s'] * 1e3:7.3f}ms {r['best']:5.2f}x  "
      f"{r['median_s'] * 1e3:7.3f}ms {r['median']:5.2f}x"
    )
  return out


def table(trees: list[dict[str, Any]]) -> str:
  """One markdown table per tree: ratios to the ``optax.sgd`` step, best and median."""
  parts = []
  for tree in trees:
    header = [
      f"{tree['tree']} ({tree['params'] / 1e6:.1f} M params, {tree['leaves']} leaves)",
      "best",
      "median",
      "best ms",
    ]
    body = [
      [r["what"].strip(), f"{r['best']:.2f}x", f"{r['median']:.2f}x", f"{r['best_s'] * 1e3:.3f}"]
      for r in tree["rows"]
    ]
    parts.append(harness.markdown_table(header, body))
  return "\n\n".join(parts)


def plot(trees: list[dict[str, Any]], path: Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(trees), figsize=(6 * len(trees), 4.5), sharey=True)
  for ax, tree in zip(np.atleast_1d(axes), trees, strict=True):
    names = [r["what"].strip() for r in tree["rows"]]
    y = np.arange(len(names))
    ax.barh(y - 0.2, [r["best"] for r in tree["rows"]], 0.4, label="best")
    ax.barh(y + 0.2, [r["median"] for r in tree["rows"]], 0.4, label="median")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(y, names, fontsize=7)
    ax.set_xlabel("time per message / one optax.sgd step")
    ax.set_title(tree["tree"], fontsize=9)
    ax.legend(fontsize=8)
  np.atleast_1d(axes)[0].invert_yaxis()  # the y axis is shared: once for both
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv: list[str] | None = None) -> str:
  """Measures (or with ``--report_only`` reads) both trees; returns and prints the tables."""
  parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="few repeats (a smoke run)")
  parser.add_argument("--repeats", type=int, default=30)
  parser.add_argument("--period", type=int, default=4)
  parser.add_argument("--system-malloc", action="store_true", help="keep glibc's defaults")
  parser.add_argument(
    "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "receive_cost.json"
  )
  parser.add_argument("--report_only", action="store_true", help="tables and plot from --out")
  args = parser.parse_args(argv)
  if args.report_only:
    trees = json.loads(args.out.read_text())["trees"]
  else:
    repeats = 3 if args.quick else args.repeats
    print(f"jax {jax.__version__}, optax {optax.__version__}, device {jax.devices()[0]}")
    trees = []
    for label, shapes in (("ResNet-50 (CIFAR-10)", resnet50_shapes()), ("MLP", mlp_shapes())):
      trees.append(tree_result(label, shapes, repeats, args.period))
      print("\n".join(lines(trees[-1])), flush=True)
    results = {
      "recorded": harness.recorded(),
      "machine": harness.machine_info(),
      "repeats": repeats,
      "trees": trees,
    }
    harness.write_json(args.out, results)
  plot(trees, args.out.with_suffix(".png"))
  text = table(trees)
  print(text)
  return text


if __name__ == "__main__":
  main()
