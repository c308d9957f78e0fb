"""An untrusted upstream's server process per session (DESIGN §6b "The gateway").

One process serving every session sees every session's arguments and can answer one
session with another's data. So an untrusted upstream (``trusted = false``) runs one
confined process of its own for each rho session that calls it: :class:`SessionServers`
starts it on the session's first call, as a ``temporary`` child of the upstream's own
supervisor (``mcp:<name>:session-<n>``, an :class:`~rho_actors.mcp.source.MCPConnection`
that never lists tools), and routes each call by ``ctx["session_id"]``. The upstream's
listing comes from its supervised connection, whose process never gets a call.

Bounded: a session's process idle for :data:`SESSION_IDLE_S` is stopped (at a later
call's look), and at most ``max_servers`` run at once: past it the least recently used
idle one is stopped first, and when all are busy the call is ``unavailable`` (naming
the bound). A process that ends (exits, crashes, breaks a bound) is not restarted: the
session's next call starts another. ``shared = true`` in the server's configuration is
the explicit opt-in to one process for every session.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import pykka

from rho_actors.mcp.source import Link, MCPConnection, MCPServer
from rho_actors.otp.supervisor import ChildSpec, StartChild
from rho_actors.results import TEXTS, text
from rho_actors.tool import ToolFailure

__all__ = ["MAX_SESSION_SERVERS", "SESSION_IDLE_S", "SessionServers"]

MAX_SESSION_SERVERS: Final = 16
"""Session processes of one untrusted upstream at once, by default."""
SESSION_IDLE_S: Final = 300.0
"""A session's process unused this long (seconds) is stopped."""
_ASK_S: Final = 15.0


@dataclass(slots=True)
class _Held:
    link: Link
    child_id: str
    ref: Any
    calls: int = 0
    used: float = 0.0


class SessionServers:
    """The per-session processes of ``server`` (see the module doc); ``max_servers``
    at once, each stopped after ``idle_s`` seconds unused."""

    def __init__(self, server: MCPServer, max_servers: int = MAX_SESSION_SERVERS,
                 idle_s: float = SESSION_IDLE_S) -> None:
        self._server = server
        self.max_servers = max_servers
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._serial = itertools.count(1)
        self.started = 0  # processes started so far

    @contextlib.contextmanager
    def link(self, tool: str, ctx: Mapping[str, Any]) -> Iterator[Link]:
        """The connection of ``ctx["session_id"]``'s own process (started now when it has
        none), held while the call runs. Raises :class:`ToolFailure` (``unavailable``)
        when it cannot be started or every process is busy at the bound."""
        session = str(ctx.get("session_id") or "")
        deadline = float(ctx.get("deadline", time.monotonic() + self._server.connect_timeout_s))
        held = self._take(session, tool, deadline)
        try:
            yield held.link
        finally:
            with self._lock:
                held.calls -= 1
                held.used = time.monotonic()

    def sessions(self) -> dict[str, int]:
        """``{session id: calls running}`` of the processes alive now."""
        with self._lock:
            return {s: h.calls for s, h in self._held.items()}

    def _take(self, session: str, tool: str, deadline: float) -> _Held:
        stopping: list[_Held] = []
        with self._lock:
            now = time.monotonic()
            for name, kept in list(self._held.items()):
                if kept.calls == 0 and (now - kept.used >= self.idle_s or not kept.ref.is_alive()):
                    stopping.append(self._held.pop(name))
            held = self._held.get(session)
            if held is None and len(self._held) >= self.max_servers:
                idle = sorted((h.used, s) for s, h in self._held.items() if h.calls == 0)
                if not idle:
                    raise ToolFailure(TEXTS["mcp_session_cap"][0], text(
                        "mcp_session_cap", tool=tool, server=self._server.name, count=self.max_servers))
                stopping.append(self._held.pop(idle[0][1]))
            if held is not None:
                held.calls += 1
        self._stop(stopping)
        if held is not None:
            return held
        started = self._start(tool, deadline)
        with self._lock:
            other = self._held.get(session)
            if other is None:  # the session's first call (another thread did not start one meanwhile)
                self._held[session] = held = started
                held.calls += 1
                return held
            other.calls += 1
        self._stop([started])
        return other

    def _start(self, tool: str, deadline: float) -> _Held:
        server = self._server
        subtree = server.subtree
        if subtree is None:
            raise ToolFailure(TEXTS["mcp_not_connected"][0], text("mcp_not_connected", tool=tool, server=server.name))
        link = Link()
        child_id = f"{server.child_id}:session-{next(self._serial)}"
        spec = ChildSpec(child_id, StartChild(MCPConnection, (server, link, False)), restart="temporary",
                         shutdown=10_000)
        try:
            ref = subtree.proxy().start_child(spec).get(timeout=_ASK_S)
        except (pykka.ActorDeadError, pykka.Timeout, RuntimeError):
            raise ToolFailure(TEXTS["mcp_not_connected"][0],
                              text("mcp_not_connected", tool=tool, server=server.name)) from None
        self.started += 1
        wait_s = max(0.0, min(server.connect_timeout_s, deadline - time.monotonic()))
        with link.changed:
            link.changed.wait_for(lambda: link.session is not None or link.failures > 0 or not ref.is_alive(),
                                  wait_s)
        if link.session is None:
            self._stop([_Held(link, child_id, ref)])
            raise ToolFailure(TEXTS["mcp_not_connected"][0], text("mcp_not_connected", tool=tool, server=server.name))
        return _Held(link, child_id, ref, used=time.monotonic())

    def _stop(self, stopping: list[_Held]) -> None:
        subtree = self._server.subtree
        for held in stopping:
            if subtree is not None:
                with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                    subtree.proxy().terminate_child(held.child_id).get(timeout=_ASK_S)

    def close(self) -> None:
        """Stop every session's process; never raises."""
        with self._lock:
            stopping = list(self._held.values())
            self._held.clear()
        self._stop(stopping)
