"""ALADDIN (and AR-SGD, ASP, EASGD, SGP) on Ray: n workers train the MNIST-1D CNN for a time
budget (``python -m examples.aladdin``; the program is :mod:`examples.aladdin.main`, the task
it trains :mod:`examples.aladdin.task`)."""
