"""Large-batch study of a deep BatchNorm network: tuned LARS/LAMB, LENA's warm-up variants.

MNIST-1D with :class:`examples.models.ResNet1D` (ResNet-18's 62 parameter leaves, BatchNorm)
instead of the CNN study's 8-leaf CNN. Every optimizer comes from the examples' registry
(``examples.optimizers``); the study registers LENA with the warm-up variants of
``ol.lena(warmup_progress=...)`` while it trains. The grid, in the order it runs (the most
informative cells first):

* ``core``: at ``ablation_scales`` (S = 256, 128), the paper's Table 2 in its shape, rules
  {LSW, AdaScale, LENA} x warm-ups {none, fixed, state-aware}, plus LENA with the two warm-up
  variants ``relative_to_max`` and ``relative_to_mean`` (the per-layer end times: Fig. 7).
* ``key``: the cells that decide the question (LSW fixed, AdaScale without / with the
  state-aware warm-up, LENA without / with the paper's warm-up / with each variant), run first
  with more seeds and at the second scale.
* ``table1``: Table 1's shape at every scale, {LSW (fixed), AdaScale (none), LENA
  (state-aware)} (the paper's), AdaScale (state-aware) and LENA (relative_to_max), 3 seeds.
* ``sweep``: ``optax.lars`` and ``optax.lamb`` with the fixed warm-up, the learning rate chosen
  by the same small sweep (seed 0) at each scale, then the best rate with every seed.
* ``long``: a 3x longer epoch budget at ``long_scale`` (the single worker included).
* ``lr``: sensitivity to eta0 at the first ablation scale.

Every run is one call of the trainer (``benchmarks.trainer``) with ``parallel='vmap'``: the S
per-worker gradients of an update are one ``vmap`` (each worker normalises with its own BatchNorm
batch, as data-parallel workers), so the statistics are exactly those of S workers. A run makes
``(train examples // global batch) x epochs`` updates (each epoch's remainder dropped) and logs the
per-layer ratios and rate multipliers about ``ratio_records`` times. Runs go into
``<out>/runs/<name>`` (resumable, ``--shard I/N``), archived as ``<out>/runs.tar.xz``; every
invocation ends by writing ``tables.md``, ``summary.json`` and the plots of whatever finished.

The setup ``equal_tuning`` (``results/equal_tuning/``, pre-registered in RESULTS.md) gives every
method the same treatment at S = 256: five rates each, chosen on the validation accuracy of a
selection seed (an independent MNIST-1D draw), then reported on fresh seeds, paired by seed.

  python -m benchmarks.large_batch_resnet                       # both setups, resumable
  python -m benchmarks.large_batch_resnet --setup default --set groups=core --set scales=256
  python -m benchmarks.large_batch_resnet --setup default --only lena_s256 --set groups=long
  python -m benchmarks.large_batch_resnet --shard 0/2 &         # two processes
  python -m benchmarks.large_batch_resnet --report_only
  python -m benchmarks.large_batch_resnet --setup smoke --out /tmp/smoke      # seconds (CI)
  python -m benchmarks.large_batch_resnet --setup equal_tuning_smoke --out /tmp/eq
"""
