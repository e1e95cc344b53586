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

log = logging.getLogger("examples.lena.train")
# Per-layer diagnostics written as {layer: value} dicts.
DIAGNOSTICS = ("lr_multiplier", "gain_ratio", "warmup_end_step")


def diagnostics_record(opt_state: optax.OptState, params: Any) -> dict[str, Any]:
  """Per-layer rate multipliers, ratios and warm-up end steps as ``{layer: value}`` dicts
  (layers named by their ``/``-joined parameter path, e.g. ``Conv_0/kernel``)."""
  flat = ol.flat_diagnostics(opt_state, params)
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


def read_metrics(workdir: str | Path, kind: str | None = "eval") -> list[dict[str, Any]]:
  """The records of a run's ``metrics.jsonl`` of this ``type`` (``'eval'``, ``'train'``; None:
  all), in order."""
  lines = (Path(workdir) / "metrics.jsonl").read_text().splitlines()
  records = [json.loads(line) for line in lines if line]
  return [r for r in records if kind is None or r.get("type") == kind]


class MetricsWriter:
  """Appends records to ``metrics.jsonl``, after dropping those a resumed run will redo
  (``workdir=None``: writes nothing, as on the processes other than 0 of a multi-host run)."""

  def __init__(self, workdir: Path | None, resume_step: int):
    self.path = None if workdir is None else workdir / "metrics.jsonl"
    if self.path is None:
      return
    lines = self.path.read_text().splitlines() if resume_step and self.path.exists() else []
    kept = [line for line in lines if line and json.loads(line).get("iteration", 0) <= resume_step]
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
    old = json.loads(path.read_text())
    changed = sorted(k for k, v in record.items() if k != "progress_bar" and old.get(k) != v)
    if changed:
      log.warning(
        "Resuming with a changed configuration (%s): the result will differ from an "
        "uninterrupted run.",
        ", ".join(changed),
      )
  path.write_text(json.dumps(record, indent=2))
