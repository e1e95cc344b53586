"""What LENA costs over plain data-parallel SGD with momentum: time, memory and compile time.

Run from the repository root::

  python -m benchmarks.overhead [--quick] [--device cpu|gpu] [--out benchmarks/overhead/results]

Sections (every time is a RATIO candidate / baseline measured side by side in one run: each
function is jitted and warmed up, then the candidates run interleaved, in alternating order, for
N repeats, and the ratio of the medians is reported, with the absolute medians as context):

* (a) update only, statistics given: ``ol.lena`` / ``ol.adascale`` / ``optax.lars`` /
  ``optax.lamb`` vs SGD with momentum and coupled weight decay (``update``);
* (b) statistics plus update from S = 8 stacked worker gradients vs plain mean + SGD-momentum
  (``update``);
* (c) a full data-parallel step on 8 (simulated CPU) devices in ``pmap`` and ``shard_map``:
  local gradients -> ``ol.all_reduce_grad_stats`` + ``ol.lena`` vs ``lax.pmean`` + SGD-momentum,
  and vs ``ol.linear_scaling`` (which needs the same statistics) (``data_parallel``);
* (d) a whole training step (forward, backward, all-reduce, update) of the example models
  (``data_parallel``);
* (e) optimizer-state memory vs SGD-momentum (bytes of the state pytree) (``state_and_compile``);
* (f) compile time (``jit(...).lower(...).compile()``) vs number of leaves
  (``state_and_compile``; ``compile_profile`` explains it).

Section (c) also times the two passes over the gradients that the statistics need (the local
squared norms, and the squared norm of the mean) one at a time, and section (f) counts the
distinct kernels XLA compiles: the profiles that explain the targets this machine misses.

Run as a script, the benchmark re-executes itself with glibc's allocator told to keep freed
memory (``benchmarks.harness.reexec_with_caching_malloc``); ``--system-malloc`` turns this off.

Writes ``overhead.md``, ``overhead.json`` and ``overhead.png`` to ``--out`` and prints PASS/FAIL
per target. The smoke test (``tests/benchmarks/test_overhead.py``) runs every section at toy
sizes. Importing this package imports nothing (jax must come after the set-up of ``__main__``).
"""
