"""What one ALADDIN server message costs, relative to one ``optax.sgd`` step of the same tree.

Run from the repository root::

  python -m benchmarks.aladdin.receive_cost [--set repeats=N --set period=4]
  python -m benchmarks.aladdin.receive_cost --report_only   # tables and plot from the JSON
  python -m benchmarks.aladdin.receive_cost --setup smoke --out /tmp/r   # few repeats

It writes ``results/receive_cost.json`` (every candidate's best and median seconds per message
and their ratios; its ``recorded`` field holds the commit, date, load and command) and
``results/receive_cost.png`` beside it (``--out`` moves both; a folder that holds the JSON is
not measured again).

Every number printed is a RATIO measured side by side in one run: each function is jitted with
its state donated (as a server would run it) and warmed up, then the candidates run interleaved
for N rounds; the ratios of the best times (the cost of the work itself) and of the medians (what
a shared machine adds) are printed, with the absolute times as context.

* baseline: one jitted ``optax.sgd(0.1)`` step, ``tx.update`` + ``optax.apply_updates``
  (reads the gradient and the parameters, writes the parameters);
* ``receive`` of :func:`al.parameter_server` with ``optax.sgd(0.1)``, jitted as it is: a
  message that does not trigger (finiteness check + accumulation), a triggering one (the lazy
  global update and the reply) and the mean over one period of ``period`` messages from one
  worker (``period - 1`` accumulations + 1 trigger: what the server pays per message on
  average). It returns x~ twice (state and reply), so XLA copies x~ on every message;
* ``serve``, the same step for a server loop (x~ read from the state, no copy);
* ``serve`` on the flattened tree (one contiguous float32 array per message, as a runtime that
  sends one buffer per message has it: one kernel per pass instead of one per leaf);
* ``serve_flat_verified``: the same with a trusted sender's finiteness verdict (``serve(...,
  accept=)``): the sender computes the verdict inside its own jitted step, so the server makes
  no pass of its own over the message to decide acceptance;
* ``shard_fold``: the exact compiled call of a Ray PS shard (``folded_receive``) on one period
  of one worker's messages (``period`` messages in one call, the last one triggering, its reply
  written to the call's output), per message: the shard applies the worker's verdict; and
  ``shard_fold_recheck``, the same with ``Config(recheck_messages=True)`` (the shard checks its
  slice too);
* the floor: one accumulation ``g~ += g`` alone, and the finiteness check alone.

Trees: ResNet-50 for CIFAR-10 (23.5 M float32 parameters in 161 leaves) and a small MLP
(0.1 M parameters, 6 leaves). The measured ratios and the machine are in
``benchmarks/aladdin/receive_cost/RESULTS.md``.

Like the overhead benchmark, the script re-executes itself with glibc told to keep freed memory
(``benchmarks.harness.reexec_with_caching_malloc``: otherwise every buffer over 32 MB is mapped
and unmapped at each call and the page faults move the ratios); ``--system-malloc`` turns this
off.
"""
