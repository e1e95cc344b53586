"""What a run writes besides checkpoints: ``config.json`` and ``metrics.jsonl``.

``metrics.jsonl`` holds one JSON object per line: ``"type": "eval"`` records (iteration, epoch,
base steps, wall time, train loss/accuracy, eval loss/accuracy) and, with ``log_every > 0``,
``"type": "train"`` records in between. For optimizers that report diagnostics (the registry's
``diagnostics`` flag) every record also holds the per-layer ``lr_multiplier``, ``gain_ratio``
and ``warmup_end_step`` as ``{layer: value}`` dicts, ``global_ratio`` and ``num_skipped_steps``,
read with ``ol.flat_diagnostics``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import optax

import optax_lena as ol
from examples.errors import ConfigError

log = logging.getLogger("examples.lena.train")
# Per-layer diagnostics written as {layer: value} dicts.
DIAGNOSTICS = ("lr_multiplier", "gain_ratio", "warmup_end_step")


def diagnostics_record(
  opt_state: optax.OptState, params: Any, layer_axes: Any = None
) -> dict[str, Any]:
  """Per-layer rate multipliers, ratios and warm-up end steps as ``{layer: value}`` dicts
  (layers named by their ``/``-joined parameter path, e.g. ``Conv_0/kernel``; with the
  optimizer's ``layer_axes``, a stacked parameter's slices by path and index,
  ``blocks/Dense_0/kernel/3``)."""
  flat = ol.flat_diagnostics(opt_state, params, layer_axes=layer_axes)
  out: dict[str, Any] = {k: {} for k in DIAGNOSTICS}
  for key, value in flat.items():
    metric, _, layer = key.partition("/")
    if metric in out:
      out[metric][layer] = value
  # flat_diagnostics leaves out the layers still warming up; the records keep -1 for them.
  ends = out["warmup_end_step"]
  out["warmup_end_step"] = {k: int(ends.get(k, -1)) for k in out["lr_multiplier"]}
  out["global_ratio"] = flat.get("global_ratio")
  out["num_skipped_steps"] = int(flat["num_skipped_steps"])
  return out


def _parse_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
  """``(line, record)`` of every line of ``path``. A last line that is not JSON (cut short by a
  crash mid-write) is dropped with a warning.

  Raises:
    ConfigError: a line before the last is not JSON (the message names the file and line).
  """
  lines = [line for line in path.read_text().splitlines() if line.strip()]
  out = []
  for i, line in enumerate(lines):
    try:
      record = json.loads(line)
      if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    except ValueError as e:  # JSONDecodeError is a ValueError
      if i < len(lines) - 1:
        raise ConfigError(
          f"{path}, line {i + 1}, is not a JSON record ({e}): repair or delete that line."
        ) from None
      log.warning("Dropping the partial last line of %s (%d characters): %s", path, len(line), e)
      continue
    out.append((line, record))
  return out


def read_metrics(workdir: str | Path, kind: str | None = "eval") -> list[dict[str, Any]]:
  """The records of a run's ``metrics.jsonl`` of this ``type`` (``'eval'``, ``'train'``; None:
  all), in order; a partial last line (a run killed mid-write) is left out."""
  records = [r for _, r in _parse_lines(Path(workdir) / "metrics.jsonl")]
  return [r for r in records if kind is None or r.get("type") == kind]


class MetricsWriter:
  """Appends records to ``metrics.jsonl``, after dropping those a resumed run will redo
  (``workdir=None``: writes nothing, as on the processes other than 0 of a multi-host run)."""

  def __init__(self, workdir: Path | None, resume_step: int):
    self.path = None if workdir is None else workdir / "metrics.jsonl"
    if self.path is None:
      return
    lines = _parse_lines(self.path) if resume_step and self.path.exists() else []
    kept = [line for line, r in lines if r.get("iteration", 0) <= resume_step]
    self.path.write_text("".join(f"{line}\n" for line in kept))

  def write(self, record: dict[str, Any]) -> None:
    if self.path is not None:
      with self.path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def write_config(workdir: Path | None, record: dict[str, Any], resuming: bool) -> None:
  """Writes ``config.json``; warns when a resumed run's configuration changed (``workdir=None``:
  nothing, as on the processes other than 0 of a multi-host run)."""
  if workdir is None:
    return
  path = workdir / "config.json"
  if resuming and path.exists():
    try:
      old = json.loads(path.read_text())
      if not isinstance(old, dict):
        raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as e:
      raise ConfigError(
        f"{path} is damaged ({e}), so the resumed configuration cannot be compared with the "
        "one that wrote the checkpoints: delete it (or restore it from a copy) and rerun; the "
        "run then writes it again."
      ) from None
    changed = sorted(k for k, v in record.items() if k != "progress_bar" and old.get(k) != v)
    if changed:
      log.warning(
        "Resuming with a changed configuration (%s): the result will differ from an "
        "uninterrupted run.",
        ", ".join(changed),
      )
  path.write_text(json.dumps(record, indent=2))
