"""Servers no one here wrote: the official MCP reference servers from PyPI
(``mcp-server-time``, ``mcp-server-git``, ``mcp-server-fetch``, the ``dev`` extra),
started with their documented commands (``python -m mcp_server_time``...), as sources
with their default names and through the gateway (the SDK's client -> ``rho-actors
mcp serve --mcp ...`` -> them), trusted and confined. The fetch server only ever
fetches a loopback ``http.server`` these tests start."""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import pytest

pytest.importorskip("mcp")
pytest.importorskip("mcp_server_time", reason="the reference servers are in the dev extra: pip install -e '.[dev]'")
pytest.importorskip("mcp_server_git", reason="the reference servers are in the dev extra: pip install -e '.[dev]'")
pytest.importorskip("mcp_server_fetch", reason="the reference servers are in the dev extra: pip install -e '.[dev]'")

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from rho_actors import ActorSystem, ToolCall
from rho_actors.mcp import MCPServer
from tests.conftest import WAIT_S, closed_to_others

BOUND_S = 2 * WAIT_S  # a gateway and three SDK servers importing on a loaded machine

SLOW_START_S = BOUND_S  # connect_timeout_s: add_source returns once connected
PY = sys.executable
TIME = [PY, "-m", "mcp_server_time", "--local-timezone", "UTC"]
PAGE = b"<html><head><title>rho page</title></head><body><h1>Hello from loopback</h1><p>A paragraph.</p></body></html>"


def _text(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


@contextlib.contextmanager
def _loopback_site() -> Iterator[str]:
    """An ``http.server`` on 127.0.0.1 serving :data:`PAGE` at ``/`` (404 elsewhere); its URL."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == "/"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.end_headers()
            self.wfile.write(PAGE if found else b"not here")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _git_repo(where: Path) -> Path:
    """A real repository: one commit, one changed file, one untracked file."""
    repo = where / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=rho", "-c", "user.email=rho@example.invalid"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "tracked.txt").write_text("one\n")
    subprocess.run([*git, "add", "tracked.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    (repo / "tracked.txt").write_text("two\n")
    (repo / "untracked.txt").write_text("new\n")
    return repo


async def _listed_directly(command: list[str]) -> dict[str, dict[str, Any]]:
    """The tools a server lists to the SDK's own client, no rho between: name -> inputSchema."""
    params = StdioServerParameters(command=command[0], args=command[1:])
    with anyio.fail_after(BOUND_S):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return {t.name: t.input_schema for t in (await session.list_tools()).tools}


def _now_in(zone: str, shown: str) -> bool:
    """Whether ISO time ``shown`` is the time now in ``zone`` (within a minute)."""
    when = datetime.datetime.fromisoformat(shown)
    now = datetime.datetime.now(ZoneInfo(zone))
    return when.utcoffset() == now.utcoffset() and abs((now - when).total_seconds()) < 60


def test_reference_servers_as_sources_with_their_default_names(system: ActorSystem, tmp_path: Path) -> None:
    repo = _git_repo(tmp_path)
    with _loopback_site() as site:
        servers = [
            MCPServer(command=TIME, connect_timeout_s=SLOW_START_S),
            MCPServer(command=[PY, "-m", "mcp_server_git", "--repository", str(repo)], connect_timeout_s=SLOW_START_S),
            MCPServer(command=[PY, "-m", "mcp_server_fetch", "--allow-private-ips"], connect_timeout_s=SLOW_START_S),
        ]
        with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:  # they start together
            list(pool.map(lambda server: system.add_source(server, poll_s=None), servers))
        assert [s.name for s in servers] == ["mcp_server_time", "mcp_server_git", "mcp_server_fetch"]
        assert [(s.server_info or {}).get("name") for s in servers] == ["mcp-time", "mcp-git", "mcp-fetch"]
        assert all(s.connected for s in servers) and system.whereis("mcp:mcp_server_git") is not None

        # offered with the servers' own schemas (compared whole with a direct listing through the gateway below)
        offered = {info.name: info.parameter_schema for info in system.tools()}
        assert {"get_current_time", "convert_time", "git_status", "git_log", "git_diff", "fetch"} <= set(offered)
        zone = offered["get_current_time"]
        described = zone["properties"]["timezone"]["description"]
        assert zone["required"] == ["timezone"] and "IANA timezone name" in described
        assert "Use 'UTC' as local timezone" in described  # its --local-timezone UTC
        assert set(offered["convert_time"]["required"]) == {"source_timezone", "time", "target_timezone"}

        loop = system.start_loop("reference")
        now, bad_zone, status, outside, page, refused = loop.run_turn([
            ToolCall("c1", "get_current_time", {"timezone": "Asia/Tokyo"}),
            ToolCall("c2", "get_current_time", {"timezone": "Mars/Olympus_Mons"}),
            ToolCall("c3", "git_status", {"repo_path": str(repo)}),
            ToolCall("c4", "git_status", {"repo_path": str(tmp_path)}),
            ToolCall("c5", "fetch", {"url": site}),
            ToolCall("c6", "fetch", {"url": site + "missing"}),
        ])
    assert now.ok, now.content
    shown = json.loads(now.content)
    assert shown["timezone"] == "Asia/Tokyo" and _now_in("Asia/Tokyo", shown["datetime"])
    assert now.details == {"structuredContent": shown}  # its structuredContent, kept for the host
    # a bad argument: the server's own error, as a tool error
    assert not bad_zone.ok and bad_zone.error_kind == "tool_error" and "Invalid timezone" in bad_zone.content
    assert status.ok and "untracked.txt" in status.content and "modified:   tracked.txt" in status.content
    assert not outside.ok and outside.error_kind == "tool_error" and "outside the allowed repository" in outside.content
    assert page.ok and "Hello from loopback" in page.content and "<h1>" not in page.content  # made markdown
    assert not refused.ok and refused.error_kind == "tool_error" and "status code 404" in refused.content
    # an argument the declared schema refuses never reaches the server
    [wrong] = system.start_loop("schema").run_turn([ToolCall("c7", "git_status", {"repo": 3})])
    assert not wrong.ok and wrong.error_kind == "invalid_arguments" and "repo_path" in wrong.content


class _Gateway:
    """The SDK's client session on a gateway, and its ``tools/list_changed`` notifications."""

    def __init__(self) -> None:
        self.session: ClientSession | None = None
        self.changed = anyio.Event()

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.changed.set()

    async def listed(self, expected: set[str]) -> dict[str, types.Tool]:
        """The tools listed once all of ``expected`` are (a server slow to start on a
        loaded machine joins later, announced by ``list_changed``)."""
        assert self.session is not None
        while True:
            self.changed = anyio.Event()
            listed = {t.name: t for t in (await self.session.list_tools()).tools}
            if expected <= set(listed):
                return listed
            await self.changed.wait()


@asynccontextmanager
async def _gateway(args: list[str], tmp_path: Path) -> AsyncIterator[_Gateway]:
    """The SDK's client on ``rho-actors mcp serve ARGS`` over stdio (its stderr in tmp_path/gateway.err)."""
    params = StdioServerParameters(
        command=PY, args=["-m", "rho_actors.cli", "mcp", "serve", *args, "--data-dir", str(tmp_path / "data")],
    )
    gateway = _Gateway()
    with open(tmp_path / "gateway.err", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write, message_handler=gateway.on_message) as session:
            with anyio.fail_after(BOUND_S):
                await session.initialize()
            gateway.session = session
            yield gateway


def test_the_sdk_client_through_the_gateway_to_the_reference_servers(tmp_path: Path) -> None:
    repo = _git_repo(tmp_path)
    with _loopback_site() as site:

        async def main() -> None:
            direct = await _listed_directly([PY, "-m", "mcp_server_git", "--repository", str(repo)])
            args = ["--mcp", " ".join(TIME), "--mcp", f"{PY} -m mcp_server_git --repository {repo}",
                    "--mcp", f"{PY} -m mcp_server_fetch --allow-private-ips"]
            async with _gateway(args, tmp_path) as gateway:
                session = gateway.session
                assert session is not None
                with anyio.fail_after(BOUND_S):
                    listed = await gateway.listed({"get_current_time", "convert_time", "fetch", "git_status"})
                    assert {n: listed[n].input_schema for n in direct} == direct  # the git server's own schemas
                    assert listed["convert_time"].output_schema is not None  # served on

                    converted = await session.call_tool("convert_time", {
                        "source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"})
                    assert not converted.is_error, _text(converted)
                    assert converted.structured_content is not None
                    assert converted.structured_content["target"]["datetime"].endswith("T21:00:00+09:00")
                    assert converted.structured_content["time_difference"] == "+9.0h"
                    bad = await session.call_tool("convert_time", {
                        "source_timezone": "UTC", "time": "25:99", "target_timezone": "Asia/Tokyo"})
                    assert bad.is_error and "Invalid time format" in _text(bad)

                    status = await session.call_tool("git_status", {"repo_path": str(repo)})
                    assert not status.is_error and "untracked.txt" in _text(status)
                    outside = await session.call_tool("git_status", {"repo_path": str(tmp_path)})
                    assert outside.is_error and "outside the allowed repository" in _text(outside)
                    page = await session.call_tool("fetch", {"url": site})
                    assert not page.is_error and "Hello from loopback" in _text(page)

        anyio.run(main)
    said = (tmp_path / "gateway.err").read_text()
    for name in ("mcp_server_time", "mcp_server_git", "mcp_server_fetch"):  # the default names, at start
        assert f"MCP server {name} (trusted): " in said, said
    assert "MCP server mcp_server_time (trusted): connected, 2 tools (it says it is mcp-time 20" in said or \
        "MCP server mcp_server_time (trusted): not connected yet" in said  # a slow start on a loaded machine


@contextlib.contextmanager
def _folder(mode: int) -> Iterator[Path]:
    """A fresh folder of ``mode`` in the system's temporary folder (whose own mode
    ``tmp_path``'s 0700 parents would override)."""
    folder = Path(tempfile.mkdtemp(prefix="rho-reference-"))
    try:
        folder.chmod(mode)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _system_python() -> str | None:
    """A system Python of this interpreter's version (a venv made from it can use this
    interpreter's installed packages), readable by every user."""
    found = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin")
    return found if found is not None and os.stat("/usr/bin").st_mode & 0o005 == 0o005 else None


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only: confined servers then drop to a uid of their own")
def test_confined_reference_servers_and_what_an_unreadable_installation_gets(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rho_actors.cli import main as cli

    # an installation the server's uid cannot reach (as a venv under /root is): refused at start, once, saying why
    with _folder(0o700) as closed:
        (closed / "python3").symlink_to(PY)
        assert cli(["mcp", "serve", "--untrusted-mcp", f"{closed}/python3 -m mcp_server_time"]) == 2
    said = capsys.readouterr().err
    [message] = [line for line in said.splitlines() if line.startswith("rho-actors mcp serve:")]
    assert re.search(f"its program, {re.escape(str(closed))}/python3, cannot be read by uid [0-9]+", message)
    assert f"{closed} (mode drwx------, owner uid 0) is closed to it" in message
    assert "python -m MODULE" in message and "Traceback" not in said
    assert cli(["mcp", "serve", "--untrusted-mcp", f"{PY} -m no_such_server_module"]) == 2
    assert "the module 'no_such_server_module' is not installed for" in capsys.readouterr().err

    system_python = _system_python()
    with _loopback_site() as site, _folder(0o755) as opt:
        venv_way: list[str] = []
        [ours] = [os.path.realpath(p) for p in sys.path
                  if p.endswith("site-packages") and Path(p, "mcp_server_time").is_dir()]
        # a server in a venv of its own that uid 65534 can read, using this interpreter's packages
        # (when they lie where it can read them: not in a clone only its owner can enter)
        if system_python is not None and closed_to_others(Path(ours)) is None:
            subprocess.run([system_python, "-m", "venv", "--without-pip", str(opt / "time")], check=True,
                           timeout=BOUND_S)
            # its packages: this interpreter's, by a .pth (offline; a pip install puts them there itself)
            [site_packages] = (opt / "time" / "lib").glob("python3*/site-packages")
            (site_packages / "host.pth").write_text(ours + "\n")
            venv_way = ["--untrusted-mcp", f"{opt}/time/bin/python -m mcp_server_time --local-timezone UTC"]

        async def run() -> None:
            args = ["--untrusted-mcp", " ".join(TIME),
                    "--untrusted-mcp", f"{PY} -m mcp_server_fetch --allow-private-ips", *venv_way]
            async with _gateway(args, tmp_path) as gateway:
                session = gateway.session
                assert session is not None
                with anyio.fail_after(BOUND_S):
                    zone = "mcp_server_time__get_current_time" if venv_way else "get_current_time"
                    await gateway.listed({zone, "fetch", *(["mcp_server_time-2__get_current_time"] * bool(venv_way))})
                    now = await session.call_tool(zone, {"timezone": "Europe/Paris"})
                    assert not now.is_error, _text(now)
                    assert now.structured_content is not None
                    assert _now_in("Europe/Paris", now.structured_content["datetime"])
                    if venv_way:
                        other = await session.call_tool("mcp_server_time-2__get_current_time", {"timezone": "UTC"})
                        assert not other.is_error and _now_in("UTC", json.loads(_text(other))["datetime"])
                    # the site the trusted fetch server reads (above): the confined one has a
                    # loopback of its own, where nothing listens
                    cut = await session.call_tool("fetch", {"url": site})
                    assert cut.is_error and "Failed to fetch" in _text(cut) and "Hello" not in _text(cut)

        anyio.run(run)
    said = (tmp_path / "gateway.err").read_text()
    for name in ("mcp_server_time", "mcp_server_fetch", *(["mcp_server_time-2"] * bool(venv_way))):
        assert f"MCP server {name} (confined): " in said, said
