"""Benchmarks of optax_lena (run as modules, e.g. ``python -m benchmarks.overhead``)."""
