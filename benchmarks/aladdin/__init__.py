"""The ALADDIN studies (the simulator's) and benchmarks (the Ray runtime's), one folder each; the
simulator studies' shared declarations are ``protocol.py``, their simulation ``training.py``."""
