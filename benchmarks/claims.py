"""The headline claims of the RESULTS files, each recomputed from the committed JSON.

Every claim is a difference A - B paired by seed, with its Student-t 95% interval
(``benchmarks/paired_intervals.py``, ``n - 1`` degrees of freedom) and its seed count; an
interval that contains 0 is "not distinguishable". Each RESULTS file carries its study's table
verbatim (``tests/benchmarks/test_committed_tables.py`` checks it), so a claim in the text can
be traced to one row here.

Usage::

  python -m benchmarks.claims                    # every study's table
  python -m benchmarks.claims aladdin_recipe     # one study's
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from benchmarks import harness
from benchmarks.paired_intervals import Paired, paired_by_seed

ROOT = Path(__file__).resolve().parent
Values = Mapping[int, float]  # seed -> value


class Claim(NamedTuple):
  """``a - b`` over ``seeds`` (None: every seed both sides ran)."""

  label: str
  a: Values
  b: Values
  seeds: Sequence[int] | None = None
  digits: int = 4
  # The verdict when the interval excludes 0: (if a - b > 0, if a - b < 0).
  words: tuple[str, str] = ("A ahead", "B ahead")


def _json(path: Path) -> dict:
  with open(path) as f:
    return json.load(f)


def _by_seed(names: Mapping[str, float | None]) -> dict[str, dict[int, float]]:
  """``{"x_seed0": v, "x_seed1": w}`` -> ``{"x": {0: v, 1: w}}``."""
  out: dict[str, dict[int, float]] = {}
  for name, value in names.items():
    match = re.fullmatch(r"(.*)_seed(\d+)", name)
    if match and value is not None:
      out.setdefault(match.group(1), {})[int(match.group(2))] = value
  return out


def _acc(a: str, b: str, context: str) -> tuple[str, str, str]:
  return f"{a} - {b}, {context}", f"{a} ahead", f"{b} ahead"


def _claim(a_name: str, b_name: str, context: str, a: Values, b: Values, **kw) -> Claim:
  label, up, down = _acc(a_name, b_name, context)
  return Claim(label, a, b, words=(up, down), **kw)


# ------------------------------------------------------------------------------------------------
# ALADDIN: the recipe (results/recipe/runs.json)
# ------------------------------------------------------------------------------------------------


def aladdin_recipe() -> list[Claim]:
  runs = _json(ROOT / "aladdin" / "recipe" / "results" / "runs.json")
  acc: dict[tuple[str, str], dict[int, float]] = {}
  for r in runs.values():
    acc.setdefault((r["candidate"], r["cluster"]), {})[r["seed"]] = r["test_accuracy"]
  rec = "update_p4_a0.5"
  ho, he1, ar = acc[(rec, "HO")], acc[(rec, "HE1")], acc[("ar_sgd", "HO")]
  claims = [
    _claim("recipe", "AR-SGD", f"HO, seeds {s}", ho, ar, seeds=seeds)
    for s, seeds in (("0-2", range(3)), ("0-4", range(5)), ("5-14", range(5, 15)))
  ]
  claims += [
    _claim("recipe", "AR-SGD", "HO, seeds 0-14", ho, ar, seeds=range(15)),
    _claim("recipe", "AR-SGD", "HE1, seeds 0-14", he1, acc[("ar_sgd", "HE1")], seeds=range(15)),
    Claim("recipe HE1 - recipe HO, seeds 0-14", he1, ho, range(15), 4, ("HE1 ahead", "HO ahead")),
    Claim(
      "recipe HE1 - recipe HO, seeds 5-14", he1, ho, range(5, 15), 4, ("HE1 ahead", "HO ahead")
    ),
  ]
  # The selection among candidates (seeds 0-2, on the test accuracy that is then reported).
  for other in (
    "update_p4_count",
    "update_p4_npi",
    "update_p4_a0.3",
    "update_p4_a0.65",
    "update_p2_a0.5",
    "update_p6_a0.5",
    "update_p8_a0.5",
    "printed",
  ):
    claims.append(_claim("recipe", other, "HO, seeds 0-2", ho, acc[(other, "HO")], seeds=range(3)))
  claims.append(
    _claim("recipe", "update_p2_a0.5", "HE1, seeds 0-2", he1, acc[("update_p2_a0.5", "HE1")])
  )
  return claims + _recipe_on_validation()


def _recipe_on_validation() -> list[Claim]:
  """The pre-registered headlines of the re-choice on validation (final runs, test accuracy):
  the chosen recipe against AR-SGD and against the default, and HE1 against HO."""
  runs = _json(ROOT / "aladdin" / "recipe" / "results" / "validation" / "runs.json")
  acc: dict[tuple[str, str], dict[int, float]] = {}
  rate: dict[str, float] = {}
  for r in runs.values():
    cell = r["cell"]
    if cell["group"] == "final":
      acc.setdefault((cell["candidate"], cell["cluster"]), {})[cell["seed"]] = r["test_accuracy"]
      rate[cell["candidate"]] = cell["lr"]
  default = "update_p4_a0.5"
  # The default runs the final seeds too only when validation chose another recipe.
  chosen = next((c for c in rate if c not in ("ar_sgd", default)), default)
  name = {c: f"{'AR-SGD' if c == 'ar_sgd' else c} (lr {lr:g})" for c, lr in rate.items()}
  ar = acc[("ar_sgd", "HO")]  # AR-SGD's model does not depend on the cluster
  ten = range(10)
  claims = [
    _claim(name[chosen], name["ar_sgd"], f"{k}, seeds 0-9", acc[(chosen, k)], ar, seeds=ten)
    for k in ("HO", "HE1")
  ]
  claims.append(
    Claim(
      f"{name[chosen]} HE1 - HO, seeds 0-9",
      acc[(chosen, "HE1")],
      acc[(chosen, "HO")],
      ten,
      words=("HE1 ahead", "HO ahead"),
    )
  )
  if chosen != default:
    claims += [
      _claim(
        name[chosen],
        name[default],
        f"{k}, seeds 0-9",
        acc[(chosen, k)],
        acc[(default, k)],
        seeds=ten,
      )
      for k in ("HO", "HE1")
    ]
  return claims


# ------------------------------------------------------------------------------------------------
# ALADDIN: the first study (results/runs.json)
# ------------------------------------------------------------------------------------------------


def aladdin_reproduction() -> list[Claim]:
  runs = _json(ROOT / "aladdin" / "reproduction" / "results" / "runs.json")
  final: dict[str, dict[int, float]] = {}
  for name, r in runs.items():  # names hold "_seed<k>" in the middle: "aladdin_HO_seed0_p4_..."
    seed = r["spec"]["seed"]
    final.setdefault(name.replace(f"_seed{seed}", "", 1), {})[seed] = r["evals"][-1][
      "test_accuracy"
    ]

  def key(alg: str, cluster: str, rest: str = "") -> Values:
    return final[f"{alg}_{cluster}{rest}"]

  default = "_p4_mean_of_locals_momentum_acount"
  claims = [
    _claim("ALADDIN", "AR-SGD", "HO", key("aladdin", "HO", default), key("ar_sgd", "HO")),
    _claim("ALADDIN", "SGP", "HO", key("aladdin", "HO", default), key("sgp", "HO")),
  ]
  for cluster in ("HO", "HE1", "HE2"):
    claims.append(
      _claim("ALADDIN", "EASGD", cluster, key("aladdin", cluster, default), key("easgd", cluster))
    )
  local = {
    r["spec"]["seed"]: r["evals"][-1]["local_accuracy"]
    for name, r in runs.items()
    if name.startswith("aladdin_HO_seed") and name.endswith(default)
  }
  claims.append(
    _claim(
      "average of local models", "global model", "ALADDIN, HO", local, key("aladdin", "HO", default)
    )
  )
  he1 = key("aladdin", "HE1", default)
  claims += [
    _claim(
      "full", "L2", "HE1", he1, key("aladdin", "HE1", "_p1_mean_of_locals_momentum_a0.8232_r4")
    ),
    _claim("full", "L1", "HE1", he1, key("aladdin", "HE1", "_p4_mean_of_locals_momentum_a0.0")),
    _claim(
      "period 4",
      "period 2",
      "alpha count, HE1",
      he1,
      key("aladdin", "HE1", "_p2_mean_of_locals_momentum_acount"),
    ),
    _claim(
      "alpha 0.5",
      "alpha count",
      "lr 0.1, HE1",
      key("aladdin", "HE1", "_p4_mean_of_locals_momentum_a0.5"),
      he1,
    ),
    _claim(
      "alpha 0.5",
      "alpha count",
      "lr 0.05, HE1",
      key("aladdin", "HE1", "_lr0.05_p4_mean_of_locals_momentum_a0.5"),
      key("aladdin", "HE1", "_lr0.05_p4_mean_of_locals_momentum_acount"),
    ),
    _claim(
      "alpha count",
      "alpha n_pi",
      "lr 0.1, HE1",
      he1,
      key("aladdin", "HE1", "_p4_mean_of_locals_momentum_an_pi"),
    ),
    _claim(
      "momentum server",
      "plain SGD server",
      "alpha count, HE1",
      he1,
      key("aladdin", "HE1", "_p4_mean_of_locals_sgd_acount"),
    ),
  ]
  # The straggler: the local steps of the 7 fast workers at the same sample budget.
  steps = {}
  for cluster in ("HO", "HE1"):
    steps[cluster] = {
      r["spec"]["seed"]: sum(r["iterations"][1:]) / 7
      for name, r in runs.items()
      if name.startswith(f"aladdin_{cluster}_seed") and name.endswith(default)
    }
  claims.append(
    Claim(
      "local steps of a fast worker (1-7), HE1 - HO, ALADDIN",
      steps["HE1"],
      steps["HO"],
      digits=1,
      words=("more in HE1", "fewer in HE1"),
    )
  )
  return claims


# ------------------------------------------------------------------------------------------------
# AdamW (adamw_scaling/results/summary.json)
# ------------------------------------------------------------------------------------------------

ADAMW_LABELS = {
  "adam_lsw": "LSW",
  "adam_sqrt_lsw": "sqrt LSW",
  "lamb": "LAMB (seed-0 rate)",
  "lena": "LENA p=1",
  "lena_sqrt": "LENA p=1/2",
  "adascale": "AdaScale p=1",
  "adascale_sqrt": "AdaScale p=1/2",
  "lena_sa": "LENA p=1 + SA",
  "lena_sqrt_sa": "LENA p=1/2 + SA",
  "adascale_sa": "AdaScale p=1 + SA",
  "adascale_sqrt_sa": "AdaScale p=1/2 + SA",
  "adamw": "tuned AdamW",
  "malladi": "Malladi SDE rule",
  "malladi_b2": "Malladi, b1 kept (variant)",
  "lamb_val": "LAMB (validation rate)",
  "adamw_check": "AdamW (check-seed rate)",
}


# The study's questions, ``benchmarks.adamw_scaling.report.PAIRS`` (copied so that this module
# does not import JAX; the committed-tables test checks that the two agree).
ADAMW_PAIRS = (
  ("adam_sqrt_lsw", "adam_lsw"),
  ("lena", "lena_sqrt"),
  ("adascale", "adascale_sqrt"),
  ("lena_sa", "lena_sqrt_sa"),
  ("adascale_sa", "adascale_sqrt_sa"),
  ("lena", "adascale"),
  ("lena_sa", "lena"),
  ("adascale_sa", "adascale"),
  ("lena", "adam_sqrt_lsw"),
  ("lena", "lamb"),
)
# Every rule against AdamW with its rate tuned on validation at that S
# (``benchmarks.adamw_scaling.report.REFERENCE_RULES``; the committed-tables test checks them).
ADAMW_REFERENCE = "adamw"
ADAMW_REFERENCE_RULES = (
  "adam_sqrt_lsw",
  "adam_lsw",
  "adascale",
  "lena",
  "lamb",
  "lamb_val",
  "malladi",
  "malladi_b2",
  "adamw_check",
)


def adamw() -> list[Claim]:
  cells = _json(ROOT / "adamw_scaling" / "results" / "summary.json")["cells"]
  claims = []
  for s in (32, 128, 256):
    for a, b in ADAMW_PAIRS:
      va = dict(enumerate(cells[f"{a}/S{s}"]["final_accuracy"]))
      vb = dict(enumerate(cells[f"{b}/S{s}"]["final_accuracy"]))
      claims.append(_claim(ADAMW_LABELS[a], ADAMW_LABELS[b], f"S = {s}", va, vb))

  def by_seed(cell: dict) -> dict[int, float]:
    return dict(zip(cell["seeds"], cell["final_accuracy"], strict=True))

  for s in (32, 128, 256):
    reference = cells.get(f"{ADAMW_REFERENCE}/S{s}")
    for a in ADAMW_REFERENCE_RULES:
      if reference is None or f"{a}/S{s}" not in cells:
        continue  # not run (Malladi's rule is defined at S = 32 only)
      va, vb = by_seed(cells[f"{a}/S{s}"]), by_seed(reference)
      claims.append(_claim(ADAMW_LABELS[a], ADAMW_LABELS[ADAMW_REFERENCE], f"S = {s}", va, vb))
  # Malladi's rule differs from the square-root LSW in the betas and eps only: what they add.
  for s in (32, 128, 256):
    for a in ("malladi", "malladi_b2"):
      if f"{a}/S{s}" in cells:
        va, vb = by_seed(cells[f"{a}/S{s}"]), by_seed(cells[f"adam_sqrt_lsw/S{s}"])
        claims.append(_claim(ADAMW_LABELS[a], ADAMW_LABELS["adam_sqrt_lsw"], f"S = {s}", va, vb))
  return claims


# ------------------------------------------------------------------------------------------------
# LENA: ResNet1D and CNN (large_batch_*/results/summary.json)
# ------------------------------------------------------------------------------------------------


def _lena_runs(study: str, what: str = "acc") -> dict[str, dict[int, float]]:
  runs = _json(ROOT / study / "results" / "summary.json")["runs"]
  if what == "acc":
    return _by_seed({n: r["final_accuracy"] for n, r in runs.items()})
  return _by_seed({n: (r["reach"] or {}).get("iterations") for n, r in runs.items()})


def resnet() -> list[Claim]:
  acc, its = _lena_runs("large_batch_resnet"), _lena_runs("large_batch_resnet", "iterations")
  claims = []
  for s in (128, 256):
    lena = acc[f"lena_s{s}_state_aware"]
    for other, label in (
      (f"adascale_s{s}_none", "AdaScale (none)"),
      (f"linear_scaling_s{s}_fixed", "LSW (fixed)"),
    ):
      claims.append(_claim("LENA (SA)", label, f"S = {s}", lena, acc[other]))
    claims += [
      _claim("AdaScale (SA)", "LENA (SA)", f"S = {s}", acc[f"adascale_s{s}_state_aware"], lena),
      _claim("LENA (none)", "LENA (SA)", f"S = {s}", acc[f"lena_s{s}_none"], lena),
      _claim(
        "AdaScale (SA)",
        "AdaScale (none)",
        f"S = {s}",
        acc[f"adascale_s{s}_state_aware"],
        acc[f"adascale_s{s}_none"],
      ),
      _claim(
        "LENA relative_to_max", "LENA (SA)", f"S = {s}", acc[f"lena_relmax_s{s}_state_aware"], lena
      ),
      _claim(
        "LENA relative_to_mean",
        "LENA (SA)",
        f"S = {s}",
        acc[f"lena_relmean_s{s}_state_aware"],
        lena,
      ),
    ]
  claims.append(
    _claim(
      "LENA (fixed)", "LENA (SA)", "S = 256", acc["lena_s256_fixed"], acc["lena_s256_state_aware"]
    )
  )
  lars = {128: "lars_s128_fixed_lr30", 256: "lars_s256_fixed_lr10"}
  lamb = {128: "lamb_s128_fixed_lr0.1", 256: "lamb_s256_fixed_lr0.1"}
  for s in (128, 256):
    lena = acc[f"lena_s{s}_state_aware"]
    claims.append(_claim("LARS (seed-0 rate)", "LENA (SA)", f"S = {s}", acc[lars[s]], lena))
    claims.append(_claim("LAMB (seed-0 rate)", "LENA (SA)", f"S = {s}", acc[lamb[s]], lena))
  # Same protocol for LENA: its eta0 picked on seed 0 (0.0125 of 0.00625-0.1), as LARS/LAMB's.
  tuned = acc["lena_s256_none_lr0.0125"]
  claims += [
    _claim("LARS (seed-0 rate)", "LENA none (seed-0 eta0)", "S = 256", acc[lars[256]], tuned),
    _claim("LAMB (seed-0 rate)", "LENA none (seed-0 eta0)", "S = 256", acc[lamb[256]], tuned),
    _claim("LENA none eta0 0.0125", "LENA none eta0 0.05", "S = 256", tuned, acc["lena_s256_none"]),
    _claim(
      "LENA none eta0 0.0125",
      "AdaScale (SA) eta0 0.0125",
      "S = 256",
      tuned,
      acc["adascale_s256_state_aware_lr0.0125"],
    ),
  ]
  claims += _resnet_equal_tuning()
  for s in (8, 32):
    lena = its[f"lena_s{s}_state_aware"]
    for other, label in (
      (f"adascale_s{s}_none", "AdaScale (none)"),
      (f"linear_scaling_s{s}_fixed", "LSW (fixed)"),
      (f"adascale_s{s}_state_aware", "AdaScale (SA)"),
    ):
      claims.append(
        Claim(
          f"LENA (SA) - {label}, updates to target, S = {s}",
          lena,
          its[other],
          digits=1,
          words=(f"{label} first", "LENA (SA) first"),
        )
      )
  return claims


def _resnet_equal_tuning() -> list[Claim]:
  """Test accuracy at each method's rate chosen on the validation draw (the ResNet1D study's
  equal-tuning setup)."""
  path = ROOT / "large_batch_resnet" / "results" / "equal_tuning" / "summary.json"
  if not path.exists():
    return []
  summary = _json(path)
  ms, context = summary["methods"], f"S = {summary['scale']}, equal tuning"
  claims = []
  for a, b in summary["pairs"]:
    va, vb = ({int(k): f["test_accuracy"] for k, f in ms[m]["final"].items()} for m in (a, b))
    if set(va) & set(vb):
      claims.append(_claim(ms[a]["label"], ms[b]["label"], context, va, vb))
  return claims


def cnn() -> list[Claim]:
  acc = _lena_runs("large_batch_cnn")
  claims = [
    _claim(
      "LENA (SA)",
      "AdaScale (none)",
      f"S = {s}",
      acc[f"lena_s{s}_state_aware"],
      acc[f"adascale_s{s}_none"],
    )
    for s in (8, 16, 32, 64, 128)
  ]
  lena = acc["lena_s128_state_aware"]
  claims += [
    _claim("LENA (none)", "LENA (SA)", "S = 128", acc["lena_s128_none"], lena),
    _claim(
      "LENA (none)", "AdaScale (none)", "S = 128", acc["lena_s128_none"], acc["adascale_s128_none"]
    ),
    _claim("LENA alpha 1%", "LENA alpha 5%", "SA, S = 128", acc["lena_s128_state_aware_a1"], lena),
    _claim(
      "LENA per module",
      "LENA per leaf",
      "none, S = 128",
      acc["lena_s128_none_module"],
      acc["lena_s128_none"],
    ),
    _claim(
      "AdaScale (SA)",
      "AdaScale (none)",
      "S = 128",
      acc["adascale_s128_state_aware"],
      acc["adascale_s128_none"],
    ),
  ]
  return claims


# ------------------------------------------------------------------------------------------------
# Tables
# ------------------------------------------------------------------------------------------------

STUDIES: dict[str, tuple[str, Callable[[], list[Claim]]]] = {
  "aladdin_recipe": ("aladdin/recipe/RESULTS.md", aladdin_recipe),
  "aladdin_reproduction": ("aladdin/reproduction/RESULTS.md", aladdin_reproduction),
  "adamw": ("adamw_scaling/RESULTS.md", adamw),
  "resnet": ("large_batch_resnet/RESULTS.md", resnet),
  "cnn": ("large_batch_cnn/RESULTS.md", cnn),
}


def evaluate(claim: Claim) -> Paired:
  return paired_by_seed(claim.a, claim.b, None if claim.seeds is None else list(claim.seeds))


def render(study: str) -> str:
  """The markdown table of one study's claims (what its RESULTS file carries verbatim)."""
  rows = []
  for claim in STUDIES[study][1]():
    p = evaluate(claim)
    rows.append([*p.row(claim.label, claim.digits), p.verdict(*claim.words)])
  header = ["claim (A - B)", "seeds", "mean", "95% interval (t, n-1 dof)", "seeds A > B", "verdict"]
  return harness.markdown_table(header, rows)


def main(argv: Sequence[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("studies", nargs="*", help=f"any of {', '.join(STUDIES)} (default: all)")
  args = parser.parse_args(argv)
  unknown = [name for name in args.studies if name not in STUDIES]
  if unknown:
    parser.error(f"unknown studies {unknown}; choose from {list(STUDIES)}.")
  names = args.studies or list(STUDIES)
  text = "\n\n".join(f"{name} ({STUDIES[name][0]}):\n\n{render(name)}" for name in names)
  print(text)
  return text


if __name__ == "__main__":
  main()
