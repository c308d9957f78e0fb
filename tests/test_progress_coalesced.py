"""A served call's progress is a level: at most one report is being sent to its client
and ``MAX_WAITING_REPORTS`` wait (the last one made always among them), whatever the
pace of the tool or of the client
(:mod:`rho_actors.mcp.progress`); a report's message is at most
``MAX_PROGRESS_MESSAGE_CHARS``. Before, each report was a task of its own on the
server's loop holding its message until sent: a tool reporting in a loop to a client
that stopped reading its SSE stream grew the server without bound (50,000 reports of
2 KB: 46,000 tasks, about 480 MB)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx2 as httpx
import pytest

from rho_actors import ActorSystem, tool
from rho_actors.events import MAX_PROGRESS_MESSAGE_CHARS, EventBus, ProgressEvent, report_progress
from rho_actors.mcp.progress import MAX_WAITING_REPORTS, LiveProgress
from tests.conftest import WAIT_S
from tests.test_mcp_http_guard import Served
from tests.test_mcp_slow_clients import guarded_servers
from tests.test_mcp_slow_readers import _not_reading, _session

REPORTS = 20_000  # of MAX_PROGRESS_MESSAGE_CHARS each: about 20 MB, past the kernel's queues
_REPORTED: dict[int, threading.Event] = {}


@tool
def chatty(n: int, ctx: dict[str, Any]) -> str:
    """Report progress n times, each with a long message, then return."""
    for k in range(n):
        ctx["progress"](k, n, "m" * (2 * MAX_PROGRESS_MESSAGE_CHARS))
    _REPORTED.setdefault(n, threading.Event()).set()
    return "reported"


@pytest.fixture
def served(system: ActorSystem) -> Iterator[Callable[..., Served]]:
    system.register(chatty)
    yield from guarded_servers(system)


def _call(n: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "chatty", "arguments": {"n": n}, "_meta": {"progressToken": "p"}}}


def test_a_client_not_reading_its_progress_holds_no_task_a_report(served: Callable[..., Served]) -> None:
    server = served(send_timeout_s=WAIT_S)  # the connection is not cut while the test looks
    headers = _session(server.url)
    reported = _REPORTED.setdefault(REPORTS, threading.Event())
    with _not_reading(server.port) as sock:
        body = json.dumps(_call(REPORTS)).encode()
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
                     f"{lines}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert reported.wait(WAIT_S), "the tool did not report"
        loop = server._loops[0]

        async def tasks() -> int:
            return len(asyncio.all_tasks())

        assert asyncio.run_coroutine_threadsafe(tasks(), loop).result(WAIT_S) < 100  # was a task a report


def test_a_reading_client_gets_growing_progress_ending_with_the_last_before_the_result(
        served: Callable[..., Served]) -> None:
    server = served()
    headers = _session(server.url)
    done: list[float] = []
    result = None
    with httpx.stream("POST", server.url, headers=headers, json=_call(500), timeout=WAIT_S) as answer:
        for line in answer.iter_lines():
            if not line.startswith("data:") or not line[5:].strip():
                continue
            message = json.loads(line[5:])
            if message.get("method") == "notifications/progress":
                assert result is None, "progress after the result"
                assert len(message["params"]["message"]) == MAX_PROGRESS_MESSAGE_CHARS
                done.append(message["params"]["progress"])
            elif message.get("id") == 2:
                result = message
                break
    assert result is not None and "reported" in json.dumps(result)
    assert done and done == sorted(set(done)) and done[-1] == 499, done[-5:]


def test_reports_made_while_one_is_sent_wait_bounded_the_last_one_kept() -> None:
    """:class:`LiveProgress` on its own: while one report is being sent, the first
    ``MAX_WAITING_REPORTS`` made wait in order, a later one replaces the newest waiting,
    and the last one made is always sent."""
    loop = asyncio.new_event_loop()
    release = asyncio.Event()
    sent: list[tuple[Any, ...]] = []
    sending = threading.Event()

    class Session:
        async def report_progress(self, *report: Any) -> None:
            sent.append(report)
            sending.set()
            await release.wait()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        live = LiveProgress(loop, Session())
        live.report(0, 10, "first")
        assert sending.wait(WAIT_S)
        for k in range(1, 1000):
            live.report(k, 1000, None)
        assert live.replaced == 999 - MAX_WAITING_REPORTS
        loop.call_soon_threadsafe(release.set)
        asyncio.run_coroutine_threadsafe(live.flushed(WAIT_S), loop).result(WAIT_S)
        steps = [(k, 1000, None) for k in range(1, MAX_WAITING_REPORTS)]
        assert sent == [(0, 10, "first"), *steps, (999, 1000, None)]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(WAIT_S)
        loop.close()


def test_a_progress_message_is_cut_where_it_is_reported() -> None:
    bus = EventBus()
    got: list[ProgressEvent] = []
    bus.subscribe(got.append)  # type: ignore[arg-type]
    report_progress(bus, "s", "c", "t", 1, None, "x" * 10_000_000)
    report_progress(bus, "s", "c", "t", 2, None, "short")
    assert got[0].message == "x" * (MAX_PROGRESS_MESSAGE_CHARS - 3) + "..." and got[1].message == "short"
