"""Reproduction study of LENA (Ko et al., WWW 2022) on MNIST-1D: Tables 1-3 and ablations.

The grid (every cell x seeds; the single-worker SGD baseline once per seed):

* **Table 1**: batch scale S x {LSW (fixed warm-up), AdaScale (none), LENA (state-aware)}.
* **Table 2**: the 3x3 ablation {linear scaling, AdaScale, LENA} x warm-up {none, fixed,
  state-aware} at the ``ablation_scales`` (the largest by default: that is where the paper's
  table is).
* **Table 3**: LENA's warm-up threshold alpha in {1, 3, 5, 7, 9}% at ``alpha_scale``.
* **Table 4** ("what makes layer-wise scaling win or lose", at ``extra_scale``): per-module
  instead of per-leaf grouping, a longer epoch budget, and layer-wise ratios around an Adam
  inner update (``optax.scale_by_adam`` -> ``ol.scale_by_lena`` -> ``ol.layerwise_warmup`` ->
  ``ol.scale_by_learning_rate``) next to plain Adam and ``optax.lamb``. The two Adam variants
  are this study's own entries of the optimizer registry (:data:`STUDY_OPTIMIZERS`), registered
  while the study trains.

Every run is one in-process call of the trainer (``benchmarks.trainer``) into
``<out>/runs/<name>`` (metrics.jsonl + config.json, no checkpoints): finished runs are skipped,
``--shard I/N`` lets N processes share one grid. The raw runs are kept as ``<out>/runs.tar.xz``
(unpacked into ``runs/`` when missing, repacked after training); every invocation ends by
writing the tables (``tables.md``, ``summary.json``) and plots of whatever has finished.


Setups: ``default`` (the committed study: the ``quick`` sizes with seeds 0-2, Table 1 at S = 8
... 128 and Tables 2-4 on seeds 0-1; RESULTS.md reports it), ``quick`` (the ~40-minute preset),
``full`` (the complete grid, hours) and ``smoke`` (seconds, CI).

  python -m benchmarks.large_batch_cnn                          # the committed study, resumable
  python -m benchmarks.large_batch_cnn --report_only            # its tables and plots
  python -m benchmarks.large_batch_cnn --shard 0/2 &            # two processes
  python -m benchmarks.large_batch_cnn --shard 1/2
  python -m benchmarks.large_batch_cnn --setup full --out benchmarks/large_batch_cnn/results_full
  python -m benchmarks.large_batch_cnn --setup smoke --out /tmp/smoke   # seconds, CI
"""
