"""Hostile round 8: what this round's one-call turn path and settling (``loop/turns.py``)
do when the host's own code fails under them, and the keeper's spare a call waits for.

1. A host's OpenTelemetry span processor raising as a call's span ends (its ``on_end``:
   the SDK calls it in ``span.end()`` and lets what it raises through) was raised in
   the middle of settling the turn's last call, after the turn was marked finished: the
   settle's ``loop_failed`` rescue found it finished and did nothing, and ``run_turn``
   waited out its whole bound (a one-call turn and a turn of two alike); a host
   cancelling such a turn hung the same way. Now a span's failure is logged and the
   call's own result is given, and a turn a settle or an end had marked finished is
   completed whatever raises after. Each runs in a child process of its own: a tracer
   provider is set once per process (the other test files configure theirs).
2. Held (kept as checks): a call waiting for the worker pool keeper's spare (this round:
   it takes that spare rather than start a second worker) whose spare is killed with
   ``SIGKILL`` meanwhile gets a worker of its own, one not ready by its start bound is
   ``unavailable``; one result each, and the pool serves on.
3. ``scrub_strings`` (a child's plain data, a transcript record) made two keys that
   scrub to one string (``"a\\x00"`` and ``"a\\x01"`` from a child, ``"a\\ud800"`` and
   ``"a\\udc00"`` in a record) one key, the other's value dropped without a word: an
   untrusted tool's schema lost a property and was offered. Now it raises naming both
   keys: the declaration read is a malformed answer naming the tool, the record one
   JSON cannot hold.

Every wait is bounded by :data:`~tests.conftest.WAIT_S`.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from loguru import logger

from rho_actors import ActorSystem, ToolCall, tool
from rho_actors.sandbox import WorkerSlots
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S, wait_for
from .test_worker_pool_faults import Results, a_call
from .test_worker_spares import pool_with_held_spare, worker_pid  # the tool is pickled by value there

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(180)

_RAISING_SPANS = """
import sys, threading, tempfile
from pathlib import Path
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from loguru import logger
from rho_actors import ActorSystem, CancelToken, ToolCall, tool

logger.enable("rho_actors")
WAIT_S = float(sys.argv[1])

class Raising(SpanProcessor):
    def on_end(self, span):
        if span.name.startswith("execute_tool"):
            raise RuntimeError("the host's span processor failed")

provider = TracerProvider()
provider.add_span_processor(Raising())
trace.set_tracer_provider(provider)
STARTED = threading.Event()

@tool
def quick() -> str:
    \"\"\"Answer at once.\"\"\"
    return "q"

@tool
def crash() -> str:
    \"\"\"Raise.\"\"\"
    raise ValueError("no")

@tool(timeout_ms=int(WAIT_S * 1000))
def hold(ctx) -> str:
    \"\"\"Wait until cancelled.\"\"\"
    STARTED.set()
    ctx["cancel"].wait(WAIT_S)
    return "cancelled"

system = ActorSystem(data_dir=Path(tempfile.mkdtemp()) / "data", shutdown_ms=1_000)
for t in (quick, crash, hold):
    system.register(t)
loop = system.start_loop("s")

def show(results):
    print(" ".join(f"{r.call_id}:{'ok' if r.ok else r.error_kind}" for r in results), flush=True)

show(loop.run_turn([ToolCall("c1", "quick", "{}")], timeout_s=WAIT_S))
show(loop.run_turn([ToolCall("c2", "quick", "{}"), ToolCall("c3", "crash", "{}")], timeout_s=WAIT_S))
token = CancelToken()
threading.Thread(target=lambda: (STARTED.wait(WAIT_S), token.cancel()), daemon=True).start()
show(loop.run_turn([ToolCall("c4", "hold", "{}")], cancel=token, timeout_s=WAIT_S))
system.stop()
"""


def test_a_hosts_span_processor_raising_as_a_calls_span_ends_loses_no_turn() -> None:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_RAISING_SPANS), str(WAIT_S)], check=False,
                          capture_output=True, text=True, timeout=4 * WAIT_S, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["c1:ok", "c2:ok c3:raised", "c4:cancelled"], done.stderr[-3000:]
    assert "the host's span processor failed" in done.stderr  # logged, with what raised


@tool
def crash() -> str:
    """Raise (its traceback is logged at error level)."""
    raise ValueError("no")


@tool
def quick() -> str:
    """Answer at once."""
    return "q"


def _raising_sink(message: Any) -> None:
    raise RuntimeError("the host's log sink failed")


def test_host_code_raising_after_a_turns_last_call_settled_still_completes_the_turn(tmp_path: Path) -> None:
    """A host's loguru sink added with ``catch=False`` raising on the traceback line that
    settling a crashed call logs (after the turn was marked finished): the turn is
    completed with its results, not left for ``run_turn`` to wait out."""
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    logger.enable("rho_actors")
    sink = logger.add(_raising_sink, catch=False, level="ERROR",  # the crash's traceback line only
                      filter=lambda record: record["message"].startswith("session ") and "ValueError: no" in
                      record["message"])
    try:
        system.register(crash)
        system.register(quick)
        loop = system.start_loop("s")
        [crashed] = loop.run_turn([ToolCall("c1", "crash", "{}")], timeout_s=WAIT_S)
        assert crashed.error_kind is ErrorKind.RAISED, crashed
        both = loop.run_turn([ToolCall("c2", "quick", "{}"), ToolCall("c3", "crash", "{}")], timeout_s=WAIT_S)
        assert [r.call_id for r in both] == ["c2", "c3"] and both[0].ok, both
        assert both[1].error_kind in (ErrorKind.RAISED, ErrorKind.CRASHED), both  # settled before, or failed
        [after] = loop.run_turn([ToolCall("c4", "quick", "{}")], timeout_s=WAIT_S)
        assert after.ok
    finally:
        logger.remove(sink)
        logger.disable("rho_actors")
        system.stop()


# --- 2. the keeper's spare a waiting call counts on: killed, or not ready by the call's start bound ---------


def _state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``None``: no such process)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


@pytest.mark.parametrize("fate", ["killed", "late"])
def test_a_call_waiting_for_the_keepers_spare_gets_exactly_one_result_whatever_becomes_of_it(
        fate: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call with a start bound waits for the spare the keeper is starting (its
    ``READY`` read held by the test). ``killed``: the spare is killed with ``SIGKILL``
    while the call waits (and is dead, its pipe closed, before its ``READY`` is read: a
    spare killed later, with the call sent to it, is a call whose worker died under it,
    ``crashed``); the call runs on another worker. ``late``:
    the spare is not ready by the call's start bound, and the cap (one worker, the
    spare's) leaves no room for a worker of the call's own (round 9: a call waits for a
    spare at most half its start bound, then starts its own); the call is ``unavailable``
    (no worker started in time). Each: one result, never a second one."""
    waited = threading.Event()
    p, spare, ready = pool_with_held_spare(monkeypatch, waited, **({"slots": WorkerSlots(1)} if fate == "late" else {}))
    try:
        results = Results()
        bound_s = WAIT_S if fate == "killed" else 0.5  # "late": the start bound the product keeps
        call = dataclasses.replace(a_call({}, "c", the_tool=worker_pid), start_by=time.monotonic() + bound_s)
        caller = threading.Thread(target=p.start, args=(call, results.done("c")), daemon=True)
        caller.start()
        assert waited.wait(WAIT_S)  # the call waits for the spare
        if fate == "killed":
            os.kill(spare, signal.SIGKILL)
            assert wait_for(lambda: _state(spare) in ("Z", None))  # dead, its pipe's end closed
            ready.set()  # its READY read now: the READY it sent before is read, then its end
        [result] = results.wait("c")
        if fate == "killed":
            assert result.ok and result.content != str(spare), (result, spare)
        else:
            assert result.error_kind is ErrorKind.UNAVAILABLE, result
        ready.set()
        caller.join(WAIT_S)
        later = dataclasses.replace(a_call({}, "c2", the_tool=worker_pid), start_by=time.monotonic() + WAIT_S)
        p.start(later, results.done("c2"))  # the pool serves on
        [after] = results.wait("c2")
        assert after.ok, after
        assert len(results.got["c"]) == 1, results.got  # never a second result
    finally:
        ready.set()
        p.stop()


class _Colliding:
    """An untrusted declaration whose schema has two properties a host scrubs to one name."""

    name = staticmethod(lambda: "colliding")
    description = staticmethod(lambda: "Two properties, one name once scrubbed.")
    parameter_schema = staticmethod(lambda: {"type": "object", "properties": {
        "a\x00": {"type": "string"}, "a\x01": {"type": "integer"}}})
    run = staticmethod(lambda args, ctx: "x")


def test_keys_that_scrub_to_one_are_refused_naming_both_never_merged(tmp_path: Path) -> None:
    from rho_actors import UntrustedReads
    from rho_actors.agent.lines import record_line
    from rho_actors.sandbox import wire

    with ActorSystem(data_dir=tmp_path, untrusted=UntrustedReads(timeout_s=WAIT_S), shutdown_ms=1_000) as system:
        registration = system.register(_Colliding, untrusted=True)  # a real read, in a child process
        assert not registration.offered, "a property was dropped from the schema without a word"
        reason = registration.reason or ""
        assert "_Colliding" in reason and "'a\\x00' and 'a\\x01'" in reason, reason
    with pytest.raises(wire.WireError, match="both become"):
        wire.decode_json(b'{"a\\ud800": 1, "a\\udc00": 2}')
    with pytest.raises(ValueError, match=r"a result record cannot be written as JSON: the keys"):
        record_line({"type": "result", "details": dict([("a\ud800", 1), ("a\udc00", 2)])})
    _, line = record_line({"type": "result", "details": {"a\ud800": 1, "b": 2}})  # no collision: scrubbed
    assert "a\ufffd" in line.decode()
