"""A served tool and the MCP client that called it: the SDK's own client against
:func:`rho_actors.mcp.aserve` over streamable HTTP on 127.0.0.1 (log messages and
``logging/setLevel``, sampling, elicitation, progress before the result,
``structuredContent`` and ``outputSchema``), the bounded SSE event store, and the one
private SDK attribute serving relies on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import warnings
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.streamable_http import EventMessage
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPDeprecationWarning

from rho_actors import ActorSystem, CallEvent, Details, tool
from rho_actors.mcp import ClientRequestError, client_of
from rho_actors.mcp.events import BoundedEventStore
from tests.conftest import WAIT_S, slack
from tests.helpers import free_port
from tests.test_mcp_serve import TOKEN, _connect_http, _serve_http, _text


@tool
def chatty(ctx: Any) -> str:
    """Log at every level, then answer."""
    client = client_of(ctx)
    assert client is not None
    sent = [level for level in ("debug", "info", "warning", "error") if client.log(level, f"at {level}", "chatty")]
    return ",".join(sent)


@tool
def ask_model(prompt: str, ctx: Any) -> str:
    """Ask the client's model."""
    client = client_of(ctx)
    assert client is not None
    try:
        return "model said: " + client.sample(prompt, max_tokens=20)
    except ClientRequestError as exc:
        return f"no sampling: {exc}"


@tool
def ask_user(ctx: Any) -> str:
    """Ask the client's user for a name."""
    client = client_of(ctx)
    assert client is not None
    try:
        action, content = client.elicit("Your name?", {"type": "object", "properties": {"name": {"type": "string"}}})
    except ClientRequestError as exc:
        return f"no elicitation: {exc}"
    return f"{action}: {json.dumps(content)}"


@tool
def steps(ctx: Any) -> str:
    """Report progress three times."""
    for done in (1, 2, 3):
        ctx["progress"](done, 3, f"step {done}")
    return "stepped"


class Forecast:
    """Returns JSON, and declares its outputSchema."""

    @staticmethod
    def name() -> str:
        return "forecast"

    @staticmethod
    def description() -> str:
        return "The forecast of a city."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

    @staticmethod
    def output_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {"celsius": {"type": "number"}}, "required": ["celsius"]}

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> Any:
        if args["city"] == "nowhere":
            return {"fahrenheit": 70}  # not what the schema says
        return Details({"city": args["city"], "celsius": 21.5}, {"host": "only"})


@tool
def plain_json() -> dict[str, int]:
    """Return a JSON object, without an outputSchema."""
    return {"n": 1}


def test_a_served_tool_logs_samples_elicits_and_reports_progress_to_its_client(system: ActorSystem) -> None:
    for t in (chatty, ask_model, ask_user, steps):
        system.register(t)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    thread, loops = _serve_http(system, port)
    logged: list[types.LoggingMessageNotificationParams] = []
    asked: list[str] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params)

    async def on_sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        block = params.messages[0].content
        asked.append(block.text if isinstance(block, types.TextContent) else "?")
        return types.CreateMessageResult(role="assistant", model="test",
                                         content=types.TextContent(type="text", text="forty-two"))

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    async def main() -> None:
        await _connect_http(url)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with streamable_http_client(url, http_client=create_mcp_http_client(headers=headers)) as (r, w), \
                ClientSession(r, w, logging_callback=on_log, sampling_callback=on_sampling,
                              elicitation_callback=on_elicit) as session:
            with anyio.fail_after(WAIT_S):
                init = await session.initialize()
                assert init.capabilities.logging is not None
                first = await session.call_tool("chatty", {})
                assert _text(first) == "debug,info,warning,error"
                assert [p.data for p in logged] == ["at debug", "at info", "at warning", "at error"]
                assert {p.logger for p in logged} == {"chatty"}
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", MCPDeprecationWarning)
                    await session.set_logging_level("warning")
                logged.clear()
                second = await session.call_tool("chatty", {})
                assert _text(second) == "warning,error" and [p.level for p in logged] == ["warning", "error"]

                sampled = await session.call_tool("ask_model", {"prompt": "six times seven?"})
                assert _text(sampled) == "model said: forty-two" and asked == ["six times seven?"]
                elicited = await session.call_tool("ask_user", {})
                assert _text(elicited) == 'accept: {"name": "Ada"}'

                reported: list[float] = []

                async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                    reported.append(progress)

                stepped = await session.call_tool("steps", {}, progress_callback=on_progress)
                assert _text(stepped) == "stepped" and reported == [1, 2, 3]  # all of it before the result

        # a client without the capabilities: the tool gets an error naming it, at once
        async with streamable_http_client(url, http_client=create_mcp_http_client(headers=headers)) as (r, w), \
                ClientSession(r, w) as bare:
            with anyio.fail_after(WAIT_S):
                await bare.initialize()
                refused = await bare.call_tool("ask_user", {})
                assert _text(refused) == "no elicitation: the client did not declare the elicitation capability"

    try:
        anyio.run(main)
    finally:
        if loops:
            loops[0].call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(loops[0])])
        thread.join(WAIT_S)


def test_structured_content_beside_the_text_and_the_declared_output_schema(system: ActorSystem) -> None:
    system.register(Forecast)
    system.register(plain_json)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    thread, loops = _serve_http(system, port)

    async def main() -> None:
        await _connect_http(url)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with streamable_http_client(url, http_client=create_mcp_http_client(headers=headers)) as (r, w), \
                ClientSession(r, w) as session:
            with anyio.fail_after(WAIT_S):
                await session.initialize()
                listed = {t.name: t for t in (await session.list_tools()).tools}
                assert listed["forecast"].output_schema == Forecast.output_schema()
                assert listed["plain_json"].output_schema is None
                ok = await session.call_tool("forecast", {"city": "Oslo"})
                assert not ok.is_error and ok.structured_content == {"city": "Oslo", "celsius": 21.5}
                assert json.loads(_text(ok)) == ok.structured_content  # the text too; details stay home
                plain = await session.call_tool("plain_json", {})
                assert plain.structured_content == {"n": 1} and _text(plain) == '{"n": 1}'
                wrong = await session.call_tool("forecast", {"city": "nowhere"})
                assert wrong.is_error and wrong.structured_content is None
                assert "does not match its outputSchema" in _text(wrong) and "celsius" in _text(wrong)

    try:
        anyio.run(main)
    finally:
        if loops:
            loops[0].call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(loops[0])])
        thread.join(WAIT_S)


def test_client_of_is_none_outside_an_mcp_request(system: ActorSystem) -> None:
    system.register(chatty)
    loop = system.start_loop("plain")
    from rho_actors import ToolCall

    [result] = loop.run_turn([ToolCall("c1", "chatty", {})])
    assert not result.ok and "AssertionError" in result.content  # the tool asserted a client: there is none


def test_the_event_store_replays_after_an_id_and_keeps_its_bounds() -> None:
    async def main() -> None:
        store = BoundedEventStore(max_events=5, max_age_s=60)
        message = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"n": 1})
        priming = await store.store_event("s1", None)
        ids = [await store.store_event("s1", message) for _ in range(2)]
        await store.store_event("s2", message)  # another stream: never replayed for s1
        sent: list[EventMessage] = []

        async def send(event: EventMessage) -> None:
            sent.append(event)

        assert await store.replay_events_after(priming, send) == "s1"
        assert [e.event_id for e in sent] == ids
        for _ in range(5):
            await store.store_event("s3", message)
        assert store.count == 5 and bool(BoundedEventStore())  # the oldest went first; empty is still a store
        assert await store.replay_events_after(priming, send) is None
        aged = BoundedEventStore(max_events=5, max_age_s=0.001)
        old = await aged.store_event("s", message)
        time.sleep(0.01)
        assert await aged.replay_events_after(old, send) is None
        with pytest.raises(ValueError, match="more than 0"):
            BoundedEventStore(max_events=0)

    anyio.run(main)


def test_the_sdk_still_has_what_serving_reads_from_a_request_context() -> None:
    """Serving reads the connection of a request as ``ctx.session._connection`` (mcp 2.x
    has no public way: served_sessions.connection_of's doc). This fails when the SDK changes it:
    then use the public ``ctx.connection`` if it has come, else follow the rename."""
    from mcp.server.connection import Connection
    from mcp.server.context import ServerRequestContext
    from mcp.server.session import ServerSession

    from rho_actors.mcp.served_sessions import connection_of

    assert "connection" not in {f for f in ServerRequestContext.__dataclass_fields__}, (
        "the SDK's request context has a public connection now: read it, drop the private one")
    connection = Connection.__new__(Connection)
    session = ServerSession.__new__(ServerSession)
    session._connection = connection
    ctx: ServerRequestContext[dict[str, Any], Any] = ServerRequestContext(
        session=session, lifespan_context={}, protocol_version="2025-11-25", method="x")
    assert connection_of(ctx) is connection
    for public in ("state", "exit_stack", "session_id"):  # what serving uses of it
        assert public in dir(Connection) or public in getattr(Connection, "__annotations__", {}), public
    assert "_connection" in ServerSession.__init__.__code__.co_names  # where the SDK keeps it


def test_an_output_schema_is_served_only_when_valid_and_trusted(system: ActorSystem,
                                                               logs: list[str]) -> None:
    from rho_actors.mcp.call_results import output_schema

    class NoSchema(Forecast):
        @staticmethod
        def name() -> str:
            return "no_schema"

        @staticmethod
        def output_schema() -> Any:
            return None

    class BadSchema(Forecast):
        @staticmethod
        def name() -> str:
            return "bad_schema"

        @staticmethod
        def output_schema() -> Any:
            return {"type": "string"}

    for t in (Forecast, NoSchema, BadSchema, plain_json):
        system.register(t)
    assert output_schema(system, "forecast") == Forecast.output_schema()
    assert output_schema(system, "no_schema") is None and output_schema(system, "plain_json") is None
    assert output_schema(system, "missing") is None
    assert output_schema(system, "bad_schema") is None
    assert [m for m in logs if "output_schema() is not served" in m] == [
        "MCP: tool 'bad_schema': its output_schema() is not served: "
        "ValueError: an outputSchema must be a schema of an object (\"type\": \"object\")"]


@tool
def polled(ctx: Any) -> str:
    """Close the call's SSE stream, then answer (the client polls for it)."""
    client = client_of(ctx)
    assert client is not None
    return f"closed={client.close_stream()}"


def _sse_events(lines: Any) -> list[dict[str, str]]:
    """The SSE events of ``lines`` (text lines), each ``{field: value}``, until the stream ends.
    A comment line (``: ping - …``, the keep-alive sse-starlette sends every 15 s) is no
    event and is skipped, as the SSE spec says."""
    events: list[dict[str, str]] = []
    event: dict[str, str] = {}
    for line in lines:
        if not line:
            if event:
                events.append(event)
            event = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        event[name] = event.get(name, "") + value.removeprefix(" ")
    if event:
        events.append(event)
    return events


def test_sse_streams_are_primed_and_a_closed_one_is_resumed_with_last_event_id(system: ActorSystem) -> None:
    import httpx2 as httpx

    system.register(polled)
    finished = threading.Event()
    system.subscribe(lambda e: finished.set() if isinstance(e, CallEvent) and e.tool == "polled"
                     and e.kind == "finished" else None)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    thread, loops = _serve_http(system, port)
    version = "2025-11-25"
    headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json", "MCP-Protocol-Version": version}
    try:
        anyio.run(_connect_http, url)
        with httpx.Client(timeout=WAIT_S) as http:
            init = http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
            assert init.status_code == 200, init.text
            headers["Mcp-Session-Id"] = init.headers["mcp-session-id"]
            assert http.post(url, headers=headers, json={"jsonrpc": "2.0",
                                                         "method": "notifications/initialized"}).status_code == 202
            with http.stream("POST", url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                                 "params": {"name": "polled", "arguments": {}}}) as r:
                first = _sse_events(r.iter_lines())
            assert first[0]["data"] == "" and first[0]["retry"] == "500" and first[0]["id"]  # the priming event
            assert not any('"id":1' in e.get("data", "").replace(" ", "") for e in first)  # closed before the result
            assert finished.wait(WAIT_S)  # the result is in the event store (or on its way to it)
            answer = _resumed_answer(http, url, headers, _last_event_id(first), 1)
            assert answer and answer["result"]["content"][0]["text"] == "closed=True", answer
    finally:
        if loops:
            loops[0].call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(loops[0])])
        thread.join(WAIT_S)


def _last_event_id(events: list[dict[str, str]]) -> str:
    """The SSE "last event ID" of ``events``: the id of the last event that has one."""
    return [event["id"] for event in events if "id" in event][-1]


def _resumed_answer(http: Any, url: str, headers: dict[str, str], last_event_id: str,
                    request_id: int) -> dict[str, Any]:
    """The JSON-RPC response to ``request_id`` on the stream resumed (GET) with
    ``last_event_id``, or {} when none comes within :data:`WAIT_S`. A result stored while
    the SDK replays and re-registers the stream reaches neither (its transport's
    "replay→live-tail window"), so a resumed stream that carries no event for
    ``slack(3.0)`` is resumed again; keep-alive pings are no event (an httpx read
    timeout alone misses a stream that only pings, every 15 s). That quiet time is at most
    an eighth of :data:`WAIT_S`, so a loaded machine resumes several times within it (at a
    load of 30 on 2 cores slack(3.0) is 45 s: one missed resume used up the whole wait)."""
    import httpx2 as httpx

    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        quiet = min(slack(3.0), WAIT_S / 8, deadline - time.monotonic())
        with contextlib.suppress(httpx.ReadTimeout), http.stream(
                "GET", url, headers={**headers, "Last-Event-ID": last_event_id},
                timeout=httpx.Timeout(WAIT_S, read=quiet)) as resumed:
            lines = _until_result(resumed.iter_lines(), time.monotonic() + quiet)
            for message in map(_message, _sse_events(lines)):
                if message.get("id") == request_id and ("result" in message or "error" in message):
                    return message
    return {}


def _message(event: dict[str, str]) -> dict[str, Any]:
    """The JSON-RPC message an SSE event carries ({} for the priming event's empty data)."""
    return json.loads(event["data"]) if event.get("data") else {}


def _until_result(lines: Any, deadline: float) -> Any:
    """``lines`` up to the end of the first event whose data is a JSON-RPC response (one
    with an ``id``; notifications may come before it, and a GET stream stays open), or
    until ``deadline`` (``time.monotonic()``) once a line (a keep-alive ping too) comes
    after it with no response yet."""
    seen_result = False
    for line in lines:
        if time.monotonic() > deadline and not seen_result:
            return
        yield line
        data = line.removeprefix("data:").strip() if line.startswith("data:") else ""
        if data:
            message = json.loads(data)
            seen_result = seen_result or (isinstance(message, dict) and "id" in message)
        elif not line and seen_result:
            return
