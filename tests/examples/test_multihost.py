"""The LENA trainer on several processes: ``python -m examples.main`` started 2 times on this
machine, each process with 4 simulated CPU devices, joined by ``jax.distributed`` (gloo).

* 2 processes x 4 devices give the parameters, optimizer state and metrics of 1 process x 8
  devices after 6 updates, for a LENA batch ramp (S = 8 for 4 updates, then 16: one, then two
  micro-batches per device, shard_map) and for SGD at a fixed S (GSPMD). Not bitwise: the
  cross-process all-reduce adds the devices' partial sums in another order than the in-process
  one (observed 2.3e-7 of a leaf's largest entry), so float32 rounding is asserted; reading the
  wrong rows of a batch changes the parameters by ~1e-2.
* The ramp stopped after its checkpoint at update 3 and started again continues bitwise as the
  uninterrupted multi-process run (same processes, same programs).
* A process of the ramp killed mid-step (in CI; mid-save, mid-evaluation and the coordinator's
  process in the slow set; ``tests/examples/faults.py``) makes the other exit within seconds,
  with default flags, status 1 and one message naming the dead process and the resume command;
  the newest checkpoint is complete.
* A wrong ``--num_processes`` or an unreachable coordinator ends every process after
  ``--initialization_timeout`` with a message naming what to fix.

The single-process references run in this test process (8 devices, see conftest.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from examples import checkpoints, metrics
from examples.lena import distributed, train
from examples.lena import main as cli
from tests.examples import faults

REPO_ROOT = Path(__file__).resolve().parents[2]
DEVICES_PER_PROCESS = 4
# Generous bounds that only a hang reaches (the machine may be loaded); not timing assertions.
RUN_TIMEOUT_S = 400
# Parameters of differently ordered float32 reductions: see the module docstring.
RTOL = 2e-6
COMMON = ["--config", "tiny_test", "--set", "progress_bar=false"]
# 4 updates of S = 8, then 2 of S = 16 (the budget: 8 updates of the first S).
LENA_RAMP = [
  *("--set", "optimizer=lena", "--set", "batch_ramp=steps:0:8,4:16", "--set", "num_steps=8"),
  *("--set", "checkpoint_every=3"),
]
SGD_GSPMD = [*("--set", "optimizer=sgd", "--set", "parallel=gspmd", "--set", "checkpoint_every=6")]


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(cache_dir: str) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}  # gRPC on localhost
  env.update(
    # One compilation per program for all launches (the executables, not the numbers, are
    # reused): the resume and failure runs compile what the first LENA run compiled.
    JAX_COMPILATION_CACHE_DIR=str(Path(cache_dir) / "jax_cache"),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS}",
    PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
    PYTHONUNBUFFERED="1",
  )
  env.pop("JAX_NUM_CPU_DEVICES", None)
  return env


class Processes:
  """``python -m examples.main`` processes of one run, their logs in ``log_dir``."""

  def __init__(
    self,
    args: list[str],
    ids: list[int],
    num_processes: int,
    log_dir: Path,
    env,
    program: str = "examples.main",
  ):
    self.logs = [open(log_dir / f"process_{i}.log", "w+") for i in ids]  # noqa: SIM115
    coordinator = f"127.0.0.1:{_free_port()}"
    self.procs = [
      subprocess.Popen(
        [
          *(sys.executable, "-m", program, *args),
          *(f"--coordinator_address={coordinator}", f"--num_processes={num_processes}"),
          f"--process_id={i}",
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
      )
      for i, log in zip(ids, self.logs, strict=True)
    ]

  def wait(self, timeout: float = RUN_TIMEOUT_S) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
      for p in self.procs:
        p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      pytest.fail(f"processes still running after {timeout} s:\n{self.output()}")
    finally:
      self.kill()
    return [p.returncode for p in self.procs]

  def kill(self) -> None:
    for p in self.procs:
      if p.poll() is None:
        p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
          p.wait(timeout=30)

  def texts(self) -> list[str]:
    out = []
    for log in self.logs:
      log.flush()
      log.seek(0)
      out.append(log.read())
    return out

  def output(self) -> str:
    return "\n".join(f"----- process {i} -----\n{t[-4000:]}" for i, t in enumerate(self.texts()))


def _run_2x4(workdir: Path, args: list[str], cache_dir: str) -> list[str]:
  """Runs the trainer on 2 processes x 4 devices into ``workdir``; returns their logs."""
  log_dir = workdir.with_name(workdir.name + "_logs")
  log_dir.mkdir(parents=True, exist_ok=True)
  procs = Processes(
    [*COMMON, *args, "--workdir", str(workdir), "--set", f"cache_dir={cache_dir}"],
    [0, 1],
    2,
    log_dir,
    _env(cache_dir),
  )
  codes = procs.wait()
  assert codes == [0, 0], f"exit codes {codes}:\n{procs.output()}"
  return procs.texts()


def _run_1x8(workdir: Path, args: list[str], cache_dir: str) -> None:
  config, _, _ = cli.parse_args(
    [*COMMON, *args, "--set", f"cache_dir={cache_dir}", "--workdir", "x"]
  )
  assert jax.device_count() == 8
  train.train_and_evaluate(config, workdir)


def _leaves(workdir: Path) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(checkpoints.restore_checkpoint(workdir)["state"])]


def _assert_same_run(multi: Path, single: Path) -> None:
  """Same final state (float32 rounding) and the same metrics records."""
  got, want = _leaves(multi), _leaves(single)
  assert len(got) == len(want)
  for a, b in zip(got, want, strict=True):
    assert a.dtype == b.dtype and a.shape == b.shape
    scale = float(np.max(np.abs(b.astype(np.float64)), initial=0.0))
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * scale)
  records, expected = metrics.read_metrics(multi, None), metrics.read_metrics(single, None)
  assert [(r["type"], r["iteration"]) for r in records] == [
    (r["type"], r["iteration"]) for r in expected
  ]
  for r, e in zip(records, expected, strict=True):
    assert r.keys() == e.keys()
    for key in ("epoch", "base_steps"):
      assert r[key] == e[key]
    for key in ("train_loss", "eval_loss"):
      if key in e:
        np.testing.assert_allclose(r[key], e[key], rtol=1e-5, err_msg=key)
    if "eval_accuracy" in e:  # a logit within rounding of another could flip one example
      assert abs(r["eval_accuracy"] - e["eval_accuracy"]) <= 1 / 200
    for layer, value in e.get("lr_multiplier", {}).items():
      np.testing.assert_allclose(r["lr_multiplier"][layer], value, rtol=1e-5, err_msg=layer)


def _assert_written_once(logs: list[str]) -> None:
  assert "Process 0 of 2 joined" in logs[0] and "Process 1 of 2 joined" in logs[1]
  assert "step 6 epoch" in logs[0] and "step 6 epoch" not in logs[1]  # process 0 logs


@pytest.fixture(scope="module")
def lena_runs(tmp_path_factory, cache_dir: str) -> dict[str, Path]:
  """The LENA ramp: 2 x 4 (checkpoints at 3 and 6), and 1 x 8."""
  root = tmp_path_factory.mktemp("multihost_lena")
  logs = _run_2x4(root / "multi", LENA_RAMP, cache_dir)
  _run_1x8(root / "single", LENA_RAMP, cache_dir)
  return {"root": root, "multi": root / "multi", "single": root / "single", "logs": logs}


@pytest.mark.xdist_group("multihost_lena")
def test_lena_ramp_2x4_equals_1x8(lena_runs) -> None:
  assert "8 devices x 1 micro-batches x 8 examples (S=8)" in lena_runs["logs"][0]
  assert "on 2 processes" in lena_runs["logs"][0]
  _assert_written_once(lena_runs["logs"])
  _assert_same_run(lena_runs["multi"], lena_runs["single"])
  records = metrics.read_metrics(lena_runs["multi"], None)
  assert [(r["iteration"], r["num_samples"]) for r in records] == [
    *((2, 8), (3, 8), (4, 8), (6, 16)),
  ]


@pytest.mark.xdist_group("multihost_lena")
def test_stop_and_resume_across_processes_continues_bitwise(lena_runs, cache_dir: str) -> None:
  resumed = lena_runs["root"] / "resumed"
  shutil.copytree(lena_runs["multi"], resumed)
  shutil.rmtree(resumed / "checkpoints" / "6")  # stopped right after the checkpoint at 3
  logs = _run_2x4(resumed, LENA_RAMP, cache_dir)
  assert "Resumed from checkpoint at step 3" in logs[0]
  for a, b in zip(_leaves(resumed), _leaves(lena_runs["multi"]), strict=True):
    np.testing.assert_array_equal(a, b)
  strip = lambda rs: [{k: v for k, v in r.items() if k != "wall_time"} for r in rs]
  assert strip(metrics.read_metrics(resumed, None)) == strip(
    metrics.read_metrics(lena_runs["multi"], None)
  )


def test_sgd_gspmd_2x4_equals_1x8(tmp_path: Path, cache_dir: str) -> None:
  logs = _run_2x4(tmp_path / "multi", SGD_GSPMD, cache_dir)
  _assert_written_once(logs)
  _run_1x8(tmp_path / "single", SGD_GSPMD, cache_dir)
  _assert_same_run(tmp_path / "multi", tmp_path / "single")


# A dead peer with default flags (JAX's heartbeat, not a test's short one): noticed within 30 s
# (heartbeat 15 s) and acted on within 10 s, the bounds; a hang or abort takes ~100 s.
DEAD_PEER_BOUND_S = 40


@pytest.mark.xdist_group("multihost_lena")
@pytest.mark.parametrize(
  "fault",
  [
    "1:step:4",  # process 0 is inside update 4's collectives: the pulse check ends it
    "0:step:4",  # the coordination service goes too: JAX aborts, the supervisor reports
    pytest.param("1:save:4", marks=pytest.mark.slow),  # both background writes in flight
    pytest.param("1:eval:3", marks=pytest.mark.slow),  # process 0 is evaluating
  ],
)
def test_a_dead_peer_ends_the_survivor_cleanly(lena_runs, cache_dir: str, fault: str) -> None:
  """The LENA ramp again (compiled already), checkpoints at 2 and 4, one process killed
  (SIGKILL, by ``tests.examples.faults``): the other exits with status 1 and one message naming
  the dead process and the resume command, no C++ abort or stack trace, and the newest
  checkpoint on disk is a complete one."""
  name = "killed_" + fault.replace(":", "_")
  workdir, logs = lena_runs["root"] / name, lena_runs["root"] / f"{name}_logs"
  logs.mkdir()
  env = {**_env(cache_dir), "EXAMPLES_LENA_FAULT": fault}
  args = [*COMMON, *LENA_RAMP, "--set=checkpoint_every=2", f"--set=cache_dir={cache_dir}"]
  procs = Processes([*args, f"--workdir={workdir}"], [0, 1], 2, logs, env, faults.PROGRAM)
  dead = int(fault[0])
  survivor = procs.procs[1 - dead]
  try:
    procs.procs[dead].wait(timeout=RUN_TIMEOUT_S)
    died = time.monotonic()
    survivor.wait(timeout=RUN_TIMEOUT_S)
    waited = time.monotonic() - died
  finally:
    procs.kill()
  text = procs.texts()[1 - dead]
  assert procs.procs[dead].returncode == -signal.SIGKILL, procs.output()
  assert f"{faults.ENV}: process {dead} kills itself now" in procs.texts()[dead]
  assert survivor.returncode == 1, procs.output()
  assert waited < DEAD_PEER_BOUND_S, (waited, text[-3000:])
  assert "step 6 epoch" not in text
  assert text.count("error:") == 1, text[-3000:]
  message = text[text.index("error:") :]
  assert f"error: process {1 - dead} of 2 stops: process {dead} died" in message, message
  assert "start all 2 processes again with the same commands" in message, message
  assert f"python -m examples.main {shlex.join(args)}" in message, message
  for trace in ("Check failed", "*** ", "Fatal Python error", "Traceback", "@ 0x", "client.h"):
    assert trace not in text, text[-3000:]
  # The newest step directory is complete: Orbax's latest, restorable, and the one named.
  steps = sorted(int(d.name) for d in (workdir / "checkpoints").iterdir() if d.name.isdigit())
  if not steps:
    assert "from the start (no complete checkpoint yet)" in message, message
    return
  assert f"from the newest complete checkpoint, step {steps[-1]}, in " in message, message
  restored = checkpoints.restore_checkpoint(workdir)
  assert int(restored["state"]["step"]) == steps[-1] and steps[-1] in (2, 4), steps


def test_wrong_process_count_and_unreachable_coordinator_fail_fast(
  tmp_path: Path, cache_dir: str
) -> None:
  args = [*COMMON, "--workdir", str(tmp_path / "run"), "--initialization_timeout=5"]
  env = _env(cache_dir)
  (tmp_path / "three").mkdir()
  (tmp_path / "alone").mkdir()
  three = Processes(args, [0, 1], 3, tmp_path / "three", env)  # 2 of 3 processes started
  alone = Processes(args, [1], 2, tmp_path / "alone", env)  # process 0 never started
  assert three.wait() == [2, 2] and alone.wait() == [2], three.output() + alone.output()
  for text in three.texts():
    assert "did not hear from all 3 processes" in text and "--num_processes" in text, text
  assert "nothing answers at the coordinator address 127.0.0.1:" in alone.texts()[0]
  assert "start process 0" in alone.texts()[0]


def test_flags_that_cannot_work_fail_at_parse_time(capsys: pytest.CaptureFixture) -> None:
  for flags, message in [
    (["--num_processes=2", "--process_id=2", "--coordinator_address=h:1"], "outside 0..1"),
    (["--num_processes=2", "--process_id=0"], "needs all three"),
    (["--coordinator_address=nohostport", "--num_processes=2", "--process_id=0"], "host:port"),
    (["--distributed=off", "--num_processes=2"], "contradicts"),
    (["--coordinator_address=127.0.0.1:70000", "--num_processes=2", "--process_id=0"], "1..65535"),
  ]:
    with pytest.raises(SystemExit):
      cli.parse_args([*COMMON, "--workdir", "x", *flags])
    assert message in capsys.readouterr().err, flags


LISTEN = """
import json, sys
from examples.lena import distributed
port = int(sys.argv[1])
distributed.initialize(distributed.DistributedOptions(
  coordinator_address=f"127.0.0.1:{port}", num_processes=1, process_id=0))
listening = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
  for line in open(table).read().splitlines()[1:]:
    local, state = line.split()[1], line.split()[3]
    address, hex_port = local.rsplit(":", 1)
    if state == "0A" and int(hex_port, 16) == port:
      listening.append(address)
print(json.dumps(listening))
"""


def test_a_loopback_coordinator_listens_on_loopback_only(tmp_path: Path, cache_dir: str) -> None:
  assert distributed.bind_address("127.0.0.1:5") == "127.0.0.1:5"
  assert distributed.bind_address("localhost:5") == "127.0.0.1:5"
  assert distributed.bind_address("[::1]:5") == "[::1]:5"
  assert distributed.bind_address("10.0.0.1:5") is None  # other machines must reach it
  assert distributed.bind_address("node-3:5") is None
  port = _free_port()
  out = subprocess.run(
    [sys.executable, "-c", LISTEN, str(port)],
    env=_env(cache_dir),
    cwd=REPO_ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  listening = json.loads(out.stdout.strip().splitlines()[-1])
  # 127.0.0.1, as IPv4 or IPv4-mapped IPv6 (::ffff:127.0.0.1): never 0.0.0.0 or [::].
  loopback = {"0100007F", "0000000000000000FFFF00000100007F"}
  assert listening and set(listening) <= loopback, listening


def test_launcher_detection(monkeypatch: pytest.MonkeyPatch) -> None:
  for var in ("JAX_COORDINATOR_ADDRESS", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID"):
    monkeypatch.delenv(var, raising=False)
  for var in ("OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES"):
    monkeypatch.delenv(var, raising=False)
  assert distributed.launcher_in_environment() is None
  assert distributed.initialize(distributed.DistributedOptions()) is False  # one process
  monkeypatch.setenv("SLURM_NTASKS", "1")
  monkeypatch.setenv("SLURM_PROCID", "0")
  assert distributed.launcher_in_environment() is None  # a one-task SLURM job
  monkeypatch.setenv("SLURM_NTASKS", "4")
  assert distributed.launcher_in_environment() == "SLURM"
  monkeypatch.delenv("SLURM_NTASKS")
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "w0,w1")
  assert distributed.launcher_in_environment() == "TPU slice"


@pytest.mark.slow
@pytest.mark.parametrize("path", ["gspmd", "shard_map"])
def test_model_parallel_2x4_equals_unsharded_1x8(path: str, tmp_path: Path, cache_dir: str) -> None:
  """Kernels split over 2 devices of each process's 4 (2 data rows per process): the parameters
  of the unsharded run of the same 4 workers x 4 micro-batches on one process."""
  lena = ["--set=optimizer=lena", "--set=batch_scale=16", "--set=checkpoint_every=6"]
  sharded = [*lena, "--set=micro_batches=4", f"--set=parallel={path}"]
  _run_2x4(tmp_path / "multi", [*sharded, "--set=model_parallel=2"], cache_dir)
  _run_1x8(tmp_path / "single", [*sharded, "--set=num_devices=4"], cache_dir)
  _assert_same_run(tmp_path / "multi", tmp_path / "single")
