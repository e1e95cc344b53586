"""ALADDIN's server as an outer optimizer (issue 37, item 4): plain, Nesterov, delayed Nesterov.

With update messages the ALADDIN server steps on the average of the workers' local
displacements, like DiLoCo's outer optimizer. This study compares three ``server_tx`` choices
against AR-SGD with its rate tuned the same way (the protocol is pre-registered in
``RESULTS.md``):

* ``plain``: ``optax.sgd(1.0)``, ``al.Aladdin``'s default;
* ``nesterov``: DiLoCo's ``optax.sgd(0.7, momentum=0.9, nesterov=True)``;
* ``delayed_nesterov``: Liu et al. 2024's delayed Nesterov (``runner.delayed_nesterov``), lr 0.7,
  momentum 0.9, the momentum applied once every N = n server updates.

Setting: ``../protocol.py``'s default preset (MNIST-1D, CNN1D, 8 workers), 1,000 of the 4,000
training examples held out for validation; tuning (15 epochs, HO, seeds 100-101) selects each
method's rate on the validation accuracy; the final runs (seeds 0-9, HO / HE1 / HE2) report the
test accuracy.

  python -m benchmarks.aladdin.outer_optimizer                              # resumable
  python -m benchmarks.aladdin.outer_optimizer --report_only                # tables.md, the plot
  python -m benchmarks.aladdin.outer_optimizer --setup smoke --out /tmp/s   # the CI's tiny one

Outputs in ``--out``: ``runs.json`` (one summary per finished cell), ``tables.md``,
``accuracy_vs_time.png``, ``machine.json``.
"""
