"""Straggler robustness on real processes: ALADDIN, AR-SGD, ASP and SGP on Ray, one worker slower.

Every (cluster, algorithm) pair trains the MNIST-1D CNN of ``python -m examples.aladdin`` with
4 workers for the same wall-time budget, on one local Ray cluster (fresh actors for every run):
HO (homogeneous), HE1 (worker 0 x10) and HE2 (worker 0 x100; the worker sleeps so that each of
its iterations takes FACTOR times its compute time). Throughput is reported relative to the same
algorithm's HO run, since the machine has fewer cores than processes.

Setups (``grid.py``), each one file ``results/<setup>.json`` (its ``recorded`` field holds the
commit, date and command) with its plots ``<setup>_accuracy.png`` and
``<setup>_throughput.png``: ``recipe`` (ALADDIN with the recipe's defaults against AR-SGD),
``sgd_server`` and ``momentum_server`` (every algorithm, the server without and with momentum;
their files were measured with the runtime before the rebuild, see ``RESULTS.md``), and
``defaults`` (every algorithm with today's defaults; no result kept yet: give ``--out``).
Resumable: the pairs already in the file are skipped.

  python -m benchmarks.aladdin.ray_stragglers --setup recipe        # resumable
  python -m benchmarks.aladdin.ray_stragglers --report_only         # every table and plot
  python -m benchmarks.aladdin.ray_stragglers --setup defaults --out /tmp/s
"""
