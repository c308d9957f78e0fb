"""The test suite (tests/conftest.py holds its shared fixtures and time bounds).

Bytecode is cached during a test run even where ``PYTHONDONTWRITEBYTECODE`` is set:
otherwise every xdist worker rewrites and compiles the ~150 test modules again at each
collection (8 s of CPU a worker), and every child process compiles the rho_actors
modules it imports (0.1-0.3 s each, hundreds of them a run). The caches go to the
git-ignored ``__pycache__`` folders."""

import sys

sys.dont_write_bytecode = False
