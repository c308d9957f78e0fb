"""``subscriptions/listen`` served (protocol 2026-07-28, SEP-2575): the one channel a
modern client has for what the server says unasked, since the revision has no GET
stream. A listen request's response is its stream:

- its first frame acknowledges the subset of the requested filter the server honours,
  then each event it asked for follows, every frame stamped with the request's id
  under ``_meta["io.modelcontextprotocol/subscriptionId"]``;
- list changes (``toolsListChanged``...) come from the server's
  :class:`~mcp.server.subscriptions.InMemorySubscriptionBus`, as the SDK's own
  ``ListenHandler`` serves them;
- ``taskIds`` (the tasks extension, SEP-2663) asks for ``notifications/tasks`` of those
  tasks: each carries the task's ``DetailedTask`` as ``tasks/get`` gives it at that
  moment. Only the tasks of the request's own principal are honoured: another's id and
  an unknown one are left out of the acknowledgement alike (no existence oracle). The
  stream sends each honoured task's state once at its start (a change between the task's
  creation and the listen is not lost), then at each change of status, and nothing for
  a task after its end. Asking for ``taskIds`` without declaring the extension is
  ``MissingRequiredClientCapability`` (``-32021``); more than :data:`MAX_TASK_IDS` ids,
  or one that is not a short string, is invalid params.

Bounds: at most ``max_streams`` streams open and ``max_streams_per_client`` of one
principal (past them ``INTERNAL_ERROR`` before the acknowledgement, as the SDK's
handler); a stream whose client lets ``backlog`` events wait unsent is ended (the client
listens again and refetches: there is no replay)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

import anyio
import mcp_types as types
from loguru import logger
from mcp.server.subscriptions import SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY, ServerEvent, event_matches, event_to_notification
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST

from rho_actors.mcp.tasks import ServedTasks, declared, required_error

__all__ = ["MAX_TASK_IDS", "Listening", "TaskStatusNotification"]

MAX_TASK_IDS: Final = 256
"""The most ``taskIds`` one ``subscriptions/listen`` request may name."""
_TASK_ID_CHARS: Final = 256  # the longest task id a request may name
_ENDED: Final = frozenset({"completed", "failed", "cancelled"})


class TaskStatusNotification(types.Notification[dict[str, Any], Literal["notifications/tasks"]]):
    """``notifications/tasks`` (SEP-2663): a task's ``DetailedTask`` as its params."""

    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: dict[str, Any]


def _task_ids(requested: types.SubscriptionFilter) -> list[str] | None:
    """The ``taskIds`` a listen request names (None: it names none), checked."""
    raw = (requested.model_extra or {}).get("taskIds")
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) > MAX_TASK_IDS or not all(
            isinstance(t, str) and 0 < len(t) <= _TASK_ID_CHARS for t in raw):
        raise MCPError(INVALID_PARAMS, f"notifications.taskIds must be a list of at most {MAX_TASK_IDS} task ids "
                                       f"(strings of at most {_TASK_ID_CHARS} characters)")
    return list(dict.fromkeys(raw))


def _honoured(requested: types.SubscriptionFilter, task_ids: list[str] | None) -> types.SubscriptionFilter:
    """The filter acknowledged: every list-change kind asked for, and ``task_ids``."""
    honoured = types.SubscriptionFilter(
        tools_list_changed=True if requested.tools_list_changed else None,
        prompts_list_changed=True if requested.prompts_list_changed else None,
        resources_list_changed=True if requested.resources_list_changed else None,
        resource_subscriptions=list(requested.resource_subscriptions) if requested.resource_subscriptions else None)
    if task_ids:
        honoured = honoured.model_copy(update={"taskIds": task_ids})  # an extension's key (extra="allow")
    return honoured


@dataclass(slots=True)
class Listening:
    """The ``subscriptions/listen`` handler (see the module doc): ``bus`` carries the list
    changes, ``tasks`` the served tasks, ``principal_of(ctx)`` names a request's client."""

    bus: SubscriptionBus
    tasks: ServedTasks
    principal_of: Callable[[Any], str]
    max_streams: int
    max_streams_per_client: int
    backlog: int = 64
    _open: dict[object, str] = field(default_factory=dict)  # each open stream -> its principal

    async def __call__(self, ctx: Any, params: types.SubscriptionsListenRequestParams
                       ) -> types.SubscriptionsListenResult:
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(INVALID_REQUEST, "subscriptions/listen requires a request id")
        requested = params.notifications
        task_ids = _task_ids(requested)
        if task_ids is not None and not declared(ctx):
            raise required_error("notifications.taskIds of subscriptions/listen")
        principal = self.principal_of(ctx)
        mine = sum(1 for owner in self._open.values() if owner == principal)
        if len(self._open) >= self.max_streams or mine >= self.max_streams_per_client:
            raise MCPError(INTERNAL_ERROR, f"Subscription limit reached: at most {self.max_streams_per_client} "
                                           f"listen streams per client and {self.max_streams} in all")
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        send, receive = anyio.create_memory_object_stream[ServerEvent | str](self.backlog)
        aloop = asyncio.get_running_loop()

        def deliver(event: ServerEvent | str) -> None:  # on the event loop
            try:
                send.send_nowait(event)
            except anyio.ClosedResourceError:
                pass
            except anyio.WouldBlock:
                logger.info("MCP listen stream {!r}: {} events unsent; ended (its client listens again)",
                            subscription_id, self.backlog)
                send.close()

        def changed(task_id: str) -> None:  # in any thread
            try:
                aloop.call_soon_threadsafe(deliver, task_id)
            except RuntimeError:  # the loop has closed
                pass

        followed, unfollow = self.tasks.follow(task_ids or [], principal, changed)
        honoured = _honoured(requested, followed)
        uris = frozenset(honoured.resource_subscriptions or ())
        unsubscribe = self.bus.subscribe(lambda e: deliver(e) if event_matches(honoured, uris, e) else None)
        token = object()
        self._open[token] = principal
        try:
            await ctx.session.send_notification(types.SubscriptionsAcknowledgedNotification(
                params=types.SubscriptionsAcknowledgedNotificationParams(notifications=honoured, _meta=meta)),
                related_request_id=subscription_id)
            for task_id in followed:  # each task's state now: a change before this listen is not missed
                deliver(task_id)
            await self._forward(ctx, receive, meta, principal)
        finally:
            unsubscribe()
            unfollow()
            self._open.pop(token, None)
            send.close()
            receive.close()
        return types.SubscriptionsListenResult(_meta=meta)

    async def _forward(self, ctx: Any, receive: Any, meta: dict[str, Any], principal: str) -> None:
        """Send each event of ``receive`` on the listen request's stream: a list change as
        the SDK's notification, a task id as ``notifications/tasks`` with the task's state
        now (sent only when it differs from the last one sent, never after its end)."""
        sent: dict[str, dict[str, Any]] = {}  # each task's last state sent
        async for event in receive:
            if not isinstance(event, str):
                await ctx.session.send_notification(event_to_notification(event, meta),
                                                    related_request_id=ctx.request_id)
                continue
            state = self.tasks.detailed(event, principal)
            if state is None or sent.get(event) == state or sent.get(event, {}).get("status") in _ENDED:
                continue
            sent[event] = state
            notification = TaskStatusNotification(params={**state, "_meta": meta})
            await ctx.session.send_notification(cast(types.ServerNotification, notification),
                                                related_request_id=ctx.request_id)
