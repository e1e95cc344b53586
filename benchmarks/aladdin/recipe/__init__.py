"""ALADDIN's recipe: the measurement that chose ``al.Aladdin``'s defaults, and the choice re-made
on a validation split (issue 37, item 2).

Two setups, in the order they ran (``grid.py``):

* ``candidates``: every candidate on HO and HE1, compared on the test accuracy (8 simulated
  workers, the example CNN on MNIST-1D, 15 epochs of samples, the workers' optimizer
  ``al.local_optimizer(0.1)`` for ALADDIN and AR-SGD alike), ``results/runs.json`` and
  ``results/recipe.md``;
* ``validation``: the same choice with every candidate's rate tuned on a validation split,
  then the chosen recipe against AR-SGD on fresh seeds (pre-registered in ``RESULTS.md``),
  ``results/validation/``.

  python -m benchmarks.aladdin.recipe                    # both setups, resumable
  python -m benchmarks.aladdin.recipe --report_only      # their tables (and the plot)
  python -m benchmarks.aladdin.recipe --setup validation # one of them
  python -m benchmarks.aladdin.recipe --setup smoke --out /tmp/s   # the CI's tiny validation
"""
