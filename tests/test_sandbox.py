"""rho_actors.sandbox: isolated declaration reads and the worker pool of ``process``
isolation (DESIGN §3, §5).

Every wait is bounded; synchronisation is by files the tools write (a tool's pid, a
"started" marker), never by sleeping for a guessed time. The tools below are shipped to
child processes by value (this module is registered with cloudpickle), so a child never
imports pytest or this file.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from rho_actors.declarations.checks import DeclarationError, check_declaration
from rho_actors.function_tool import tool
from rho_actors.sandbox import IsolatedReadError, WorkerPool, raw_declaration, read_declaration_isolated
from rho_actors.tool import Details, Error, ErrorKind, ToolResult

from .conftest import WAIT_S, slack, wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(60)

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
MAX_CHARS = 1_000


# --- helpers -----------------------------------------------------------------------------------


def gone(pid: int) -> bool:
    """Whether process ``pid`` no longer runs (absent, or a zombie awaiting its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in ("Z", "X")


def read_pid(path: Path) -> int:
    assert wait_for(lambda: path.exists() and path.read_text().strip() != ""), f"{path} never written"
    return int(path.read_text().split()[0])


def call(
    pool: WorkerPool, tool: Any, args: Mapping[str, Any] | None = None, *, timeout_s: float = WAIT_S,
    started: float | None = None, **ctx: Any,
) -> ToolResult:
    """``tool`` run in ``pool``; its deadline ``timeout_s`` after its start (the same
    instant: a start read later, on a loaded machine, would shorten the timeout it states)."""
    ctx = {"session_id": "s1", "call_id": "c1", **ctx}
    now = time.monotonic()
    start = now if started is None else started
    return pool.run(tool, dict(args or {}), ctx, now + timeout_s, MAX_CHARS, started=start)


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    p = WorkerPool(warm=2)
    try:
        assert p.wait_warm(WAIT_S)
        yield p
    finally:
        p.stop()


# --- tools -------------------------------------------------------------------------------------


class Base:
    @staticmethod
    def name() -> str:
        return "base"

    @staticmethod
    def description() -> str:
        return "A test tool."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return SCHEMA


class Pid(Base):
    @staticmethod
    def name() -> str:
        return "pid"

    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> int:
        return os.getpid()


class Echo(Base):
    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "args": dict(args),
            "keys": sorted(ctx),
            "session_id": ctx["session_id"],
            "call_id": ctx["call_id"],
            "data_dir": str(ctx["data_dir"]),
            "withheld": list(ctx["withheld"]),
            "deadline": ctx["deadline"],
            "cancelled": ctx["cancel"].cancelled,
            "deps": ctx.get("deps"),
        }


class AsyncSleep(Base):
    @staticmethod
    async def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        await asyncio.sleep(args.get("seconds", 0.01))
        return "slept"


class Append(Base):
    """Writes its pid, then appends to a file forever."""

    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> None:
        Path(args["path"] + ".pid").write_text(str(os.getpid()))
        with open(args["path"], "a") as f:
            while True:
                f.write("x" * 100 + "\n")
                f.flush()
                time.sleep(0.002)


class BigPower(Base):
    """A C call holding the GIL for seconds."""

    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> int:
        power: int = 10 ** (10**7)  # typeshed types a non-literal power as Any
        return power % 7


class WaitForFile(Base):
    """Marks that it started, then waits (bounded) for the test's go-ahead file."""

    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        Path(args["path"] + ".started").write_text(str(os.getpid()))
        until = time.monotonic() + WAIT_S
        while not Path(args["path"] + ".go").exists():
            if time.monotonic() > until:
                return "never released"
            time.sleep(0.002)
        return "sibling done"


class Segfault(Base):
    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> Any:
        return ctypes.string_at(0)


class Abort(Base):
    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> Any:
        os.abort()


class HardExit(Base):
    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> Any:
        os._exit(args["code"])


class SoftExit(Base):
    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> Any:
        if args.get("interrupt"):
            raise KeyboardInterrupt
        sys.exit(args["code"])


class Hog(Base):
    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> int:
        return len(bytearray(2**30))


class Huge(Base):
    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> Any:
        if args.get("details"):
            return Details("big details", b"y" * 30_000_000)
        return "x" * 30_000_000


class LockedDetails(Base):
    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> Any:
        return Details("fine", threading.Lock())


class LockedError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


class RaisesLocked(Base):
    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> Any:
        raise LockedError("the lock is held")


class ReturnsError(Base):
    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> Any:
        return Error("bad input")


class SpawnsSleep(Base):
    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> list[int]:
        child = subprocess.Popen(["sleep", "300"])
        return [os.getpid(), child.pid]


class Rendezvous(Base):
    """Waits until ``n`` calls have started (each writes a marker file): proves that the
    calls run at the same time."""

    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> int:
        folder = Path(args["path"])
        (folder / f"{ctx['call_id']}.started").write_text(str(os.getpid()))
        until = time.monotonic() + WAIT_S
        while len(list(folder.glob("*.started"))) < args["n"]:
            if time.monotonic() > until:
                raise TimeoutError("the other calls never started")
            time.sleep(0.002)
        return os.getpid()


@tool(timeout_ms=int(WAIT_S * 1000))  # only a hang reaches it
def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


class Unshippable:
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def name(self) -> str:
        return "unshippable"

    def description(self) -> str:
        return "Holds a lock."

    def parameter_schema(self) -> dict[str, Any]:
        return SCHEMA

    def run(self, args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        return "never"


# --- 1. isolated declaration reads ---------------------------------------------------------------


class Good(Base):
    @staticmethod
    def name() -> str:
        return "good_tool"

    @staticmethod
    def timeout_ms() -> int:
        return 1_500

    @staticmethod
    def concurrency() -> str:
        return "exclusive"


def test_read_plain_declaration_checks() -> None:
    payload = read_declaration_isolated(Good)
    assert payload == {
        "name": {"type": "str", "value": "good_tool"},
        "description": {"type": "str", "value": "A test tool."},
        "parameter_schema": {"type": "dict", "value": SCHEMA},
        "timeout_ms": {"type": "int", "value": 1_500},
        "concurrency": {"type": "str", "value": "exclusive"},
    }
    info = check_declaration(raw_declaration(payload))
    assert (info.name, info.timeout_ms, info.concurrency) == ("good_tool", 1_500, "exclusive")
    assert info.parameter_schema == SCHEMA


class RaisingCallbacks:
    @staticmethod
    def name() -> str:
        raise ValueError("no name today")

    @staticmethod
    def description() -> str:
        raise SystemExit(3)

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return SCHEMA

    @staticmethod
    def timeout_ms() -> int:
        raise KeyboardInterrupt


def test_read_raises_come_back_as_data() -> None:
    payload = read_declaration_isolated(RaisingCallbacks)
    assert payload["name"] == {"raised": "ValueError: no name today"}
    assert payload["description"] == {"raised": "SystemExit: 3"}
    assert payload["timeout_ms"] == {"raised": "KeyboardInterrupt"}
    assert "concurrency" not in payload  # absent callbacks are absent
    with pytest.raises(DeclarationError, match=r"name\(\) raised ValueError: no name today") as err:
        check_declaration(raw_declaration(payload))
    assert "description() raised SystemExit: 3" in str(err.value)


class MyStr(str):
    pass


class StrSubclassName(Base):
    @staticmethod
    def name() -> str:
        return MyStr("sneaky")


def test_read_str_subclass_reports_its_type_without_value() -> None:
    payload = read_declaration_isolated(StrSubclassName)
    assert payload["name"]["type"] == "MyStr"
    assert payload["name"]["unencodable"] is True
    assert "value" not in payload["name"]
    with pytest.raises(DeclarationError, match="name: expected str, got MyStr"):
        check_declaration(raw_declaration(payload))


class TupleInSchema(Base):
    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {"x": {"enum": ("a", "b")}}}

    @staticmethod
    def timeout_ms() -> float:
        return float("nan")


def test_read_tuple_in_schema_is_unencodable() -> None:
    payload = read_declaration_isolated(TupleInSchema)
    schema = payload["parameter_schema"]
    assert schema["type"] == "dict" and schema["unencodable"] is True and "value" not in schema
    assert "tuple" in schema["reason"] and "properties.x.enum" in schema["reason"]
    assert payload["timeout_ms"]["type"] == "float" and payload["timeout_ms"]["unencodable"] is True
    with pytest.raises(DeclarationError, match="parameter_schema: expected dict, got dict holding non-JSON data") as e:
        check_declaration(raw_declaration(payload))
    assert "a tuple is not JSON data" in str(e.value)


def sleeper_tool(pid_file: Path) -> type:
    class Sleeper(Base):
        @staticmethod
        def name() -> str:
            child = subprocess.Popen(["sleep", "300"])
            Path(f"{pid_file}.part").write_text(f"{child.pid} {os.getpid()}")
            os.rename(f"{pid_file}.part", pid_file)  # whole, or not there
            time.sleep(60)
            return "late"

    return Sleeper


def test_read_timeout_kills_the_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    tool = sleeper_tool(pid_file)
    for timeout_s in (1.0, 4.0, 16.0, WAIT_S):  # on a loaded machine the timeout may come before the spawn
        t0 = time.monotonic()
        with pytest.raises(IsolatedReadError) as err:
            read_declaration_isolated(tool, timeout_s=timeout_s)
        elapsed = time.monotonic() - t0
        assert err.value.kind == "timeout"
        assert "Sleeper" in err.value.message and f"{timeout_s:g} s" in err.value.message, err.value.message
        assert "killed" in err.value.message
        assert timeout_s <= elapsed < timeout_s + slack(3.0)
        if pid_file.exists():
            break
    sleep_pid, child_pid = (int(p) for p in pid_file.read_text().split())
    assert wait_for(lambda: gone(sleep_pid) and gone(child_pid)), "the child or its sleep survived"


class SchemaHog(Base):
    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"blob": bytearray(2**30)}


def test_read_memory() -> None:
    with pytest.raises(IsolatedReadError) as err:
        read_declaration_isolated(SchemaHog, heap_bytes=256 * 2**20)
    assert err.value.kind == "memory"
    assert "SchemaHog" in err.value.message and "256 MiB" in err.value.message
    assert "MemoryError" in err.value.message


class SegfaultName(Base):
    @staticmethod
    def name() -> str:
        return str(ctypes.string_at(0))


def test_read_crash_names_the_signal() -> None:
    with pytest.raises(IsolatedReadError) as err:
        read_declaration_isolated(SegfaultName)
    assert err.value.kind == "crashed"
    assert "SIGSEGV" in err.value.message and "SegfaultName" in err.value.message


class ExitZeroDescription(Base):
    @staticmethod
    def description() -> str:
        os._exit(0)


def test_read_exit_zero_is_not_an_answer() -> None:
    with pytest.raises(IsolatedReadError) as err:
        read_declaration_isolated(ExitZeroDescription)
    assert err.value.kind == "exited"
    assert "code 0" in err.value.message and "without an answer" in err.value.message
    assert "ExitZeroDescription" in err.value.message


def test_read_unpicklable_tool() -> None:
    with pytest.raises(IsolatedReadError) as err:
        read_declaration_isolated(Unshippable())
    assert err.value.kind == "unpicklable"
    assert "lock" in err.value.message and "Unshippable" in err.value.message
    copy = cloudpickle.loads(cloudpickle.dumps(err.value))  # the runtime may pass it on
    assert (copy.kind, copy.message) == (err.value.kind, err.value.message)


PLUGIN_SOURCE = '''
import os

HELLO = "hello from a plugin"


def name():
    return "plugin_module"


def description():
    return "A module that is a tool."


def parameter_schema():
    return {"type": "object", "properties": {}}


def run(args, ctx):
    return "module " + HELLO


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


class PointTool:
    @staticmethod
    def name():
        return "point_tool"

    @staticmethod
    def run(args, ctx):
        from rho_actors.tool import Details

        return Details("a point", Point(1, 2))


class PluginTool:
    @staticmethod
    def name():
        return "plugin_tool"

    @staticmethod
    def description():
        return HELLO

    @staticmethod
    def parameter_schema():
        return {"type": "object", "properties": {}}

    @staticmethod
    def run(args, ctx):
        return HELLO + " in " + str(os.getpid() != int(args["parent"]))
'''


@pytest.fixture(params=["in sys.modules", "not in sys.modules"])
def plugin(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A tool from a module loaded from a file path that is not on sys.path (and left in
    sys.modules, or taken out of it after loading, as rho_actors.sources does)."""
    name = f"rho_test_plugin_{os.getpid()}_{time.monotonic_ns()}"
    path = tmp_path / "elsewhere" / f"{name}.py"
    path.parent.mkdir()
    path.write_text(PLUGIN_SOURCE)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if request.param == "not in sys.modules":
        del sys.modules[name]
    try:
        yield module
    finally:
        sys.modules.pop(name, None)


def test_read_tool_from_a_file_module(plugin: Any) -> None:
    payload = read_declaration_isolated(plugin.PluginTool)
    assert payload["name"] == {"type": "str", "value": "plugin_tool"}
    assert payload["description"] == {"type": "str", "value": "hello from a plugin"}
    assert check_declaration(raw_declaration(payload)).name == "plugin_tool"
    assert read_declaration_isolated(plugin)["name"] == {"type": "str", "value": "plugin_module"}


def spawner_tool(pid_file: Path) -> type:
    class Spawner(Good):
        @staticmethod
        def description() -> str:
            pid_file.write_text(str(subprocess.Popen(["sleep", "300"]).pid))
            return "Leaves a process behind."

    return Spawner


def test_read_leaves_no_process_behind(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    payload = read_declaration_isolated(spawner_tool(pid_file))
    assert payload["description"]["value"] == "Leaves a process behind."
    sleep_pid = read_pid(pid_file)
    assert wait_for(lambda: gone(sleep_pid)), "a process a callback started survived the read"


def test_read_function_tool() -> None:
    payload = read_declaration_isolated(add)
    info = check_declaration(raw_declaration(payload))
    assert (info.name, info.description, info.timeout_ms) == ("add", "Add two integers.", int(WAIT_S * 1000))
    assert info.parameter_schema["required"] == ["a"]


def test_read_with_spawn() -> None:
    payload = read_declaration_isolated(Good, start_method="spawn", timeout_s=WAIT_S)
    assert payload["name"] == {"type": "str", "value": "good_tool"}


def test_read_refuses_bare_fork() -> None:
    with pytest.raises(ValueError, match="fork"):
        read_declaration_isolated(Good, start_method="fork")


def test_concurrent_reads() -> None:
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(read_declaration_isolated(Good))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert len(results) == 6 and all(r["name"]["value"] == "good_tool" for r in results)


# --- 2. the worker pool --------------------------------------------------------------------------


def test_run_ok_with_context(pool: WorkerPool, tmp_path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    ctx = {
        "session_id": "s9", "call_id": "c7", "data_dir": tmp_path, "withheld": ("x", "y"),
        "loop": object(), "deadline": deadline, "deps": {"db": "conn-string"},
    }
    result = pool.run(Echo, {"path": "p"}, ctx, deadline, MAX_CHARS, name="echo")
    assert result.ok and result.error_kind is None and result.call_id == "c7" and result.name == "echo"
    seen = json.loads(result.content)
    assert seen["keys"] == ["call_id", "cancel", "data_dir", "deadline", "deps", "session_id", "withheld"]
    assert seen["args"] == {"path": "p"}
    assert (seen["session_id"], seen["call_id"], seen["data_dir"]) == ("s9", "c7", str(tmp_path))
    assert seen["withheld"] == ["x", "y"] and seen["deadline"] == deadline and seen["cancelled"] is False
    assert seen["deps"] == {"db": "conn-string"}


def test_unpicklable_deps_are_left_out(pool: WorkerPool) -> None:
    result = call(pool, Echo, deps={"lock": threading.Lock()}, data_dir=None, withheld=())
    assert result.ok, result.content
    assert "deps" not in json.loads(result.content)["keys"]


def test_function_tool(pool: WorkerPool) -> None:
    assert call(pool, add, {"a": 2, "b": 3}).content == "5"
    bad = call(pool, add, {"a": "x"})
    assert bad.error_kind is ErrorKind.RAISED and "ValidationError" in bad.content


def test_duration_counts_from_the_given_start(pool: WorkerPool) -> None:
    result = call(pool, Pid, started=time.monotonic() - 1.0)
    assert result.ok and result.duration_ms >= 1_000


def test_async_run(pool: WorkerPool) -> None:
    assert call(pool, AsyncSleep, {"seconds": 0.01}).content == "slept"
    result = call(pool, AsyncSleep, {"seconds": 30}, timeout_s=0.5)
    assert result.error_kind is ErrorKind.TIMEOUT


def test_returned_error_and_raise(pool: WorkerPool) -> None:
    result = call(pool, ReturnsError)
    assert (result.ok, result.error_kind, result.content) == (False, ErrorKind.TOOL_ERROR, "bad input")


def test_timeout_stops_the_work(pool: WorkerPool, tmp_path: Path) -> None:
    out, pid_file = tmp_path / "growing.txt", tmp_path / "growing.txt.pid"
    # on a loaded machine the timeout may come before the tool wrote anything: a longer one then
    calls = 0
    for timeout_s in (0.5, 2.0, 8.0, WAIT_S):
        t0 = time.monotonic()
        result = call(pool, Append, {"path": str(out)}, timeout_s=timeout_s)
        calls += 1
        elapsed = time.monotonic() - t0
        assert result.error_kind is ErrorKind.TIMEOUT and result.retryable
        assert f"timeout of {timeout_s * 1000:.0f} ms" in result.content and "killed" in result.content
        assert timeout_s <= elapsed < timeout_s + slack(1.5)
        if out.exists() and out.stat().st_size > 0:  # the worker is gone: the files are as it left them
            break
    worker_pid = read_pid(pid_file)
    assert gone(worker_pid)  # the worker was killed and reaped before the result came back
    size = out.stat().st_size
    time.sleep(0.2)
    assert out.stat().st_size == size, "the tool kept writing after its timeout"
    assert pool.stats()["killed"] == calls  # one worker killed for each


def test_gil_holding_c_code_times_out_on_time(pool: WorkerPool) -> None:
    t0 = time.monotonic()
    result = call(pool, BigPower, timeout_s=0.5)
    elapsed = time.monotonic() - t0
    assert result.error_kind is ErrorKind.TIMEOUT
    assert 0.5 <= elapsed < 0.5 + slack(1.0), f"took {elapsed:.2f} s"
    assert 450 <= result.duration_ms < (0.5 + slack(1.0)) * 1000


def test_replacement_after_a_kill(pool: WorkerPool, tmp_path: Path) -> None:
    assert call(pool, Append, {"path": str(tmp_path / "f")}, timeout_s=0.3).error_kind is ErrorKind.TIMEOUT
    assert pool.wait_warm(WAIT_S)
    stats = pool.stats()
    assert stats["killed"] == 1 and stats["started"] == 3 and stats["alive"] == 2 and stats["idle"] == 2
    assert call(pool, Pid).ok


def test_sibling_completes_while_one_crashes(pool: WorkerPool, tmp_path: Path) -> None:
    base = tmp_path / "sibling"
    box: list[ToolResult] = []
    sibling = threading.Thread(target=lambda: box.append(call(pool, WaitForFile, {"path": str(base)})))
    sibling.start()
    try:
        sibling_pid = read_pid(Path(str(base) + ".started"))
        crash = call(pool, Segfault)
        assert crash.error_kind is ErrorKind.CRASHED and crash.retryable
        assert "SIGSEGV" in crash.content
        assert not gone(sibling_pid)
    finally:
        Path(str(base) + ".go").write_text("go")
        sibling.join(WAIT_S)
    assert [r.content for r in box] == ["sibling done"] and box[0].ok


def test_abort_is_a_crash(pool: WorkerPool) -> None:
    result = call(pool, Abort)
    assert result.error_kind is ErrorKind.CRASHED and "SIGABRT" in result.content


@pytest.mark.parametrize("code", [0, 3])
def test_hard_exit_names_the_code(pool: WorkerPool, code: int) -> None:
    result = call(pool, HardExit, {"code": code})
    assert result.error_kind is ErrorKind.EXITED and not result.ok
    assert f"exit code {code}" in result.content
    assert pool.stats()["died"] == 1


@pytest.mark.parametrize("interrupt", [False, True])
def test_soft_exit_keeps_the_worker(interrupt: bool) -> None:
    with WorkerPool(warm=1) as pool:
        assert pool.wait_warm(WAIT_S)
        pid = int(call(pool, Pid).content)
        result = call(pool, SoftExit, {"code": 4, "interrupt": interrupt})
        assert result.error_kind is ErrorKind.EXITED
        assert ("KeyboardInterrupt" if interrupt else "SystemExit: 4") in result.content
        assert int(call(pool, Pid).content) == pid


def test_memory(pool: WorkerPool) -> None:
    result = call(pool, Hog)
    assert result.error_kind is ErrorKind.MEMORY and "256 MiB" in result.content
    assert pool.stats()["retired"] == 1  # a worker that ran out of memory is replaced
    assert call(pool, Pid).ok


def test_large_output_is_capped_in_the_worker(pool: WorkerPool) -> None:
    result = call(pool, Huge)
    assert result.ok and result.content.startswith("x" * MAX_CHARS)
    assert len(result.content) < MAX_CHARS + 200 and "30,000,000" in result.content
    result = call(pool, Huge, {"details": True})  # the default codec sends plain data only
    assert result.error_kind is ErrorKind.RAISED and "details: a bytes is not JSON data" in result.content


def test_pickle_codec_sends_any_details_for_trusted_tools() -> None:
    with WorkerPool(warm=0, codec="pickle") as trusted:
        result = call(trusted, Huge, {"details": True})
        assert result.ok and result.content == "big details"
        assert isinstance(result.details, bytes) and len(result.details) == 30_000_000


def test_unpicklable_details() -> None:
    with WorkerPool(warm=1) as solo:
        assert solo.wait_warm(WAIT_S)
        pid = int(call(solo, Pid).content)
        result = call(solo, LockedDetails)
        assert result.error_kind is ErrorKind.RAISED
        assert "details of type lock" in result.content and "cannot be sent back" in result.content
        assert int(call(solo, Pid).content) == pid


def test_unpicklable_exception() -> None:
    with WorkerPool(warm=1) as solo:
        assert solo.wait_warm(WAIT_S)
        pid = int(call(solo, Pid).content)
        result = call(solo, RaisesLocked)
        assert result.error_kind is ErrorKind.RAISED
        assert "LockedError: the lock is held" in result.content
        assert int(call(solo, Pid).content) == pid


def test_unshippable_tool(pool: WorkerPool) -> None:
    result = call(pool, Unshippable())
    assert result.error_kind is ErrorKind.RAISED and "could not be shipped" in result.content
    assert "lock" in result.content


def test_tool_from_a_file_module(pool: WorkerPool, plugin: Any) -> None:
    result = call(pool, plugin.PluginTool, {"parent": os.getpid()})
    assert result.ok and result.content == "hello from a plugin in True"
    assert call(pool, plugin).content == "module hello from a plugin"
    result = call(pool, plugin.PointTool)  # details of a class that came by value: not plain data
    assert result.error_kind is ErrorKind.RAISED and "details: a Point is not JSON data" in result.content


@pytest.mark.slow  # a benchmark's smoke run (18 s of CPU): outside the default run, as the others' are
def test_benchmark_smoke() -> None:
    """benchmarks/bench_isolation.py runs and reports every number (timings unchecked)."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_isolation.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--json"], capture_output=True, text=True, timeout=3 * WAIT_S,
        check=False, cwd=script.parent.parent,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report) == {
        "environment", "noop_call", "replacement", "declarations", "untrusted", "child_start", "many_sessions",
        "cold_start", "total_s",
    }
    for part, key in (("noop_call", "ratio"), ("replacement", "target_ms"), ("declarations", "target_ms")):
        assert report[part][key] > 0 and isinstance(report[part]["pass"], bool)
    assert report["noop_call"]["worker_pool_us"]["p50"] > 0
    assert report["replacement"]["deadline_to_ready_ms"]["p50"] > 0
    assert report["declarations"]["accepted"] == 50 and report["declarations"]["per_tool_ms"]["mean"] > 0
    for part in ("warm_call", "new_session_first_call", "worker_scope_call", "cold_session_first_call"):
        pair = report["untrusted"][part]
        assert pair["system_us"]["p50"] > 0 and pair["process_pool_executor_us"]["p50"] > 0 and pair["ratio"] > 0
    for part in ("warm_call", "new_session_first_call"):
        assert report["untrusted"][part]["target"] > 0 and isinstance(report["untrusted"][part]["pass"], bool)
    start = report["child_start"]
    assert start["clean_ms"]["p50"] > 0 and start["forkserver_ms"]["p50"] > 0 and start["ratio"] > 0
    many = report["many_sessions"]
    assert many["trusted"]["calls"] == many["untrusted"]["calls"] == 40 and many["ratio"] > 0


def test_calls_never_queue_and_idle_workers_follow_demand(tmp_path: Path) -> None:
    """A burst starts a worker per call; the pool keeps them idle up to that peak (the
    next burst finds them warm), then retires all but ``warm`` once idle for ``idle_s``."""
    n = 5
    results: dict[int, ToolResult] = {}

    def one(burst: WorkerPool, i: int) -> None:
        results[i] = call(burst, Rendezvous, {"path": str(tmp_path), "n": n}, call_id=f"c{i}")

    idle_s = slack(1.0)
    with WorkerPool(warm=2, idle_s=idle_s) as pool:
        assert pool.wait_warm(WAIT_S)
        began = time.monotonic()  # no worker of the burst can have been idle for longer than this
        threads = [threading.Thread(target=one, args=(pool, i)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        stats = pool.stats()
        if time.monotonic() - began < idle_s:  # none idle for idle_s yet: all kept (a loaded machine may be later)
            assert stats["idle"] == n and stats["alive"] == n and stats["retired"] == 0
        assert all(r.ok for r in results.values()), [r.content for r in results.values()]
        assert len({r.content for r in results.values()}) == n  # five different workers
        assert stats["alive"] + stats["retired"] == n
        assert wait_for(lambda: pool.stats()["retired"] == n - 2 and pool.stats()["alive"] == 2)
        stats = pool.stats()
        assert stats["idle"] == 2 and stats["alive"] == 2 and stats["retired"] == n - 2


def test_stop_leaves_no_process(tmp_path: Path) -> None:
    pool = WorkerPool(warm=2)
    assert pool.wait_warm(WAIT_S)
    worker_pid, sleep_pid = json.loads(call(pool, SpawnsSleep).content)
    assert not gone(sleep_pid)
    busy: list[ToolResult] = []
    runner = threading.Thread(target=lambda: busy.append(call(pool, WaitForFile, {"path": str(tmp_path / "b")})))
    runner.start()
    busy_pid = read_pid(tmp_path / "b.started")
    workers = set(pool.pids())
    assert {worker_pid, busy_pid} <= workers and len(workers) >= 2
    pool.stop()
    runner.join(WAIT_S)
    assert busy and busy[0].error_kind is ErrorKind.CANCELLED
    for pid in {sleep_pid, *workers}:
        assert wait_for(functools.partial(gone, pid)), f"process {pid} survived stop()"
    assert pool.stats()["alive"] == 0
    assert call(pool, Pid).error_kind is ErrorKind.CANCELLED


def test_ready_worker_killed_while_idle_is_replaced(pool: WorkerPool) -> None:
    pid = int(call(pool, Pid).content)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: gone(pid))
    results = [call(pool, Pid) for _ in range(3)]
    assert all(r.ok for r in results) and all(int(r.content) != pid for r in results)
    assert pool.wait_warm(WAIT_S)


# --- shipped code per tool version -------------------------------------------------------------


def _closure_tool(answer: str) -> Any:
    """An ``@tool`` of a nested function: pickled by value, its closure cell included."""

    @tool
    def answer_tool() -> str:
        """Say the answer."""
        return answer

    return answer_tool


def _shouting_tool(answer: str) -> Any:
    @tool
    def answer_tool() -> str:
        """Say the answer, upper-case."""
        return answer.upper()

    return answer_tool


class _Counter:
    def __init__(self) -> None:
        self.count = 0

    @tool
    def current(self) -> int:
        """The count."""
        return self.count


def test_tool_code_shipped_once_per_version(pool: WorkerPool) -> None:
    """An ``@tool`` is pickled once per (object, version): the same version keeps what
    was shipped even when the closure changed; a new version (a re-registration), or
    the function's code replaced in place, ships it anew."""
    t = _closure_tool("a")

    def run(version: object) -> str:
        deadline = time.monotonic() + WAIT_S
        result = pool.run(t, {}, {"session_id": "s1", "call_id": "c1"}, deadline, MAX_CHARS, version=version)
        assert result.ok, result.content
        return result.content

    first, second = object(), object()
    assert run(first) == "a"
    assert t.func.__closure__ is not None
    t.func.__closure__[0].cell_contents = "b"
    assert run(first) == "a"  # same version: the bytes shipped before
    assert run(second) == "b"  # re-registered: shipped anew
    t.func.__code__ = _shouting_tool("c").func.__code__  # as a reload patching code in place does
    assert run(second) == "B"  # code replaced in place: shipped anew


def test_instance_state_still_travels_each_call(pool: WorkerPool) -> None:
    """An ``@tool`` method bound to an instance is pickled on every call, even with a
    version: the instance's current state travels."""
    counter = _Counter()
    version = object()
    for expected in (0, 1, 2):
        counter.count = expected
        result = pool.run(counter.current, {}, {"session_id": "s1", "call_id": "c1"}, time.monotonic() + WAIT_S,
                          MAX_CHARS, version=version)
        assert result.ok and result.content == str(expected), result.content
