"""How close ALADDIN on Ray comes to the machine's limit (``docs/ALADDIN-ray.md``, efficiency).

Two measurements, each side by side in one run and repeated (the machine is shared: ratios, not
absolute times):

* ``single``: the limit of one worker is its local step alone (the same model, batch, optimizer
  and data iterator in a loop in one process, no Ray, no server), each step's message read
  after the next step is dispatched (a JAX loop's Python overlaps XLA), measured four times:
  in this process (XLA's default thread pool), and in a child process whose pool has the one
  thread the runtime gives its actors where they are at least as many as the cores, free to
  move between cores, then pinned as the runtime pins a worker (XLA's threads on one core, the
  Python thread on the others), then with every thread on one core and each step waited for
  (the limit of earlier runs); the limit is the fastest of the four. Efficiency = samples/s of
  ALADDIN on Ray with that one worker / samples/s of the limit, alternating the loops and the
  Ray run ``--repeats`` times per batch size. Also the CPU seconds the worker and the shard
  processes spent per iteration against the limit loop's (what the shard costs on a machine
  without spare cores).
* ``cluster``: 4 ALADDIN workers and the PS on this machine with the program's default settings
  (``python -m examples.aladdin``: batch 128, the runtime's default priority), against the same
  with the workers at the shards' priority (``worker_nice=0``): each worker's wait and compute
  fractions and the throughput.

  python -m benchmarks.aladdin.ray_efficiency        # results/efficiency.json and .png (the
                                                     # declared sizes: RESULTS.md's table)
  python -m benchmarks.aladdin.ray_efficiency --report_only   # the table and plot from the JSON
  python -m benchmarks.aladdin.ray_efficiency --setup smoke --out /tmp/e   # seconds (CI)

A measurement is one cell: a rerun into a folder that holds ``efficiency.json`` measures
nothing (use a fresh ``--out``).

The JSON's ``recorded`` field holds the commit, date, load and command of the measurement.
"""
