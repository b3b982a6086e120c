# hlotune: all set-up happens here; `make demo` and `make test` work on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,db]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python -m hlotune.demo

lint: install
	$(BIN)/ruff check hlotune tests benchmarks
	$(BIN)/lint-imports

test: install lint
	$(BIN)/python -m pytest -q -x --durations=15 tests

bench: install
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
