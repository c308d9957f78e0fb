"""MCP Tasks served (``io.modelcontextprotocol/tasks``, SEP-2663; ``rho_actors.mcp.tasks``):
the official SDK's ``Client`` of either protocol era, over HTTP on loopback and over
stdio, creating tasks of rho background calls and following them with ``tasks/get``,
``tasks/update`` and ``tasks/cancel``; the errors bad input gets. A served task is a rho
background task: the system's registry lists it, its record is in the session's folder."""

from __future__ import annotations

import functools
import os
import sys
import threading
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest

pytest.importorskip("mcp")

import mcp_types as types
from mcp.client.client import Client
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim, advertise
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, TypeAdapter
from pydantic.alias_generators import to_camel

from rho_actors import ActorSystem, ToolCall, tool
from rho_actors.mcp.tasks import EXTENSION, RELATED_TASK
from tests.conftest import WAIT_S, wait_for
from tests.mcp_fixtures import task_tools
from tests.test_mcp_protocol_eras import _elicited, _http_client, _served_http

TOOLS = str(Path(task_tools.__file__))
MODES = ("legacy", "2026-07-28")
_ANY = TypeAdapter(dict[str, Any])
_ENDED = ("completed", "failed", "cancelled")


class Created(types.Result):
    """A ``CreateTaskResult`` as the SDK's client receives it (a claimed result shape)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None


async def _request(session: Any, method: str, **params: Any) -> dict[str, Any]:
    found: dict[str, Any] = await session.send_request(types.Request[Any, Any](method=method, params=params), _ANY)
    return found


async def _ended(session: Any, task_id: str) -> dict[str, Any]:
    with anyio.fail_after(WAIT_S):
        while True:
            got = await _request(session, "tasks/get", taskId=task_id)
            if got["status"] in _ENDED:
                return got
            await anyio.sleep(0.05)


async def _resolve(created: Created, ctx: ClaimContext) -> types.CallToolResult:
    got = await _ended(ctx.session, created.task_id)
    return types.CallToolResult.model_validate(got["result"])


class Tasks(ClientExtension):
    """The tasks extension as a client of the SDK declares and follows it: a
    ``CreateTaskResult`` is polled to its end and its inlined result returned."""

    identifier = EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=Created, resolve=_resolve)]


def _extensions(mode: str) -> list[ClientExtension]:
    return [Tasks()] if mode != "legacy" else [advertise(EXTENSION)]


async def _create(client: Client, name: str, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Call ``name`` as a task: its id and the creation as the client saw it."""
    if client.protocol_version == "2026-07-28":
        created = await client.session.call_tool(name, arguments, allow_claimed=True)
        assert isinstance(created, Created), created
        return created.task_id, created.model_dump(by_alias=True)
    result = await client.call_tool(name, arguments)  # a handshake-era wire has no CreateTaskResult
    assert result.meta is not None and result.structured_content is not None, result
    assert result.meta[RELATED_TASK]["taskId"] == result.structured_content["taskId"]
    return result.structured_content["taskId"], {"resultType": "task", **result.structured_content}


async def _drive(client: Client) -> dict[str, Any]:
    """Create, follow, answer and cancel tasks; what was seen."""
    seen: dict[str, Any] = {}
    task_id, created = await _create(client, "crawl", {"seconds": 0.1})
    assert created["status"] in ("working", "completed")  # 0.1 s may have passed on a loaded host
    assert created["ttlMs"] > 0 and created["pollIntervalMs"] > 0
    done = await _ended(client.session, task_id)
    seen["done"] = (done["status"], done["result"]["content"][0]["text"], done["resultType"])
    slow, created = await _create(client, "crawl", {"seconds": 30})
    assert created["status"] == "working"
    assert (await _request(client.session, "tasks/get", taskId=slow))["status"] == "working"
    assert (await _request(client.session, "tasks/cancel", taskId=slow)).get("resultType", "complete") == "complete"
    seen["cancelled"] = (await _ended(client.session, slow))["status"]
    asking, _ = await _create(client, "confirm", {"path": "/tmp/x"})
    with anyio.fail_after(WAIT_S):
        while (waiting := await _request(client.session, "tasks/get", taskId=asking))["status"] == "working":
            await anyio.sleep(0.05)
    seen["asked"] = {key: request["method"] for key, request in waiting["inputRequests"].items()}
    await _request(client.session, "tasks/update", taskId=asking,
                   inputResponses={"sure": {"action": "accept", "content": {"sure": True}}})
    answered = await _ended(client.session, asking)
    seen["answered"] = (answered["status"], answered["result"]["content"][0]["text"])
    failed, _ = await _create(client, "broken", {})
    broken = await _ended(client.session, failed)
    seen["broken"] = (broken["status"], broken["result"]["isError"])
    return seen


EXPECTED = {"done": ("completed", "crawled for 0.1 s", "complete"), "cancelled": "cancelled",
            "asked": {"sure": "elicitation/create"}, "answered": ("completed", "accept: sure=True"),
            "broken": ("completed", True)}


@pytest.mark.parametrize("mode", MODES)
def test_http_a_client_of_either_era_creates_follows_answers_and_cancels_tasks(system: ActorSystem, mode: str) -> None:
    for name in ("crawl", "confirm", "report", "broken"):
        system.register(getattr(task_tools, name))
    with _served_http(system) as (url, _guard):
        async def main() -> dict[str, Any]:
            async with _http_client(url, mode, extensions=_extensions(mode)) as client:
                return await _drive(client)

        assert anyio.run(main) == EXPECTED
    registry = system.task_registry  # one registry: the served tasks are rho background calls
    assert registry.stats()["completed"] == 2 and registry.stats()["cancelled"] == 1


@pytest.mark.parametrize("mode", MODES)
def test_stdio_a_client_of_either_era_creates_follows_answers_and_cancels_tasks(tmp_path: Path, mode: str) -> None:
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "rho_actors.cli", "mcp", "serve", "--tools", TOOLS, "--data-dir", str(tmp_path)], env={**os.environ})

    async def main() -> dict[str, Any]:
        with anyio.fail_after(WAIT_S * 3):
            async with Client(params, mode=mode, extensions=_extensions(mode),
                              elicitation_callback=_elicited) as client:
                return await _drive(client)

    assert anyio.run(main) == EXPECTED
    records = list(tmp_path.glob("sessions/*/tasks/t_*.json"))  # each task's record in its session's folder
    assert len(records) == 4


def test_the_sdk_client_gets_a_task_s_result_through_its_claim(system: ActorSystem) -> None:
    system.register(task_tools.crawl)
    with _served_http(system) as (url, _guard):
        async def main() -> types.CallToolResult:
            async with _http_client(url, "2026-07-28", extensions=[Tasks()]) as client:
                return await client.call_tool("crawl", {"seconds": 0.05})

        result = anyio.run(main)
    assert [b.text for b in result.content if isinstance(b, types.TextContent)] == ["crawled for 0.05 s"]


async def _code(call: Any) -> tuple[int, str]:
    with pytest.raises(MCPError) as raised:
        await call
    return raised.value.code, str(raised.value)


def test_bad_task_requests_get_the_spec_s_errors(system: ActorSystem) -> None:
    for name in ("crawl", "report"):
        system.register(getattr(task_tools, name))
    with _served_http(system) as (url, _guard):
        async def main() -> dict[str, Any]:
            said: dict[str, Any] = {}
            async with _http_client(url, "2026-07-28", extensions=[Tasks()]) as client:
                session = client.session
                said["unknown"] = await _code(_request(session, "tasks/get", taskId="t_" + "0" * 32))
                said["unknown_cancel"] = await _code(_request(session, "tasks/cancel", taskId="nope"))
                working, _ = await _create(client, "crawl", {"seconds": 30})
                said["update_working"] = await _code(_request(session, "tasks/update", taskId=working,
                                                              inputResponses={"x": {"action": "accept"}}))
                await _request(session, "tasks/cancel", taskId=working)
                await _ended(session, working)
                said["cancel_ended"] = await _request(session, "tasks/cancel", taskId=working)
                said["still"] = (await _request(session, "tasks/get", taskId=working))["status"]
                said["removed"] = await _code(_request(session, "tasks/list"))
            async with _http_client(url, "2026-07-28") as plain:  # no tasks extension declared
                said["undeclared_get"] = await _code(_request(plain.session, "tasks/get", taskId=working))
                said["undeclared_call"] = await _code(plain.call_tool("crawl", {"seconds": 0}))
                said["optional"] = (await plain.call_tool("report", {"topic": "x"})).content[0]
            return said

        said = anyio.run(main)
    assert said["unknown"][0] == types.INVALID_PARAMS and "unknown task 't_000" in said["unknown"][1]
    assert said["unknown_cancel"][0] == types.INVALID_PARAMS
    assert said["update_working"][0] == types.INVALID_PARAMS and "is working, not input_required" in \
        said["update_working"][1]
    assert said["cancel_ended"]["resultType"] == "complete" and said["still"] == "cancelled"
    assert set(said["cancel_ended"]) <= {"resultType", "_meta"}  # an empty result: no task envelope
    assert said["removed"][0] == types.METHOD_NOT_FOUND
    assert said["undeclared_get"][0] == types.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert said["undeclared_call"][0] == types.MISSING_REQUIRED_CLIENT_CAPABILITY and EXTENSION in \
        said["undeclared_call"][1]
    assert said["optional"].text == "report on x"  # an "optional" tool runs as a call of its turn


def test_an_optional_background_tool_runs_as_a_task_when_the_caller_asks(system: ActorSystem) -> None:
    system.register(task_tools.report)
    loop = system.start_loop("s1")
    [plain] = loop.run_turn([ToolCall("c1", "report", '{"topic": "a"}')])
    assert plain.ok and plain.content == "report on a" and not plain.details
    asked, other = loop.run_turn([ToolCall("c2", "report", '{"topic": "b"}'),
                                  ToolCall("c3", "report", '{"topic": "c"}')], background={"c2"})
    assert other.content == "report on c"
    task_id = asked.details["task_id"]
    assert loop.task_result(task_id, timeout_s=WAIT_S).result.content == "report on b"  # type: ignore[union-attr]
    [every] = loop.run_turn([ToolCall("c4", "report", '{"topic": "d"}')], background=True)
    assert wait_for(lambda: loop.tasks()[-1].status == "completed") and "task_id" in every.details
    with pytest.raises(TypeError, match="background must be a bool or call ids"):
        loop.run_turn([ToolCall("c5", "report", '{"topic": "e"}')], background="c5")
    with pytest.raises(TypeError, match='background must be a bool or "optional", got str \'sometimes\''):
        tool(background="sometimes")(lambda: "x")  # type: ignore[call-overload]


def test_a_task_whose_call_waits_for_a_person_is_input_required_until_decided(system: ActorSystem) -> None:
    system.register(task_tools.wipe)
    with _served_http(system) as (url, _guard):
        async def main() -> dict[str, Any]:
            said: dict[str, Any] = {}
            async with _http_client(url, "2026-07-28", extensions=[Tasks()]) as client:
                session = client.session
                first, created = await _create(client, "wipe", {"path": "/srv/a"})
                said["created"] = created["status"]
                asked = await _request(session, "tasks/get", taskId=first)
                said["asked"] = (asked["status"], asked["inputRequests"]["approval"]["method"],
                                 "/srv/a" in asked["inputRequests"]["approval"]["params"]["message"])
                await _request(session, "tasks/update", taskId=first,
                               inputResponses={"approval": {"action": "accept", "content": {"approve": True}}})
                done = await _ended(session, first)
                said["approved"] = (done["status"], done["result"]["content"][0]["text"])
                second, _ = await _create(client, "wipe", {"path": "/srv/b"})
                await _request(session, "tasks/update", taskId=second,
                               inputResponses={"approval": {"action": "decline"}})
                declined = await _ended(session, second)
                said["declined"] = (declined["status"], declined["result"]["isError"])
            return said

        said = anyio.run(main)
    assert said == {"created": "input_required", "asked": ("input_required", "elicitation/create", True),
                    "approved": ("completed", "wiped /srv/a"), "declined": ("completed", True)}


def test_a_background_call_held_for_approval_is_an_input_required_task_the_host_decides(
        system: ActorSystem) -> None:
    system.register(task_tools.wipe)
    loop = system.start_loop("s1")
    [ack] = loop.run_turn([ToolCall("c1", "wipe", '{"path": "/x"}')])
    task_id = ack.details["task_id"]
    assert [(t.task_id, t.status) for t in loop.tasks()] == [(task_id, "input_required")]
    assert [p.call_id for p in loop.pending()] == ["c1"] and ack.details["pending"].call_id == "c1"
    approved = loop.approve("c1")
    assert approved.details["task_id"] == task_id  # the approved call runs as the task that waited
    assert loop.task_result(task_id, timeout_s=WAIT_S).result.content == "wiped /x"  # type: ignore[union-attr]
    [other] = loop.run_turn([ToolCall("c2", "wipe", '{"path": "/y"}')])
    loop.reject("c2", "not that one")
    rejected = loop.task_result(other.details["task_id"], timeout_s=WAIT_S)
    assert rejected.status == "failed" and "rejected" in rejected.result.content  # type: ignore[union-attr]


class _Notified(types.NotificationParams):
    task_id: str
    status: str


def test_a_handshake_era_client_is_told_each_change_of_its_task_s_status(tmp_path: Path) -> None:
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "rho_actors.cli", "mcp", "serve", "--tools", TOOLS, "--data-dir", str(tmp_path)], env={**os.environ})
    told: list[tuple[str, str]] = []
    ended = anyio.Event()

    async def heard(notified: _Notified) -> None:
        told.append((notified.task_id, notified.status))
        if notified.status in _ENDED:
            ended.set()

    class Told(ClientExtension):
        identifier = EXTENSION

        def notifications(self) -> list[NotificationBinding[Any]]:
            return [NotificationBinding(method="notifications/tasks", params_type=_Notified, handler=heard)]

    async def main() -> str:
        with anyio.fail_after(WAIT_S * 3):
            async with Client(params, mode="legacy", extensions=[Told()]) as client:
                task_id, _ = await _create(client, "crawl", {"seconds": 0.2})
                await ended.wait()
                return task_id

    task_id = anyio.run(main)
    assert told[-1] == (task_id, "completed")


class _Status(types.NotificationParams):
    """``notifications/tasks`` as a 2026-07-28 client of the SDK binds it (a ``DetailedTask``)."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)
    task_id: str
    status: str


class Followed(Tasks):
    """:class:`Tasks` with ``notifications/tasks`` bound: each one put in ``heard``."""

    def __init__(self) -> None:
        self.heard: list[_Status] = []
        self.changed = anyio.Event()

    def notifications(self) -> list[NotificationBinding[Any]]:
        async def hear(status: _Status) -> None:
            self.heard.append(status)
            self.changed.set()

        return [NotificationBinding(method="notifications/tasks", params_type=_Status, handler=hear)]

    async def next(self, status: str) -> _Status:
        """The first notification heard of ``status`` (waiting for it)."""
        with anyio.fail_after(WAIT_S):
            while not any(n.status == status for n in self.heard):
                self.changed = anyio.Event()
                await self.changed.wait()
        return next(n for n in self.heard if n.status == status)


async def _followed_to_its_end(client: Client, told: Followed, acked: list[types.SubscriptionFilter]) -> Any:
    """Create a ``confirm`` task, listen to it (and to an id the server does not know),
    answer its question when told it is input_required; what the client heard."""
    assert client.protocol_version == "2026-07-28"
    task_id, _ = await _create(client, "confirm", {"path": "/tmp/y"})
    unknown = "t_" + "0" * 32
    async with anyio.create_task_group() as listening:
        listening.start_soon(functools.partial(_request, client.session, "subscriptions/listen",
                                               notifications={"taskIds": [task_id, unknown]}))
        asked = await told.next("input_required")
        await _request(client.session, "tasks/update", taskId=task_id,
                       inputResponses={key: {"action": "accept", "content": {"sure": True}}
                                       for key in (asked.model_extra or {})["inputRequests"]})
        done = await told.next("completed")
        listening.cancel_scope.cancel()  # the client ends its stream
    extra = done.model_extra or {}
    return {"acked": [f.model_extra for f in acked], "ids": {n.task_id for n in told.heard},
            "subscription": {(n.meta or {}).get("io.modelcontextprotocol/subscriptionId") for n in told.heard},
            "asked": sorted((asked.model_extra or {})["inputRequests"]),
            "result": extra["result"]["content"][0]["text"], "last": told.heard[-1].status,
            "known": task_id}


def _acks(acked: list[types.SubscriptionFilter]) -> Any:
    async def handle(message: Any) -> None:
        if isinstance(message, types.SubscriptionsAcknowledgedNotification):
            acked.append(message.params.notifications)

    return handle


def _heard_as_expected(heard: dict[str, Any]) -> None:
    assert heard["acked"] == [{"taskIds": [heard["known"]]}]  # the unknown id left out
    assert heard["ids"] == {heard["known"]}  # nothing of another task
    [subscription] = heard["subscription"]  # every frame stamped with the listen request's id
    assert subscription is not None
    assert heard["asked"] == ["sure"] and heard["result"] == "accept: sure=True" and heard["last"] == "completed"


def test_http_a_2026_client_hears_its_tasks_on_its_listen_stream(system: ActorSystem) -> None:
    system.register(task_tools.confirm)
    told, acked = Followed(), list[types.SubscriptionFilter]()
    with _served_http(system) as (url, _guard):
        async def main() -> Any:
            async with _http_client(url, "auto", extensions=[told], message_handler=_acks(acked)) as client:
                return await _followed_to_its_end(client, told, acked)

        _heard_as_expected(anyio.run(main))


def test_stdio_a_2026_client_hears_its_tasks_on_its_listen_stream(tmp_path: Path) -> None:
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "rho_actors.cli", "mcp", "serve", "--tools", TOOLS, "--data-dir", str(tmp_path)], env={**os.environ})
    told, acked = Followed(), list[types.SubscriptionFilter]()

    async def main() -> Any:
        with anyio.fail_after(WAIT_S * 3):
            async with Client(params, extensions=[told], message_handler=_acks(acked),
                              elicitation_callback=_elicited) as client:
                return await _followed_to_its_end(client, told, acked)

    _heard_as_expected(anyio.run(main))


def test_listening_for_tasks_needs_the_extension_and_few_short_ids(system: ActorSystem) -> None:
    with _served_http(system) as (url, _guard):
        async def main() -> dict[str, Any]:
            said: dict[str, Any] = {}
            async with _http_client(url, "2026-07-28") as plain:
                said["undeclared"] = await _code(_request(plain.session, "subscriptions/listen",
                                                          notifications={"taskIds": ["t_1"]}))
            async with _http_client(url, "2026-07-28", extensions=[Tasks()]) as client:
                said["many"] = await _code(_request(client.session, "subscriptions/listen",
                                                    notifications={"taskIds": [f"t_{n}" for n in range(257)]}))
                said["long"] = await _code(_request(client.session, "subscriptions/listen",
                                                    notifications={"taskIds": ["t" * 257]}))
            return said

        said = anyio.run(main)
    assert said["undeclared"][0] == types.MISSING_REQUIRED_CLIENT_CAPABILITY and EXTENSION in said["undeclared"][1]
    assert said["many"][0] == types.INVALID_PARAMS and "at most 256 task ids" in said["many"][1]
    assert said["long"][0] == types.INVALID_PARAMS


@tool(background=True)
def quick_task(text: str) -> str:
    """Say ``text`` back, as a task."""
    return text


def test_a_task_call_cancelled_as_its_task_is_made_is_still_followed(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that closes its ``tools/call`` request just as its call became a task (the
    cancel waited for while the call's result was recorded) does not leave that task
    unknown to the server: it is followed as any task (``tasks/get`` of its own client
    finds it), so its end releases the call's ``client_of`` binding and its client's
    task slot, which else stay taken for good."""
    import importlib
    from types import SimpleNamespace

    from rho_actors.agent.transcript import Transcript
    from rho_actors.mcp import client_requests
    from rho_actors.mcp.call_results import call_tool_result
    from rho_actors.mcp.tasks import ServedTasks, TaskParams

    serve = importlib.import_module("rho_actors.mcp.serve")
    kept = importlib.import_module("rho_actors.mcp.served_sessions")
    scopes: list[anyio.CancelScope] = []

    class Cancelled(Transcript):  # the client's cancel arrives while the call's result is recorded
        def result(self, *args: Any, **kwargs: Any) -> Any:
            anyio.from_thread.run_sync(scopes[0].cancel)
            return super().result(*args, **kwargs)

    monkeypatch.setattr(kept, "Transcript", Cancelled)
    caps = SimpleNamespace(extensions={EXTENSION: {}})
    ctx = SimpleNamespace(protocol_version="2026-07-28", request_id=7, request=None, params={}, close_sse_stream=None,
                          session=SimpleNamespace(client_capabilities=caps))

    async def main(served: Any) -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await serve._call_tool(served, ctx, types.CallToolRequestParams(name="quick_task",
                                                                               arguments={"text": "hi"}))
        assert scope.cancel_called

    with ActorSystem(data_dir=tmp_path) as system:
        system.register(quick_task)
        served = kept.Served(system, (), 1 << 20)
        served.tasks = ServedTasks(system.task_registry, call_tool_result)
        anyio.run(main, served)
        [session] = served.sessions
        sid = session.loop.session_id
        [task] = system.task_registry.tasks(sid, session.loop.data_dir)
        assert served.tasks.get(ctx, TaskParams(task_id=task.task_id), "local")["taskId"] == task.task_id
        assert wait_for(lambda: not [key for key in client_requests._live if key[0] == sid])
        served.tasks.close()


_going = threading.Event()


@tool(background=True, requires_approval=True)
def guarded_wait() -> str:
    """Wait until the test lets it end (a person approves each call first)."""
    _going.wait(WAIT_S)
    return "done"


def test_a_held_call_approved_before_its_task_is_made_is_working_not_asking(tmp_path: Path) -> None:
    """A held call that a person approves (its call now running) before the server made
    its task known is ``working`` with no ``approval`` question: the server does not set
    the running task back to ``input_required`` asking a decision already taken."""
    from types import SimpleNamespace

    from rho_actors.mcp.call_results import call_tool_result
    from rho_actors.mcp.tasks import ServedTask, ServedTasks, TaskParams

    _going.clear()
    caps = SimpleNamespace(extensions={EXTENSION: {}})
    ctx = SimpleNamespace(request=None, session=SimpleNamespace(client_capabilities=caps))
    with ActorSystem(data_dir=tmp_path) as system:
        system.register(guarded_wait)
        served = ServedTasks(system.task_registry, call_tool_result)
        loop = system.start_loop("s1")
        try:
            [ack] = loop.run_turn([ToolCall("c1", "guarded_wait", "{}")], background=True)
            loop.approve("c1", decided_by="ada")  # by the host, before the server's created() below
            task = ServedTask("local", SimpleNamespace(loop=loop), "guarded_wait")
            assert served.created(task, ack, None)["status"] == "working"
            got = served.get(ctx, TaskParams(task_id=ack.details["task_id"]), "local")
            assert got["status"] == "working" and "inputRequests" not in got
            [info] = loop.tasks()
            assert info.status == "working"
        finally:
            _going.set()
            served.close()
