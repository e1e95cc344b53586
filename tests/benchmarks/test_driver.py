"""The studies' driver and its kit: shards, the resumable run of a grid's cells in each store
(one that grows as cells finish), ``--set``, the command line; the finished rule, archives,
report cells, and the two process set-ups (host devices, allocator re-exec)."""

import dataclasses
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks import driver, harness


def test_parse_shard_accepts_i_of_n_and_names_the_form_otherwise() -> None:
  assert driver.parse_shard("0/1") == (0, 1)
  assert driver.parse_shard("2/3") == (2, 3)
  for bad in ("3/3", "-1/2", "1", "a/b", "1/0", ""):
    with pytest.raises(ValueError, match="expected I/N"):
      driver.parse_shard(bad)


def test_shards_partition_the_grid() -> None:
  items = list(range(10))
  parts = [driver.shard_of(items, (i, 3)) for i in range(3)]
  assert sorted(x for p in parts for x in p) == items
  assert parts[1] == [1, 4, 7]


def test_mean_std_cells() -> None:
  assert harness.mean_std([]) == "—"
  assert harness.mean_std([0.5]) == "0.5000"
  assert harness.mean_std([1.0, 2.0, 3.0], ".2f") == "2.00 ± 1.00"  # sample std
  assert harness.mean_std_reached([], 0) == "no baseline"
  assert harness.mean_std_reached([], 3) == "never"
  assert harness.mean_std_reached([10, 20], 2) == "15 ± 7"
  assert harness.mean_std_reached([10, 20], 3) == "15 ± 7 (2/3)"


def test_markdown_table() -> None:
  assert harness.markdown_table(["a", "b"], [[1, "x"], [2.5, None]]) == (
    "| a | b |\n|---|---|\n| 1 | x |\n| 2.5 | None |"
  )


def _write_run(workdir: Path, total: int, last: int, setting: int = 0) -> None:
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "config.json").write_text(json.dumps({"total_steps": total, "setting": setting}))
  records = [{"type": "train", "iteration": total}]  # a train record does not finish a run
  records += [{"type": "eval", "iteration": i, "eval_accuracy": 0.5} for i in range(1, last + 1)]
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_finished_rule_reads_the_trainer_schema(tmp_path: Path) -> None:
  assert not harness.is_finished(tmp_path / "absent")
  _write_run(tmp_path / "done", total=3, last=3)
  _write_run(tmp_path / "partial", total=3, last=2)
  assert harness.is_finished(tmp_path / "done")
  assert not harness.is_finished(tmp_path / "partial")
  # A line cut in mid-write (a killed process) is not finished, not an error.
  with (tmp_path / "done" / "metrics.jsonl").open("a") as f:
    f.write('{"type": "ev')
  assert not harness.is_finished(tmp_path / "done")


@dataclasses.dataclass(frozen=True)
class _Cell:
  name: str
  setting: int = 0


@dataclasses.dataclass(frozen=True)
class _Sizes:
  cells: int = 5
  grows: bool = False  # a last cell joins once the others have finished
  rates: tuple[float, ...] = (0.1,)
  label: str | None = None
  flag: bool = False


def _cells(sizes: _Sizes, out: Path) -> list[_Cell]:
  cells = [_Cell(f"run{i}") for i in range(sizes.cells)]
  done = harness.load_summaries(out)
  if sizes.grows and all(c.name in done for c in cells):
    cells.append(_Cell("chosen"))
  return cells


def _context(out: Path, shard: tuple[int, int] = (0, 1)) -> driver.Context:
  return driver.Context(out, out / "cache", "default", shard)


def test_run_cells_trains_the_unfinished_run_directories_of_its_shard_and_resumes(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  trained: list[str] = []

  def run(cell: _Cell, sizes: _Sizes, context: driver.Context) -> None:
    trained.append(cell.name)
    _write_run(context.out / "runs" / cell.name, total=2, last=2, setting=cell.setting)

  store = driver.RunDirectories(settings=lambda cell, sizes, context: {"setting": cell.setting})
  grid = driver.Grid(_cells, run, lambda sizes, out: driver.Report("", {}), store)
  assert driver.run_cells(grid, _Sizes(), _context(tmp_path, (1, 2))) == (2, 0)
  assert trained == ["run1", "run3"]
  out = capsys.readouterr().out
  assert "[1/2] run1: acc 0.5000 after 2 updates" in out
  assert out.strip().splitlines()[-1].startswith("Ran 2, skipped 0 in ")
  assert (tmp_path / "runs.tar.xz").exists()  # archived after the cells ran

  _write_run(tmp_path / "runs" / "run0", total=2, last=1)  # interrupted: trained again
  assert driver.run_cells(grid, _Sizes(), _context(tmp_path)) == (3, 2)
  assert trained[2:] == ["run0", "run2", "run4"]
  assert capsys.readouterr().out.count("finished earlier, skipped") == 2

  # Resuming with other settings into the same directory is refused before anything runs.
  other = driver.Grid(lambda s, o: [_Cell("run0", 1)], run, grid.report, store)
  with pytest.raises(ValueError, match=r"other settings \(setting\)"):
    driver.run_cells(other, _Sizes(), _context(tmp_path))


def test_run_cells_keeps_summaries_per_shard_grows_the_grid_and_stops_at_the_limit(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  ran: list[str] = []

  def run(cell: _Cell, sizes: _Sizes, context: driver.Context) -> dict:
    ran.append(cell.name)
    return {"test_accuracy": 0.25}

  grid = driver.Grid(_cells, run, lambda sizes, out: driver.Report("", {}), driver.Summaries())
  sizes = _Sizes(grows=True)
  for shard in ((0, 2), (1, 2)):
    assert driver.run_cells(grid, sizes, _context(tmp_path, shard), limit=2) == (2, 0)
  assert ran == ["run0", "run2", "run1", "run3"]
  files = sorted(p.name for p in tmp_path.iterdir())
  assert files == ["machine.json", "runs-0-of-2.json", "runs-1-of-2.json"]
  assert "[1/3] run0: acc 0.2500" in capsys.readouterr().out
  assert sorted(harness.load_summaries(tmp_path)) == ["run0", "run1", "run2", "run3"]

  # One process resumes: the shards' cells are finished; run4 runs, then the chosen cell joins.
  assert driver.run_cells(grid, sizes, _context(tmp_path)) == (2, 4)
  assert ran[4:] == ["run4", "chosen"]
  assert list(harness.load_summaries(tmp_path / "runs.json")) == []  # no such folder
  assert sorted(json.loads((tmp_path / "runs.json").read_text())) == ["chosen", "run4"]
  assert capsys.readouterr().out.count("finished earlier, skipped") == 4
  before = (tmp_path / "runs.json").read_bytes()
  harness.save_summaries(
    tmp_path / "runs.json", {"run4": {"test_accuracy": 0.25}, "chosen": {"test_accuracy": 0.25}}
  )
  assert (tmp_path / "runs.json").read_bytes() == before  # sorted: the same bytes


def test_summaries_with_a_key_refuse_a_file_of_another_setup(tmp_path: Path) -> None:
  grid = driver.Grid(
    _cells, lambda c, s, x: {"v": 1}, lambda s, o: driver.Report("", {}),
    driver.Summaries("summary.json", key="runs"),
  )  # fmt: skip
  driver.run_cells(grid, _Sizes(cells=1), _context(tmp_path))
  stored = json.loads((tmp_path / "summary.json").read_text())
  assert stored["runs"] == {"run0": {"v": 1}} and stored["setup"]["cells"] == 1
  assert {"recorded", "machine"} <= set(stored)
  assert driver.run_cells(grid, _Sizes(cells=1), _context(tmp_path)) == (0, 1)
  with pytest.raises(ValueError, match=r"another setup \(cells, rates\)"):
    driver.run_cells(grid, _Sizes(cells=2, rates=(0.2,)), _context(tmp_path))


def test_a_cell_whose_run_finishes_nothing_stops_the_study(tmp_path: Path) -> None:
  def run(cell: _Cell, sizes: _Sizes, context: driver.Context) -> None:
    _write_run(context.out / "runs" / cell.name, total=2, last=1)  # stopped before its end

  store = driver.RunDirectories()
  grid = driver.Grid(_cells, run, lambda s, o: driver.Report("", {}), store)
  with pytest.raises(RuntimeError, match="run0 ran but its result is not finished"):
    driver.run_cells(grid, _Sizes(), _context(tmp_path))


def test_files_store_one_file_per_cell_compressed_or_not(tmp_path: Path) -> None:
  for suffix in (".json", ".json.xz"):
    store = driver.Files(suffix)
    grid = driver.Grid(_cells, lambda c, s, x: {"cell": c.name}, lambda s, o: None, store)
    assert driver.run_cells(grid, _Sizes(cells=2), _context(tmp_path)) == (2, 0)
    assert store.load(tmp_path, "run1") == {"cell": "run1"}
    assert driver.run_cells(grid, _Sizes(cells=2), _context(tmp_path)) == (0, 2)
  assert store.load(tmp_path, "absent") is None


def test_set_converts_to_the_field_types_and_names_the_keys() -> None:
  changed = driver.override(
    _Sizes(), ["cells=3", "rates=0.5, 1", "label=x", "flag=true", "grows=0"]
  )
  assert changed == _Sizes(cells=3, rates=(0.5, 1.0), label="x", flag=True, grows=False)
  assert driver.override(_Sizes(label="x"), ["label=none"]).label is None
  for bad, match in (
    ("size=3", "valid keys: cells, grows, rates, label, flag"),
    ("cells=three", "expected int"),
    ("flag=maybe", "expected a boolean"),
    ("cells", "key=value"),
  ):
    with pytest.raises(ValueError, match=match):
      driver.override(_Sizes(), [bad])


def test_main_runs_then_reports_and_needs_out_for_a_setup_git_keeps_no_results_of(
  tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
  def report(sizes: _Sizes, out: Path) -> driver.Report:
    text = f"{len(harness.load_summaries(out))} of {sizes.cells}"
    return driver.Report(text, {"tables.md": text + "\n"})

  grid = driver.Grid(_cells, lambda c, s, x: {"test_accuracy": 0.5}, report, driver.Summaries())
  setups = {
    "default": driver.Setup(grid, _Sizes(cells=3)),
    "smoke": driver.Setup(grid, _Sizes(), None),
  }
  study = driver.Study("benchmarks.toy", setups, "A toy study.\n\nMore.", tmp_path / "results")
  assert study.committed() == ["default"]
  assert driver.main(study, ["--max_cells", "2", "--set", "cells=4"]) == "2 of 4"
  assert (tmp_path / "results" / "tables.md").read_text() == "2 of 4\n"
  assert driver.main(study, ["--report_only"]) == "2 of 3"
  assert "Ran" not in capsys.readouterr().out.split("2 of 4")[-1]
  with pytest.raises(SystemExit):
    driver.main(study, ["--setup", "smoke"])
  assert "--setup smoke keeps no results in git: give --out DIR" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    driver.main(study, ["--set", "size=1"])
  assert "valid keys" in capsys.readouterr().err
  assert driver.main(study, ["--setup", "smoke", "--out", str(tmp_path / "s")]) == "5 of 5"


def test_runs_archive_is_reproducible_and_unpacks_only_into_a_fresh_directory(
  tmp_path: Path,
) -> None:
  for name in ("b", "a"):
    _write_run(tmp_path / "runs" / name, total=1, last=1)
  (tmp_path / "runs" / "a" / "checkpoint.bin").write_text("not packed")
  first = harness.pack_runs(tmp_path).read_bytes()
  os.utime(tmp_path / "runs" / "a" / "config.json", (1, 1))  # timestamps do not matter
  assert harness.pack_runs(tmp_path).read_bytes() == first
  with tarfile.open(tmp_path / "runs.tar.xz") as tar:
    assert tar.getnames() == [
      "runs/a/config.json",
      "runs/a/metrics.jsonl",
      "runs/b/config.json",
      "runs/b/metrics.jsonl",
    ]

  fresh = tmp_path / "fresh"
  fresh.mkdir()
  (fresh / "runs.tar.xz").write_bytes(first)
  assert harness.unpack_runs(fresh) == 4
  assert harness.is_finished(fresh / "runs" / "a") and harness.is_finished(fresh / "runs" / "b")
  # An existing runs/ is left alone: a run removed there is not brought back.
  (fresh / "runs" / "b" / "metrics.jsonl").unlink()
  assert harness.unpack_runs(fresh) == 0
  assert not harness.is_finished(fresh / "runs" / "b")
  assert harness.unpack_runs(tmp_path / "none") == 0


def test_atomic_writes_leave_no_temporary_files(tmp_path: Path) -> None:
  harness.write_json(tmp_path / "sub" / "x.json", {"a": 1})
  harness.write_text(tmp_path / "sub" / "x.json", "{}")
  assert [p.name for p in (tmp_path / "sub").iterdir()] == ["x.json"]


def test_machine_info_names_the_versions_and_devices() -> None:
  import jax

  info = harness.machine_info()
  assert info["jax"] == jax.__version__
  assert info["cpu_cores"] == os.cpu_count()
  assert "cpu" in info["devices"]


def test_recorded_names_the_commit_and_marks_uncommitted_code(
  tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
  monkeypatch.chdir(tmp_path)
  assert harness.recorded()["commit"] == "unknown"  # not a repository
  git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
  subprocess.run([*git, "init", "-q"], check=True)
  (tmp_path / "f.txt").write_text("a")
  subprocess.run([*git, "add", "f.txt"], check=True)
  subprocess.run([*git, "commit", "-qm", "c"], check=True)
  head = subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
  ).stdout.strip()
  (tmp_path / "untracked.txt").write_text("u")  # untracked files do not count
  rec = harness.recorded()
  assert rec["commit"] == head and rec["date"].endswith(" UTC")
  assert rec["load_average"] == pytest.approx(os.getloadavg()[0], abs=5.0)
  (tmp_path / "f.txt").write_text("b")
  assert harness.recorded()["commit"] == f"{head}-dirty"


_SCRIPT = """
import os, sys
sys.path.insert(0, {root!r})
from benchmarks import harness
harness.reexec_with_caching_malloc()
harness.force_host_devices(3)
print(os.environ.get("GLIBC_TUNABLES") == harness.CACHING_MALLOC, os.environ["XLA_FLAGS"])
import jax
print(jax.device_count())
harness.force_host_devices(3)
"""


@pytest.mark.parametrize("extra", [[], ["--system-malloc"]])
def test_script_set_up_reexecs_once_and_forces_host_devices(tmp_path: Path, extra: list) -> None:
  script = tmp_path / "script.py"
  script.write_text(_SCRIPT.format(root=str(Path(__file__).resolve().parents[2])))
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "XLA_FLAGS")}
  env["JAX_PLATFORMS"] = "cpu"
  proc = subprocess.run(
    [sys.executable, str(script), *extra], env=env, capture_output=True, text=True, timeout=120
  )
  lines = proc.stdout.splitlines()
  assert lines[0] == f"{not extra} --xla_force_host_platform_device_count=3", proc.stderr
  assert lines[1] == "3"
  # Once jax is imported the flag would be ignored: said, not silently dropped.
  assert proc.returncode != 0 and "must run before jax is imported" in proc.stderr
