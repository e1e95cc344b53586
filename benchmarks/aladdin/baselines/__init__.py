"""ALADDIN against its baselines, each tuned on a validation split (issue 37, item 3).

ALADDIN (``al.Aladdin``'s defaults), AR-SGD, SGP, EASGD and ASP (momentum and plain SGD
servers), each with its rate chosen on the validation split at each budget (15 and 45 epochs),
then seeds 0-9 on HO, HE1 and HE2, paired by seed against AR-SGD. The protocol is pre-registered
in ``RESULTS.md``; the setting and the tuning rule are the outer-optimizer study's, the
baselines are built as in the retired equal-tuning study (its history: ``RESULTS.md``).

  python -m benchmarks.aladdin.baselines                              # resumable
  python -m benchmarks.aladdin.baselines --report_only                # tables.md, the plot
  python -m benchmarks.aladdin.baselines --setup smoke --out /tmp/s   # the CI's tiny version

Outputs in ``--out``: ``runs.json`` (one summary per finished cell), ``tables.md``,
``accuracy_vs_time.png``, ``machine.json``.
"""
