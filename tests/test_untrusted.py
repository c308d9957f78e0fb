"""Untrusted tools in a system (DESIGN §3, §5): declarations read in throwaway processes,
retried on a schedule, calls run in killable worker processes."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from rho_actors import (
    ActorSystem,
    DeclarationEvent,
    DuplicateToolError,
    ErrorKind,
    ToolCall,
    UntrustedReads,
    declaration,
    timeout_ms,
    untrusted,
)

from .conftest import WAIT_S, slack, wait_for
from .helpers import make_tool

ECHO_MS = int(WAIT_S * 1000)  # echo's deadline: only a hang reaches it

Echo: Any = make_tool(
    "echo",
    lambda args, ctx: f"{args['text']} {os.getpid()}",  # reports the process it ran in
    description="Echo the text with the pid of the process that ran it.",
    schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    timeout_ms=ECHO_MS,
)

def holds_the_gil(deadline_ms: int) -> Any:
    """Computes a huge power in C (about 7 s): only another process can keep a deadline against it."""
    return make_tool("gil", lambda args, ctx: str(10 ** (10**7) > 0), description="Hold the GIL for seconds.",
                     timeout_ms=deadline_ms)


def slow_once(flag: Path) -> type:
    """A tool whose name() hangs until ``flag`` exists: the first read runs over, a retry
    works. Each test has its own flag (tests run in parallel), under ``/tmp`` so that a
    confined reader can see it."""

    class SlowOnce:
        @staticmethod
        def name() -> str:
            while not flag.exists():
                time.sleep(0.01)
            return "slow_once"

        description = staticmethod(lambda: "Slow to read the first time.")
        parameter_schema = staticmethod(lambda: {"type": "object"})
        run = staticmethod(lambda args, ctx: "ran")

    return SlowOnce


@pytest.fixture
def flag() -> Iterator[Path]:
    path = Path(f"/tmp/rho_actors-test-slow-once-{uuid.uuid4().hex}.flag")
    yield path
    path.unlink(missing_ok=True)


class Hangs:
    @staticmethod
    def name() -> str:
        time.sleep(60)
        return "hangs"

    description = staticmethod(lambda: "Never answers.")
    parameter_schema = staticmethod(lambda: {"type": "object"})
    run = staticmethod(lambda args, ctx: "never")


BadName = make_tool("bad name!", "never", description="A name with a space.")


def _reading_within(tmp_path: Path, timeout_s: float) -> ActorSystem:
    reads = UntrustedReads(timeout_s=timeout_s, retry_s=(0.05, 0.1))
    return ActorSystem(data_dir=tmp_path, untrusted=reads, shutdown_ms=2_000, warm_workers=1)


@pytest.fixture
def system(tmp_path: Path) -> Any:
    # a read is cut only at a hang: a load of 20 and more (a fork server starting, a module
    # imported by value) took one past a load-scaled bound
    with _reading_within(tmp_path, WAIT_S) as sys_:
        yield sys_


@pytest.fixture
def cutting(tmp_path: Path) -> Any:
    # a read that hangs (slow_once's first) is cut at this bound, three times within WAIT_S;
    # a read the machine's load slows down stays within it
    with _reading_within(tmp_path, min(slack(2.0), WAIT_S / 4)) as sys_:
        yield sys_


def test_an_untrusted_tool_is_read_and_run_in_other_processes(system: ActorSystem) -> None:
    registration = system.register(Echo, untrusted=True)
    assert registration.info is not None and registration.info.timeout_ms == ECHO_MS
    [result] = system.start_loop().run_turn([ToolCall("e", "echo", '{"text": "hi"}')])
    text, pid = result.content.split()
    assert result.ok and text == "hi" and int(pid) != os.getpid()
    assert system.stats()["untrusted_workers_alive"] >= 1


def test_a_process_call_times_out_on_time_even_holding_the_gil(system: ActorSystem) -> None:
    loop = system.start_loop()
    # a loaded machine may pass 300 ms before the call reaches its worker ("it did not start", no worker
    # killed): then again with a longer deadline, still far within the C call's
    for deadline_ms in (300, 1_200, 4_800):
        system.register(holds_the_gil(deadline_ms), untrusted=True)
        started = time.monotonic()
        [result] = loop.run_turn([ToolCall(f"g{deadline_ms}", "gil", "{}")])
        elapsed = time.monotonic() - started
        assert result.error_kind is ErrorKind.TIMEOUT, result
        assert elapsed < deadline_ms / 1000 + 0.7 + slack(2.0)  # the C call alone takes ~7 s
        if "it did not start" not in result.content:
            break
        system.unregister("gil")
    assert "worker process was killed" in result.content, result
    assert wait_for(lambda: system.stats()["untrusted_workers_killed"] == 1)
    assert system.stats()["abandoned_threads_total"] == 0  # nothing abandoned: the worker died instead


def test_bad_untrusted_declarations_are_left_out_with_their_reason(system: ActorSystem) -> None:
    events: list[DeclarationEvent] = []
    system.subscribe(lambda e: events.append(e) if isinstance(e, DeclarationEvent) else None)
    registration = system.register(BadName, untrusted=True)
    assert registration.info is None and "does not match" in str(registration.reason)
    loop = system.start_loop()
    assert loop.offered() == []
    [result] = loop.run_turn([ToolCall("b", "bad name!", "{}")])
    assert result.error_kind is ErrorKind.UNKNOWN_TOOL
    assert [e.kind for e in events] == ["rejected"]


def test_a_read_that_runs_over_is_retried_then_excluded(tmp_path: Path) -> None:
    # a read that never answers runs over any bound: a short one (not the load-scaled one
    # of the fixture, three times over) cuts all three reads alike
    reads = UntrustedReads(timeout_s=0.3, retry_s=(0.05, 0.1))
    with ActorSystem(data_dir=tmp_path, untrusted=reads, shutdown_ms=2_000, warm_workers=1) as system:
        events: list[DeclarationEvent] = []
        system.subscribe(lambda e: events.append(e) if isinstance(e, DeclarationEvent) else None)
        registration = system.register(Hangs, untrusted=True)
        assert registration.info is None and "(timeout)" in str(registration.reason)
        assert wait_for(lambda: [e.kind for e in events] == ["retry", "retry", "excluded"], timeout_s=WAIT_S)
        assert "read again in 0.05 s" in str(events[0].reason) and "read again in 0.1 s" in str(events[1].reason)
        assert declaration(untrusted(Hangs)) is None


def test_a_retry_that_succeeds_offers_the_tool(cutting: ActorSystem, flag: Path) -> None:
    registration = cutting.register(slow_once(flag), untrusted=True)
    assert registration.info is None
    flag.touch()
    loop = cutting.start_loop()
    assert wait_for(lambda: [i.name for i in loop.offered()] == ["slow_once"], timeout_s=WAIT_S)
    assert loop.run_turn([ToolCall("s", "slow_once", "{}")])[0].content == "ran"


def test_untrusted_duplicates_are_refused_naming_both(system: ActorSystem) -> None:
    system.register(Echo)

    class Other(Echo):
        pass

    with pytest.raises(DuplicateToolError, match="'echo' is already registered by"):
        system.register(Other, untrusted=True)


def test_the_module_functions_use_the_checked_declaration_of_a_marked_tool(system: ActorSystem) -> None:
    class Marked(Echo):
        pass

    untrusted(Marked)
    assert declaration(Marked, "mcp") is None  # not read yet: never read in this thread
    assert timeout_ms(Marked) == 30_000
    registration = system.register(Marked)  # marked: read in a throwaway process
    assert registration.info is not None
    assert declaration(Marked, "mcp") == {
        "name": "echo", "description": Echo.description(), "inputSchema": Echo.parameter_schema()
    }
    assert timeout_ms(Marked) == ECHO_MS
    [result] = system.start_loop().run_turn([ToolCall("m", "echo", '{"text": "x"}')])
    assert int(result.content.split()[1]) != os.getpid()


def test_two_systems_share_no_checked_declaration(system: ActorSystem, tmp_path: Path) -> None:
    """Each system reads an untrusted tool itself; unregistering it in one leaves the
    other's checked declaration (and what the module functions answer) as it was."""

    class Shared(Echo):
        pass

    untrusted(Shared)
    with ActorSystem(data_dir=tmp_path / "other", untrusted=UntrustedReads(timeout_s=WAIT_S), warm_workers=0) as other:
        assert other.register(Shared).info is not None
        assert timeout_ms(Shared) == ECHO_MS
        assert system.register(Shared).info is not None
        system.unregister("echo")
        assert timeout_ms(Shared) == ECHO_MS  # still the other system's checked declaration
        assert declaration(Shared, "mcp") is not None
        other.unregister("echo")
    assert timeout_ms(Shared) == 30_000 and declaration(Shared, "mcp") is None  # no live system holds it


def test_a_trusted_tool_may_ask_for_process_isolation(system: ActorSystem) -> None:
    system.register(Echo, isolation="process")
    [result] = system.start_loop().run_turn([ToolCall("e", "echo", '{"text": "x"}')])
    assert result.ok and int(result.content.split()[1]) != os.getpid(), result
    with pytest.raises(ValueError, match="isolation must be one of"):
        system.register(BadName, isolation="gpu")


class Spawner:
    """Starts a grandchild process (found by its unusual arguments), then blocks."""

    name = staticmethod(lambda: "spawner")
    description = staticmethod(lambda: "Start a subprocess and wait.")
    parameter_schema = staticmethod(lambda: {"type": "object"})

    @staticmethod
    def run(args: Any, ctx: Any) -> str:
        import subprocess

        subprocess.Popen(["sleep", "300.25"])
        time.sleep(60)
        return "never"


def test_stop_leaves_no_worker_process_nor_anything_it_started(tmp_path: Path) -> None:
    system = ActorSystem(data_dir=tmp_path, warm_workers=1, shutdown_ms=500)
    system.register(Spawner, untrusted=True)
    loop = system.start_loop("s")
    future = loop.submit_turn([ToolCall("s", "spawner", "{}")])
    sleepers: list[psutil.Process] = []

    def found() -> bool:
        sleepers.extend(_sleepers("300.25"))
        return bool(sleepers)

    assert wait_for(found)
    pids = [sleepers[0].pid, sleepers[0].ppid()]
    assert all(_alive(p) for p in pids)
    system.stop()
    assert future.result(WAIT_S)[0].error_kind is ErrorKind.CANCELLED
    assert wait_for(lambda: not any(_alive(p) for p in pids))


def _sleepers(arg: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", arg]]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class SlowName:
    """Its name() takes a while: long enough to restart the system's actors meanwhile."""

    @staticmethod
    def name() -> str:
        time.sleep(0.5)
        return "slow_name"

    description = staticmethod(lambda: "Slow to read.")
    parameter_schema = staticmethod(lambda: {"type": "object"})
    run = staticmethod(lambda args, ctx: "ran")


@pytest.mark.parametrize("victim", ["registry", "declarations"])
def test_a_read_in_flight_survives_a_restart_of_the_system_actors(system: ActorSystem, victim: str) -> None:
    import threading

    from rho_actors import kill

    done: list[Any] = []
    registering = threading.Thread(target=lambda: done.append(system.register(SlowName, untrusted=True)))
    registering.start()
    old = system.whereis(victim)
    assert old is not None
    kill(old)
    registering.join(WAIT_S)
    assert done and done[0].info is not None and done[0].info.name == "slow_name"
    assert [i.name for i in system.tools()] == ["slow_name"]


def test_a_retry_survives_a_restart_of_the_declaration_actor(cutting: ActorSystem, flag: Path) -> None:
    from rho_actors import kill

    events: list[DeclarationEvent] = []
    cutting.subscribe(lambda e: events.append(e) if isinstance(e, DeclarationEvent) else None)
    assert cutting.register(slow_once(flag), untrusted=True).info is None  # timed out: a retry is scheduled
    old = cutting.whereis("declarations")
    assert old is not None
    kill(old)
    assert wait_for(lambda: cutting.whereis("declarations") not in (None, old))
    flag.touch()
    assert wait_for(lambda: [i.name for i in cutting.tools()] == ["slow_once"], timeout_s=WAIT_S)


class HangsAndTells:
    """Writes the pid of the process reading it, then never answers."""

    @staticmethod
    def name() -> str:
        Path("/tmp/rho_actors-test-untrusted-reader.pid").write_text(str(os.getpid()))
        time.sleep(60)
        return "never"

    description = staticmethod(lambda: "Never answers.")
    parameter_schema = staticmethod(lambda: {"type": "object"})
    run = staticmethod(lambda args, ctx: "never")


def test_stop_cancels_a_read_in_flight_and_the_waiting_register(tmp_path: Path) -> None:
    import threading

    pid_file = Path("/tmp/rho_actors-test-untrusted-reader.pid")
    pid_file.unlink(missing_ok=True)
    # Without OS confinement: the read tells its pid through a file outside its private folder.
    system = ActorSystem(data_dir=tmp_path, untrusted=UntrustedReads(timeout_s=3 * WAIT_S), confinement=False)
    errors: list[BaseException] = []

    def register() -> None:
        try:
            system.register(HangsAndTells, untrusted=True)
        except BaseException as err:
            errors.append(err)

    registering = threading.Thread(target=register)
    registering.start()
    assert wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "")  # created, then written
    reader = int(pid_file.read_text())
    started = time.monotonic()
    system.stop()
    registering.join(WAIT_S)
    assert time.monotonic() - started < WAIT_S
    assert len(errors) == 1 and "stopped before the declaration was read" in str(errors[0])
    assert wait_for(lambda: not _alive(reader))
    pid_file.unlink(missing_ok=True)


def test_no_code_of_an_untrusted_module_runs_in_the_host_to_register_it(system: ActorSystem, tmp_path: Path) -> None:
    from rho_actors.sources.source_actor import load_module_file

    lookups = tmp_path / "lookups"
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import os\n"
        f"HOST = {os.getpid()}\n"
        "def name(): return 'plugin'\n"
        "def description(): return 'A plugin with a module __getattr__.'\n"
        "def parameter_schema(): return {'type': 'object'}\n"
        "def run(args, ctx): return 'ran'\n"
        "def __getattr__(attr):\n"
        "    if os.getpid() == HOST:\n"
        f"        open({str(lookups)!r}, 'a').write(attr + '\\n')\n"
        "    raise AttributeError(attr)\n"
    )
    module = load_module_file(plugin)
    registration = system.register(module, untrusted=True)
    assert registration.info is not None and registration.info.name == "plugin"
    assert system.start_loop().run_turn([ToolCall("p", "plugin", "{}")])[0].content == "ran"
    assert not lookups.exists(), lookups.read_text()


def test_unregister_returns_once_the_systems_checked_declaration_is_gone(system: ActorSystem,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``unregister`` waits for the DeclarationActor to drop the tool's checked
    declaration: right after it returns, ``timeout_ms`` of the untrusted tool is the
    default (before: the drop was a message not waited for, and a slow actor left the
    declaration readable after unregister returned, as a loaded machine did)."""
    from rho_actors.declarations.checked import CheckedCache

    class Alone(Echo):
        pass

    untrusted(Alone)
    assert system.register(Alone).info is not None and timeout_ms(Alone) == ECHO_MS
    forget = CheckedCache.forget

    def slow_forget(self: Any, tool: Any) -> None:
        time.sleep(0.5)  # a slow actor, not a synchronisation: the result below may not depend on it
        forget(self, tool)

    monkeypatch.setattr(CheckedCache, "forget", slow_forget)
    assert system.unregister("echo")
    assert timeout_ms(Alone) == 30_000 and declaration(Alone, "mcp") is None
