"""The examples: programs, one folder each (as Flax's examples), and the pieces they share.

Programs:

* ``examples/lena/``: the LENA trainer (``python -m examples.main``, ``make demo``).
* ``examples/aladdin``: the ALADDIN-on-Ray program (``python -m examples.aladdin``).

The kit: what the benchmarks and the notebook may import from ``examples`` (nothing else;
``tests/examples/test_kit.py`` checks it by parsing their imports):

* ``examples.models``: the Flax models (``create_model``, ``MODELS``, ``CNN1D``, ``ResNet18``, ...).
* ``examples.input_pipeline``: MNIST-1D and CIFAR pipelines behind one ``Dataset`` protocol.
* ``examples.training_stream``: the deterministic training stream, cut into global batches of
  one size or of sizes that change, on one process or several.
* ``examples.losses``: the one classifier loss and accuracy.
* ``examples.optimizers``: the one optimizer registry (``get``, ``build``, ``register``, ...).
* ``examples.metrics``: ``metrics.jsonl`` / ``config.json`` writing and reading.
* ``examples.analysis``: iterations to target and the plots.
* ``examples.checkpoints``: Orbax checkpoints of a train state and its data position.
* ``examples.errors``: ``ConfigError``, a configuration that cannot run.
* ``examples.lena``: the trainer's public entry, ``train_and_evaluate(config, workdir)`` and
  ``evaluate_split(config, state, split)``, its ``Config`` / ``ConfigError`` / ``TrainState``
  and ``get_config`` / ``override`` / ``available_configs`` (see ``examples/lena/__init__.py``).
"""

KIT = (
  "examples.models",
  "examples.input_pipeline",
  "examples.training_stream",
  "examples.losses",
  "examples.optimizers",
  "examples.metrics",
  "examples.analysis",
  "examples.checkpoints",
  "examples.errors",
  "examples.lena",
)
