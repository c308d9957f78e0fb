"""rho as a gateway: the SDK's client -> ``rho-actors mcp serve --config/--mcp...`` ->
SDK-built upstream servers (a hanging tool, a crashing server restarted, an untrusted
server confined), and the gateway serving 20 concurrent clients over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from rho_actors import ActorSystem, tool
from rho_actors.mcp import HTTPGuard, aserve
from rho_actors.mcp.confined import python_target
from rho_actors.mcp.gateway import (
    Gateway,
    GatewayConfig,
    GatewayConfigError,
    GatewayError,
    UpstreamSpec,
    gateway_config,
    load_config,
    specs_from_flags,
)
from rho_actors.mcp.names import default_name
from rho_actors.sandbox.confine.uids import DEFAULT_UID_RANGE
from tests.conftest import WAIT_S, open_folder, slack, wait_for
from tests.helpers import free_port, listening

UPSTREAM = str(Path(__file__).parent / "mcp_fixtures" / "gateway_upstream.py")
TOKEN = "a-test-token-of-32-characters-xx"


def _text(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))



def _toml_list(argv: list[str]) -> str:
    return "[" + ", ".join(f'"{a}"' for a in argv) + "]"


@contextlib.contextmanager
def _host_secret() -> Any:
    """A file any local user may read (0644 in a 0755 folder), outside every read path
    of a confined process: only Landlock keeps it from an untrusted server."""
    folder = tempfile.mkdtemp(prefix="gateway-secret-")
    try:
        os.chmod(folder, 0o755)
        secret = Path(folder) / "secret.txt"
        secret.write_text("host-secret")
        secret.chmod(0o644)
        yield secret
    finally:
        secret.unlink(missing_ok=True)
        os.rmdir(folder)


@contextlib.contextmanager
def _listener() -> Any:
    """A TCP listener on the host's 127.0.0.1 that accepts every connection."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = sock.accept()
                conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        sock.close()


@asynccontextmanager
async def _gateway_over_stdio(config: Path, tmp_path: Path, seen: list[Any]) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "rho_actors.cli", "mcp", "serve", "--config", str(config), "--data-dir", str(tmp_path / "data")],
    )

    async def on_message(message: Any) -> None:
        seen.append(message)

    async with stdio_client(params) as (read, write), \
            ClientSession(read, write, message_handler=on_message) as session:
        with anyio.fail_after(WAIT_S):
            await session.initialize()
        yield session


def test_sdk_client_through_the_gateway_to_hanging_crashing_and_confined_servers(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    python = sys.executable
    config = tmp_path / "gateway.toml"
    alpha_ms = int(slack(1.5) * 1000)  # alpha's deadline: a quiet machine's 1.5 s, as this machine keeps up now
    with _host_secret() as secret, _listener() as port, open_folder(UPSTREAM) as scripts:
        upstream = str(scripts / Path(UPSTREAM).name)  # the confined server must read its script
        config.write_text(f"""
[servers.alpha]
command = {_toml_list([python, upstream, str(marks), "alpha"])}
timeout_ms = {alpha_ms}
max_restarts = 5
max_seconds = 60
connect_timeout_s = {WAIT_S}

[servers.jail]
command = {_toml_list([python, upstream, str(marks), "beta"])}
trusted = false
connect_timeout_s = {WAIT_S}

[servers.open]
command = {_toml_list([python, upstream, str(marks), "beta"])}
connect_timeout_s = {WAIT_S}
""")
        seen: list[Any] = []

        async def main() -> None:
            async with _gateway_over_stdio(config, tmp_path, seen) as session:
                with anyio.fail_after(WAIT_S):
                    names = {t.name for t in (await session.list_tools()).tools}
                    # echo is listed by all three, read_file/connect/whoami by two: namespaced for each
                    assert {"alpha__echo", "jail__echo", "open__echo", "jail__read_file", "open__read_file",
                            "jail__connect", "open__connect", "hang", "stubborn", "crash", "grow", "pid"} <= names
                    assert not {"echo", "read_file", "connect"} & names
                    assert _text(await session.call_tool("alpha__echo", {"text": "hi"})) == "alpha: hi"
                    # an upstream's audio and embedded resource are served on, in its order
                    media = (await session.call_tool("media", {})).content
                    assert [b.type for b in media] == ["text", "audio", "resource"]
                    assert isinstance(media[1], types.AudioContent) and media[1].data == "UklGRg=="
                    assert isinstance(media[2], types.EmbeddedResource)
                    assert media[2].resource.model_dump(by_alias=True, exclude_none=True) == {
                        "uri": "test://alpha", "mimeType": "text/plain", "text": "alpha's notes"}

                    # the untrusted server runs as a uid of its own in a folder of its own; the trusted one as the host
                    jailed = _text(await session.call_tool("jail__whoami", {}))
                    assert int(jailed.split()[0]) in DEFAULT_UID_RANGE and "rho-actors-" in jailed.split()[1]
                    assert _text(await session.call_tool("open__whoami", {})).split()[0] == str(os.getuid())
                    # a host file: read by the trusted server, refused to the confined one
                    opened = await session.call_tool("open__read_file", {"path": str(secret)})
                    assert not opened.is_error and _text(opened) == "host-secret"
                    refused = await session.call_tool("jail__read_file", {"path": str(secret)})
                    assert refused.is_error and "Permission denied" in _text(refused)
                    assert "host-secret" not in refused.model_dump_json()
                    # a socket to the host's loopback: the trusted server connects, the confined one cannot
                    assert _text(await session.call_tool("open__connect", {"port": port})) == "connected"
                    cut = await session.call_tool("jail__connect", {"port": port})
                    assert cut.is_error and "connect: [Errno" in _text(cut)

                    # the deadline holds though the upstream ignores the cancellation
                    started = time.monotonic()
                    stubborn = await session.call_tool("stubborn", {"seconds": 30})
                    said = _text(stubborn)
                    assert stubborn.is_error and f"did not finish within its timeout of {alpha_ms} ms" in said
                    assert time.monotonic() - started < alpha_ms / 1000 + slack(2.0)

                    # the client's cancellation reaches the upstream (notifications/cancelled)
                    async with anyio.create_task_group() as tasks:
                        tasks.start_soon(session.call_tool, "hang", {"seconds": 30})
                        while not (marks / "hang-started").exists():
                            await anyio.sleep(0.02)
                        tasks.cancel_scope.cancel()
                    while not (marks / "cancelled").exists():
                        await anyio.sleep(0.02)

                    # list_changed from the upstream reaches the client
                    assert _text(await session.call_tool("grow", {})) == "grew"
                    while not any(isinstance(m, types.ToolListChangedNotification) for m in seen):
                        await anyio.sleep(0.02)
                    while "grown" not in {t.name for t in (await session.list_tools()).tools}:
                        await anyio.sleep(0.05)
                    assert _text(await session.call_tool("grown", {})) == "grown"

                    # a crash: crashed; while the restarted server is held down its tools are
                    # unavailable, naming it; let up, it is back by itself
                    first = _text(await session.call_tool("pid", {}))
                    os.mkfifo(marks / "gate")
                    crashed = await session.call_tool("crash", {})
                    assert crashed.is_error and "MCP server alpha exited" in _text(crashed)
                    while (marks / "alpha-started").read_text() == first:
                        await anyio.sleep(0.02)
                    down = await session.call_tool("alpha__echo", {"text": "x"})
                    assert down.is_error and "MCP server alpha is not connected now" in _text(down)
                    assert "alpha__echo" in {t.name for t in (await session.list_tools()).tools}
                    await anyio.to_thread.run_sync(lambda: open(marks / "gate", "wb").close())
                    while True:
                        back = await session.call_tool("alpha__echo", {"text": "back"})
                        if not back.is_error:
                            break
                        await anyio.sleep(0.05)
                    assert _text(back) == "alpha: back"
                    assert _text(await session.call_tool("pid", {})) not in ("", first)
                    # the other servers were not touched
                    assert _text(await session.call_tool("jail__echo", {"text": "still"})) == "beta: still"

        anyio.run(main)


@tool
def echo(text: str) -> str:
    """The host's own echo."""
    return f"host: {text}"


def _serve_http(system: ActorSystem, port: int) -> tuple[threading.Thread, list[asyncio.AbstractEventLoop]]:
    loops: list[asyncio.AbstractEventLoop] = []

    async def run() -> None:
        loops.append(asyncio.get_running_loop())
        await aserve(system, http=("127.0.0.1", port), guard=HTTPGuard(TOKEN, max_sessions_per_client=32))

    def target() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            asyncio.run(run())

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, loops



def test_the_gateway_serves_20_concurrent_clients_from_an_http_upstream(system: ActorSystem, tmp_path: Path) -> None:
    up_port, port = free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, UPSTREAM, str(tmp_path), "alpha", "--http", str(up_port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: listening(up_port), WAIT_S)
        system.register(echo)  # the host's own tool: the upstream's echo is served namespaced
        config = gateway_config(mcp_url=[f"http://127.0.0.1:{up_port}/mcp"])
        [spec] = config.servers
        assert spec.name == "127_0_0_1-" + str(up_port)
        gateway = Gateway(config)
        gateway.start(system)
        served = gateway.status()[spec.name]["tools"]
        assert served[f"{spec.name}__echo"] == "echo" and served["pid"] == "pid"
        thread, loops = _serve_http(system, port)
        url = f"http://127.0.0.1:{port}/mcp"
        assert wait_for(lambda: listening(port), WAIT_S)

        async def client(i: int) -> tuple[str, str, str]:
            http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
            async with streamable_http_client(url, http_client=http) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                names = {t.name for t in (await session.list_tools()).tools}
                assert {"echo", f"{spec.name}__echo", "pid", "hang"} <= names
                mine = await session.call_tool(f"{spec.name}__echo", {"text": str(i)})
                host = await session.call_tool("echo", {"text": str(i)})
                pid = await session.call_tool("pid", {})
                return _text(mine), _text(host), _text(pid)

        async def main() -> dict[int, tuple[str, str, str]]:
            results: dict[int, tuple[str, str, str]] = {}

            async def one(i: int) -> None:
                results[i] = await client(i)

            with anyio.fail_after(WAIT_S):
                async with anyio.create_task_group() as tasks:
                    for i in range(20):
                        tasks.start_soon(one, i)
            return results

        try:
            results = anyio.run(main)
        finally:
            if loops:
                loops[0].call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(loops[0])])
            thread.join(WAIT_S)
        assert {i: r[:2] for i, r in results.items()} == {i: (f"alpha: {i}", f"host: {i}") for i in range(20)}
        assert {r[2] for r in results.values()} == {str(upstream.pid)}  # one upstream behind 20 clients
        assert len(list((system.data_dir / "sessions").iterdir())) == 20
        gateway.close()
    finally:
        upstream.kill()
        upstream.wait(WAIT_S)


def test_colliding_names_are_refused_at_start_naming_both_servers(system: ActorSystem, tmp_path: Path) -> None:
    config = GatewayConfig((
        UpstreamSpec("first", command=(sys.executable, UPSTREAM, str(tmp_path), "alpha"), connect_timeout_s=WAIT_S),
        UpstreamSpec("second", command=(sys.executable, UPSTREAM, str(tmp_path), "beta"), connect_timeout_s=WAIT_S),
    ), collisions="refuse")
    gateway = Gateway(config)
    with pytest.raises(GatewayError) as err:
        gateway.start(system)
    assert "tool 'echo' is listed by both MCP servers 'first' and 'second'" in str(err.value)
    assert "prefix = true" in str(err.value)
    assert not {info.name for info in system.tools()}  # nothing served: both were removed


def test_gateway_config_file_and_its_errors(tmp_path: Path) -> None:
    good = tmp_path / "gateway.toml"
    good.write_text("""
collisions = "refuse"
[servers.files]
command = "python -m my_files_server /srv/docs"
env = { LOG_LEVEL = "warning" }
timeout_ms = 20000
max_restarts = 2
max_seconds = 10
trusted = false
network = true
read = ["/srv/docs"]
memory_mb = 512
[servers.search]
url = "http://127.0.0.1:9000/mcp"
headers = { Authorization = "Bearer abc" }
prefix = true
""")
    config = load_config(good)
    assert config.collisions == "refuse"
    files, search = config.servers
    assert files.command == ("python", "-m", "my_files_server", "/srv/docs") and not files.trusted
    assert (files.env, files.timeout_ms, files.max_restarts, files.max_seconds) == ({"LOG_LEVEL": "warning"}, 20000,
                                                                                    2, 10.0)
    assert files.network and files.read == ("/srv/docs",) and files.memory_mb == 512
    assert search.url == "http://127.0.0.1:9000/mcp" and search.trusted and search.prefix
    assert search.headers == {"Authorization": "Bearer abc"}

    bad = tmp_path / "bad.toml"
    cases = {
        "[servers.x\n": "not valid TOML",
        "[servers.x]\ncommand = 'a'\nurl = 'http://h/'\n": "give exactly one of command",
        "[servers.x]\n": "give exactly one of command",
        "[servers.x]\ncommand = 'a'\ntimout_ms = 5\n": "unknown key(s) ['timout_ms']",
        "[servers.x]\ncommand = 'a'\ntimeout_ms = '5'\n": "timeout_ms must be an integer, got '5'",
        "[servers.x]\ncommand = 'a'\ntrusted = 1\n": "trusted must be true or false",
        "[servers.x]\nurl = 'http://h/'\ntrusted = false\n": "an untrusted server must be a command",
        "[servers.x]\nurl = 'ftp://h/'\n": "url must be http:// or https://",
        "[servers.'a b']\ncommand = 'a'\n": "a server's name must be 1 to 32 of",
        "[servers.x]\ncommand = []\n": "command must be a non-empty string or list",
        "[servers.x]\ncommand = 'a'\nread = ['relative']\n": "read must be a list of absolute paths",
        "[servers.x]\ncommand = 'a'\nmax_seconds = 0\n": "max_seconds must be a positive number",
        "collisions = 'merge'\n[servers.x]\ncommand = 'a'\n": "collisions must be one of",
        "servers = 3\n": "no [servers.NAME] table",
        "[server.x]\ncommand = 'a'\n": "unknown top-level key(s) ['server']",
    }
    for text, message in cases.items():
        bad.write_text(text)
        with pytest.raises(GatewayConfigError) as err:
            load_config(bad)
        assert str(bad) in str(err.value) and message in str(err.value), (text, str(err.value))
        if "[servers.x]" in text and not text.startswith("collisions"):
            assert "[servers.x]" in str(err.value)
    with pytest.raises(GatewayConfigError, match="cannot be read"):
        load_config(tmp_path / "missing.toml")


def test_names_from_flags() -> None:
    specs = specs_from_flags(
        mcp=["python -m mcp_server_time --local-timezone UTC", "npx -y @modelcontextprotocol/server-everything",
             "python /opt/srv/server.py"],
        untrusted_mcp=["uvx mcp-server-fetch", "/usr/local/bin/my-server --flag"],
        mcp_url=["http://127.0.0.1:9000/mcp"], taken=["server"],
    )
    assert [(s.name, s.trusted) for s in specs] == [
        ("mcp_server_time", True), ("server-everything", True), ("server-2", True), ("mcp-server-fetch", False),
        ("my-server", False), ("127_0_0_1-9000", True),
    ]
    assert specs[0].command == ("python", "-m", "mcp_server_time", "--local-timezone", "UTC")
    # one rule: a flag's server and a source without name= are named alike
    from rho_actors.mcp import MCPServer

    for spec in specs[:2] + specs[3:5]:
        assert MCPServer(command=list(spec.command or ())).name == spec.name
    assert MCPServer(url="http://127.0.0.1:9000/mcp").name == specs[5].name
    assert default_name(["python3", "-u", "-m", "pkg.sub.server"]) == "server"
    assert default_name(["npx", "-y", "@scope/thing@1.2.3"]) == "thing"
    with pytest.raises(GatewayConfigError, match="--mcp needs a command"):
        specs_from_flags(mcp=["  "])
    with pytest.raises(GatewayConfigError, match="--mcp-url must be an http"):
        specs_from_flags(mcp_url=["localhost:9000"])
    with pytest.raises(GatewayConfigError, match="given more than once"):
        Gateway(GatewayConfig((UpstreamSpec("a", command=("x",)), UpstreamSpec("a", command=("y",)))))
    assert python_target(["python3.11", "-u", "s.py", "--x"]) == ("path", os.path.abspath("s.py"), ["--x"])
    assert python_target(["node", "s.js"]) is None
    assert python_target([sys.executable, "-m", "m"]) == ("module", "m", [])
    assert python_target(["/opt/venv/bin/python", "-m", "m"]) is None  # another interpreter: exec-ed


def test_mcp_serve_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from rho_actors.cli import main

    assert main(["mcp", "serve"]) == 2
    err = capsys.readouterr().err
    assert "nothing to serve" in err and "--tools" in err and "--mcp" in err
    bad = tmp_path / "bad.toml"
    bad.write_text("[servers.x]\n")
    assert main(["mcp", "serve", "--config", str(bad)]) == 2
    assert "give exactly one of command" in capsys.readouterr().err
    assert main(["mcp", "serve", "--mcp-url", "nowhere"]) == 2
    assert "--mcp-url must be an http" in capsys.readouterr().err
    assert main(["mcp", "serve", "--mcp", "x", "--collisions", "merge"]) == 2
    assert "invalid choice: 'merge'" in capsys.readouterr().err


def test_the_guide_s_gateway_section_is_usable(tmp_path: Path) -> None:
    import json
    import re
    import shlex

    from rho_actors.cli import build_parser

    guide = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "mcp-gateway.md").read_text()
    section = guide.split("\n## rho as a gateway for your MCP servers\n", 1)[1].split("\n## ", 1)[0]
    [command] = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    [toml] = re.findall(r"```toml\n(.*?)```", section, flags=re.S)
    [desktop] = re.findall(r"```json\n(.*?)```", section, flags=re.S)
    argv = shlex.split(command.replace("\\\n", " "), comments=True)
    args = build_parser().parse_args(argv[1:])
    assert args.mcp[0] == "python -m mcp_server_time --local-timezone Europe/Paris"
    assert args.untrusted_mcp == ["python -m mcp_server_fetch"]
    assert [(s.name, s.trusted) for s in gateway_config(None, args.mcp, args.mcp_url, args.untrusted_mcp).servers] == [
        ("mcp_server_time", True), ("mcp_server_git", True), ("mcp_server_fetch", False)]
    (tmp_path / "gateway.toml").write_text(toml)
    config = load_config(tmp_path / "gateway.toml")
    assert [(s.name, s.trusted) for s in config.servers] == [("time", True), ("git", True), ("fetch", False),
                                                             ("search", True)]
    fetch = config.servers[2]
    assert fetch.command == ("python", "-m", "mcp_server_fetch") and fetch.network and fetch.memory_mb == 512
    server = json.loads(desktop)["mcpServers"]["rho"]
    assert server["command"] == "rho-actors" and server["args"][:3] == ["mcp", "serve", "--config"]
    assert build_parser().parse_args(server["args"]).config == server["args"][3]


PLAIN = str(Path(__file__).parent / "mcp_fixtures" / "plain_stdio_server.py")


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs a system Python at /usr/bin/python3")
def test_an_untrusted_program_is_exec_ed_confined(system: ActorSystem) -> None:
    from rho_actors import ToolCall

    with _host_secret() as secret, open_folder(PLAIN) as scripts:  # the confined program must read its script
        plain = str(scripts / Path(PLAIN).name)
        gateway = Gateway(GatewayConfig((UpstreamSpec("plain", command=("/usr/bin/python3", plain), trusted=False),)))
        gateway.start(system)
        assert gateway.status()["plain"]["connected"]
        loop = system.start_loop("exec")
        [who] = loop.run_turn([ToolCall("c1", "whoami", {})])
        assert who.ok and int(who.content.split()[0]) in DEFAULT_UID_RANGE and "rho-actors-" in who.content
        [read] = loop.run_turn([ToolCall("c2", "read_file", {"path": str(secret)})])
        assert not read.ok and "Permission denied" in read.content and "host-secret" not in read.content
        [own] = loop.run_turn([ToolCall("c3", "read_file", {"path": plain})])  # its own folder is readable
        assert own.ok and "standard library only" in own.content
    gateway.close()
    assert not system.tools()


def test_the_names_rule() -> None:
    from rho_actors.mcp.gateway import _Names

    names = _Names("namespace", host={"echo"}, servers={"files", "search"})
    names.update("files", {"read", "list", "echo"})
    names.update("search", {"query", "list", "files__read"})
    served = {s: {n: names.served(s, n, prefix=False) for n in sorted(listed)}
              for s, listed in {"files": {"read", "list", "echo"}, "search": {"query", "list", "files__read"}}.items()}
    assert served == {
        "files": {"echo": "files__echo", "list": "files__list", "read": "read"},  # echo: the host's
        "search": {"files__read": "search__files__read", "list": "search__list", "query": "query"},
    }
    assert names.served("files", "read", prefix=True) == "files__read"
    refuse = _Names("refuse", host={"echo"}, servers={"files", "search"})
    refuse.update("files", {"read", "list", "echo"})
    refuse.update("search", {"list"})
    assert refuse.served("files", "list", prefix=False) == "list"
    assert refuse.clashes(frozenset()) == [
        "tool 'echo' of MCP server 'files' has the name of one of the host's own tools",
        "tool 'list' is listed by both MCP servers 'files' and 'search'",
    ]
    assert refuse.clashes(frozenset({"files"})) == []


def test_an_upstream_given_up_past_its_intensity_has_its_tools_withdrawn(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    config = tmp_path / "gateway.toml"
    config.write_text(f"""
[servers.alpha]
command = {_toml_list([sys.executable, UPSTREAM, str(marks), "alpha"])}
max_restarts = 0
connect_timeout_s = {WAIT_S}

[servers.other]
command = {_toml_list([sys.executable, UPSTREAM, str(marks), "beta"])}
connect_timeout_s = {WAIT_S}
""")
    seen: list[Any] = []

    async def main() -> None:
        async with _gateway_over_stdio(config, tmp_path, seen) as session:
            with anyio.fail_after(WAIT_S):
                names = {t.name for t in (await session.list_tools()).tools}
                assert {"alpha__echo", "other__echo", "pid", "crash"} <= names
                crashed = await session.call_tool("crash", {})
                assert crashed.is_error and "MCP server alpha exited" in _text(crashed)
                # past its intensity (no restart allowed): its tools leave, and the client is told
                while True:
                    while not any(isinstance(m, types.ToolListChangedNotification) for m in seen):
                        await anyio.sleep(0.02)
                    seen.clear()
                    names = {t.name for t in (await session.list_tools()).tools}
                    if "pid" not in names:
                        break
                assert not {"alpha__echo", "pid", "crash", "hang"} & names
                assert "echo" in names  # other's echo collides with nothing now
                gone = await session.call_tool("pid", {})
                assert gone.is_error and "pid" in _text(gone)
                assert _text(await session.call_tool("echo", {"text": "still"})) == "beta: still"

    anyio.run(main)


def test_a_namespaced_upstreams_crash_and_given_up_texts_name_the_tool_as_the_client_called_it(
        tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    config = tmp_path / "gateway.toml"
    config.write_text(f"""
[servers.up]
command = {_toml_list([sys.executable, UPSTREAM, str(marks), "alpha"])}
prefix = true
max_restarts = 0
max_seconds = 5
connect_timeout_s = {WAIT_S}
""")
    seen: list[Any] = []

    async def main() -> None:
        async with _gateway_over_stdio(config, tmp_path, seen) as session:
            with anyio.fail_after(WAIT_S):
                assert {"up__pid", "up__crash"} <= {t.name for t in (await session.list_tools()).tools}
                crashed = await session.call_tool("up__crash", {})
                assert crashed.is_error and _text(crashed) == (
                    "tool 'up__crash' (upstream 'crash' of server 'up'): MCP server up exited or dropped the "
                    "connection during the call; it is restarted within its restart intensity")
                while "up__pid" in {t.name for t in (await session.list_tools()).tools}:
                    while not any(isinstance(m, types.ToolListChangedNotification) for m in seen):
                        await anyio.sleep(0.02)
                    seen.clear()
                gone = await session.call_tool("up__pid", {})
                said = _text(gone)
                assert gone.is_error and said.startswith(
                    "tool 'up__pid' cannot be called: MCP server up was given up: it failed past its restart "
                    "intensity (0 restarts in 5 s) and is not restarted again; its last error: ConnectionError: the "
                    "server closed the connection (its process exited?)"), said
                assert said.endswith("; to start it afresh, restart the gateway (rho-actors mcp serve)"), said

    anyio.run(main)


def test_a_server_that_cannot_start_stops_the_gateway_at_once_with_one_message(
        capsys: pytest.CaptureFixture[str]) -> None:
    from rho_actors.cli import main

    assert main(["mcp", "serve", "--mcp", "no-such-mcp-server --flag", "--mcp", f"{sys.executable} -m x"]) == 2
    err = capsys.readouterr().err
    assert err.count("its program 'no-such-mcp-server' is not found") == 1 and "Traceback" not in err
    assert err.startswith("rho-actors mcp serve: the MCP server 'no-such-mcp-server' cannot start")


def test_an_untrusted_programs_venv_opens_its_installation_only(tmp_path: Path) -> None:
    from rho_actors.mcp.confined import _venv_of

    # a venv made in a project's folder, its pyvenv.cfg naming a folder of secrets as its "home"
    project, secrets = tmp_path / "project", tmp_path / "secrets"
    (project / "bin").mkdir(parents=True)
    (project / "lib").mkdir()
    (project / ".env").write_text("TOKEN=x")
    (project / "bin" / "server").write_text("#!/usr/bin/python3\n")
    (secrets / "bin").mkdir(parents=True)
    (secrets / "bin" / "python3").write_text("")
    (project / "pyvenv.cfg").write_text(f"home = {secrets / 'bin'}\n")
    granted = _venv_of(str(project / "bin" / "server"))
    assert set(granted) == {str(project / "pyvenv.cfg"), str(project / "bin"), str(project / "lib")}
    # a real installation named as home: its interpreter, standard library and libpython only
    (secrets / "lib" / "python3.11").mkdir(parents=True)
    (secrets / "lib" / "python3.11" / "os.py").write_text("")
    (secrets / "lib" / "keys.txt").write_text("secret")
    granted = _venv_of(str(project / "bin" / "server"))
    assert str(secrets / "lib" / "python3.11") in granted and str(secrets / "bin" / "python3") in granted
    assert not [g for g in granted if g in (str(secrets), str(secrets / "lib"), str(project))]
    assert _venv_of(str(tmp_path / "elsewhere" / "bin" / "x")) == ()
