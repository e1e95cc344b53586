"""The critical batch measured with branched runs, beside the estimate in the optimizer state.

A main run (S_main per-worker gradients of ``per_worker_batch`` examples) stops at a few
checkpoints (early, middle, late): of the MNIST-1D CNN with momentum SGD (``ol.adascale`` or
``ol.lena``), or of the attention model of ``benchmarks/adamw_scaling`` with AdamW
(``ol.adascale_adamw`` or ``ol.lena_adamw``, rate times the ratio to the power ``power``). From
each, short runs branch at several S (the state carried over: parameters, momentum or Adam's
moments, and the rule's moving averages; the rule's own rate at each S), and each measures the
updates needed to lower
the training loss (on a fixed subset) by a fixed fraction, interpolated between evaluations and
the median over seeds. Then:

* McCandlish et al. (2018): ``(S / S_min - 1)(E / E_min - 1) = 1`` with E = S B the
  examples (here per-worker batches), i.e. ``updates(B) = S_min + E_min / B``: a least-squares
  line of the updates against 1 / B gives S_min (intercept) and E_min (slope), and
  ``B_crit = E_min / S_min``;
* Zhang et al. (ICLR 2025): the batch at which the updates exceed ideal linear scaling from the
  smallest batch by 20% (``updates(B) B / (updates(B_1) B_1) = 1.2``, interpolated in log B);
* the estimate: ``ol.diagnostics(state)["critical_batch_size"]`` at the checkpoint (B_simple of
  the moving averages), and, from the same statistics without the averages' lag, B_simple of
  ``fresh`` per-worker gradients drawn at the checkpoint's parameters.

All batch sizes are in per-worker batches (multiply by ``per_worker_batch`` for examples).

The four measurements (``grid.py``) are the cells of one grid, each its own
``results/critical_batch_<name>.json`` with its ``table_<name>.md`` and plot:

  python -m benchmarks.critical_batch                                  # the unmeasured ones
  python -m benchmarks.critical_batch --only critical_batch_lena       # one of them
  python -m benchmarks.critical_batch --report_only                    # every table and plot
  python -m benchmarks.critical_batch --setup smoke --out /tmp/cb      # seconds
"""
