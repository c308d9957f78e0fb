"""The command line as a new user meets it: ``--version``, ``tree`` (a fresh system's
or a running one's through its observer), ``selftest`` going on past an unloadable
file and failing a tool with an invalid declaration, and ``top`` at an address where
nothing listens."""

from __future__ import annotations

import json
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem
from rho_actors.cli import main
from rho_actors.observe.observer import Observer
from tests.conftest import WAIT_S, wait_for
from tests.test_selftest import tools_file

pytestmark = pytest.mark.timeout(120)

BAD_SCHEMA = """
    class Sloppy(_Base):
        @staticmethod
        def parameter_schema():
            return {"type": "object", "properties": {"a": {"type": "nope"}}}

        @staticmethod
        def selftest():
            return Ok("fine, says the tool")

    class Untested(_Base):
        @staticmethod
        def parameter_schema():
            return {"type": "string"}
"""


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short folder: Unix socket paths are limited to ~100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="rho-cli-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed: nothing listens there (the kernel does not hand it out again at once)


def test_version_prints_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"rho-actors {version('rho_actors')}"


def test_tree_of_a_fresh_system_with_the_given_tools(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tools_file(tmp_path, "two.py", "class One(_Base):\n    pass\n\nclass Two(_Base):\n    pass\n")
    assert main(["tree", "--tools", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tools"] == ["one", "two"]
    assert [c["id"] for c in report["tree"]["children"]] == [
        "declarations", "registry", "calls", "workers", "sources", "sessions", "servers", "tasks",
    ]
    assert main(["tree", "--tools", str(path)]) == 0
    out = capsys.readouterr().out
    assert "supervision tree" in out and "registry worker permanent" in out and "tools offered: one, two" in out
    assert main(["tree", "--tools", str(tmp_path / "missing.py")]) == 2
    assert "missing.py: no such file" in capsys.readouterr().err


def test_tree_of_a_running_system_through_its_observer(
    system: ActorSystem, short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    observer = system.observe(short_dir / "tree.sock")
    system.start_loop("session-7")
    assert main(["tree", "--connect", observer.address, "--json"]) == 0
    tree = json.loads(capsys.readouterr().out)["tree"]
    [sessions] = [c for c in tree["children"] if c["id"] == "sessions"]
    assert [s["id"] for s in sessions["children"]] == ["session-7"]
    assert main(["tree", "--connect", observer.address]) == 0
    assert "session-7" in capsys.readouterr().out
    tcp = Observer(system, 0)
    assert tcp.token is not None and re.fullmatch(r"[0-9a-f]{48}", tcp.token)  # never read as an option ("-x...")
    try:
        assert main(["tree", "--connect", tcp.address, "--token", "wrong-token-0123456789"]) == 2
        assert "token" in capsys.readouterr().err
        assert main(["tree", "--connect", tcp.address, "--token", tcp.token or "", "--json"]) == 0
        assert "sessions" in capsys.readouterr().out
    finally:
        tcp.close()


def test_top_and_tree_where_nothing_listens_say_connection_refused(
    system: ActorSystem, short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{_unused_port()}"
    for argv in (["top", "--connect", address, "--once"], ["tree", "--connect", address]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "connection refused" in err and "token" not in err, err
    tcp = Observer(system, 0)  # one that listens still asks for its token
    try:
        assert main(["top", "--connect", tcp.address, "--once"]) == 2
        assert "needs its token" in capsys.readouterr().err
    finally:
        tcp.close()
    assert main(["top", "--connect", str(short_dir / "none.sock"), "--once"]) == 2
    assert "no such socket" in capsys.readouterr().err


def test_selftest_goes_on_past_unloadable_explicit_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tools_file(tmp_path, "good.py", "class Good(_Base):\n    selftest = staticmethod(lambda: None)\n")
    broken = tmp_path / "broken.py"
    broken.write_text("def (\n")
    # a selftest's process may take longer than the default 10 s to start on a loaded machine: the wait bound
    bound = ["--timeout", f"{WAIT_S:g}"]
    assert main(["selftest", str(broken), str(good), str(tmp_path / "missing.py"), "--json", *bound]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert [(r["tool"], r["outcome"]) for r in report["results"]] == [("good", "passed")]
    assert report["broken_files"] == 2 and report["exit_code"] == 1
    assert any("broken.py: line 1: SyntaxError" in e for e in report["load_errors"])
    assert any("missing.py: no such file" in e for e in report["load_errors"])
    assert "the other files go on" in captured.err
    assert main(["selftest", str(broken), str(tmp_path / "missing.py")]) == 2  # nothing at all to test
    assert "no tools could be loaded" in capsys.readouterr().err


@pytest.mark.parametrize("trusted", [False, True])
def test_a_tool_whose_declaration_fails_is_a_selftest_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], trusted: bool
) -> None:
    path = tools_file(tmp_path, f"sloppy_{trusted}.py", BAD_SCHEMA)
    argv = ["selftest", str(path), "--json", "--timeout", f"{WAIT_S:g}", *(["--trusted"] if trusted else [])]
    assert main(argv) == 1
    rows = {r["tool"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert rows["sloppy"]["outcome"] == "failed"  # its own selftest passes, but it is never offered
    assert "its declaration fails its checks, so it is never offered" in rows["sloppy"]["message"]
    assert "parameter_schema.properties.a.type" in rows["sloppy"]["message"]
    assert rows["untested"]["outcome"] == "failed"  # no selftest, and never offered either
    assert "the top level must be an object schema" in rows["untested"]["message"]


def test_top_says_why_it_exits_when_the_observer_closes(
    system: ActorSystem, short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A live ``top`` whose observer closes (the system stopped) ends with 0 saying so
    on stderr: it used to return without a word."""
    import argparse
    import io
    import threading

    from rich.console import Console

    from rho_actors.observe.top import run as top

    observer = system.observe(short_dir / "live.sock", interval_s=0.05)
    codes: list[int] = []
    args = argparse.Namespace(connect=observer.address, token=None, once=False, json=False)
    watching = threading.Thread(target=lambda: codes.append(top(args, Console(file=io.StringIO()))))
    watching.start()
    assert wait_for(lambda: observer.stats()["viewers"] == 1)
    observer.close()
    watching.join(WAIT_S)
    assert codes == [0]
    assert f"the observer at {observer.address} closed the connection: the system stopped" in capsys.readouterr().err


def test_verbose_shows_rhos_log_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``-v`` (before or after the command) shows rho's log from INFO up, ``-vv`` from
    DEBUG up; without it rho is silent."""
    path = tools_file(tmp_path, "one.py", "class One(_Base):\n    pass\n")
    assert main(["tree", "--tools", str(path), "--json"]) == 0
    assert "child registry started" not in capsys.readouterr().err
    for argv in (["-v", "tree", "--tools", str(path), "--json"], ["tree", "--json", "-v", "--tools", str(path)]):
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert "INFO" in err and "root: child registry started" in err and "DEBUG" not in err, err
    assert main(["-vv", "tree", "--tools", str(path), "--json"]) == 0
    assert "root: child registry started" in capsys.readouterr().err


def _subcommands(parser: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _subcommands(sub, (*path, name))


def test_every_subcommand_help_has_a_description() -> None:
    """``rho-actors COMMAND --help`` says what the command does, for every command and
    action (``replay``, ``mcp``, ``top`` had none; ``tree`` showed its usage line)."""
    from rho_actors.cli import build_parser

    found = dict(_subcommands(build_parser()))
    assert {" ".join(p) for p in found} >= {"replay", "replay bfcl", "selftest", "chat", "mcp", "mcp serve", "top",
                                             "tree"}
    for path, sub in found.items():
        text = sub.description or ""
        assert len(text.split()) >= 8 and not text.startswith("rho-actors"), (path, text)


def test_an_upstream_that_fails_to_start_says_why_on_stderr_at_once(tmp_path: Path) -> None:
    import shlex
    import subprocess
    import sys

    command = shlex.join([sys.executable, "-m", "no_such_module_rho"])
    done = subprocess.run([sys.executable, "-m", "rho_actors.cli", "mcp", "serve", "--mcp", command, "--data-dir",
                           str(tmp_path / "data")], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=WAIT_S * 4, check=False)
    [line] = [x for x in done.stderr.splitlines() if x.startswith("MCP server no_such_module_rho")]
    assert "not connected yet, 0 tools: " in line and "No module named no_such_module_rho" in line, done.stderr
    assert "it is started again within its restart intensity" in line or "given up" in line, line
