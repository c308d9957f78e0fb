"""What one MCP client's session may see of serving's event store: never another
session's events (its results), whatever event id it sends on a resume."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("mcp")

from rho_actors import ActorSystem, CallEvent
from tests.conftest import WAIT_S
from tests.helpers import free_port
from tests.test_mcp_client_requests import _last_event_id, _resumed_answer, _sse_events, _until_result, polled
from tests.test_mcp_serve import TOKEN, _connect_http, _serve_http

VERSION = "2025-11-25"


@dataclass
class Resumable:
    """One session's view of a serving event store whose stream ``"1"`` is primed (the
    event id a resume sends: ``primed``), its streams registry, a ``message`` to store
    and the streams :meth:`register` made: what the tests of a stream's resume start
    from (here and ``test_hostile_round6``)."""

    events: Any
    streams: Any
    primed: str
    message: Any
    received: list[Any] = field(default_factory=list)

    @classmethod
    async def made(cls) -> Resumable:
        import mcp_types as types

        from rho_actors.mcp.events import BoundedEventStore, _SessionEvents, _Streams

        events = _SessionEvents(BoundedEventStore(), "s1")
        message = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"n": 1})
        return cls(events, _Streams(events), await events.store_event("1", None), message)

    async def register(self) -> None:
        """Register stream ``"1"`` for live events (as the task that replayed it, or a
        POST of request id 1, does); its receiving end goes to ``received``."""
        import anyio

        send, receive = anyio.create_memory_object_stream[Any](16)
        self.streams["1"] = (send, receive)
        self.received.append(receive)

    @staticmethod
    async def nothing(event: Any) -> None:
        """A replay's sender that must get no event."""
        raise AssertionError(event)


def _session(http: Any, url: str, headers: dict[str, str]) -> dict[str, str]:
    """A new MCP session's headers (initialized)."""
    init = http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
    assert init.status_code == 200, init.text
    own = {**headers, "Mcp-Session-Id": init.headers["mcp-session-id"]}
    initialized = http.post(url, headers=own, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert initialized.status_code == 202
    return own


@dataclass
class Victim:
    """An HTTP client of ``mcp serve`` whose session's stream of a ``polled`` call closed
    mid-call (its result left in the event store for it to resume) and a second session:
    what a test of another client's reach into the store starts from."""

    http: Any  # the httpx client
    url: str
    headers: dict[str, str]  # the victim session's
    other: dict[str, str]  # the other session's
    first: list[dict[str, Any]]  # the events the victim's stream gave before it closed


@contextlib.contextmanager
def victim_of(system: ActorSystem) -> Iterator[Victim]:
    """Serve ``system`` over HTTP (``polled`` registered), open two sessions, and let the
    first's ``tools/call`` stream close before its result (waited for); stops serving after."""
    import anyio
    import httpx2 as httpx

    system.register(polled)
    finished = threading.Event()
    system.subscribe(lambda e: finished.set() if isinstance(e, CallEvent) and e.tool == "polled"
                     and e.kind == "finished" else None)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    thread, loops = _serve_http(system, port)
    headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json", "MCP-Protocol-Version": VERSION}
    try:
        anyio.run(_connect_http, url)
        with httpx.Client(timeout=WAIT_S) as http:
            victim, other = _session(http, url, headers), _session(http, url, headers)
            with http.stream("POST", url, headers=victim, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                                "params": {"name": "polled", "arguments": {}}}) as r:
                first = _sse_events(r.iter_lines())
            assert finished.wait(WAIT_S)
            yield Victim(http, url, victim, other, first)
    finally:
        if loops:
            loops[0].call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(loops[0])])
        thread.join(WAIT_S)


def test_a_session_cannot_replay_another_sessions_events(system: ActorSystem) -> None:
    with victim_of(system) as v:
        # the victim gets its result (so it is in the store)
        answer = _resumed_answer(v.http, v.url, v.headers, _last_event_id(v.first), 1)
        assert answer and answer["result"]["content"][0]["text"] == "closed=True", answer
        # the other session, a thief, resumes with the victim's event id (ids are "<request id>/<n>": guessable)
        seen: list[dict[str, Any]] = []
        with v.http.stream("GET", v.url, headers={**v.other, "Last-Event-ID": _last_event_id(v.first)}) as stolen:
            for event in _sse_events(_until_result(stolen.iter_lines(), time.monotonic() + 2.0)):
                if event.get("data"):
                    seen.append(json.loads(event["data"]))
        assert not any(m.get("id") == 1 and "result" in m for m in seen), seen


def test_session_views_of_the_event_store_are_apart() -> None:
    import anyio
    import mcp_types as types
    from mcp.server.streamable_http import EventMessage

    from rho_actors.mcp.events import BoundedEventStore

    async def main() -> None:
        store = BoundedEventStore(max_events=4)
        a, b = store.session("a"), store.session("b")
        message = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"n": 1})
        primed_a, primed_b = await a.store_event("1", None), await b.store_event("1", None)
        mine = [await a.store_event("1", message), await b.store_event("1", message)]
        sent: list[EventMessage] = []

        async def send(event: EventMessage) -> None:
            sent.append(event)

        assert bool(a) and await b.replay_events_after(primed_a, send) is None and not sent  # a's id, in b
        assert await a.replay_events_after(primed_a, send) == "1" and [e.event_id for e in sent] == mine[:1]
        sent.clear()
        assert await b.replay_events_after(primed_b, send) == "1" and [e.event_id for e in sent] == mine[1:]
        for _ in range(4):  # the bound is over every session together: the one holding the most loses its oldest
            await b.store_event("2", message)
        sent.clear()
        assert store.count == 4 and await b.replay_events_after(primed_b, send) is None
        assert await a.replay_events_after(primed_a, send) == "1" and [e.event_id for e in sent] == mine[:1]
        own = BoundedEventStore(max_session_events=2).session("c")  # and over one session's: its oldest go
        primed_c = await own.store_event("1", message)
        await own.store_event("1", message)
        assert await own.replay_events_after(primed_c, send) == "1"
        await own.store_event("1", message)
        assert await own.replay_events_after(primed_c, send) is None

    anyio.run(main)


def test_a_result_stored_while_a_stream_is_resumed_reaches_the_resumed_stream() -> None:
    """The SDK's transport replays a stream, then sends the resumed stream's priming event,
    then registers the stream for live events: the call's result, stored by the router in
    between (it found no stream to send it to), must still reach the resumed stream. The
    interleaving is forced: the result is stored where the priming event is minted."""
    from types import SimpleNamespace

    import anyio
    import mcp_types as types
    from mcp.server.streamable_http import StreamableHTTPServerTransport
    from starlette.requests import Request

    from rho_actors.mcp.events import BoundedEventStore, own_event_stores

    async def main() -> None:
        store = BoundedEventStore()
        transport = StreamableHTTPServerTransport(mcp_session_id="s1", event_store=store)
        manager = SimpleNamespace(_admit_session=lambda: transport)
        own_event_stores(manager, store)
        manager._admit_session()
        events = transport._event_store
        assert events is not None
        primed = await events.store_event("1", None)
        result = types.JSONRPCResponse(jsonrpc="2.0", id=1, result={"content": [], "isError": False})
        mint = transport._mint_priming_event

        async def result_stored_before_the_priming(stream_id: str, version: str) -> Any:
            assert stream_id not in transport._request_streams  # the router has nowhere to send it
            await events.store_event(stream_id, result)
            return await mint(stream_id, version)

        transport._mint_priming_event = result_stored_before_the_priming  # type: ignore[method-assign,assignment]
        body = bytearray()
        answered = anyio.Event()

        async def send(message: MutableMapping[str, Any]) -> None:
            body.extend(message.get("body", b""))
            if b'"id":1' in body:
                answered.set()

        async def receive() -> dict[str, Any]:
            await anyio.sleep_forever()
            return {}

        scope = {"type": "http", "method": "GET", "path": "/mcp", "query_string": b"", "headers": [
            (b"last-event-id", primed.encode()), (b"mcp-protocol-version", VERSION.encode())]}
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(transport._replay_events, primed, Request(scope, receive), send)
            with anyio.fail_after(WAIT_S):
                await answered.wait()
            tasks.cancel_scope.cancel()
        assert b'"isError":false' in body, bytes(body)

    anyio.run(main)


def test_a_replayed_streams_later_events_go_to_no_other_requests_stream() -> None:
    """The events stored after a replay are given only to the stream that replay's task
    registers: a new request of the same id, registered by another task, gets none, and
    that replay's mark is gone with it."""
    import anyio

    async def main() -> None:
        r = await Resumable.made()
        events, streams, primed, message, received, nothing, register = (
            r.events, r.streams, r.primed, r.message, r.received, r.nothing, r.register)
        assert await events.replay_events_after(primed, nothing) == "1"
        later = await events.store_event("1", message)
        await register()  # the replaying task's own registration gets what was stored since
        assert received[0].receive_nowait().message == message
        del streams["1"]
        assert await events.replay_events_after(later, nothing) == "1"
        await events.store_event("1", message)
        async with anyio.create_task_group() as tasks:  # another task: a POST of request id 1
            tasks.start_soon(register)
        await register()
        for stream in received[1:]:
            with pytest.raises(anyio.WouldBlock):
                stream.receive_nowait()

    anyio.run(main)
