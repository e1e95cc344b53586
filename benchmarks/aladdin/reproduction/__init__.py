"""Reproduction study of ALADDIN (Ko et al., CIKM 2021) with the deterministic cluster simulator,
and its two test-set choices re-made on a validation split (issue 37, item 2).

Setups (``grid.py``):

* ``first`` (``results/``), the parts of the first study (``--set parts=table3,table2``):

  * ``table3``: the paper's Table 3 in its own shape -- speed-up of 8 workers over one on HO /
    HE0 (worker 0 x2 slower) / HE1 (x10) / HE2 (x100), ALADDIN, AR-SGD, ASP, EASGD and SGP,
    ResNet-50 and VGG-16 sizes, from the timing-only mode (no training), next to the paper's
    numbers. Two compute-time settings: from a published RTX 2080 Ti throughput, and
    calibrated so that the model reproduces the paper's AR-SGD HO speed-up.
  * ``table2``: Table 2's shape on MNIST-1D (generated offline; the example CNN1D): final test
    accuracy, accuracy at a fixed simulated time budget and simulated time to a target
    accuracy, five algorithms x HO / HE1 / HE2 x seeds, mean +- std.
  * ``ablation``: ALADDIN-L1 (local self-update only: alpha = 0), L2 (+ PS-triggered local
    update without the lazy global update: period = 1, the PS updates x~ and replies at every
    gradient) and full ALADDIN (period = 4), on HE1.
  * ``period``: period in {1, 2, 4} on HE1; ``lr``: the same comparisons at half the rate.
  * ``choices``: normalise x server_tx x alpha on HE1 (the ambiguous points of the algorithm).
  * ``overhead``: the simulator's host time outside the JAX computations it runs.

* ``validation`` (``results/validation/``): AR-SGD's rate and the options normalise x
  server_tx x alpha, chosen on the validation accuracy of seeds 100-101 (pre-registered in
  ``RESULTS.md``).

  python -m benchmarks.aladdin.reproduction                        # both, resumable
  python -m benchmarks.aladdin.reproduction --only table3 --setup first   # Table 3 (~20 s)
  python -m benchmarks.aladdin.reproduction --report_only          # the tables and plots
  python -m benchmarks.aladdin.reproduction --setup smoke --out /tmp/s    # the CI's tiny ones
  python -m benchmarks.aladdin.reproduction --setup validation_smoke --out /tmp/v
"""
