"""Batch ramps against fixed S at equal samples: the trainer on MNIST-1D (issue 36 item 3).

Two declared setups: ``cnn`` (the default: the trainer's 1D CNN, momentum SGD with LENA) and
``attention`` (``--setup attention``: the small attention model of ``benchmarks/adamw_scaling``
with LENA around AdamW, ``examples/lena/configs/mnist1d_attention.py``), each with its own
output folder (``results/``, ``results/attention/``).

Five arms of the trainer's ``batch_ramp``, each over the same
examples (``num_epochs`` epochs) and the same seeds (a seed fixes the initialisation and the
data order):

* ``small``: fixed S = ``small`` per-worker gradients (``steps:0:S``, the ramp's loop at one S,
  bitwise the fixed trainer: same budget rule and timing for every arm);
* ``large``: fixed S = ``large``;
* ``steps``: S doubles from ``small`` to ``large`` at the ``step_fractions`` of the examples
  (the update indices are computed from the budget);
* ``noise``: ``noise:every=N,max=large`` from S = ``small`` (S follows the state's B_crit);
* ``seesaw``: ``seesaw:max=large`` from S = ``small`` (S doubles, rate x sqrt(2), wherever the
  decay has halved the rate).

Every run evaluates on a validation split held out of the training set once per epoch; the
target accuracy is a validation accuracy fixed in the setup before the study ran (never chosen
on the test set), and the updates to it are interpolated linearly between the evaluations
around the first crossing. The final state is evaluated once on the test split. Time per
sample is the run's wall time (training, each S's compilation and the per-epoch evaluations)
over its examples. Each arm is compared with ``small`` seed by seed
(``benchmarks/paired_intervals.py``: Student t, n - 1 degrees of freedom).

Setups: ``cnn`` (``results/``), ``attention_pilot`` (``small`` on the pilot seed, validation
only: the run that fixed the attention target, ``results/attention/pilot.json``), ``attention``
(``results/attention/``), ``pilot`` (the CNN's pilot; not kept: give ``--out``) and ``smoke``
(seconds: the smoke test's).

  python -m benchmarks.batch_ramp                    # every setup kept (RESULTS.md: durations)
  python -m benchmarks.batch_ramp --report_only      # their tables and plots from summary.json
  python -m benchmarks.batch_ramp --setup attention  # one of them
  python -m benchmarks.batch_ramp --setup smoke --out /tmp/ramp   # seconds

A stopped study resumes: finished runs are kept in ``summary.json`` after every run.
"""
