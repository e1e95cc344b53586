"""The one driver of the studies: ``python -m benchmarks.<study>`` is :func:`main` for each.

A study is a folder ``benchmarks/<study>/`` (or ``benchmarks/aladdin/<study>/``): ``grid.py``
declares its cells (the declared configurations, seeds and selection split), ``runner.py``
runs one cell, ``report.py`` builds the tables and plots from the results and the grid alone,
and ``__main__.py`` puts them together as a :class:`Study` and calls :func:`main`. Every study
takes the same options:

* ``--setup NAME``: one declared configuration (:class:`Setup`). Without it, every setup whose
  results git keeps (those with a ``folder``), in order; the others (``smoke``, the CI's tiny
  one, and the larger variants) need ``--out``.
* ``--out DIR``: where the results go (default: the setup's folder under the study's
  ``results/``).
* ``--report_only``: no cell runs; the tables and plots from what ``--out`` holds.
* ``--set KEY=VALUE``: changes a field of the setup's configuration (a frozen dataclass), as
  the trainer's ``--set`` does; tuples are comma-separated.
* ``--shard I/N``: this process runs every N-th cell from the I-th, so N processes share a grid.
* ``--max_cells N``, ``--only PREFIX ...``: at most N cells, only those whose name starts so.
* ``--cache_dir``: the MNIST-1D cache; ``--system-malloc``: see
  :func:`benchmarks.harness.reexec_with_caching_malloc`.

Resumable: a cell whose result is already in ``--out`` is skipped. The grid is asked for its
cells again after every cell, so cells that depend on finished ones (a rate chosen on a
sweep) join as soon as they can, in the grid's order; a grid that grows appends, so the
shards of concurrent processes stay disjoint. Each cell's result goes to the setup's
:class:`Store`: one JSON summary per cell in one file (:class:`Summaries`), one file per cell
(:class:`Files`, measurements), or a trainer run directory per cell (:class:`RunDirectories`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import lzma
import time
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from benchmarks import harness

DEFAULT_CACHE = "data_cache"


class Cell(Protocol):
  """A cell of a grid: ``name`` is unique in the grid and names its result."""

  @property
  def name(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class Measurement:
  """A cell that is one measurement, kept as one file (a :class:`Files` store's)."""

  name: str


def measurement(name: str) -> Callable[[Any, Path], list[Measurement]]:
  """The ``cells`` of a grid that is the one measurement ``name`` (``<name>.json``)."""
  return lambda config, out: [Measurement(name)]


class Context(NamedTuple):
  """Where a setup runs: its output folder, the MNIST-1D cache, its name and the shard."""

  out: Path
  cache_dir: Path
  setup: str
  shard: tuple[int, int] = (0, 1)


class Report(NamedTuple):
  """What a report built: the text to print and the files (name under ``--out`` -> text) that
  git keeps; the plots it writes itself (through ``examples.analysis.save_figure``)."""

  text: str
  files: dict[str, str]


# ----------------------------------------------------------------------------------------------
# Stores: where the result of a cell goes, and whether it is there
# ----------------------------------------------------------------------------------------------


class Store(Protocol):
  """Opens on a setup's context; the opened store answers for the cells of that run."""

  def open(self, config: Any, context: Context) -> OpenStore: ...

  def prepare(self, out: Path) -> None:
    """Makes the results under ``out`` readable (before a run or a report)."""
    ...


class OpenStore(Protocol):
  """A store opened for one run of a setup's cells."""

  def finished(self, cell: Cell) -> bool: ...

  def record(self, cell: Cell, result: Any) -> str:
    """Keeps ``result`` (what the runner returned); returns the cell's progress text."""
    ...

  def close(self, ran: int) -> None:
    """After the run of ``ran`` cells: archives, machine information."""
    ...


def _describe(summary: Any) -> str:
  if isinstance(summary, dict) and isinstance(summary.get("test_accuracy"), float):
    return f"acc {summary['test_accuracy']:.4f}"
  return "done"


@dataclasses.dataclass(frozen=True)
class Summaries:
  """One JSON summary per cell, by cell name, in one file of ``--out``.

  ``key=None``: the file is the mapping itself (``runs.json``), and ``machine.json`` beside it
  says where the last cells ran. With a ``key``, the file holds the mapping under it next to
  ``setup`` (the configuration: a file whose fields differ is not resumed into),
  ``recorded`` and ``machine``, refreshed by every invocation that runs a cell. Each shard
  writes its own file (``runs-I-of-N.json``); all of them are read.
  """

  file: str = "runs.json"
  key: str | None = None
  describe: Callable[[Any], str] = _describe

  def path(self, context: Context) -> Path:
    name, (index, count) = self.file, context.shard
    if count > 1:
      stem, _, suffix = name.rpartition(".")
      name = f"{stem}-{index}-of-{count}.{suffix}"
    return context.out / name

  def load(self, out: Path) -> dict[str, Any]:
    """The summaries of every shard's file under ``out`` (empty when there is none)."""
    return harness.load_summaries(out, self.file, self.key)

  def prepare(self, out: Path) -> None:
    pass

  def open(self, config: Any, context: Context) -> _OpenSummaries:
    return _OpenSummaries(self, config, context)


class _OpenSummaries:
  def __init__(self, store: Summaries, config: Any, context: Context):
    self.store, self.context, self.path = store, context, store.path(context)
    self.done = store.load(context.out)
    own = json.loads(self.path.read_text()) if self.path.exists() else {}
    self.header: dict[str, Any] = {}
    if store.key is not None:
      setup = _as_json(dataclasses.asdict(config))
      stored = own.get("setup", {})  # the fields both have must agree (as for run directories)
      changed = sorted(k for k, v in setup.items() if k in stored and stored[k] != v)
      if changed:
        raise ValueError(
          f"{self.path} holds a study of another setup ({', '.join(changed)}); use another "
          "--out, or delete it to restart."
        )
      self.header = {k: v for k, v in own.items() if k != store.key} | {"setup": setup}
      own = own.get(store.key, {})
    self.own, self.stamped = own, False

  def finished(self, cell: Cell) -> bool:
    return cell.name in self.done

  def record(self, cell: Cell, result: Any) -> str:
    self.own[cell.name] = self.done[cell.name] = result
    if self.store.key is None:
      harness.save_summaries(self.path, self.own)
    else:
      if not self.stamped:  # where and when this invocation's cells ran
        self.header.update(recorded=harness.recorded(), machine=harness.machine_info())
        self.stamped = True
      harness.write_json(self.path, {**self.header, self.store.key: self.own}, sort_keys=True)
    return self.store.describe(result)

  def close(self, ran: int) -> None:
    if ran and self.store.key is None:
      harness.write_json(self.context.out / "machine.json", harness.machine_info())


@dataclasses.dataclass(frozen=True)
class Files:
  """One file per cell: ``--out/<cell name><suffix>`` (a measurement's JSON; ``.json.xz``:
  compressed)."""

  suffix: str = ".json"
  describe: Callable[[Any], str] = lambda result: "measured"

  def path(self, out: Path, name: str) -> Path:
    return out / f"{name}{self.suffix}"

  def load(self, out: Path, name: str) -> Any:
    """The result of cell ``name`` (None: not measured)."""
    path = self.path(out, name)
    if not path.exists():
      return None
    data = path.read_bytes()
    return json.loads(lzma.decompress(data) if self.suffix.endswith(".xz") else data)

  def prepare(self, out: Path) -> None:
    pass

  def open(self, config: Any, context: Context) -> _OpenFiles:
    return _OpenFiles(self, context.out)


class _OpenFiles:
  def __init__(self, store: Files, out: Path):
    self.store, self.out = store, out

  def finished(self, cell: Cell) -> bool:
    return self.store.path(self.out, cell.name).exists()

  def record(self, cell: Cell, result: Any) -> str:
    path = self.store.path(self.out, cell.name)
    if self.store.suffix.endswith(".xz"):
      path.write_bytes(lzma.compress(json.dumps(result, sort_keys=True).encode()))
    else:
      harness.write_json(path, result)
    return self.store.describe(result)

  def close(self, ran: int) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class RunDirectories:
  """A trainer run directory per cell, ``--out/runs/<name>/`` (``config.json``,
  ``metrics.jsonl`` and ``files``), archived as ``--out/runs.tar.xz`` after cells ran and
  unpacked from it when ``runs/`` is absent (a fresh checkout).

  A cell is finished by :func:`benchmarks.harness.is_finished` with every one of ``files``
  present. ``settings(cell, config, context)``, when given, is what the cell's ``config.json``
  must hold to be resumed (the keys of ``ignore`` aside): a run directory of other settings is
  refused rather than skipped.
  """

  files: tuple[str, ...] = harness.RUN_FILES
  settings: Callable[[Any, Any, Context], Mapping[str, Any]] | None = None
  ignore: tuple[str, ...] = ("progress_bar", "cache_dir")  # they do not change the numbers
  describe: Callable[[Path], str] = harness.final_evaluation  # a trained run's progress text

  def prepare(self, out: Path) -> None:
    """Unpacks ``runs.tar.xz`` when ``runs/`` is absent."""
    harness.unpack_runs(out)

  def open(self, config: Any, context: Context) -> _OpenRunDirectories:
    return _OpenRunDirectories(self, config, context)


class _OpenRunDirectories:
  def __init__(self, store: RunDirectories, config: Any, context: Context):
    self.store, self.config, self.context = store, config, context

  def finished(self, cell: Cell) -> bool:
    workdir = self.context.out / "runs" / cell.name
    if self.store.settings is not None:
      settings = self.store.settings(cell, self.config, self.context)
      harness.check_same_config(workdir, settings, self.store.ignore)
    return harness.is_finished(workdir) and all((workdir / f).exists() for f in self.store.files)

  def record(self, cell: Cell, result: Any) -> str:
    return self.store.describe(self.context.out / "runs" / cell.name)

  def close(self, ran: int) -> None:
    if ran:
      harness.pack_runs(self.context.out, files=self.store.files)


# ----------------------------------------------------------------------------------------------
# Grids, setups and studies
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Grid:
  """A kind of run: its cells, how one runs, where results go and how they are reported.

  Attributes:
    cells: ``cells(config, out)``, the cells in the order they run, given the results already
      in ``out`` (cells chosen on earlier ones join once those have finished).
    run: ``run(cell, config, context)`` runs one cell and returns its result for the store
      (a :class:`RunDirectories` runner trains into ``context.out / "runs" / cell.name``).
    report: ``report(config, out)`` reads the results under ``out`` and the grid, writes the
      plots and returns the :class:`Report`.
    store: a :class:`Store`, or one per type of cell (a measurement beside summaries).
  """

  cells: Callable[[Any, Path], Sequence[Any]]
  run: Callable[[Any, Any, Context], Any]
  report: Callable[[Any, Path], Report]
  store: Store | Mapping[type, Store]

  def store_of(self, cell: Any) -> Store:
    if isinstance(self.store, Mapping):
      return self.store[type(cell)]
    return self.store

  def stores(self) -> list[Store]:
    return list(self.store.values()) if isinstance(self.store, Mapping) else [self.store]


@dataclasses.dataclass(frozen=True)
class Setup:
  """A declared configuration of a study: its grid, its sizes and its folder.

  ``folder`` is where its results live under the study's ``results/`` (``""``: results/
  itself); ``None`` for the setups git keeps no results of (the CI's ``smoke``, larger
  variants), which need ``--out``.
  """

  grid: Grid
  config: Any  # a frozen dataclass: the setup's declared sizes, seeds and options
  folder: str | None = ""


@dataclasses.dataclass(frozen=True)
class Study:
  """A study: its package (the entry ``python -m <module>``) and its setups (those with a folder
  are the study as committed). What it asks is the package's docstring and its results are the
  package's ``results/`` folder, unless given."""

  module: str
  setups: Mapping[str, Setup]
  description: str = ""
  results: Path | None = None

  def __post_init__(self) -> None:
    if not self.description or self.results is None:
      package = importlib.import_module(self.module)
      object.__setattr__(self, "description", self.description or package.__doc__ or "")
      if self.results is None:
        object.__setattr__(self, "results", Path(package.__file__ or "").parent / "results")

  def committed(self) -> list[str]:
    """The setups whose results git keeps, in order."""
    return [name for name, s in self.setups.items() if s.folder is not None]

  def out(self, name: str) -> Path | None:
    """The results folder of setup ``name`` (None: git keeps none)."""
    folder = self.setups[name].folder
    return None if folder is None or self.results is None else self.results / folder


# ----------------------------------------------------------------------------------------------
# Running
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


def shard_of(items: Sequence[Any], shard: tuple[int, int]) -> list[Any]:
  """The items of ``shard = (I, N)``: every N-th from the I-th."""
  index, count = shard
  return list(items[index::count])


def run_cells(
  grid: Grid,
  config: Any,
  context: Context,
  *,
  limit: int | None = None,
  only: Sequence[str] = (),
) -> tuple[int, int]:
  """Runs the unfinished cells of this shard, the grid asked again after each cell.

  One progress line per cell (``[i/n] name: text, s (study s)``, or ``finished earlier,
  skipped``), and ``Ran R, skipped K in S s.`` at the end.

  Returns:
    ``(ran, skipped)``.
  """
  opened: dict[int, OpenStore] = {}

  def store(cell: Any) -> OpenStore:
    s = grid.store_of(cell)
    if id(s) not in opened:
      opened[id(s)] = s.open(config, context)
    return opened[id(s)]

  ran = skipped = 0
  seen: set[str] = set()  # reported as finished earlier, or run here
  ran_here: set[str] = set()
  start = time.perf_counter()
  while limit is None or ran < limit:
    cells = [
      c for c in grid.cells(config, context.out) if not only or c.name.startswith(tuple(only))
    ]
    mine = shard_of(cells, context.shard)
    pending = None
    for i, cell in enumerate(mine, 1):
      if store(cell).finished(cell):
        if cell.name not in seen:
          seen.add(cell.name)
          skipped += 1
          print(f"[{i}/{len(mine)}] {cell.name}: finished earlier, skipped", flush=True)
        continue
      pending = i, cell
      break
    if pending is None:
      break
    i, cell = pending
    if cell.name in ran_here:  # its run left no finished result: running it again would loop
      raise RuntimeError(f"{cell.name} ran but its result is not finished in {context.out}.")
    ran_here.add(cell.name)
    seen.add(cell.name)
    t0 = time.perf_counter()
    text = store(cell).record(cell, grid.run(cell, config, context))
    ran += 1
    now = time.perf_counter()
    print(f"[{i}/{len(mine)}] {cell.name}: {text}, {now - t0:.0f} s (study {now - start:.0f} s)")
  for s in opened.values():
    s.close(ran)
  print(f"Ran {ran}, skipped {skipped} in {time.perf_counter() - start:.0f} s.", flush=True)
  return ran, skipped


def rebuild(setup: Setup, config: Any, out: Path) -> Report:
  """The setup's report of what ``out`` holds, its files written there."""
  for store in setup.grid.stores():
    store.prepare(out)
  report = setup.grid.report(config, out)
  for name, text in report.files.items():
    harness.write_text(out / name, text)
  return report


# ----------------------------------------------------------------------------------------------
# --set
# ----------------------------------------------------------------------------------------------


def _convert(key: str, text: str, hint: Any) -> Any:
  """``text`` as a value of the field's type ``hint`` (bool, int, float, str, ``X | None``, or a
  tuple of those, comma-separated)."""
  args = typing.get_args(hint)
  if type(None) in args:
    if text.strip().lower() == "none":
      return None
    hint = next(a for a in args if a is not type(None))
    args = typing.get_args(hint)
  if typing.get_origin(hint) is tuple:
    return tuple(_convert(key, part.strip(), args[0]) for part in text.split(",") if part.strip())
  if hint is bool:
    if text.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
      raise ValueError(f"--set {key}={text}: expected a boolean (true/false).")
    return text.lower() in ("1", "true", "yes", "on")
  if hint in (int, float, str):
    try:
      return hint(text)
    except ValueError:
      raise ValueError(f"--set {key}={text}: expected {hint.__name__}.") from None
  raise ValueError(f"--set {key}: a field of type {hint} is not set from the command line.")


def override(config: Any, assignments: Iterable[str]) -> Any:
  """``config`` (a frozen dataclass) with the fields of ``key=value`` assignments changed.

  Raises:
    ValueError: a malformed assignment, a key the configuration does not have (the message
      lists them) or a value of the wrong type.
  """
  assignments = list(assignments)
  if not assignments:
    return config
  hints = typing.get_type_hints(type(config))
  changes: dict[str, Any] = {}
  for assignment in assignments:
    key, sep, text = assignment.partition("=")
    key = key.strip()
    if not sep:
      raise ValueError(f"--set expects key=value, got {assignment!r}.")
    if key not in {f.name for f in dataclasses.fields(config)}:
      names = ", ".join(f.name for f in dataclasses.fields(config))
      raise ValueError(f"Unknown key {key!r} of this setup; valid keys: {names}.")
    changes[key] = _convert(key, text, hints[key])
  return dataclasses.replace(config, **changes)


def _as_json(obj: Any) -> Any:
  """Tuples as lists, as JSON gives them back (so stored and current setups compare)."""
  return json.loads(json.dumps(obj))


# ----------------------------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------------------------


def parser(study: Study) -> argparse.ArgumentParser:
  """The options every study takes."""
  p = argparse.ArgumentParser(
    prog=f"python -m {study.module}",
    description=study.description.split("\n\n")[0],
    epilog=f"Setups: {', '.join(study.setups)} (default: {', '.join(study.committed())}).",
  )
  p.add_argument("--setup", choices=tuple(study.setups), help="one declared configuration")
  p.add_argument("--out", type=Path, help="the results folder (default: the setup's)")
  p.add_argument("--report_only", action="store_true", help="tables and plots from --out")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="changes")
  p.add_argument("--shard", type=parse_shard, default=(0, 1), help="I/N")
  p.add_argument("--max_cells", type=int, help="run at most this many cells")
  p.add_argument("--only", nargs="+", default=[], help="only the cells whose name starts so")
  p.add_argument("--cache_dir", type=Path, default=Path(DEFAULT_CACHE), help="MNIST-1D cache")
  p.add_argument(harness.SYSTEM_MALLOC_FLAG, action="store_true", help="glibc's allocator")
  return p


def main(study: Study, argv: Sequence[str] | None = None) -> str:
  """Runs (unless ``--report_only``) and reports the chosen setups; returns the printed text.

  Raises:
    SystemExit: (the parser's error, naming the fix) an unknown ``--set`` key or a value of the
      wrong type, or a setup without a folder and no ``--out``.
  """
  cli = parser(study)
  args = cli.parse_args(argv)
  names = [args.setup] if args.setup else study.committed()
  texts = []
  for name in names:
    setup = study.setups[name]
    try:
      config = override(setup.config, args.changes)
    except ValueError as e:
      cli.error(str(e))
    out = args.out if args.setup else (args.out / setup.folder if args.out else None)
    out = out or study.out(name)
    if out is None:
      cli.error(f"--setup {name} keeps no results in git: give --out DIR.")
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
      for store in setup.grid.stores():
        store.prepare(out)
      context = Context(out, args.cache_dir, name, args.shard)
      run_cells(setup.grid, config, context, limit=args.max_cells, only=args.only)
    report = rebuild(setup, config, out)
    print(report.text, flush=True)
    texts.append(report.text)
  return "\n\n".join(texts)
