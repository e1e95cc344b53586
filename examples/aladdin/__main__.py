"""``python -m examples.aladdin``: see :mod:`examples.aladdin.main`."""

import sys

from examples.aladdin.main import cli

if __name__ == "__main__":
  sys.exit(cli())
