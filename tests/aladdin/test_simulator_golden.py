"""The simulator gives exactly the events and numbers recorded before its restructuring."""

import json

import pytest

from tests.aladdin import simulator_cases as cases

GOLDEN = json.loads(cases.GOLDEN.read_text())


@pytest.fixture(scope="module")
def problem():
  return cases.tiny_problem()


@pytest.mark.parametrize("name", sorted(cases.timing_cases()))
def test_timing_run_is_unchanged(name):
  assert cases.run_timing(name) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(cases.training_cases()))
def test_training_run_is_unchanged(problem, name):
  # Equal as floats (so -0.0 == 0.0: ASP and EASGD now adopt the server's answer through
  # worker_merge with weight 1, which can turn a zero's sign, and nothing else).
  assert cases.run_training(name, problem) == GOLDEN[name]
