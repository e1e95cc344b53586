"""Compares the runs two study directories share: are retrained runs the archived ones?

Usage (after retraining some runs of a study into a scratch ``--out``)::

  python -m benchmarks.reproduce benchmarks/large_batch_cnn/results /tmp/rerun

Both directories hold ``runs/<name>/metrics.jsonl`` (unpacked from ``runs.tar.xz`` where only
the archive is there). For every run in both, prints whether the evaluation records are
bitwise equal (iteration, eval_loss, eval_accuracy; wall times aside), the largest accuracy
difference, and both final accuracies.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from benchmarks import harness

KEYS = ("iteration", "eval_loss", "eval_accuracy")


def compare(reference: Path, candidate: Path) -> dict[str, dict[str, object]]:
  """Per run present in both ``runs/``: ``bitwise``, ``max_accuracy_diff``, final accuracies."""
  from examples import metrics

  harness.unpack_runs(reference)
  out: dict[str, dict[str, object]] = {}
  for workdir in sorted((Path(candidate) / "runs").iterdir()):
    ref = Path(reference) / "runs" / workdir.name
    if not (harness.is_finished(workdir) and harness.is_finished(ref)):
      continue
    a, b = metrics.read_metrics(ref, "eval"), metrics.read_metrics(workdir, "eval")
    same = [tuple(r.get(k) for k in KEYS) for r in a] == [tuple(r.get(k) for k in KEYS) for r in b]
    diff = max(
      (abs(x["eval_accuracy"] - y["eval_accuracy"]) for x, y in zip(a, b, strict=False)),
      default=float("nan"),
    )
    out[workdir.name] = {
      "bitwise": same,
      "max_accuracy_diff": diff,
      "reference_final": a[-1]["eval_accuracy"],
      "candidate_final": b[-1]["eval_accuracy"],
    }
  return out


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.reproduce", description=__doc__)
  parser.add_argument("reference", type=Path, help="the study's results (the archive's runs)")
  parser.add_argument("candidate", type=Path, help="the directory the runs were retrained into")
  args = parser.parse_args(argv)
  result = compare(args.reference, args.candidate)
  print(
    harness.markdown_table(
      ["run", "bitwise equal", "max |d acc|", "archived final acc", "retrained final acc"],
      [
        [
          name,
          r["bitwise"],
          f"{r['max_accuracy_diff']:.4f}",
          r["reference_final"],
          r["candidate_final"],
        ]
        for name, r in result.items()
      ],
    )
  )


if __name__ == "__main__":
  main()
