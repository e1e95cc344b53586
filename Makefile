# Fresh machine: `make demo` installs and runs the main job, `make test` installs and runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_WORKERS ?= 2

.PHONY: install test lint typecheck format docs demo clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install -q -e '.[dev,examples,docs]'
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(VENV)/bin/ruff check optax_lena tests examples benchmarks

typecheck: install
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff format .

# --max-worker-restart=0: a worker that crashes fails the run; with loadgroup, pytest-xdist 3.8
# would otherwise restart it and then wait forever for its tests.
PYTEST := $(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadgroup --max-worker-restart=0 -q

# The documentation site, from scratch (an incremental build would not repeat the warnings of
# unchanged pages), with warnings as errors; open docs/_build/html/index.html.
docs: install
	rm -rf docs/_build
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

test: install typecheck docs
	$(VENV)/bin/ruff check optax_lena tests examples benchmarks
	$(VENV)/bin/ruff format --check .
	$(PYTEST) -m "not slow and not ray" tests
	$(PYTEST) -m "ray and not slow" tests

demo: install
	$(PY) -m examples.demo

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info docs/_build docs/studies
