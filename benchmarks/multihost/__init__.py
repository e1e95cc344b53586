"""Multi-host step time of the trainer (2 processes x 4 devices vs 1 x 8), and what the
statistics' all-reduce costs across two processes by message layout.

Setups: ``bench`` (``results/summary.json``, ``table.md``), ``per_worker_batch_128`` (the same
at a 4x larger per-worker batch, ``results/per_worker_batch_128/``), ``allreduce``
(``results/allreduce.json``, ``allreduce.md``), and ``bench_smoke`` / ``allreduce_smoke`` (tiny
sizes; give ``--out``). Each measurement is one cell: a folder that holds its JSON is not
measured again.

  python -m benchmarks.multihost --setup bench --out /tmp/mh     # RESULTS.md's numbers, afresh
  python -m benchmarks.multihost --report_only                   # every table from the JSON

**The step time** (``runner.py``). The same run (MNIST-1D CNN, LENA, S = 16 per-worker batches
= 8 devices x 2 micro-batches) is started with ``python -m examples.main`` as

* ``1x8``: one process with 8 simulated CPU devices;
* ``2x4``: two local processes with 4 devices each, joined by ``jax.distributed`` (gloo);
* ``1x4``: one process with 4 devices and half the global batch: one process's share of the
  ``2x4`` work, with no other process (``2x4`` minus ``1x4`` is what joining costs).

The configurations alternate (``rounds`` times each, side by side on the same machine), so a
change of load hits them alike. The step time of a run is the median wall time between
consecutive ``metrics.jsonl`` records (one per update) from update ``skip`` to ``steps`` (the
median update: robust to bursts of load): compilation and the first updates are excluded.

**The all-reduce** (``allreduce.py``). The default CNN's 8 gradient leaves and their packed
squared norms are 9 buffers (12,114 floats in all). XLA combines their all-reduces into one
tuple all-reduce, and on CPU devices of several processes the gloo collectives make one
exchange per buffer of the tuple. This times, side by side in one run,
``ol.all_reduce_grad_stats`` on those gradients

* ``per_leaf``: as by default (one buffer per leaf);
* ``packed``: with ``packed=True`` (one flat buffer: what the trainer sends when it runs on
  several CPU processes);

on ``1x8`` (one process, 8 devices: an in-process reduction) and ``2x4`` (two local processes
with 4 devices each joined by ``jax.distributed``), alternating ``rounds`` times.
"""
