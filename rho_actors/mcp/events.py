"""The event store of ``mcp serve --http``: the SSE events sent on each stream, kept so
that a client whose stream closed can reconnect with ``Last-Event-ID`` and get what it
missed (SEP-1699's polling: the server sends a *priming* event, an id with empty data
and a ``retry`` delay, first on each stream; it may close the stream mid-call; the
client reconnects after ``retry`` ms and the rest is replayed).

Bounded: at most ``max_events`` events in all (the oldest are dropped first: a client
reconnecting later than that misses them, as after a restart) and events older than
``max_age_s`` seconds are dropped. In memory: a server restart forgets them.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage

__all__ = ["DEFAULT_MAX_EVENTS", "DEFAULT_MAX_EVENT_AGE_S", "BoundedEventStore"]

DEFAULT_MAX_EVENTS = 10_000
"""Events kept at most, all streams together."""
DEFAULT_MAX_EVENT_AGE_S = 300.0
"""Seconds an event is kept for a client to reconnect and get it."""


class BoundedEventStore(EventStore):
    """An in-memory :class:`mcp.server.streamable_http.EventStore` with the bounds of
    the module doc. Event ids are ``<stream id>/<sequence number>``. Raises
    ``ValueError`` for a bound not more than 0."""

    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS, max_age_s: float = DEFAULT_MAX_EVENT_AGE_S) -> None:
        if not max_events > 0 or not max_age_s > 0:
            raise ValueError(f"max_events and max_age_s must be more than 0, got {max_events!r}, {max_age_s!r}")
        self.max_events = max_events
        self.max_age_s = max_age_s
        self._events: OrderedDict[EventId, tuple[StreamId, JSONRPCMessage | None, float]] = OrderedDict()
        self._sequence = itertools.count(1)

    @property
    def count(self) -> int:
        """Events kept now. (Not ``__len__``: the SDK tests the store for truth, and an
        empty store must count as one.)"""
        return len(self._events)

    def _trim(self, now: float) -> None:
        while self._events:
            oldest = next(iter(self._events.values()))
            if len(self._events) <= self.max_events and now - oldest[2] <= self.max_age_s:
                break
            self._events.popitem(last=False)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Keep ``message`` (None: a priming event) as the next event of ``stream_id``."""
        now = time.monotonic()
        event_id = f"{stream_id}/{next(self._sequence)}"
        self._events[event_id] = (stream_id, message, now)
        self._trim(now)
        return event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        """Send the events of ``last_event_id``'s stream stored after it (not the priming
        ones); returns that stream's id, or None when the event is unknown (never
        stored, or dropped by the bounds)."""
        self._trim(time.monotonic())
        found = self._events.get(last_event_id)
        if found is None:
            return None
        stream_id = found[0]
        after = False
        for event_id, (stream, message, _) in list(self._events.items()):
            if event_id == last_event_id:
                after = True
            elif after and stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id
