VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: serve test lint bench torture long clean

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
	$(VENV)/bin/lint-imports

test: lint
	$(VENV)/bin/pytest -q

# the long campaigns: 200 kills, 120 fault runs + 10 full-disk episodes, 2,000+ fuzz
# cases and 2,000 cases per parser (about 30 minutes on two cores); figures at the end
torture: $(VENV)/.dev
	LMSP_CAMPAIGN=long $(VENV)/bin/pytest -q --timeout 5400 tests/campaigns

# what `make test` leaves out: Claude Code reading its ~21k-token prompt (about 6 minutes)
# with the bundled model at a 32k context (tests marked `long`)
long: $(VENV)/.dev
	$(VENV)/bin/pytest -q -m long --timeout 5400

bench: $(VENV)/.dev
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
