"""Does LENA's per-slice rule matter on a scanned model? (issue 49, item 8)

The attention model of ``examples/lena/configs/mnist1d_attention.py`` with 4 blocks scanned
(``scan_layers=true``: the blocks' parameters stacked on a layer axis, as MaxText, Levanter and
axlearn keep them) at S = 64 and 256 per-worker gradients of 8 examples: LENA-AdamW with one
gain ratio and one warm-up per block's slice (``layer_axes=model``) against LENA-AdamW with one
per stacked leaf (``layer_axes=none``), AdaScale-AdamW, tuned AdamW and ``optax.lamb``, every
method's rate chosen from one grid on the validation split of a selection seed, then 5 reported
seeds evaluated once on the test split, paired seed by seed. The protocol was registered before
any run (RESULTS.md); ``grid.py`` declares it. The raw runs are ``results/runs.tar.xz``
(unpacked when ``runs/`` is absent).

  python -m benchmarks.scanned_layers                      # every unfinished cell, in order
  python -m benchmarks.scanned_layers --shard 0/2 &        # two processes (and --shard 1/2)
  python -m benchmarks.scanned_layers --report_only        # tables and plots
  python -m benchmarks.scanned_layers --setup smoke --out /tmp/scan   # seconds
"""
