"""The kit every study and benchmark of ``benchmarks/`` runs on.

Process set-up (call before anything imports jax):

* :func:`force_host_devices`: simulated CPU devices (``--xla_force_host_platform_device_count``).
* :func:`reexec_with_caching_malloc`: restarts the command with glibc keeping freed memory.

Grids of training runs, resumable and shardable:

* :func:`parse_shard` (``"I/N"``) and :func:`shard_of`: N processes share one grid.
* :func:`is_finished`: the one rule: a run directory is finished when its ``metrics.jsonl``
  (the trainer's schema, ``"type"`` records read by ``examples.metrics.read_metrics``) holds an
  evaluation at the ``total_steps`` of its ``config.json``.
* :func:`run_grid`: trains the unfinished runs of a shard, one progress line per run.
* :func:`pack_runs` / :func:`unpack_runs`: the raw runs of a study as one ``runs.tar.xz``
  (unpacked when ``runs/`` is absent).
* :func:`run_summaries`: the same for studies that keep one JSON summary per run in one file
  (the simulator's and Ray's): a run is finished when its name is a key of the summaries
  (:func:`load_summaries`, :func:`summaries_path`, :func:`save_summaries`).
* :func:`write_text` / :func:`write_json`: atomic writes (a reader never sees half a file).

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
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

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


def write_json(path: str | Path, obj: Any, indent: int = 1, sort_keys: bool = False) -> Path:
  """Writes ``obj`` as JSON to ``path`` atomically."""
  return write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n")


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
# Grids of runs
# ----------------------------------------------------------------------------------------------


def parse_shard(text: str) -> tuple[int, int]:
  """``"I/N"`` -> ``(I, N)``: this process runs every N-th run of the grid from the I-th.

  Raises:
    ValueError: naming the expected form, for anything but ``0 <= I < N``.
  """
  index_text, sep, count_text = text.partition("/")
  try:
    index, count = int(index_text), int(count_text)
  except ValueError:
    index, count = -1, 0
  if not sep or not 0 <= index < count:
    raise ValueError(
      f"--shard {text!r}: expected I/N with 0 <= I < N, e.g. --shard 0/2 and --shard 1/2 for "
      "two processes."
    )
  return index, count


T = TypeVar("T")


def shard_of(items: Sequence[T], shard: tuple[int, int]) -> list[T]:
  """The items of ``shard = (I, N)``: every N-th from the I-th."""
  index, count = shard
  return list(items[index::count])


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


class NamedRun(Protocol):
  """A run of a grid: ``name`` is its directory under ``runs/`` and unique in the grid."""

  @property
  def name(self) -> str: ...


R = TypeVar("R", bound=NamedRun)


def final_evaluation(workdir: Path) -> str:
  """The default progress text of a finished run: its last evaluation."""
  from examples import metrics

  last = metrics.read_metrics(workdir, "eval")[-1]
  return f"acc {last['eval_accuracy']:.4f} after {last['iteration']} updates"


def run_grid(
  runs: Sequence[R],
  train: Callable[[R, Path], object],
  runs_dir: str | Path,
  *,
  shard: tuple[int, int] = (0, 1),
  config_of: Callable[[R], Mapping[str, Any]] | None = None,
  ignore: Iterable[str] = (),
  describe: Callable[[Path], str] = final_evaluation,
) -> tuple[int, int]:
  """Trains the unfinished runs of this shard, one progress line per run.

  Every run trains into ``runs_dir/<run.name>``; a finished run (:func:`is_finished`) is
  skipped, so a grid can be stopped and restarted, and ``shard=(I, N)`` lets N processes share
  it. The last line is ``Trained T, skipped K in S s.``.

  Args:
    runs: the grid, in the order it should run.
    train: ``train(run, workdir)`` trains one run (writing ``config.json`` and
      ``metrics.jsonl`` there).
    runs_dir: the directory of the run directories.
    shard: ``(I, N)`` from :func:`parse_shard`.
    config_of: ``run -> settings``; when given, :func:`check_same_config` guards every run.
    ignore: keys of ``config_of``'s settings that may differ on resume.
    describe: ``workdir -> text`` of a run just trained, for its progress line.

  Returns:
    ``(trained, skipped)``.
  """

  def finished(run: R) -> bool:
    workdir = Path(runs_dir) / run.name
    if config_of is not None:
      check_same_config(workdir, config_of(run), ignore)
    return is_finished(workdir)

  def trained(run: R) -> str:
    workdir = Path(runs_dir) / run.name
    train(run, workdir)
    return describe(workdir)

  return _resumable(shard_of(runs, shard), finished, trained)


def _resumable(
  mine: Sequence[R],
  finished: Callable[[R], bool],
  run: Callable[[R], str],
  limit: int | None = None,
) -> tuple[int, int]:
  """The loop of :func:`run_grid` and :func:`run_summaries`: skips the finished runs, runs the
  others (at most ``limit``), one progress line each and a last ``Trained T, skipped K``."""
  trained = skipped = 0
  start = time.perf_counter()
  for i, item in enumerate(mine, 1):
    if limit is not None and trained >= limit:
      break
    head = f"[{i}/{len(mine)}] {item.name}"
    if finished(item):
      skipped += 1
      print(f"{head}: finished earlier, skipped", flush=True)
      continue
    t0 = time.perf_counter()
    text = run(item)
    trained += 1
    now = time.perf_counter()
    print(f"{head}: {text}, {now - t0:.0f} s (grid {now - start:.0f} s)", flush=True)
  print(f"Trained {trained}, skipped {skipped} in {time.perf_counter() - start:.0f} s.", flush=True)
  return trained, skipped


SUMMARIES = "runs.json"
Summaries = dict[str, dict[str, Any]]


def summaries_path(out: str | Path, shard: tuple[int, int] = (0, 1)) -> Path:
  """The summary file a shard writes: ``out/runs.json``, or ``out/runs-I-of-N.json`` when N
  processes share the grid (each writes its own file; :func:`load_summaries` reads them all)."""
  index, count = shard
  return Path(out) / (SUMMARIES if count == 1 else f"runs-{index}-of-{count}.json")


def load_summaries(path: str | Path) -> Summaries:
  """The run summaries of one file, or of every ``runs*.json`` of a study's directory (empty
  when there is none yet)."""
  path = Path(path)
  if not path.is_dir():
    return json.loads(path.read_text()) if path.exists() else {}
  summaries: Summaries = {}
  for shard_file in sorted(path.glob("runs*.json")):
    summaries.update(json.loads(shard_file.read_text()))
  return summaries


def save_summaries(path: str | Path, summaries: Mapping[str, Any]) -> Path:
  """Writes the summaries atomically, sorted by name (a resumed study rewrites the same bytes)."""
  return write_json(path, summaries, sort_keys=True)


def run_summaries(
  runs: Sequence[R],
  summarise: Callable[[R], dict[str, Any]],
  store: Summaries,
  save: Callable[[Summaries], object],
  *,
  finished: Iterable[str] = (),
  shard: tuple[int, int] = (0, 1),
  limit: int | None = None,
  describe: Callable[[dict[str, Any]], str] = lambda s: f"acc {s['test_accuracy']:.4f}",
) -> tuple[int, int]:
  """:func:`run_grid` for runs kept as summaries: runs the unfinished runs of this shard.

  A run is finished when its name is a key of ``store`` or in ``finished`` (the other shards'
  runs). Each new summary goes into ``store``, which ``save(store)`` writes after every run, so
  a stopped study resumes. Same progress lines as :func:`run_grid`.

  Args:
    runs: the grid, in the order it should run.
    summarise: ``summarise(run) -> summary`` (JSON-serialisable) runs one run.
    store: this process's summaries (updated in place).
    save: writes ``store`` (e.g. ``lambda s: save_summaries(path, s)``).
    finished: names of runs finished elsewhere.
    shard: ``(I, N)`` from :func:`parse_shard`.
    limit: run at most this many (the first unfinished ones); None: all.
    describe: ``summary -> text`` for the progress line.

  Returns:
    ``(trained, skipped)``.
  """
  done = set(finished) | store.keys()

  def run(item: R) -> str:
    store[item.name] = summarise(item)
    save(store)
    return describe(store[item.name])

  return _resumable(shard_of(runs, shard), lambda item: item.name in done, run, limit)


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
