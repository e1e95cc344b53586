"""AdamW at large batch: linear vs square-root scaling, LAMB, AdaScale and LENA (p = 1, 1/2),
against plain AdamW with its rate tuned on a validation set at each S, and Malladi et al.'s
rule.

The small attention model of ``examples.models`` (``PatchTransformer``) on MNIST-1D sequences,
S = 8 ... 256 per-worker gradients of batch 8, the same epoch budget at every S, AdamW's rate
tuned at S = 8 (global batch 64, the reference batch of the optax_lena optimizers). The arms
are ``grid.METHODS``, each a registry entry of the example trainer (``runner.py``). The study's
runs join in phases (``grid.cells``), each once the runs it depends on have finished: AdamW's
rate sweep at S = 8, the grid of every rule (LAMB's rate swept at every S on seed 0, its other
seeds at that rate and its neighbours), the validation selection of AdamW's and LAMB's rates
(pre-registered in RESULTS.md), and the final runs at the chosen rates. The raw runs are
``results/runs.tar.xz`` (unpacked when ``runs/`` is absent).

  python -m benchmarks.adamw_scaling                 # every unfinished run, in order
  python -m benchmarks.adamw_scaling --shard 0/2 &   # two processes (and --shard 1/2)
  python -m benchmarks.adamw_scaling --report_only   # tables and plots
  python -m benchmarks.adamw_scaling --setup smoke --out /tmp/aw --max_cells 2
"""
