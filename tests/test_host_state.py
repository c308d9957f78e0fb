"""Rho leaves the host's process-wide state alone (DESIGN §5 "The host's own state"): a
system starts and stops in a host that keeps a ``ProcessPoolExecutor``, an asyncio event
loop and threads of its own; ``multiprocessing``'s resource tracker and fork-server
settings, the ``logging`` configuration and the signal handlers are as the host left
them; and ``arun_turn`` does no file work on the caller's event loop (a ``sys.audit``
hook records every ``open``/``os.mkdir`` made in the event loop's thread while a turn is
awaited, with asyncio's debug mode on). The host runs as a
real subprocess: these are its own process-wide settings."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import WAIT_S
from tests.helpers import run_host_script

HOST = f"WAIT_S = {WAIT_S}  # tests/conftest.py's bound, in this host too\n" + '''
import asyncio, concurrent.futures, json, logging, multiprocessing, os, signal, sys, threading, time

from rho_actors import ActorSystem, ToolCall, tool


@tool(timeout_ms=int(WAIT_S * 1000))
def square(n: int) -> int:
    """n squared."""
    return n * n


@tool(timeout_ms=int(WAIT_S * 1000))
def note(text: str, ctx) -> str:
    """Write a note in the session's folder."""
    (ctx["data_dir"] / "note.txt").write_text(text)
    return "noted"


def cube(n):
    return n ** 3


def host_state():
    from multiprocessing import forkserver, resource_tracker
    tracker = resource_tracker._resource_tracker
    return {
        "tracker_pid": tracker._pid,
        "preload": list(forkserver._forkserver._preload_modules),
        "root_level": logging.getLogger().level,
        "root_handlers": [type(h).__name__ for h in logging.getLogger().handlers],
        "signals": {s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)},
        "start_method": multiprocessing.get_start_method(allow_none=True),
    }


BLOCKING = []  # (event, argument) in the event loop's thread while a turn is awaited
WATCH = threading.local()


def _frames():
    frame = sys._getframe(2)
    while frame is not None:
        yield frame
        frame = frame.f_back


def audit(event, args):
    if getattr(WATCH, "on", False) and event in ("open", "os.mkdir", "os.listdir", "os.chmod"):
        frame, where = sys._getframe(1), []
        if any(f"/{name}.py" in (f.f_code.co_filename or "") for name in ("linecache", "tokenize") for f in _frames()):
            return  # asyncio's debug mode reading source lines for its own reports
        while frame is not None and len(where) < 8:
            where.append(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}")
            frame = frame.f_back
        BLOCKING.append([event, str(args[0])[-60:], where])


async def turns(loop):
    aio = asyncio.get_running_loop()
    WATCH.on = True
    try:
        first = await loop.arun_turn([ToolCall("a1", "note", json.dumps({"text": "hi"}))])
        second = await loop.arun_turn([ToolCall("a2", "square", json.dumps({"n": 4}))])
    finally:
        WATCH.on = False
    return [r.content for r in first + second]


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    multiprocessing.set_forkserver_preload(["json"])  # the host's own fork-server setting
    stop_threads = threading.Event()
    mine = [threading.Thread(target=stop_threads.wait, name=f"host-{i}") for i in range(3)]
    for t in mine:
        t.start()
    # spawned workers share the host's resource tracker (their queue's semaphores are registered there)
    pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    out = {"pool_before": pool.submit(cube, 3).result(timeout=WAIT_S)}
    before = host_state()
    sys.addaudithook(audit)
    system = ActorSystem(sys.argv[1])
    system.register(square, isolation="process")
    system.register(note)
    [r] = system.start_loop("sync").run_turn([ToolCall("c1", "square", json.dumps({"n": 7}))])
    out["process_call"] = r.content
    out["async_turns"] = asyncio.run(turns(system.start_loop("aio")), debug=True)
    stopping = threading.Thread(target=system.stop)
    began = time.monotonic()
    stopping.start()
    stopping.join(WAIT_S)
    out["stop_returned"] = not stopping.is_alive()
    out["stop_s"] = round(time.monotonic() - began, 2)
    out["pool_after"] = pool.submit(cube, 4).result(timeout=WAIT_S)
    out["same_state"] = host_state() == before
    out["state"] = [before, host_state()]
    out["blocking"] = BLOCKING
    out["host_threads_alive"] = all(t.is_alive() for t in mine)
    stop_threads.set()
    pool.shutdown()
    print(json.dumps(out))
    sys.stdout.flush()
    if not out["stop_returned"]:
        os._exit(3)
'''


def test_a_system_leaves_the_hosts_process_pool_event_loop_and_settings_alone(tmp_path: Path) -> None:
    done = run_host_script(tmp_path, HOST, str(tmp_path / "data"))
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    out = json.loads(lines[-1])
    assert out["stop_returned"], out
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out["pool_before"], out["pool_after"], out["process_call"]) == (27, 64, "49")
    assert out["async_turns"] == ["noted", "16"]
    assert out["state"][1] == out["state"][0]
    assert out["blocking"] == [], out["blocking"]
    assert out["host_threads_alive"]


LATE_CHILD = """
import json, multiprocessing, sys
from multiprocessing import forkserver

from rho_actors import ActorSystem, Ok, tool
from rho_actors.sandbox import processes
from rho_actors.selftest import run_selftests


@tool
def checked(a: int) -> int:
    \"\"\"Checked.\"\"\"
    return a


checked.selftest = lambda: Ok(checked(2))


if __name__ == "__main__":
    multiprocessing.set_forkserver_preload(["json"])  # the host's own fork-server setting
    seen = {}
    system = ActorSystem(data_dir=sys.argv[1])
    seen["held"] = list(forkserver._forkserver._preload_modules)
    system.stop()
    processes.context("forkserver")  # a child started after the system stopped (a late declaration read)
    seen["late"] = list(forkserver._forkserver._preload_modules)
    seen["selftest"] = [row.outcome for row in run_selftests([checked], timeout_s=float(sys.argv[2]))]
    seen["after_selftest"] = list(forkserver._forkserver._preload_modules)
    print(json.dumps(seen))
"""


def test_rhos_fork_server_preload_lasts_only_while_a_system_or_selftest_holds_it(tmp_path: Path) -> None:
    done = run_host_script(tmp_path, LATE_CHILD, str(tmp_path / "data"), str(WAIT_S))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["held"] == ["json", "__main__", "rho_actors.sandbox"]  # rho's modules, the host's kept
    assert seen["late"] == ["json"]  # a child started when no one holds never changes it again
    assert seen["selftest"] == ["passed"]
    assert seen["after_selftest"] == ["json"]  # a selftest run gives it back too
