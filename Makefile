# Two commands for a newcomer: `make demo` (the main job) and `make test` (the tests).
# Each creates the virtualenv in .venv on first use.

PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
BFCL = bfcl-eval==2026.3.23
# The official MCP conformance suite (npm) that tests/test_mcp_conformance.py runs.
CONFORMANCE = @modelcontextprotocol/conformance@0.1.10
CONFORMANCE_DIR = .mcp-conformance

.PHONY: demo test lint docs install clean

# BFCL's declared dependencies serve its model handlers, which rho_actors does not use;
# its eight multi-turn backends need only mpmath (the `bfcl` extra): hence --no-deps.
$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev,bfcl]'
	$(BIN)/python -m pip install --quiet --no-deps $(BFCL)
	touch $@

# Installed when npm is on PATH (Node 20+); without it, or when the install fails, the
# conformance test is skipped, saying why, and nothing else changes.
$(CONFORMANCE_DIR)/.installed: Makefile
	@if command -v npm >/dev/null 2>&1; then \
		if npm install --prefix $(CONFORMANCE_DIR) --no-audit --no-fund --loglevel=error $(CONFORMANCE); \
		then touch $@; \
		else echo "warning: npm could not install $(CONFORMANCE): tests/test_mcp_conformance.py will be skipped"; fi; \
	else echo "npm is not on PATH: tests/test_mcp_conformance.py will be skipped (it needs Node 20+)"; fi

install: $(VENV)/.installed $(CONFORMANCE_DIR)/.installed

demo: $(VENV)/.installed
	$(BIN)/rho-actors replay bfcl --category base

test: $(VENV)/.installed $(CONFORMANCE_DIR)/.installed
	$(BIN)/python -m pytest

# The documentation site, into site/: a broken link, anchor or docstring reference fails it.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info $(CONFORMANCE_DIR) site
