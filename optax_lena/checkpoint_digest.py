"""Checkpoint digests: a checkpoint that cannot restore wrong (see the module of the same name
under ``optax_lena._src`` for the format)."""

from optax_lena._src.checkpoint_digest import (
  DIGEST,
  INCOMPLETE,
  check_files,
  check_tree,
  tree_digest,
  write_digest,
)

__all__ = ["DIGEST", "INCOMPLETE", "check_files", "check_tree", "tree_digest", "write_digest"]
