"""The frameworks' own tool-executor test suites, run twice: as they are (the framework's
own executor) and with rho's adapter swapped in (a pytest plugin beside this file,
``swap_<framework>.py``). Prints, per suite, how many of the tests that pass as they
are still pass swapped (DESIGN §6c: the goal is 95 % or more) and names each one that
does not.

    python -m tests.frameworks.run [langgraph ...] [--swapped-only] [-k EXPR] [-n N]

The suites are vendored under ``upstream/`` (each with its licence and UPSTREAM.md).
Their pytest plugins (pytest-asyncio and the like: ``requirements.txt``) are installed
by ``make test-frameworks`` into ``.upstream-plugins`` (git-ignored), kept out of the
project's own venv so its suite runs without them. Exit status 1 when a suite is under
the goal.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PLUGINS = ROOT / ".upstream-plugins"
GOAL = 0.95


@dataclass(frozen=True)
class Suite:
    """A vendored suite: its folder under ``upstream/``, the test files it runs and the
    swap plugin's module name."""

    folder: str
    paths: tuple[str, ...]
    plugin: str


SUITES: dict[str, Suite] = {
    "langgraph": Suite("langgraph", (
        "tests/test_tool_node.py", "tests/test_on_tool_call.py", "tests/test_injected_state_not_required.py",
        "tests/test_tool_node_interceptor_unregistered.py", "tests/test_tool_node_validation_error_filtering.py",
        "tests/test_react_agent.py", "tests/test_tool_call_transformer.py",
    ), "swap_langgraph"),
    "openai_agents": Suite("openai_agents", (
        "tests/test_function_tool.py", "tests/test_function_tool_decorator.py", "tests/test_tool_context.py",
        "tests/test_run_step_execution.py", "tests/test_tool_use_behavior.py", "tests/test_tool_guardrails.py",
    ), "swap_openai_agents"),
    "pydantic_ai": Suite("pydantic_ai", ("tests/test_tools.py", "tests/test_toolsets.py"), "swap_pydantic_ai"),
}


@dataclass(frozen=True)
class Outcome:
    """One run of a suite: the ids of the tests that passed, and what the others said."""

    passed: frozenset[str]
    failed: dict[str, str]
    rho_turns: int


def run_suite(suite: Suite, *, swapped: bool, select: list[str] | None = None, keyword: str | None = None,
              workers: int = 2) -> Outcome:
    """Run ``suite`` in a child pytest (``select``: test ids or files instead of the
    suite's files; ``keyword``: pytest's ``-k``), with rho's adapter swapped in when
    ``swapped``. Raises ``RuntimeError`` when pytest could not run the suite at all."""
    folder = HERE / "upstream" / suite.folder
    with tempfile.TemporaryDirectory() as scratch:
        report, turns = Path(scratch) / "report.xml", Path(scratch) / "turns"
        command = [sys.executable, "-m", "pytest", "-c", str(folder / "pytest.ini"), "--rootdir", str(folder),
                   "-q", "-p", "no:randomly", f"--junitxml={report}", *(select or suite.paths)]
        if workers > 0:
            command += ["-n", str(workers)]
        if keyword:
            command += ["-k", keyword]
        if swapped:
            command += ["-p", suite.plugin]
        paths = [str(ROOT), str(HERE), *([str(PLUGINS)] if PLUGINS.is_dir() else [])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "RHO_FRAMEWORKS_TURNS": str(turns)}
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, check=False)
        if not report.exists():
            output = done.stdout[-3000:] + done.stderr[-3000:]
            raise RuntimeError(f"pytest could not run {suite.folder}'s suite:\n{output}")
        passed, failed = _outcomes(report)
        counted = turns.read_text().split() if turns.exists() else []
        return Outcome(frozenset(passed), failed, sum(int(n) for n in counted))


def _outcomes(report: Path) -> tuple[set[str], dict[str, str]]:
    passed: set[str] = set()
    failed: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        problems = [c for c in case if c.tag in ("failure", "error")]
        if any(c.tag == "skipped" for c in case):
            continue
        if problems:
            failed[test_id] = (problems[0].get("message") or "").splitlines()[0][:200] if problems[0].get(
                "message") else problems[0].tag
        else:
            passed.add(test_id)
    return passed, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # no suite named: every one (argparse checks a "*" default against the choices whole, hence [])
    parser.add_argument("suites", nargs="*", default=[], choices=[*SUITES, []])
    parser.add_argument("--swapped-only", action="store_true", help="skip the run as-is (count every passing test)")
    parser.add_argument("-k", dest="keyword", help="pytest's -k for both runs")
    parser.add_argument("-n", dest="workers", type=int, default=2, help="pytest-xdist workers (0: none)")
    args = parser.parse_args(argv)
    under = False
    for name in args.suites or list(SUITES):
        suite = SUITES[name]
        swapped = run_suite(suite, swapped=True, keyword=args.keyword, workers=args.workers)
        if args.swapped_only:
            as_is = Outcome(swapped.passed | frozenset(swapped.failed), {}, 0)
        else:
            as_is = run_suite(suite, swapped=False, keyword=args.keyword, workers=args.workers)
        kept = as_is.passed & swapped.passed
        share = len(kept) / len(as_is.passed) if as_is.passed else 1.0
        under = under or share < GOAL
        print(f"{name}: {len(kept)} of {len(as_is.passed)} tests that pass as-is pass with rho's adapter "
              f"({share:.1%}; {swapped.rho_turns} rho turns)")
        for test_id in sorted(as_is.passed - swapped.passed):
            print(f"  {test_id}: {swapped.failed.get(test_id, 'not run')}")
    return 1 if under else 0


if __name__ == "__main__":
    sys.exit(main())
