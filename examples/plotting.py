"""Figure saving shared by the demo and the studies (matplotlib is an `examples` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_figure(fig: Any, path: Path, dpi: int = 120) -> Path:
  """Writes ``fig`` to ``path`` as PNG, closes it (figures pile up in long studies) and
  returns the path."""
  import matplotlib.pyplot as plt

  fig.tight_layout()
  fig.savefig(path, dpi=dpi)
  plt.close(fig)
  return path
