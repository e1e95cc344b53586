"""The studies and benchmarks of optax_lena, one folder each, all run by ``benchmarks/driver.py``
(``python -m benchmarks.<study>``; the index: ``benchmarks/README.md``)."""
