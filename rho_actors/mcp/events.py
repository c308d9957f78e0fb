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

Resumed without a gap: the SDK's transport replays a stream's events, then (after sending
the resumed stream's priming event) registers the stream for its live events; an event
stored in between (the call's result, say) was neither replayed nor sent live, and the
resumed stream stayed open without it. Each session's transport registers its streams
through :func:`own_event_stores`'s registry, which sends such events first into the stream
its replay registers (the same task's registration only: another request's stream of that
id gets none). A stream resumed twice at once keeps each replay's place (per task, at
most :data:`_MAX_RESUMES`): whichever registers it gets what was stored since its own
replay, and that registration takes every resume's mark of the stream.

Bounded: at most ``max_session_events`` events of one session (its oldest dropped
first: its client reconnecting later than that misses them, as after a restart), at
most ``max_events`` in all (past it, the oldest event of the session holding the most
is dropped: one client's flood of events, its own calls' or requests', never drops
another session's result before that client can fetch it), and events older than
``max_age_s`` seconds are dropped. In memory: a server restart forgets them.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage

__all__ = ["DEFAULT_MAX_EVENTS", "DEFAULT_MAX_EVENT_AGE_S", "DEFAULT_MAX_SESSION_EVENTS", "BoundedEventStore",
           "own_event_stores"]

DEFAULT_MAX_EVENTS = 10_000
"""Events kept at most, all streams together."""
DEFAULT_MAX_SESSION_EVENTS = 1_000
"""Events of one session kept at most, all its streams together."""
DEFAULT_MAX_EVENT_AGE_S = 300.0
"""Seconds an event is kept for a client to reconnect and get it."""


_MAX_RESUMES = 16
"""Resumes of one stream (of one session) at once whose replay is remembered until the
stream is registered: more (clients that leave before it is) drop the oldest."""


_MAX_RESUMED_STREAMS = 256
"""Streams of one session whose resumes are remembered until they are registered: more
(streams resumed by clients that left each time) drop the oldest."""


class BoundedEventStore(EventStore):
    """An in-memory :class:`mcp.server.streamable_http.EventStore` with the bounds of
    the module doc. Event ids are ``<stream id>/<sequence number>``. Used as is, it is
    one session's store; :meth:`session` gives each of many sessions its own view, all
    within these bounds. Raises ``ValueError`` for a bound not more than 0."""

    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS, max_age_s: float = DEFAULT_MAX_EVENT_AGE_S,
                 max_session_events: int = DEFAULT_MAX_SESSION_EVENTS) -> None:
        if not max_events > 0 or not max_age_s > 0 or not max_session_events > 0:
            raise ValueError(f"max_events, max_age_s and max_session_events must be more than 0, got {max_events!r}, "
                             f"{max_age_s!r}, {max_session_events!r}")
        self.max_events = max_events
        self.max_age_s = max_age_s
        self.max_session_events = max_session_events
        # event id -> (session, stream id, message, when stored)
        self._events: OrderedDict[EventId, tuple[str | None, StreamId, JSONRPCMessage | None, float]] = OrderedDict()
        self._owned: dict[str | None, OrderedDict[EventId, None]] = {}  # each session's event ids, oldest first
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
        while self._events:  # by age: the oldest of all first
            event_id, oldest = next(iter(self._events.items()))
            if now - oldest[3] <= self.max_age_s:
                break
            self._drop(oldest[0], event_id)
        while len(self._events) > self.max_events:  # by count: the oldest of the session that holds the most
            session, owned = max(self._owned.items(), key=lambda item: len(item[1]))
            self._drop(session, next(iter(owned)))

    def _drop(self, session: str | None, event_id: EventId) -> None:
        del self._events[event_id]
        owned = self._owned[session]
        del owned[event_id]
        if not owned:
            del self._owned[session]

    def _store(self, session: str | None, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        now = time.monotonic()
        event_id = f"{stream_id}/{next(self._sequence)}"
        self._events[event_id] = (session, stream_id, message, now)
        owned = self._owned.setdefault(session, OrderedDict())
        owned[event_id] = None
        if len(owned) > self.max_session_events:  # the session's own oldest first
            self._drop(session, next(iter(owned)))
        self._trim(now)
        return event_id

    async def _replay(self, session: str | None, last_event_id: EventId,
                      send_callback: EventCallback) -> StreamId | None:
        self._trim(time.monotonic())
        found = self._events.get(last_event_id)
        if found is None or found[0] != session:
            return None
        stream_id = found[1]
        for event in self._after(session, stream_id, last_event_id):
            await send_callback(event)
        return stream_id

    def _after(self, session: str | None, stream_id: StreamId, last_event_id: EventId) -> list[EventMessage]:
        """``session``'s events of ``stream_id`` stored after ``last_event_id`` (none when it is gone)."""
        events, after = [], False
        for event_id, (owner, stream, message, _) in list(self._events.items()):
            if event_id == last_event_id:
                after = True
            elif after and owner == session and stream == stream_id and message is not None:
                events.append(EventMessage(message, event_id))
        return events

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
        # stream id -> {a replaying task's id: the last event it replayed}, until the stream is registered
        self._resumed: OrderedDict[StreamId, OrderedDict[int, EventId]] = OrderedDict()
        self.streams: dict[Any, Any] = {}  # the transport's registry (a _Streams), once admitted

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Keep ``message`` as this session's next event of ``stream_id``."""
        return self._store._store(self._session, stream_id, message)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        """This session's events of the stream after ``last_event_id`` (None: not this session's event)."""
        last = [last_event_id]

        async def sending(event: EventMessage) -> None:
            await send_callback(event)
            last[0] = event.event_id or last[0]

        stream_id = await self._store._replay(self._session, last_event_id, sending)
        if stream_id is not None and stream_id not in self.streams:  # the SDK registers it next
            marks = self._resumed.setdefault(stream_id, OrderedDict())
            self._resumed.move_to_end(stream_id)
            while len(self._resumed) > _MAX_RESUMED_STREAMS:  # streams resumed and never registered: oldest go
                self._resumed.popitem(last=False)
            marks[anyio.get_current_task().id] = last[0]  # one a task: two resumes at once each keep theirs
            while len(marks) > _MAX_RESUMES:  # resumes whose clients left unregistered: the oldest go
                marks.popitem(last=False)
        return stream_id

    def registered(self, stream_id: StreamId, live: MemoryObjectSendStream[EventMessage]) -> None:
        """The transport registered ``live`` for ``stream_id``'s live events: when this task
        replayed that stream, send ``live`` the events stored since its replay (the SDK's
        router found no stream for them). More than ``live`` holds closes it once those it
        holds are read: the client resumes from the last it got."""
        marks = self._resumed.pop(stream_id, None)  # every resume's of it: the others register it no more
        last = marks.get(anyio.get_current_task().id) if marks is not None else None
        if last is None:  # another task's (a POST of that id): none
            return
        for event in self._store._after(self._session, stream_id, last):
            try:
                live.send_nowait(event)
            except anyio.WouldBlock:
                live.close()
                return


class _Streams(dict[Any, Any]):
    """A transport's registry of its streams (``_request_streams``) that tells the
    session's events each registration (:meth:`_SessionEvents.registered`)."""

    def __init__(self, events: _SessionEvents) -> None:
        super().__init__()
        self._events = events
        events.streams = self

    def __setitem__(self, stream_id: Any, streams: Any) -> None:
        super().__setitem__(stream_id, streams)
        self._events.registered(stream_id, streams[0])


def own_event_stores(manager: Any, store: BoundedEventStore) -> None:
    """Give each session ``manager`` (the SDK's ``StreamableHTTPSessionManager``) admits
    its own view of ``store``: the SDK hands every session's transport the one store
    (its ``_admit_session``, checked by the tests), and a registry of its streams that
    closes the resume's gap (module doc). Raises ``AttributeError`` when the SDK no longer
    has what this relies on (serving would leak events between sessions, or lose them)."""
    admit = manager._admit_session

    def admit_with_own_store(*args: Any, **kwargs: Any) -> Any:
        transport = admit(*args, **kwargs)
        if transport is not None:
            if (not hasattr(transport, "_event_store") or transport.mcp_session_id is None
                    or getattr(transport, "_request_streams", None) != {}):
                raise AttributeError("the MCP SDK's transport has no _event_store, session id or empty "
                                     "_request_streams: rho cannot keep its sessions' SSE events apart")
            events = _SessionEvents(store, transport.mcp_session_id)
            transport._event_store = events
            transport._request_streams = _Streams(events)
        return transport

    manager._admit_session = admit_with_own_store
