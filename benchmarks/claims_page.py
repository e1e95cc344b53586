"""The results page: every paired claim of the studies, its verdict computed from its interval.

``docs/claims.md`` is generated here from the committed JSON and nothing else: the claims of
``benchmarks.claims`` (the tables the RESULTS files carry) and those of the studies whose
RESULTS condense their own tables (the batch ramps, the ALADDIN baselines and outer
optimizers). Each claim belongs to one family, the comparisons that answer one question of its
study; the page gives, beside each claim's 95% interval and verdict, the family's size m and
the Bonferroni interval (each at confidence 1 - 0.05 / m, so that all m hold together with
probability at least 95%) with the verdict it gives. Nothing on the page is written by hand
but the families' titles and how their configurations were selected.

Usage::

  python -m benchmarks.claims_page --write docs/claims.md   # tests/docs checks it is current
  python -m benchmarks.claims_page                          # print it
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from benchmarks import claims, harness
from benchmarks.claims import Claim
from benchmarks.paired_intervals import Paired, paired_by_seed

ROOT = Path(__file__).resolve().parent
CONFIDENCE = 0.95
# How a difference is shown: (scale, digits, unit).
UNITS = {
  "points": (100.0, 2, "points"),  # accuracy, a fraction shown in points
  "percent": (100.0, 1, "%"),  # a fraction saved, shown in percent
  "updates": (1.0, 1, "updates"),
  "steps": (1.0, 1, "steps"),
}


class Family(NamedTuple):
  """The claims of a study whose label matches ``pattern``: one question, m comparisons."""

  title: str
  pattern: str
  # How the compared configurations were chosen, and on which data (the "selected on" column).
  selection: str
  better: int = 1  # +1: a higher value is better, -1: lower is better, 0: no better side
  unit: str = "points"
  # (label pattern, selection) for the claims of the family selected otherwise.
  overrides: tuple[tuple[str, str], ...] = ()

  def selection_of(self, label: str) -> str:
    return next((s for p, s in self.overrides if re.search(p, label)), self.selection)


class Study(NamedTuple):
  title: str
  results: str  # the RESULTS file, relative to benchmarks/
  claims: Callable[[], list[Claim]]
  families: tuple[Family, ...]


def _runs(path: str) -> dict:
  with open(ROOT / path) as f:
    return json.load(f)


def _acc_claim(label: str, a: dict[int, float], b: dict[int, float]) -> Claim:
  return Claim(label, a, b)


# ------------------------------------------------------------------------------------------------
# The studies whose RESULTS carry their own tables: their claims, from their JSON
# ------------------------------------------------------------------------------------------------

RAMP_ARMS = ("steps", "noise", "seesaw")


def batch_ramp() -> list[Claim]:
  out = []
  for model, path in (("CNN", "summary.json"), ("attention", "attention/summary.json")):
    runs = _runs(f"batch_ramp/results/{path}")["runs"].values()

    def by_seed(arm: str, key: str, runs=runs) -> dict[int, float]:
      return {r["seed"]: r[key] for r in runs if r["arm"] == arm and r[key] is not None}

    def acc_claim(arm: str, against: str, model=model, by_seed=by_seed) -> Claim:
      a, b = by_seed(arm, "test_accuracy"), by_seed(against, "test_accuracy")
      return Claim(f"{model}: {arm} - {against}, test accuracy", a, b)

    out += [acc_claim(arm, "small") for arm in (*RAMP_ARMS, "large")]
    out += [acc_claim(arm, "large") for arm in RAMP_ARMS]
    small = by_seed("small", "updates_to_target")
    for arm in RAMP_ARMS:
      a = by_seed(arm, "updates_to_target")
      saved = {s: 1.0 - a[s] / small[s] for s in sorted(set(a) & set(small))}
      zero = dict.fromkeys(saved, 0.0)  # a fraction saved is already a difference
      out.append(Claim(f"{model}: {arm}, updates to the target saved against small", saved, zero))
  return out


# The studies' labels (``benchmarks.aladdin.*.grid.LABELS``), copied so that this module imports
# no JAX; tests/docs/test_site.py checks that they agree.
OUTER_LABELS = {
  "ar_sgd": "AR-SGD",
  "plain": "ALADDIN-plain",
  "nesterov": "ALADDIN-Nesterov",
  "delayed_nesterov": "ALADDIN-delayed-Nesterov",
  "nesterov_gain1": "ALADDIN-Nesterov-0.1 (post hoc)",
}
BASELINE_LABELS = {
  "ar_sgd": "AR-SGD",
  "aladdin": "ALADDIN",
  "sgp": "SGP",
  "easgd": "EASGD",
  "asp_momentum": "ASP (momentum 0.9 server)",
  "asp_plain": "ASP (plain SGD server)",
}
CLUSTERS = ("HO", "HE1", "HE2")


def _final_accuracy(runs: dict, method: str, cluster: str, epochs: int | None = None) -> dict:
  """seed -> test accuracy of the final runs; AR-SGD's HO runs stand for every cluster (its
  model does not depend on the cluster, which both studies check on seed 0)."""
  where = "HO" if method == "ar_sgd" else cluster
  return {
    r["cell"]["seed"]: r["test_accuracy"]
    for r in runs.values()
    if r["cell"]["group"] == "final"
    and r["cell"]["method"] == method
    and r["cell"]["cluster"] == where
    and (epochs is None or r["cell"]["epochs"] == epochs)
  }


def outer_optimizer() -> list[Claim]:
  runs = _runs("aladdin/outer_optimizer/results/runs.json")
  acc = lambda method, cluster: _final_accuracy(runs, method, cluster)
  out = []
  for cluster in CLUSTERS:
    for method in ("plain", "nesterov", "delayed_nesterov", "nesterov_gain1"):
      for against in ("ar_sgd", "plain"):
        if method != against:
          label = f"{OUTER_LABELS[method]} - {OUTER_LABELS[against]}, {cluster}"
          out.append(_acc_claim(label, acc(method, cluster), acc(against, cluster)))
  for method in ("plain", "delayed_nesterov"):
    for cluster in CLUSTERS[1:]:
      label = f"{OUTER_LABELS[method]}, {cluster} - HO"
      out.append(_acc_claim(label, acc(method, cluster), acc(method, "HO")))
  return out


def baselines() -> list[Claim]:
  runs = _runs("aladdin/baselines/results/runs.json")
  out = []
  for epochs in (15, 45):
    for cluster in CLUSTERS:
      for method in ("aladdin", "sgp", "easgd", "asp_momentum", "asp_plain"):
        a = _final_accuracy(runs, method, cluster, epochs)
        b = _final_accuracy(runs, "ar_sgd", cluster, epochs)
        label = f"{BASELINE_LABELS[method]} - AR-SGD, {cluster}, {epochs} epochs"
        out.append(_acc_claim(label, a, b))
  return out


# ------------------------------------------------------------------------------------------------
# The families, and how each one's configurations were selected
# ------------------------------------------------------------------------------------------------

FIXED = "none: every configuration fixed in advance"
RECIPE_TEST = "test accuracy of seeds 0-2 (the recipe was chosen on it)"
LAMB_SEED0 = "LAMB's rate: seed 0's test accuracy"

STUDIES: dict[str, Study] = {
  "recipe": Study(
    "ALADDIN: the recipe",
    "aladdin/recipe/RESULTS.md",
    claims.aladdin_recipe,
    (
      Family("The recipe against AR-SGD (rate 0.1 for both)", r"^recipe - AR-SGD", RECIPE_TEST),
      Family("The recipe on HE1 against HO", r"^recipe HE1 - recipe HO", RECIPE_TEST),
      Family(
        "The selection among the candidates (seeds 0-2)",
        r"^recipe - (update|printed)",
        "test accuracy of these seeds: the numbers the choice was made on",
      ),
      Family(
        "The choice re-made on a validation split (fresh seeds 0-9)",
        r"\(lr 0\.2\)",
        "validation split (tuning seeds 100-101): every rate and the recipe",
      ),
    ),
  ),
  "baselines": Study(
    "ALADDIN against its baselines",
    "aladdin/baselines/RESULTS.md",
    baselines,
    tuple(
      Family(
        f"Every method against AR-SGD, {epochs} epochs",
        rf", {epochs} epochs$",
        "validation split (seeds 100-101): each method's rate; ALADDIN's options are the recipe "
        "(chosen on test accuracy), SGP's and EASGD's their defaults",
      )
      for epochs in (15, 45)
    ),
  ),
  "outer_optimizer": Study(
    "ALADDIN's server as an outer optimizer",
    "aladdin/outer_optimizer/RESULTS.md",
    outer_optimizer,
    (
      Family(
        "The pre-registered comparisons",
        r"^ALADDIN-(plain|Nesterov|delayed-Nesterov) - ",
        "validation split (seeds 100-101): the workers' rate of each method",
      ),
      Family(
        "The post-hoc server (chosen after seeing the data)",
        r"post hoc\) - ",
        "validation split for its rate; the method itself chosen after seeing data",
      ),
      Family(
        "The same variant on HE1 / HE2 against HO (not pre-registered)",
        r", HE\d - HO$",
        "validation split (seeds 100-101): the workers' rate",
      ),
    ),
  ),
  "reproduction": Study(
    "ALADDIN: the first reproduction study",
    "aladdin/reproduction/RESULTS.md",
    claims.aladdin_reproduction,
    (
      Family(
        "ALADDIN (gradient messages) against the baselines",
        r"^ALADDIN - ",
        "AR-SGD's rate: test accuracy of one seed on HE1 (validation chooses the same); the "
        "others fixed at 0.1",
      ),
      Family(
        "The average of the local models against the global model",
        r"^average of local models",
        FIXED,
      ),
      Family(
        "Ablations on HE1",
        r"HE1$",
        "fixed grid at rate 0.1 (0.05 where stated)",
      ),
      Family("The straggler's effect on the fast workers", r"^local steps", FIXED, 0, "steps"),
    ),
  ),
  "cnn": Study(
    "LENA: large-batch reproduction on MNIST-1D (CNN)",
    "large_batch_cnn/RESULTS.md",
    claims.cnn,
    (
      Family(
        "LENA (SA) against AdaScale (none) at each S",
        r"^LENA \(SA\) - AdaScale \(none\)",
        "none: the single worker's eta0 at every S",
      ),
      Family("Ablations at S = 128", r"S = 128$", "none: the single worker's eta0 at every S"),
    ),
  ),
  "resnet": Study(
    "LENA: a deep BatchNorm network (ResNet1D)",
    "large_batch_resnet/RESULTS.md",
    claims.resnet,
    (
      Family(
        "Equal tuning at S = 256",
        r"equal tuning$",
        "validation draw (seed 100): every method's rate from the same five-rate sweep",
      ),
      Family(
        "Updates to the target",
        r"updates to target",
        "none: the single worker's eta0",
        -1,
        "updates",
      ),
      Family(
        "LARS, LAMB and LENA's eta0 picked on seed 0",
        r"(LARS|LAMB|eta0)",
        "seed 0's test accuracy (LARS's and LAMB's rates, LENA's eta0 0.0125)",
      ),
      Family(
        "The rules and warm-ups at S = 128 and 256",
        r"S = (128|256)$",
        "none: the single worker's eta0 at every S",
      ),
    ),
  ),
  "adamw": Study(
    "AdamW at large batch",
    "adamw_scaling/RESULTS.md",
    claims.adamw,
    (
      Family(
        "Every rule against tuned AdamW",
        r" - tuned AdamW, ",
        "AdamW's rate: validation set (seed 100); the rules: none (the S = 8 rate)",
        overrides=(
          (r"^LAMB \(seed-0", LAMB_SEED0),
          (r"^LAMB \(validation", "LAMB's rate: validation set (seed 100)"),
        ),
      ),
      Family(
        "Malladi's rule against the square-root LSW",
        r"^Malladi.* - sqrt LSW",
        "none: fixed rules",
      ),
      Family(
        "The rules against each other",
        r".",
        "none: the rules at AdamW's S = 8 rate",
        overrides=((r"LAMB", LAMB_SEED0),),
      ),
    ),
  ),
  "batch_ramp": Study(
    "Batch ramps",
    "batch_ramp/RESULTS.md",
    batch_ramp,
    tuple(
      family
      for model, target in (("CNN", "0.92"), ("attention", "0.82"))
      for family in (
        Family(f"{model}: test accuracy against small S", rf"^{model}: .* - small, test", FIXED),
        Family(f"{model}: test accuracy against large S", rf"^{model}: .* - large, test", FIXED),
        Family(
          f"{model}: updates to the validation target saved against small S",
          rf"^{model}: .*updates to the target",
          f"none (the target, {target} validation accuracy, fixed from a pilot seed)",
          1,
          "percent",
        ),
      )
    ),
  ),
}


def families(study: Study) -> list[tuple[Family, list[Claim]]]:
  """The study's claims by family (each claim in the first family whose pattern it matches)."""
  grouped: dict[int, list[Claim]] = {}
  for claim in study.claims():
    matches = [i for i, f in enumerate(study.families) if re.search(f.pattern, claim.label)]
    if not matches:
      raise ValueError(f"{study.title}: the claim {claim.label!r} is in no family")
    grouped.setdefault(matches[0], []).append(claim)
  return [(study.families[i], grouped[i]) for i in sorted(grouped)]


# ------------------------------------------------------------------------------------------------
# The page
# ------------------------------------------------------------------------------------------------


def verdict(p: Paired, better: int) -> str:
  """The verdict of an interval: "ahead" / "behind" (A against B, by the family's better side)
  when it excludes 0, else "not distinguishable"; "higher" / "lower" where no side is better."""
  if p.n < 2:
    return "one seed: no interval"
  if not p.distinguishable:
    return "not distinguishable"
  if better == 0:
    return "higher" if p.mean > 0 else "lower"
  return "ahead" if (p.mean > 0) == (better > 0) else "behind"


def seed_list(seeds: Sequence[int]) -> str:
  """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
  runs: list[list[int]] = []
  for s in sorted(seeds):
    if runs and s == runs[-1][-1] + 1:
      runs[-1].append(s)
    else:
      runs.append([s])
  return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _interval(p: Paired, scale: float, digits: int) -> str:
  if p.n < 2:
    return "—"
  return f"[{p.low * scale:+.{digits}f}, {p.high * scale:+.{digits}f}]"


def family_table(family: Family, members: list[Claim]) -> str:
  """The family's table; a "selected on" column where its claims were selected differently."""
  scale, digits, unit = UNITS[family.unit]
  m = len(members)
  per_claim = len({family.selection_of(c.label) for c in members}) > 1
  rows = []
  for claim in members:
    seeds = None if claim.seeds is None else list(claim.seeds)
    chosen = sorted(set(claim.a) & set(claim.b)) if seeds is None else seeds
    p = paired_by_seed(claim.a, claim.b, seeds, CONFIDENCE)
    adjusted = paired_by_seed(claim.a, claim.b, seeds, 1.0 - (1.0 - CONFIDENCE) / m)
    rows.append(
      [
        claim.label,
        f"{len(chosen)} ({seed_list(chosen)})",
        *([family.selection_of(claim.label)] if per_claim else []),
        f"{p.mean * scale:+.{digits}f}",
        _interval(p, scale, digits),
        verdict(p, family.better),
        _interval(adjusted, scale, digits),
        verdict(adjusted, family.better),
      ]
    )
  header = [
    "claim (A - B)",
    "seeds",
    *(["selected on"] if per_claim else []),
    f"mean ({unit})",
    "95% interval",
    "verdict",
    f"Bonferroni interval (m = {m})",
    "verdict, family of m",
  ]
  return harness.markdown_table(header, rows)


def _comparisons(m: int) -> str:
  return f"{m} comparison{'s' if m > 1 else ''}"


BETTER = {1: "higher is better", -1: "fewer is better", 0: "neither side is better"}

INTRO = """# Claims and verdicts

Every comparison that the studies' RESULTS files make between two methods or settings, paired
by seed and recomputed from the committed JSON. This page is generated: `python -m
benchmarks.claims_page --write docs/claims.md` writes it, and a test fails when the committed
page differs from what the JSON gives. The README, the guides and the algorithm pages state no
verdict of their own; they link here.

How to read a row:

- **claim (A - B)**: the difference of a measure (test accuracy unless the family says
  otherwise) between A and B on the same seeds (a seed fixes the initialisation and the data
  order; `benchmarks/paired_intervals.py`).
- **seeds**: how many seeds the pair has, and which.
- **selected on**: how the compared configurations (rates, options, the method itself) were
  chosen, and on which data. A choice made on the test accuracy that is then reported favours
  the chosen configuration; such rows say so.
- **95% interval**: the Student-t interval of the mean difference, n - 1 degrees of freedom.
  **verdict**: "ahead" when the interval lies above 0 on the better side (A better than B),
  "behind" when it lies on the worse side, "not distinguishable" when it contains 0; "higher" /
  "lower" where neither side is better. One seed gives no interval.
- **Multiplicity.** Each claim belongs to a family of m comparisons that answer one question of
  its study (m is in the table's header). The **Bonferroni interval** is the same interval at
  confidence 1 - 0.05 / m, so that all m intervals of a family hold together with probability at
  least 95%; its verdict is the family-wise one. Where the two verdicts differ, the claim is one
  of many comparisons and the 95% verdict alone overstates it.

Studies without paired comparisons between methods (the timings of `overhead`, `multihost`,
`aladdin/receive_cost`, `aladdin/call_cost`, `aladdin/ray_efficiency` and
`aladdin/ray_stragglers`, the estimates of `critical_batch`, CI's time) have no rows here: their
RESULTS files report measurements, not verdicts.
"""


def render() -> str:
  """The Markdown of ``docs/claims.md``."""
  parts = [INTRO]
  total = 0
  count = 0
  for study in STUDIES.values():
    link = f"studies/{study.results.removesuffix('.md')}"
    parts.append(f"## {study.title}\n\nFrom [`benchmarks/{study.results}`]({link}.md).")
    for family, members in families(study):
      unit = UNITS[family.unit][2]
      selection = "see the table" if family.overrides else family.selection
      parts.append(
        f"### {family.title}\n\nm = {_comparisons(len(members))}; measure in {unit}, "
        f"{BETTER[family.better]}; selected on: {selection}.\n\n{family_table(family, members)}"
      )
      total += len(members)
      count += 1
  parts.insert(1, f"{total} claims in {count} families, from {len(STUDIES)} studies.")
  return "\n\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> str:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--write", type=Path, help="write the page there (e.g. docs/claims.md)")
  args = parser.parse_args(argv)
  text = render()
  if args.write is None:
    print(text, end="")
  else:
    args.write.write_text(text)
  return text


if __name__ == "__main__":
  main()
