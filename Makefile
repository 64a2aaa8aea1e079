VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: serve test lint bench clean

$(VENV)/.base: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.dev: $(VENV)/.base
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

serve: $(VENV)/.base
	$(VENV)/bin/lmsp serve

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy

test: lint
	$(VENV)/bin/pytest -q

bench: $(VENV)/.dev
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
