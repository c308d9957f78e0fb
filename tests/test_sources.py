"""Sources: plugin folders and entry-point groups kept in step with the registry."""

from __future__ import annotations

import os
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ErrorKind, ToolCall, kill, tool
from rho_actors.sources.source_actor import (
    DEFAULT_GROUP,
    Broken,
    EntryPointGroup,
    PluginFolder,
    SourceHandle,
    add_source,
    load_module_file,
)
from tests.conftest import WAIT_S, wait_for


def plugin(name: str, answer: str, body: str = "") -> str:
    """The source of a tool module named ``name`` whose run returns ``answer``."""
    return textwrap.dedent(f"""
        def name():
            return {name!r}

        def description():
            return "test tool {name}"

        def parameter_schema():
            return {{"type": "object", "properties": {{}}}}

        def run(args, ctx):
            return {answer!r}
    """) + textwrap.dedent(body)


def write(folder: Path, filename: str, text: str) -> Path:
    path = folder / filename
    path.write_text(text)
    return path


def offered(loop: Any) -> list[str]:
    return [info.name for info in loop.offered()]


def call(loop: Any, name: str, call_id: str = "c1") -> Any:
    [result] = loop.run_turn([ToolCall(call_id, name, "{}")], timeout_s=WAIT_S)
    return result


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "plugins"
    path.mkdir()
    return path


def test_a_folder_follows_its_files(system: ActorSystem, folder: Path) -> None:
    handle = add_source(system, PluginFolder(folder, trusted=True), trusted=True, poll_s=None)
    loop = system.start_loop("s1")
    assert offered(loop) == []

    # adding a file adds a tool, offered from the next turn
    hello = write(folder, "hello.py", plugin("hello", "v1"))
    write(folder, "_helper.py", "raise RuntimeError('helpers are skipped')\n")
    write(folder, "notes.txt", "not python")
    status = handle.refresh()
    assert offered(loop) == ["hello"]
    assert call(loop, "hello").content == "v1"
    assert status["tools"] == {
        str(hello): {"name": "hello", "version": status["tools"][str(hello)]["version"], "registered": True,
                     "offered": True, "reason": None},
    }
    assert status["scans"] == 2 and status["last_error"] is None

    # an unchanged scan keeps the very same tool object
    before = system._tools.current.entries["hello"].tool
    handle.refresh()
    assert system._tools.current.entries["hello"].tool is before

    # changing the file re-registers: the new code answers
    write(folder, "hello.py", plugin("hello", "v2"))
    handle.refresh()
    assert system._tools.current.entries["hello"].tool is not before
    assert call(loop, "hello", "c2").content == "v2"

    # removing it makes a call "unavailable"
    hello.unlink()
    status = handle.refresh()
    assert offered(loop) == [] and status["tools"] == {}
    result = call(loop, "hello", "c3")
    assert result.error_kind is ErrorKind.UNAVAILABLE, result
    assert "hello" in result.content


def test_broken_files_are_reported_and_hide_nothing(system: ActorSystem, folder: Path, logs: list[str]) -> None:
    write(folder, "good.py", plugin("good", "fine"))
    syntax = write(folder, "syntax.py", "def name(:\n")
    raising = write(folder, "raising.py", "x = 1\nraise ValueError('no config')\n")
    exiting = write(folder, "exiting.py", "import sys\nsys.exit(3)\n")
    interrupting = write(folder, "interrupting.py", "raise KeyboardInterrupt\n")
    not_a_tool = write(folder, "not_a_tool.py", "def name():\n    return 'x'\n")
    bad_decl = write(folder, "bad_decl.py", plugin("bad name!", "x"))
    handle = add_source(system, PluginFolder(folder, trusted=True), trusted=True, poll_s=None)
    loop = system.start_loop("s1")
    assert offered(loop) == ["good"]
    assert call(loop, "good").content == "fine"

    tools = handle.status()["tools"]
    assert tools[str(syntax)]["reason"].endswith("line 1: SyntaxError: invalid syntax")
    assert "line 2: importing it raised ValueError: no config" in tools[str(raising)]["reason"]
    assert "importing it raised SystemExit: 3" in tools[str(exiting)]["reason"]
    assert "importing it raised KeyboardInterrupt" in tools[str(interrupting)]["reason"]
    assert "not a tool: it lacks description, parameter_schema, run" in tools[str(not_a_tool)]["reason"]
    for key in (syntax, raising, exiting, interrupting, not_a_tool):
        assert tools[str(key)]["registered"] is False and tools[str(key)]["offered"] is False
    # a declaration that fails its checks: held by the registry, not offered
    assert tools[str(bad_decl)]["registered"] is True and tools[str(bad_decl)]["offered"] is False
    assert "does not match" in tools[str(bad_decl)]["reason"]

    # logged once per version, however often it is scanned
    handle.refresh()
    handle.refresh()
    assert sum("syntax.py" in m and "not loaded" in m for m in logs) == 1
    write(folder, "syntax.py", "def name(:\n\n")  # a new version, still broken: logged again
    handle.refresh()
    assert sum("syntax.py" in m and "not loaded" in m for m in logs) == 2

    # fixed: it is offered
    write(folder, "syntax.py", plugin("fixed", "ok"))
    handle.refresh()
    assert offered(loop) == ["good", "fixed"]


class Switchable:
    """A source whose tools and failures the test sets."""

    name = "switchable"

    def __init__(self) -> None:
        self.tools: dict[str, tuple[Any, object]] = {}
        self.error: BaseException | None = None

    def scan(self) -> dict[str, tuple[Any, object]]:
        if self.error is not None:
            raise self.error
        return dict(self.tools)


@tool
def alpha() -> str:
    """Alpha."""
    return "alpha"


@tool
def beta() -> str:
    """Beta."""
    return "beta"


@tool
def gamma() -> str:
    """Gamma."""
    return "gamma"


def test_a_failed_scan_keeps_the_last_good_set(system: ActorSystem, logs: list[str]) -> None:
    source = Switchable()
    source.tools = {"a": (alpha, 1)}
    handle = add_source(system, source, trusted=True, poll_s=None)
    loop = system.start_loop("s1")
    assert offered(loop) == ["alpha"]

    source.tools = {"b": (beta, 1)}
    source.error = OSError("the disk is on fire")
    status = handle.refresh()
    assert offered(loop) == ["alpha"]
    assert status["last_error"] == "scan failed: OSError: the disk is on fire"
    assert status["failed_scans"] == 1 and list(status["tools"]) == ["a"]
    source.error = SystemExit(1)  # not even an exit ends the actor
    assert handle.refresh()["failed_scans"] == 2
    source.error = None
    source.tools = {"not-a-dict": "oops"}  # type: ignore[dict-item]
    assert "expected str: (tool, version)" in handle.refresh()["last_error"]
    assert offered(loop) == ["alpha"]
    assert any("the disk is on fire" in m for m in logs)

    source.tools = {"b": (beta, 1)}
    status = handle.refresh()
    assert offered(loop) == ["beta"] and status["last_error"] is None

    class Odd:  # a version whose comparison raises counts as changed, never as a crash
        def __eq__(self, other: object) -> bool:
            raise ValueError("incomparable")

        __hash__ = object.__hash__

    source.tools = {"b": (beta, Odd())}
    handle.refresh()
    handle.refresh()
    assert offered(loop) == ["beta"] and handle.status()["last_error"] is None
    assert handle.alive


def test_a_duplicate_name_is_refused_naming_both_origins(system: ActorSystem, folder: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    first = write(folder, "a_first.py", plugin("same", "first"))
    second = write(folder, "b_second.py", plugin("same", "second"))
    handle = add_source(system, PluginFolder(folder, trusted=True), trusted=True, poll_s=None)
    loop = system.start_loop("s1")
    assert call(loop, "same").content == "first"
    entry = handle.status()["tools"][str(second)]
    assert entry["registered"] is False and entry["offered"] is False
    assert "already registered by" in entry["reason"]
    assert str(first) in entry["reason"] and str(second) in entry["reason"]
    assert handle.status()["tools"][str(first)]["offered"] is True

    # the host's own tool takes the name from the source's (DESIGN §3 "Names"), until unregistered
    @tool(name="same")
    def host_same() -> str:
        """Mine."""
        return "host"

    system.register(host_same)
    assert call(loop, "same", "c1b").content == "host"
    assert "taken by the host's own registration" in handle.refresh()["tools"][str(first)]["reason"]
    system.unregister(host_same)
    assert handle.refresh()["tools"][str(first)]["offered"] is True

    # refused again only once the tool set has changed (not at every scan)
    attempts: list[Any] = []
    register = system.register

    def counting(tool_: Any, **kwargs: Any) -> Any:
        attempts.append(tool_)
        return register(tool_, **kwargs)

    monkeypatch.setattr(system, "register", counting)
    handle.refresh()
    handle.refresh()
    assert attempts == []

    # once the first is gone, the second takes the name at the next scan
    first.unlink()
    status = handle.refresh()
    assert len(attempts) == 1
    assert status["tools"][str(second)]["offered"] is True
    assert call(loop, "same", "c2").content == "second"


def test_periodic_polling_notices_changes(system: ActorSystem, folder: Path) -> None:
    handle = add_source(system, PluginFolder(folder, trusted=True), trusted=True, poll_s=0.05)
    loop = system.start_loop("s1")
    write(folder, "ticker.py", plugin("ticker", "one"))
    assert wait_for(lambda: offered(loop) == ["ticker"])
    assert call(loop, "ticker").content == "one"
    write(folder, "ticker.py", plugin("ticker", "two"))
    assert wait_for(lambda: call(loop, "ticker", "c2").content == "two")
    (folder / "ticker.py").unlink()
    assert wait_for(lambda: offered(loop) == [])
    scans = handle.status()["scans"]
    assert wait_for(lambda: handle.status()["scans"] > scans + 2)  # it keeps polling


@pytest.mark.parametrize("trusted", [True, False], ids=["thread", "process"])
def test_a_call_in_flight_finishes_when_its_tool_is_removed(folder: Path, tmp_path: Path, trusted: bool,
                                                           request: pytest.FixtureRequest) -> None:
    started, go = tmp_path / "started", tmp_path / "go"
    body = f"""
        import os, time

        def run(args, ctx):
            open({str(started)!r}, "w").close()
            until = time.monotonic() + {WAIT_S}
            while not os.path.exists({str(go)!r}) and time.monotonic() < until:
                time.sleep(0.005)
            return "finished" if os.path.exists({str(go)!r}) else "not released"
    """
    slow = write(folder, "slow.py", plugin("slow", "unused", body))
    # the tool signals through files outside its private folder: no OS confinement here
    system = ActorSystem(tmp_path / "data", confinement=False)
    request.addfinalizer(system.stop)
    handle = add_source(system, PluginFolder(folder, trusted=trusted), trusted=trusted, poll_s=None)
    assert system._tools.current.entries["slow"].isolation == ("thread" if trusted else "process")
    loop = system.start_loop("s1")
    future = loop.submit_turn([ToolCall("c1", "slow", "{}")])
    assert wait_for(started.exists)

    slow.unlink()
    handle.refresh()
    other = system.start_loop("s2")
    assert call(other, "slow", "c2").error_kind is ErrorKind.UNAVAILABLE
    assert not future.done()

    go.touch()
    [result] = future.result(timeout=WAIT_S)
    assert result.ok and result.content == "finished"


def test_untrusted_plugins_run_in_worker_processes(tmp_path: Path, folder: Path) -> None:
    body = """
        import os

        def run(args, ctx):
            return os.getpid()
    """
    write(folder, "where.py", plugin("where", "unused", body))
    with ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000) as system:
        handle = add_source(system, PluginFolder(folder), poll_s=None)  # untrusted by default
        assert handle.trusted is False
        loop = system.start_loop("s1")
        assert offered(loop) == ["where"]
        assert system._tools.current.entries["where"].isolation == "process"
        result = call(loop, "where")
        assert result.ok and int(result.content) != os.getpid()


def test_entry_points(system: ActorSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = f"rho_test_ep_{uuid.uuid4().hex[:8]}"
    group = f"rho_actors.tools.test_{uuid.uuid4().hex[:8]}"
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{module}.py").write_text(plugin("from_module", "module answer") + textwrap.dedent("""
        class Shouter:
            @staticmethod
            def name():
                return "shout"

            @staticmethod
            def description():
                return "Shout."

            @staticmethod
            def parameter_schema():
                return {"type": "object"}

            @staticmethod
            def run(args, ctx):
                return "HEY"

        not_a_tool = 42
    """))
    info = site / "rho_test_dist-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rho-test-dist\nVersion: 1.2\n")
    (info / "entry_points.txt").write_text(
        f"[{group}]\nmod = {module}\nshouter = {module}:Shouter\nnumber = {module}:not_a_tool\n"
        f"missing = {module}_nope\n"
    )
    monkeypatch.syspath_prepend(str(site))
    try:
        source = EntryPointGroup(group)
        assert source.name == f"entry-points:{group}" and EntryPointGroup().group == DEFAULT_GROUP
        handle = add_source(system, source, trusted=True, poll_s=None)
        loop = system.start_loop("s1")
        assert sorted(offered(loop)) == ["from_module", "shout"]
        assert call(loop, "shout").content == "HEY"
        assert call(loop, "from_module", "c2").content == "module answer"
        tools = handle.status()["tools"]
        assert tools["rho-test-dist:mod"]["version"] == f"1.2:{module}"
        assert "not a tool" in tools["rho-test-dist:number"]["reason"]
        assert "ModuleNotFoundError" in tools["rho-test-dist:missing"]["reason"]
    finally:
        sys.modules.pop(module, None)


def test_the_source_actor_is_supervised(system: ActorSystem, folder: Path) -> None:
    write(folder, "one.py", plugin("one", "1"))
    handle = add_source(system, PluginFolder(folder, trusted=True), trusted=True, poll_s=None)
    assert repr(handle).startswith("<SourceHandle") and handle.alive
    with pytest.raises(ValueError, match="already added"):
        add_source(system, PluginFolder(folder, trusted=True), trusted=True)
    with pytest.raises(TypeError, match="not a source"):
        add_source(system, object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="poll_s"):
        add_source(system, PluginFolder(folder, name="other"), poll_s=0)

    # killed: restarted by the servers supervisor, with its state (nothing registered twice)
    ref = system.whereis(handle.child_id)
    assert ref is not None
    kill(ref)
    assert wait_for(lambda: system.whereis(handle.child_id) not in (None, ref))
    write(folder, "two.py", plugin("two", "2"))
    status = handle.refresh()
    assert all(t["offered"] for t in status["tools"].values()), status
    assert [t.name for t in system.tools()] == ["one", "two"]

    # closed: its tools go, its actor stops for good
    handle.close()
    assert not handle.alive and system.tools() == []
    with pytest.raises(RuntimeError, match="not running"):
        handle.refresh()


def test_stopping_the_system_stops_the_source(tmp_path: Path, folder: Path) -> None:
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000)
    handle: SourceHandle = add_source(system, PluginFolder(folder, trusted=True), trusted=True, poll_s=0.05)
    ref = system.whereis(handle.child_id)
    assert ref is not None
    system.stop()
    assert not ref.is_alive() and not handle.alive
    handle.close()  # a no-op now


def test_a_missing_folder_is_a_failed_scan(system: ActorSystem, tmp_path: Path) -> None:
    handle = add_source(system, PluginFolder(tmp_path / "nowhere", trusted=True), trusted=True, poll_s=None)
    assert handle.status()["last_error"].startswith("scan failed: FileNotFoundError")


def test_registration_errors_are_recorded_per_key(system: ActorSystem) -> None:
    source = Switchable()
    source.tools = {"ok": (alpha, 1), "junk": (object(), 1), "broken": (Broken("it broke"), 1)}
    handle = add_source(system, source, trusted=True, poll_s=None)
    tools = handle.status()["tools"]
    assert tools["ok"]["offered"] is True
    assert "is not a tool" in tools["junk"]["reason"]
    assert tools["broken"]["reason"] == "it broke"


def test_a_scans_new_tools_are_offered_as_one_change(system: ActorSystem) -> None:
    """A trusted source's new tools appear in one tool set (a server's whole listing
    after its restart, never a part of it), with the origins they would have alone."""
    before = system.tool_set().version  # one more for each tool set published
    source = Switchable()
    source.tools = {"a": (alpha, 1), "b": (beta, 1)}
    handle = add_source(system, source, trusted=True, poll_s=None)
    handle.wait_idle()
    assert {"alpha", "beta"} <= set(system.tool_set().entries)
    assert system.tool_set().version == before + 1
    assert {r.origin for r in system.registrations()} >= {"a (source switchable)", "b (source switchable)"}

    # a batch the registry refuses (a name taken twice) is registered key by key
    @tool(name="alpha")
    def alpha_again() -> str:
        """Alpha again."""
        return "again"

    source.tools = {**source.tools, "c": (gamma, 1), "d": (alpha_again, 1)}
    tools = handle.refresh()["tools"]
    assert tools["c"]["offered"] is True and "already registered by" in tools["d"]["reason"]


def test_load_module_file_keeps_sys_modules_clean(tmp_path: Path) -> None:
    path = write(tmp_path, "dc.py", "from dataclasses import dataclass\n\n@dataclass\nclass P:\n    x: int = 1\n")
    before = set(sys.modules)
    module = load_module_file(path)
    assert module.P().x == 1 and module.__file__ == str(path.resolve())
    assert set(sys.modules) == before
    again = load_module_file(path)
    assert again is not module and again.__name__ == module.__name__
    write(tmp_path, "dc.py", "x = 2\n")
    assert load_module_file(path).__name__ != module.__name__


def test_a_plugin_file_may_hold_one_tool_function(system: ActorSystem, folder: Path) -> None:
    write(folder, "greet.py", (
        "from rho_actors import tool\n\n"
        "@tool\n"
        "def greet(who: str) -> str:\n"
        "    '''Greet someone.'''\n"
        "    return f'hello {who}'\n"
    ))
    two = write(folder, "two.py", (
        "from rho_actors import tool\n\n"
        "@tool\ndef a() -> str:\n    '''A.'''\n    return 'a'\n\n"
        "@tool\ndef b() -> str:\n    '''B.'''\n    return 'b'\n"
    ))
    handle = add_source(system, PluginFolder(folder, trusted=True), trusted=True, poll_s=None)
    loop = system.start_loop("s1")
    assert offered(loop) == ["greet"]
    [result] = loop.run_turn([ToolCall("g", "greet", '{"who": "Ada"}')])
    assert result.content == "hello Ada"
    assert "defines 2 tools; a plugin file holds one" in handle.status()["tools"][str(two)]["reason"]


def test_untrusted_file_names_and_reasons_reach_status_and_logs_as_one_escaped_line(
        system: ActorSystem, folder: Path, logs: list[str]) -> None:
    """A plugin file's name is anyone's who may write the folder, and a reason is what its
    code or its child said: an escape sequence or a newline in either never reaches the
    caller of ``status()`` or the log as it is (it would drive a terminal or forge a log
    line); each is one line, escaped as Python writes it, as every reason shown."""
    from rho_actors.encoding import replace_controls

    named = write(folder, "ok\x1b]0;pwned\x07\nINFO forged.py", plugin("named", "fine"))
    raising = write(folder, "raises.py", 'raise ValueError("first\\nsecond\\x1b[2J")\n')
    handle = add_source(system, PluginFolder(folder), poll_s=None)
    tools = handle.status()["tools"]
    for key, entry in tools.items():
        for text in (key, entry["version"], entry["reason"] or ""):
            assert "\n" not in text and replace_controls(text) == text, f"unscrubbed: {text!r}"
    shown = "ok\\x1b]0;pwned\\x07\\nINFO forged.py"
    [key] = [k for k in tools if k.endswith(shown)]
    assert tools[key]["offered"] is True and tools[key]["name"] == "named"
    [reason] = [e["reason"] for k, e in tools.items() if k.endswith("raises.py")]
    assert "first\\nsecond" in reason, reason
    assert str(named) not in tools and str(raising) in tools
    for line in logs:
        assert "\n" not in line and replace_controls(line) == line, f"an unscrubbed log line: {line!r}"
    assert any(shown in line and "registered as tool 'named'" in line for line in logs)
    assert any("first\\nsecond" in line for line in logs)
    broken = PluginFolder(folder).scan()[str(raising)][0]  # a scan's own Broken, as a caller of scan() sees it
    assert isinstance(broken, Broken) and "first\\nsecond" in broken.reason and "\n" not in broken.reason


def test_two_file_names_that_show_alike_keep_their_own_status_entries(system: ActorSystem, folder: Path) -> None:
    """A file literally named with a backslash-escape shows as the one with the control
    character does: both are listed, the second told apart by a suffix."""
    write(folder, "a\x1b.py", plugin("first", "1"))
    write(folder, "a\\x1b.py", plugin("second", "2"))
    tools = add_source(system, PluginFolder(folder), poll_s=None).status()["tools"]
    names = sorted(entry["name"] for entry in tools.values())
    assert names == ["first", "second"], tools
    assert any(key.endswith("a\\x1b.py #2") for key in tools), list(tools)


def test_many_keys_that_show_alike_are_told_apart_in_linear_time(system: ActorSystem) -> None:
    """``2**k`` names spell ``k`` control characters raw or backslash-escaped: all show
    alike. Each gets its own entry, and telling them apart costs each one a look or two
    (it looked at every suffix taken before: 16,384 such names took 48 s, the source's
    lock held)."""
    from rho_actors.sources.source_actor import _distinct

    k = 10
    names = ["".join("\x01" if bit == "1" else "\\x01" for bit in f"{i:0{k}b}") for i in range(2**k)]
    source = Switchable()
    source.tools = {name: (Broken("junk"), 1) for name in names}
    tools = add_source(system, source, trusted=True, poll_s=None).status()["tools"]
    shown = "\\x01" * k
    assert set(tools) == {shown} | {f"{shown} #{n}" for n in range(2, 2**k + 1)}

    class Probed(dict[str, Any]):
        looks = 0

        def __contains__(self, key: object) -> bool:
            Probed.looks += 1
            return super().__contains__(key)

    taken = Probed()
    last: dict[str, int] = {}
    for i in range(2**k):
        taken[_distinct(taken, shown, last)] = i
    assert len(taken) == 2**k and Probed.looks <= 2 * 2**k, Probed.looks


def test_a_close_past_its_timeout_detaches_the_source_only_once_the_running_scan_ends(
        system: ActorSystem, logs: list[str]) -> None:
    """``SourceHandle.close`` whose unload and stop time out behind a scan still running:
    the source's ``detach()`` waits for that scan's end (it was called at once, the scan
    then running on with what detach tore down), and what the late scan found is not
    registered. Forced with events: the scan waits for the test's word."""
    import threading

    @tool(name="early")
    def early() -> str:
        """Early."""
        return "early"

    @tool(name="late")
    def late() -> str:
        """Late."""
        return "late"

    scanning, go_on, detached = threading.Event(), threading.Event(), threading.Event()
    scan_over = threading.Event()
    seen_during_scan: list[bool] = []

    class Slow:
        name = "slow"

        def __init__(self) -> None:
            self.scans = 0

        def scan(self) -> dict[str, tuple[Any, object]]:
            self.scans += 1
            if self.scans == 1:
                return {"early": (early, 1)}
            scanning.set()
            assert go_on.wait(WAIT_S)
            scan_over.set()
            return {"early": (early, 1), "late": (late, 1)}

        def detach(self) -> None:
            seen_during_scan.append(scanning.is_set() and not scan_over.is_set())
            detached.set()

    handle = add_source(system, Slow(), trusted=True, poll_s=None)
    assert "early" in system.tool_set().entries
    threading.Thread(target=handle.refresh, kwargs={"timeout_s": WAIT_S}, daemon=True).start()
    assert scanning.wait(WAIT_S)
    handle.close(timeout_s=0.05)  # the unload and the stop wait behind the scan: both time out
    assert not detached.is_set(), "detached while the source's scan still ran"
    go_on.set()
    assert detached.wait(WAIT_S)
    assert seen_during_scan == [False]
    assert wait_for(lambda: not handle.alive)
    assert "late" not in system.tool_set().entries and "early" not in system.tool_set().entries
    assert not any("registered as tool 'late'" in line for line in logs), logs
    assert any("a scan still runs after close's 0.05 s; the source is detached once it ends" in line
               for line in logs), logs
