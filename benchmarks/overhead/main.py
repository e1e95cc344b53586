"""The overhead benchmark's command line: presets and the order of the sections."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from benchmarks import harness
from benchmarks.overhead.common import NUM_WORKERS, Row, log
from benchmarks.overhead.data_parallel import bench_dp_step, bench_train_step
from benchmarks.overhead.report import write_reports
from benchmarks.overhead.state_and_compile import bench_compile, memory_rows
from benchmarks.overhead.trees import (
  resnet18_shapes,
  scanned_layer_axes,
  scanned_mlp_shapes,
  transformer_shapes,
)
from benchmarks.overhead.update import bench_stacked, bench_update_only

# ----------------------------------------------------------------------------------------------
# Main.


@dataclasses.dataclass
class Config:
  resnet_width: int = 64
  transformer: tuple[int, int] = (16, 192)  # (blocks, d_model)
  scanned_mlp: tuple[int, int] = (48, 512)  # (depth, width) of the scanned MLP in (a), (b)
  repeats: int = 20  # update only
  step_repeats: int = 8  # the slower sections (stacked, data-parallel, training steps)
  train_models: tuple[tuple[str, int, int], ...] = (("cnn1d", 128, 0), ("resnet18", 16, 16))
  compile_leaves: tuple[int, ...] = (100, 1000, 5000)
  compile_repeats: int = 1
  train_min_seconds: float = 30.0  # per model in (d): the CNN1D step takes milliseconds


# (a) update only, (b) stacked statistics + update, (c) data-parallel steps, (d) training steps,
# (e) optimizer-state memory, (f) compile time of the update.
SECTIONS = ("a", "b", "c", "d", "e", "f")

FULL = Config()
QUICK = Config(
  resnet_width=16,
  transformer=(4, 64),
  scanned_mlp=(8, 64),
  repeats=9,
  step_repeats=5,
  train_models=(("cnn1d", 32, 0),),
  compile_leaves=(50, 200),
  compile_repeats=1,
  train_min_seconds=0.0,
)


def run(
  config: Config,
  devices: Sequence[Any],
  out_dir: str,
  command: str,
  sections: Sequence[str] = SECTIONS,
) -> dict[str, Any]:
  """Runs the ``sections`` (letters of SECTIONS, in their order) and writes the reports."""
  start = time.perf_counter()
  load_before = [round(x, 2) for x in os.getloadavg()]
  trees = {
    f"ResNet-18 (width {config.resnet_width})": resnet18_shapes(config.resnet_width),
    "transformer ({} blocks, d={})".format(*config.transformer): transformer_shapes(
      *config.transformer
    ),
  }
  # Trees whose repeated blocks are stacked (nn.scan), LENA per slice (layer_axes=).
  scanned = {
    "transformer, scanned ({} blocks, d={})".format(*config.transformer): transformer_shapes(
      *config.transformer, scanned=True
    ),
    "MLP, scanned (depth {}, width {})".format(*config.scanned_mlp): scanned_mlp_shapes(
      *config.scanned_mlp
    ),
  }
  with jax.default_device(devices[0]):
    rows: list[Row] = []
    memory: list[dict[str, Any]] = []
    compile_rows: list[dict[str, Any]] = []
    if "a" in sections:
      for name, shapes in trees.items():
        rows += bench_update_only(name, shapes, config.repeats)
      for name, shapes in scanned.items():
        rows += bench_update_only(
          name,
          shapes,
          config.repeats,
          layer_axes=scanned_layer_axes,
          target="update_only_scanned",
        )
    if "b" in sections:
      for i, (name, shapes) in enumerate(trees.items()):
        rows += bench_stacked(name, shapes, config.step_repeats, with_slow_mean=i == 0)
      for name, shapes in scanned.items():
        rows += bench_stacked(name, shapes, config.step_repeats, layer_axes=scanned_layer_axes)
    if "c" in sections:
      for name, shapes in trees.items():
        rows += bench_dp_step(name, shapes, config.step_repeats, devices)
    if "d" in sections:
      for model_name, batch, width in config.train_models:
        rows += bench_train_step(
          model_name,
          config.step_repeats,
          devices,
          batch,
          width,
          min_seconds=config.train_min_seconds,
        )
    if "e" in sections:
      memory = memory_rows(trees)
    if "f" in sections:
      compile_rows = bench_compile(config.compile_leaves, config.compile_repeats)
  meta = {
    "command": command,
    "machine": harness.machine_info(devices),
    "repeats": f"{config.repeats} (update only), {config.step_repeats} (steps; training "
    f"steps: at least {config.train_min_seconds:g} s of rounds per model)",
    "seconds": time.perf_counter() - start,
    "load_average_before": load_before,
    "load_average_after": [round(x, 2) for x in os.getloadavg()],
    "config": dataclasses.asdict(config),
  }
  return write_reports(out_dir, meta, rows, memory, compile_rows)


def rebuild_reports(out_dir: str) -> dict[str, Any]:
  """overhead.md, .json and .png again from ``out_dir``'s overhead.json (targets re-judged)."""
  record = json.loads((Path(out_dir) / "overhead.json").read_text())
  fields = {f.name for f in dataclasses.fields(Row)}
  rows = [Row(**{k: v for k, v in r.items() if k in fields}) for r in record["rows"]]
  meta = {k: v for k, v in record.items() if k not in ("rows", "memory", "compile", "targets")}
  return write_reports(out_dir, meta, rows, record["memory"], record["compile"])


def main(argv: Sequence[str] | None = None) -> None:
  """``python -m benchmarks.overhead``: runs every section and writes the reports."""
  import benchmarks.overhead

  parser = argparse.ArgumentParser(
    prog="python -m benchmarks.overhead", description=benchmarks.overhead.__doc__.split("\n\n")[0]
  )
  parser.add_argument("--quick", action="store_true", help="small trees and few repeats (< 2 min)")
  parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
  parser.add_argument("--out", default="benchmarks/overhead/results")
  parser.add_argument(
    "--report_only", action="store_true", help="the report again from --out's overhead.json"
  )
  parser.add_argument(
    harness.SYSTEM_MALLOC_FLAG,
    action="store_true",
    help="do not re-execute with the caching glibc malloc settings",
  )
  parser.add_argument(
    "--sections",
    default=",".join(SECTIONS),
    help="the sections to run, e.g. a,b (default: all); the reports hold those only",
  )
  args = parser.parse_args(argv)
  sections = args.sections.split(",")
  if not set(sections) <= set(SECTIONS):
    parser.error(f"--sections: letters of {','.join(SECTIONS)}, got {args.sections!r}")
  if args.report_only:
    rebuild_reports(args.out)
    return
  jax.config.update("jax_platforms", "cpu" if args.device == "cpu" else "cuda")
  devices = jax.devices()[:NUM_WORKERS]
  if args.device == "cpu" and len(devices) < NUM_WORKERS:
    log(
      f"warning: {len(devices)} CPU devices (set XLA_FLAGS before importing jax); the "
      f"data-parallel sections use S = {len(devices)}"
    )
  command = "python -m benchmarks.overhead " + " ".join(sys.argv[1:] if argv is None else argv)
  log(f"LENA overhead benchmark on {harness.machine_info(devices)}")
  run(QUICK if args.quick else FULL, devices, args.out, command.strip(), sections)
