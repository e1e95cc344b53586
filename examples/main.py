"""``python -m examples.main``: the LENA trainer's command line (``examples/lena/main.py``).

A thin entry point, as the repository's documented command; see ``examples/lena/main.py`` for
``--config``, ``--set key=value`` and ``--workdir``. A process of a multi-host run runs the
trainer as the child of a light parent (``examples/lena/supervisor.py``: a dead peer ends the
run with status 1 and one message, never JAX's C++ abort).
"""

import sys

from examples.lena import supervisor

if __name__ == "__main__":
  if supervisor.wanted(sys.argv[1:]):  # before JAX is imported
    sys.exit(supervisor.run(sys.argv[1:]))
  from examples.lena.main import main

  main()
