"""Where a worker's threads run (``optax_lena._src.aladdin.ray.cores``): exclusive core claims
between processes, the step's threads pinned apart from the others, and when the runtime pins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from optax_lena._src.aladdin.ray import bootstrap, cores

CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs and Linux affinity")


def _in_child(code: str, directory: Path) -> Any:
  """Runs ``code`` in a fresh interpreter (``directory`` bound to ``locks``); returns the JSON it
  prints last."""
  prelude = "import json, os\nfrom pathlib import Path\nlocks = Path(os.environ['LOCKS'])\n"
  env = {**os.environ, "LOCKS": str(directory), "JAX_PLATFORMS": "cpu"}
  out = subprocess.run(
    [sys.executable, "-c", prelude + code], env=env, capture_output=True, text=True, timeout=120
  )
  assert out.returncode == 0, out.stderr
  return json.loads(out.stdout.strip().splitlines()[-1])


CLAIM_ONE = """
from optax_lena._src.aladdin.ray.cores import claim_cores
claim = claim_cores(1, locks)
print(json.dumps(None if claim is None else list(claim.cores)))
"""


def test_a_claimed_core_is_no_other_process_s_until_released_and_the_last_is_never_claimed(
  tmp_path: Path,
) -> None:
  claim = cores.claim_cores(1, tmp_path)
  assert claim is not None
  assert claim.cores == (CPUS[0],) and claim.others == frozenset(CPUS[1:])
  # Another process gets the next core, if one is left besides the last.
  assert _in_child(CLAIM_ONE, tmp_path) == ([CPUS[1]] if len(CPUS) > 2 else None)
  assert cores.claim_cores(len(CPUS), tmp_path) is None  # never every core
  claim.release()
  assert _in_child(CLAIM_ONE, tmp_path) == [CPUS[0]]
  # A process that ends holding a claim (no release) leaves the core free.
  again = cores.claim_cores(1, tmp_path)
  assert again is not None and again.cores == (CPUS[0],)
  again.release()


PIN = """
import threading, time
from optax_lena._src.aladdin.ray import cores

def affinity(tid):
  return sorted(os.sched_getaffinity(tid))

started = threading.Event()
early = threading.Thread(target=lambda: (started.set(), time.sleep(30)), daemon=True)
early.start()
started.wait()
before = cores.thread_ids()
assert cores.limit_intra_op_threads(1)
xla = sorted(cores.thread_ids() - before)
claim = cores.pin_step(1, before, locks)
sender = {}
late = threading.Thread(target=lambda: sender.update(cpus=affinity(threading.get_native_id())))
late.start()
late.join()
import jax.numpy as jnp
total = float(jnp.arange(10.0).sum())  # the pinned backend still computes
print(json.dumps({
  "cores": list(claim.cores), "others": sorted(claim.others), "total": total,
  "main": affinity(threading.get_native_id()), "early": affinity(early.native_id),
  "xla": [affinity(t) for t in xla], "sender": sender["cpus"],
}))
"""


def test_the_step_s_threads_run_on_the_claimed_core_and_the_others_off_it(
  tmp_path: Path,
) -> None:
  report = _in_child(PIN, tmp_path)
  core, others = report["cores"], report["others"]
  assert core == [CPUS[0]] and others == CPUS[1:]
  assert report["xla"] and all(a == core for a in report["xla"])  # XLA's threads, started then
  assert report["total"] == 45.0
  # The dispatching thread, a thread started before the backend (Ray's) and one started after
  # by the dispatching thread (the sender) run off it.
  assert report["main"] == others
  assert report["early"] == others
  assert report["sender"] == others


FOLLOW = """
import threading, time
from optax_lena._src.aladdin.ray import cores

def burn(seconds):
  start = time.thread_time()
  while time.thread_time() - start < seconds:
    pass

def spin(seconds):  # on the wall clock: reading the thread's CPU clock would update schedstat
  start = time.perf_counter()
  while time.perf_counter() - start < seconds:
    pass

before = cores.thread_ids()
assert cores.limit_intra_op_threads(1)
go, done = threading.Event(), threading.Event()
def stand_in():  # XLA's thread: computes what the caller dispatches, on the claimed core
  while go.wait():
    go.clear()
    burn(0.02)
    done.set()
threading.Thread(target=stand_in, daemon=True).start()
claim = cores.pin_step(1, before, locks)
def offloaded():
  go.set()
  done.wait()
  done.clear()
caller = threading.get_native_id()
report = {"cores": list(claim.cores), "others": sorted(claim.others)}
report["offloaded"] = cores.follow_the_step(claim, offloaded)
report["after_offloaded"] = sorted(os.sched_getaffinity(caller))
# A step of microseconds, as the tests' model's: shorter than the scheduler's tick.
report["tiny_inline"] = cores.follow_the_step(claim, lambda: spin(0.00005))
report["after_tiny_inline"] = sorted(os.sched_getaffinity(caller))
cores.set_affinity([caller], claim.others)
report["inline"] = cores.follow_the_step(claim, lambda: burn(0.02))
report["after_inline"] = sorted(os.sched_getaffinity(caller))
print(json.dumps(report))
"""


def test_the_claimed_core_goes_to_the_thread_that_computes_the_step(tmp_path: Path) -> None:
  """A step computed on XLA's thread leaves the dispatching thread off the claimed core; a
  step it computes itself (XLA:CPU runs cheap ones inline) brings it onto the core."""
  report = _in_child(FOLLOW, tmp_path)
  assert report["offloaded"] is False and report["after_offloaded"] == report["others"]
  assert report["tiny_inline"] is True and report["after_tiny_inline"] == report["cores"]
  assert report["inline"] is True and report["after_inline"] == report["cores"]


def test_without_a_free_core_nothing_is_pinned(tmp_path: Path) -> None:
  held = cores.claim_cores(len(CPUS) - 1, tmp_path)
  assert held is not None
  try:
    code = (
      "from optax_lena._src.aladdin.ray import cores\n"
      "before = cores.thread_ids()\n"
      "assert cores.limit_intra_op_threads(1)\n"
      "claim = cores.pin_step(1, before, locks)\n"
      "print(json.dumps([claim is None, sorted(os.sched_getaffinity(0))]))\n"
    )
    assert _in_child(code, tmp_path) == [True, CPUS]
  finally:
    held.release()


@pytest.mark.parametrize(
  ("pin", "threads", "workers", "cpus", "expected"),
  [
    (None, 1, 1, 2.0, 1),  # one worker, a core left for the rest: pinned
    (None, 1, 2, 2.0, 0),  # no core left: the OS places them
    (None, None, 1, 8.0, 0),  # XLA's default pool (a thread per core): nothing to pin
    (None, 2, 3, 8.0, 2),
    (False, 1, 1, 8.0, 0),
    (True, 1, 4, 2.0, 1),  # asked for: every worker tries (those without a free core float)
  ],
)
def test_when_the_runtime_pins(
  monkeypatch: pytest.MonkeyPatch,
  pin: bool | None,
  threads: int | None,
  workers: int,
  cpus: float,
  expected: int,
) -> None:
  import ray

  from optax_lena.aladdin import distributed as ad
  from tests.aladdin.ray import helpers

  monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": cpus})
  config = ad.Config(
    algorithm=helpers.spec("aladdin"),
    num_workers=workers,
    pin_compute=pin,
    intra_op_threads=threads if pin else None,
  )
  assert bootstrap.step_cores(config, threads) == expected


def test_pinning_asks_for_the_pool_it_pins() -> None:
  from optax_lena.aladdin import distributed as ad
  from tests.aladdin.ray import helpers

  with pytest.raises(ValueError, match=r"pin_compute=True needs intra_op_threads=N"):
    ad.Config(algorithm=helpers.spec("aladdin"), pin_compute=True)
  with pytest.raises(ValueError, match="pin_compute must be None or a bool"):
    ad.Config(algorithm=helpers.spec("aladdin"), pin_compute="yes")  # type: ignore[arg-type]


def test_core_locks_live_in_a_private_directory_and_never_follow_links(tmp_path: Path) -> None:
  private = cores.private_directory(tmp_path)
  assert private == tmp_path / f"optax_lena-{os.getuid()}"
  assert private.stat().st_mode & 0o777 == 0o700
  assert cores.private_directory(tmp_path) == private  # reused as it is
  # A planted link instead of a lock file: that core is skipped, the link's target never made.
  target = tmp_path / "planted"
  (private / f"core{CPUS[0]}.lock").symlink_to(target)
  claim = cores.claim_cores(1, private)
  assert (claim is not None and claim.cores == (CPUS[1],)) if len(CPUS) > 2 else claim is None
  assert not target.exists()
  if claim is not None:
    claim.release()
  # What another user could plant or open up is refused as a whole: no pinning, no crash.
  os.chmod(private, 0o755)
  assert cores.private_directory(tmp_path) is None
  other = tmp_path / "other"
  other.mkdir()
  (other / f"optax_lena-{os.getuid()}").symlink_to(private)
  assert cores.private_directory(other) is None
  assert cores.private_directory(tmp_path / "missing" / "parent") is None
