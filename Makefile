# Two commands for a newcomer: `make demo` (the main job) and `make test` (the tests).
# Each creates the virtualenv in .venv on first use.

PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
BFCL = bfcl-eval==2026.3.23

.PHONY: demo test lint install clean

# BFCL's declared dependencies serve its model handlers, which rho_actors does not use;
# its eight multi-turn backends need only mpmath (the `bfcl` extra): hence --no-deps.
$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev,bfcl]'
	$(BIN)/python -m pip install --quiet --no-deps $(BFCL)
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/rho-actors replay bfcl --category base

test: $(VENV)/.installed
	$(BIN)/python -m pytest

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info
