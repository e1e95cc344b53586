"""The kit the studies and benchmarks of ``benchmarks/`` share beside the driver
(``benchmarks/driver.py``): process set-up, result files and report cells.

Process set-up (call before anything imports jax):

* :func:`force_host_devices`: simulated CPU devices (``--xla_force_host_platform_device_count``).
* :func:`reexec_with_caching_malloc`: restarts the command with glibc keeping freed memory.

Result files:

* :func:`write_text` / :func:`write_json`: atomic writes (a reader never sees half a file);
  :func:`recorded`: the commit, date, load and command a result was measured at.
* Trainer run directories: :func:`is_finished` (the one rule: ``metrics.jsonl``, the trainer's
  schema read by ``examples.metrics.read_metrics``, holds an evaluation at the ``total_steps``
  of ``config.json``), :func:`read_config`, :func:`check_same_config`, and
  :func:`pack_runs` / :func:`unpack_runs` (the raw runs of a study as one ``runs.tar.xz``).
* Summaries (one JSON summary per cell, by name): :func:`load_summaries`,
  :func:`save_summaries`.

Reports: :func:`mean_std`, :func:`mean_std_reached`, :func:`markdown_table`,
:func:`machine_info`.
"""

from __future__ import annotations

import io
import json
import os
import platform
import sys
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

# ----------------------------------------------------------------------------------------------
# Process set-up
# ----------------------------------------------------------------------------------------------

HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def force_host_devices(count: int = 8) -> None:
  """Asks XLA for ``count`` simulated CPU devices unless a count is already set.

  Only effective before jax is first imported, so call it at the top of a script.

  Raises:
    RuntimeError: if jax is already imported (the flag would be ignored silently).
  """
  if "jax" in sys.modules:
    raise RuntimeError(
      "force_host_devices must run before jax is imported; call it at the top of the script."
    )
  flags = os.environ.get("XLA_FLAGS", "")
  if HOST_DEVICES_FLAG not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {HOST_DEVICES_FLAG}={count}".strip()


# Keep freed memory in the process (no munmap/trim) and one arena: every step then reuses the
# same pages, as a caching device allocator would, instead of page-faulting fresh ones. By
# default glibc maps and unmaps every buffer over 32 MB on each call; the page faults that follow
# moved timing ratios by up to +-40% between runs.
CACHING_MALLOC = (
  "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736:glibc.malloc.arena_max=1"
)
SYSTEM_MALLOC_FLAG = "--system-malloc"


def reexec_with_caching_malloc() -> None:
  """Restarts this very command line with ``GLIBC_TUNABLES=CACHING_MALLOC`` (glibc reads it at
  exec), once.

  A no-op when the variable is already set, when ``--system-malloc`` is on the command line, when
  jax is already imported (the caller is a test or a notebook, not a script) or when the
  interpreter was not started on a script or module (``python -c``).
  """
  if (
    SYSTEM_MALLOC_FLAG in sys.argv
    or os.environ.get("GLIBC_TUNABLES") == CACHING_MALLOC
    or "jax" in sys.modules
    or len(sys.orig_argv) < 2
    or sys.orig_argv[1] == "-c"
  ):
    return
  env = dict(os.environ, GLIBC_TUNABLES=CACHING_MALLOC)
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


# ----------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------


def write_text(path: str | Path, text: str) -> Path:
  """Writes ``text`` to ``path`` atomically (a temporary file, then ``os.replace``)."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  tmp.write_text(text)
  os.replace(tmp, path)
  return path


def json_text(obj: Any, indent: int = 1, sort_keys: bool = False) -> str:
  """``obj`` as the text of a JSON file (a final newline)."""
  return json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n"


def write_json(path: str | Path, obj: Any, indent: int = 1, sort_keys: bool = False) -> Path:
  """Writes ``obj`` as JSON to ``path`` atomically."""
  return write_text(path, json_text(obj, indent, sort_keys))


def recorded() -> dict[str, Any]:
  """When and from what a result was measured, for its file's ``recorded`` field (so that the
  file's name says what it holds, not when it was taken): the commit, the UTC date, the 1-minute
  load average and the command line."""
  import datetime
  import subprocess

  def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout

  try:
    commit = git("rev-parse", "--short", "HEAD").strip()
    # A measurement of uncommitted code says so: its commit alone would not reproduce it.
    if git("status", "--porcelain", "--untracked-files=no").strip():
      commit += "-dirty"
  except (OSError, subprocess.CalledProcessError):
    commit = "unknown"
  spec = getattr(sys.modules["__main__"], "__spec__", None)
  program = f"python -m {spec.name}" if spec is not None else sys.argv[0]
  return {
    "commit": commit,
    "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    "load_average": round(os.getloadavg()[0], 1),
    "command": " ".join([program, *sys.argv[1:]]),
  }


# ----------------------------------------------------------------------------------------------
# Trainer run directories
# ----------------------------------------------------------------------------------------------


def read_config(workdir: str | Path) -> dict[str, Any] | None:
  """A run's ``config.json`` (None if absent or unreadable)."""
  try:
    return json.loads((Path(workdir) / "config.json").read_text())
  except (FileNotFoundError, json.JSONDecodeError):
    return None


def is_finished(workdir: str | Path) -> bool:
  """Whether the run in ``workdir`` is finished: its ``metrics.jsonl`` holds an evaluation at the
  ``total_steps`` of its ``config.json`` (the trainer writes that record last)."""
  from examples import metrics  # imports jax: not at module level (see force_host_devices)

  config = read_config(workdir)
  path = Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return False
  lines = [line for line in path.read_text().splitlines() if line.strip()]
  try:
    # A line cut in mid-write: the process was killed, so the run is resumed (which rewrites it).
    if lines:
      json.loads(lines[-1])
    evals = metrics.read_metrics(workdir, "eval")
  except ValueError:  # JSONDecodeError, or the trainer's error for a damaged earlier line
    return False
  if config is None or "total_steps" not in config:
    return False
  return bool(evals) and evals[-1]["iteration"] == config["total_steps"]


def check_same_config(
  workdir: str | Path, config: Mapping[str, Any], ignore: Iterable[str] = ()
) -> None:
  """Refuses to resume into a run directory written with other settings.

  Run names do not encode every setting (data size, epochs, rates), so resuming with other
  options into an old directory would otherwise skip runs of the wrong setting.

  Args:
    workdir: the run directory.
    config: the settings this invocation would write (keys of ``config.json``).
    ignore: keys that do not change the numbers (paths, progress bars).

  Raises:
    ValueError: naming the settings that differ and the fix.
  """
  stored = read_config(workdir)
  if stored is None:
    return
  skip = set(ignore)
  changed = sorted(k for k, v in config.items() if k not in skip and k in stored and stored[k] != v)
  if changed:
    raise ValueError(
      f"{workdir} holds a run with other settings ({', '.join(changed)}); use another --out "
      "for these options."
    )


def final_evaluation(workdir: Path) -> str:
  """The default progress text of a finished run: its last evaluation."""
  from examples import metrics

  last = metrics.read_metrics(workdir, "eval")[-1]
  return f"acc {last['eval_accuracy']:.4f} after {last['iteration']} updates"


Summaries = dict[str, Any]


def load_summaries(out: str | Path, file: str = "runs.json", key: str | None = None) -> Summaries:
  """The summaries (cell name -> summary) of ``out/file`` and of the shards' files beside it
  (``runs-I-of-N.json``); empty when there is none yet. With ``key``, each file holds them
  under that key."""
  out = Path(out)
  stem, _, suffix = file.rpartition(".")
  summaries: Summaries = {}
  for path in sorted(out.glob(f"{stem}*.{suffix}")):
    if path.name == file or path.name.startswith(f"{stem}-"):
      data = json.loads(path.read_text())
      summaries.update(data if key is None else data.get(key, {}))
  return summaries


def save_summaries(path: str | Path, summaries: Mapping[str, Any]) -> Path:
  """Writes the summaries atomically, sorted by name (a resumed study rewrites the same bytes)."""
  return write_json(path, summaries, sort_keys=True)


ARCHIVE = "runs.tar.xz"
RUN_FILES = ("config.json", "metrics.jsonl")


def pack_runs(out: str | Path, runs_dir: str = "runs", files: Sequence[str] = RUN_FILES) -> Path:
  """Packs ``out/<runs_dir>/<name>/<file>`` (each of ``files`` present) into ``out/runs.tar.xz``.

  The archive is reproducible: sorted members, no timestamps or owners, so packing the same runs
  twice gives the same bytes (git sees no change).

  Returns:
    The archive's path.
  """
  out = Path(out)
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
    for path in sorted((out / runs_dir).glob("*/*")):
      if path.name not in files or not path.is_file():
        continue
      data = path.read_bytes()
      info = tarfile.TarInfo(str(path.relative_to(out)))
      info.size, info.mode = len(data), 0o644
      tar.addfile(info, io.BytesIO(data))
  archive = out / ARCHIVE
  tmp = archive.with_name(f".{ARCHIVE}.{os.getpid()}.tmp")
  tmp.write_bytes(buffer.getvalue())
  os.replace(tmp, archive)
  return archive


def unpack_runs(out: str | Path, runs_dir: str = "runs") -> int:
  """Extracts ``out/runs.tar.xz`` into ``out`` when ``out/<runs_dir>`` does not exist (a fresh
  checkout); never touches an existing run directory, so a run removed there is trained again
  (and :func:`pack_runs` then archives the new one).

  Returns:
    The number of files extracted (0 without an archive or with ``runs_dir`` present).
  """
  out = Path(out)
  archive = out / ARCHIVE
  if not archive.exists() or (out / runs_dir).exists():
    return 0
  count = 0
  with tarfile.open(archive, "r:xz") as tar:
    for member in tar.getmembers():
      target = out / member.name
      if not member.isfile() or target.exists():
        continue
      if Path(member.name).is_absolute() or ".." in Path(member.name).parts:
        raise ValueError(f"{archive}: member {member.name!r} points outside {out}.")
      source = tar.extractfile(member)
      assert source is not None  # a regular file
      write_text(target, source.read().decode())
      count += 1
  return count


# ----------------------------------------------------------------------------------------------
# Reports
# ----------------------------------------------------------------------------------------------


def mean_std(values: Sequence[float], fmt: str = ".4f") -> str:
  """``"mean ± std"`` (sample standard deviation) of ``values``; one value alone; ``"—"`` for
  none."""
  if not values:
    return "—"
  if len(values) == 1:
    return format(values[0], fmt)
  mean = sum(values) / len(values)
  std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
  return f"{mean:{fmt}} ± {std:{fmt}}"


def mean_std_reached(hits: Sequence[float], attempts: int, fmt: str = ".0f") -> str:
  """A "time to target" cell: :func:`mean_std` of the runs that reached it, ``"(k/n)"`` when
  only k of the n runs did, ``"never"`` when none did, ``"no baseline"`` when there was no
  target (``attempts == 0``)."""
  if not attempts:
    return "no baseline"
  if not hits:
    return "never"
  text = mean_std(hits, fmt)
  return text if len(hits) == attempts else f"{text} ({len(hits)}/{attempts})"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
  """A Markdown table (``str()`` of every cell)."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def machine_info(devices: Sequence[Any] | None = None) -> dict[str, Any]:
  """What the numbers were measured on: CPU, cores, memory, load, versions, devices.

  Args:
    devices: the jax devices used (default: ``jax.devices()``).
  """
  import jax
  import optax

  devices = list(devices) if devices is not None else jax.devices()
  info: dict[str, Any] = {
    "cpu": _cpu_model(),
    "cpu_cores": os.cpu_count(),
    "python": platform.python_version(),
    "jax": jax.__version__,
    "optax": optax.__version__,
    "devices": f"{len(devices)} x {devices[0].platform} ({devices[0].device_kind})",
  }
  try:
    import flax

    info["flax"] = flax.__version__
  except ImportError:
    pass
  try:
    pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    info["memory_gib"] = round(pages * page_size / 2**30, 1)
  except (ValueError, OSError, AttributeError):
    pass
  if hasattr(os, "getloadavg"):
    info["load_average"] = [round(x, 1) for x in os.getloadavg()]
  return info
