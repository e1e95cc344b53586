"""``python -m examples.demo`` (``make demo``): the LENA trainer's demo (``examples/lena/demo.py``).

A thin entry point; ``--quick`` runs the seconds-long smoke version.
"""

from examples.lena.demo import cli

if __name__ == "__main__":
  cli()
