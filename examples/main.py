"""``python -m examples.main``: the LENA trainer's command line (``examples/lena/main.py``).

A thin entry point, as the repository's documented command; see ``examples/lena/main.py`` for
``--config``, ``--set key=value`` and ``--workdir``.
"""

from examples.lena.main import main

if __name__ == "__main__":
  main()
