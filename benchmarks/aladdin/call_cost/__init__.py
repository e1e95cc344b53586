"""What one call of a worker to a PS shard costs, its messages inline or in the shared-memory ring.

A caller (this process, as a worker's sender thread) and a callee (a Ray actor that reads its
slice of a fold as ``ServerShard.receive`` does, copies it as XLA copies its argument, and
replies every period with a global slice) on one node, with up to ``max_inflight`` calls
unanswered as the outbox keeps them. Per fold size, the CPU seconds per call of the caller and
of the callee, and the wall time per call, for messages in the call (inline: Ray copies them
through gRPC) and in the worker's ring (``ad.channel``); the two
paths alternate ``--repeats`` times. The messages are the example CNN's (12,106 float32).

  python -m benchmarks.aladdin.call_cost                 # results/call_cost.json and .png
  python -m benchmarks.aladdin.call_cost --report_only   # the table and plot from the JSON
  python -m benchmarks.aladdin.call_cost --setup smoke --out /tmp/c   # a few calls (CI)

The JSON's ``recorded`` field holds the commit, date, load and command of the measurement.
"""
