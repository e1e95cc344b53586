"""The aliases' docstrings are complete once the shared Args entries are filled in, and every
option an alias takes reaches its rule or its optimizer."""

from __future__ import annotations

import inspect
import re

import pytest

import optax_lena as ol

ALIASES = (
  ol.lena,
  ol.adascale,
  ol.linear_scaling,
  ol.large_batch_adamw,
  ol.lena_adamw,
  ol.adascale_adamw,
  ol.linear_scaling_adamw,
)


@pytest.mark.parametrize("alias", ALIASES, ids=lambda f: f.__name__)
def test_every_argument_is_documented_once(alias):
  doc = inspect.getdoc(alias)
  assert doc is not None and "{" not in doc.split("Returns:")[0], doc
  args = doc.split("Args:\n")[1].split("\n\n")[0]
  documented = re.findall(r"^  (\w+): ", args, flags=re.MULTILINE)
  assert documented == sorted(set(documented), key=documented.index)  # no entry twice
  assert set(documented) == set(inspect.signature(alias).parameters)


def test_an_option_neither_the_rule_nor_the_optimizer_takes_is_refused():
  from optax_lena._src import alias, gain_ratio

  with pytest.raises(TypeError, match="nonsense"):
    alias.with_rule(
      gain_ratio.lena_rule, alias.large_batch_sgd, {"learning_rate": 0.1, "nonsense": 1}
    )
