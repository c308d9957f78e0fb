"""The event store of ``mcp serve --http``: the SSE events sent on each stream, kept so
that a client whose stream closed can reconnect with ``Last-Event-ID`` and get what it
missed (SEP-1699's polling: the server sends a *priming* event, an id with empty data
and a ``retry`` delay, first on each stream; it may close the stream mid-call; the
client reconnects after ``retry`` ms and the rest is replayed).

Per session: the SDK's transports name a stream by its request's JSON-RPC id (``"1"``
in every session) and give every session the one store, so each session's transport is
given its own view (:meth:`BoundedEventStore.session`, by :func:`own_event_stores`): a
``Last-Event-ID`` is looked up among that session's events only, and only that session's
events of the stream are replayed; another session's id, guessed or not, replays nothing.

Bounded: at most ``max_events`` events in all (the oldest are dropped first: a client
reconnecting later than that misses them, as after a restart) and events older than
``max_age_s`` seconds are dropped. In memory: a server restart forgets them.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from typing import Any

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage

__all__ = ["DEFAULT_MAX_EVENTS", "DEFAULT_MAX_EVENT_AGE_S", "BoundedEventStore", "own_event_stores"]

DEFAULT_MAX_EVENTS = 10_000
"""Events kept at most, all streams together."""
DEFAULT_MAX_EVENT_AGE_S = 300.0
"""Seconds an event is kept for a client to reconnect and get it."""


class BoundedEventStore(EventStore):
    """An in-memory :class:`mcp.server.streamable_http.EventStore` with the bounds of
    the module doc. Event ids are ``<stream id>/<sequence number>``. Used as is, it is
    one session's store; :meth:`session` gives each of many sessions its own view, all
    within these bounds. Raises ``ValueError`` for a bound not more than 0."""

    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS, max_age_s: float = DEFAULT_MAX_EVENT_AGE_S) -> None:
        if not max_events > 0 or not max_age_s > 0:
            raise ValueError(f"max_events and max_age_s must be more than 0, got {max_events!r}, {max_age_s!r}")
        self.max_events = max_events
        self.max_age_s = max_age_s
        # event id -> (session, stream id, message, when stored)
        self._events: OrderedDict[EventId, tuple[str | None, StreamId, JSONRPCMessage | None, float]] = OrderedDict()
        self._sequence = itertools.count(1)

    @property
    def count(self) -> int:
        """Events kept now. (Not ``__len__``: the SDK tests the store for truth, and an
        empty store must count as one.)"""
        return len(self._events)

    def session(self, session_id: str) -> EventStore:
        """The view of this store that one session's transport uses: its events only."""
        return _SessionEvents(self, session_id)

    def _trim(self, now: float) -> None:
        while self._events:
            oldest = next(iter(self._events.values()))
            if len(self._events) <= self.max_events and now - oldest[3] <= self.max_age_s:
                break
            self._events.popitem(last=False)

    def _store(self, session: str | None, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        now = time.monotonic()
        event_id = f"{stream_id}/{next(self._sequence)}"
        self._events[event_id] = (session, stream_id, message, now)
        self._trim(now)
        return event_id

    async def _replay(self, session: str | None, last_event_id: EventId,
                      send_callback: EventCallback) -> StreamId | None:
        self._trim(time.monotonic())
        found = self._events.get(last_event_id)
        if found is None or found[0] != session:
            return None
        stream_id = found[1]
        after = False
        for event_id, (owner, stream, message, _) in list(self._events.items()):
            if event_id == last_event_id:
                after = True
            elif after and owner == session and stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Keep ``message`` (None: a priming event) as the next event of ``stream_id``."""
        return self._store(None, stream_id, message)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        """Send the events of ``last_event_id``'s stream stored after it (not the priming
        ones); returns that stream's id, or None when the event is unknown (never
        stored, dropped by the bounds, or another session's)."""
        return await self._replay(None, last_event_id, send_callback)


class _SessionEvents(EventStore):
    """One session's view of a :class:`BoundedEventStore` (see the module doc)."""

    def __init__(self, store: BoundedEventStore, session_id: str) -> None:
        self._store = store
        self._session = session_id

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Keep ``message`` as this session's next event of ``stream_id``."""
        return self._store._store(self._session, stream_id, message)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        """This session's events of the stream after ``last_event_id`` (None: not this session's event)."""
        return await self._store._replay(self._session, last_event_id, send_callback)


def own_event_stores(manager: Any, store: BoundedEventStore) -> None:
    """Give each session ``manager`` (the SDK's ``StreamableHTTPSessionManager``) admits
    its own view of ``store``: the SDK hands every session's transport the one store
    (its ``_admit_session``, checked by the tests). Raises ``AttributeError`` when the
    SDK no longer has what this relies on (serving would leak events between sessions)."""
    admit = manager._admit_session

    def admit_with_own_store(*args: Any, **kwargs: Any) -> Any:
        transport = admit(*args, **kwargs)
        if transport is not None:
            if not hasattr(transport, "_event_store") or transport.mcp_session_id is None:
                raise AttributeError("the MCP SDK's transport has no _event_store or session id: "
                                     "rho cannot keep its sessions' SSE events apart")
            transport._event_store = store.session(transport.mcp_session_id)
        return transport

    manager._admit_session = admit_with_own_store
