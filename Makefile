# hlotune: all set-up happens here; `make demo` and `make test` work on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench bench-env clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,db,search,distributed]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python -m hlotune.demo

lint: install
	$(BIN)/ruff check hlotune tests benchmarks
	$(BIN)/lint-imports

test: install lint
	$(BIN)/python -m pytest -q -x --durations=15 tests

# the benchmark's side environment: JAX (CPU) to measure XLA in the same run; never a dependency of hlotune
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.installed:
	$(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install -q 'jax==0.10.2' 'jaxlib==0.10.2' numpy
	touch $@

bench-env: $(BENCH_VENV)/.installed

bench: install bench-env
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) $(BENCH_VENV) build *.egg-info .pytest_cache
