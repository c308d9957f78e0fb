"""A read-only live view of a running system, for ``rho-actors top`` and scripts
(OTP's ``observer``). Started by :meth:`rho_actors.ActorSystem.observe`; off until then.

A viewer connects to a Unix socket (or a TCP port on 127.0.0.1, where its first line
must be ``{"token": "..."}``: the token of :attr:`Observer.token`) and reads
newline-delimited JSON objects, each with a ``type``:

- ``snapshot``, at once and then every ``interval_s`` seconds: ``time`` (Unix seconds),
  ``tree`` (:meth:`~rho_actors.ActorSystem.tree`: restarts and liveness per child),
  ``sessions`` (``session_id``, and of its loop: ``alive``, ``restarts``, ``running``), ``calls`` (the
  running calls: ``session_id``, ``call_id``, ``tool``, ``ms_left`` to the deadline),
  ``workers`` (``pid``, ``rss_bytes`` from psutil), ``stats`` (:meth:`stats`),
  ``reports`` (recent supervisor reports), ``events`` (recent call events) and
  ``dropped`` (updates this viewer missed because it read too slowly).
- ``event``: a call event (``kind``, ``session_id``, ``call_id``, ``tool``, ``outcome``,
  ``duration_ms``) as it happens.
- ``report``: any other event of the system's bus (:class:`rho_actors.DeclarationEvent`,
  :class:`rho_actors.SupervisorEvent`, :class:`rho_actors.ProgressEvent`,
  :class:`rho_actors.ToolSetChanged`), with its fields and ``event``, its class name.

On TCP, at most ``max_unauthenticated`` connections (default 8) may be waiting to give
their token at once; one more is answered with an error line and closed at once, before
any thread is given to it. Each has ``token_deadline_s`` seconds (default 2) in all to
send its whole token line, however slowly it trickles in; then it is closed.
:meth:`Observer.stats` shows the caps and their use.

Nothing a viewer sends is acted upon (beyond the token). A slow or dead viewer never
slows the system: each viewer has a bounded queue (``max_queued`` messages) that the
system's threads only ever add to without blocking; what does not fit is dropped and
counted in the next snapshot's ``dropped``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import queue
import secrets
import socket
import socketserver
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from loguru import logger

from rho_actors.encoding import scrub_text
from rho_actors.events import CallEvent

__all__ = ["ObservedSystem", "Observer", "json_line", "snapshot"]

MAX_QUEUED = 1_000
RECENT = 50
MAX_UNAUTHENTICATED = 8
"""TCP connections that may be waiting to give their token at once (more are refused)."""
TOKEN_DEADLINE_S = 2.0
"""Seconds a TCP connection has, in all, to send its whole token line."""
_MAX_TOKEN_LINE = 1_000


class ObservedSystem(Protocol):
    """What an observer reads of a system (an :class:`~rho_actors.ActorSystem` is one):
    its tree, counters, worker pids, whether it stopped, and its event bus."""

    @property
    def stopped(self) -> bool: ...

    def tree(self) -> dict[str, Any]: ...

    def stats(self) -> dict[str, Any]: ...

    def worker_pids(self) -> list[int]: ...

    def subscribe(self, callback: Callable[[Any], None]) -> Callable[[], None]: ...


def snapshot(system: ObservedSystem, reports: list[dict[str, Any]] | None = None,
             events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One view of ``system`` as plain JSON-able data (see the module docstring)."""
    tree = system.tree()
    sessions = []
    for session in _find(tree, "sessions").get("children", []):  # one supervisor per session, over its loop
        loop = _find(session, "loop")
        sessions.append({"session_id": session["id"], "alive": bool(loop.get("alive")),
                         "restarts": loop.get("restarts", 0), "running": loop.get("running", [])})
    calls = [{"session_id": s["session_id"], **call} for s in sessions for call in s["running"]]
    return {
        "type": "snapshot",
        "time": time.time(),
        "tree": tree,
        "sessions": sessions,
        "calls": calls,
        "workers": _workers(system),
        "stats": system.stats(),
        "reports": reports or [],
        "events": events or [],
    }


def _find(node: dict[str, Any], node_id: str) -> dict[str, Any]:
    if node.get("id") == node_id:
        return node
    for child in node.get("children", []):
        found = _find(child, node_id)
        if found:
            return found
    return {}


def _workers(system: ObservedSystem) -> list[dict[str, Any]]:
    """The worker processes of ``process`` isolation, with their resident memory."""
    import psutil

    rows = []
    for pid in system.worker_pids():
        try:
            rss: int | None = psutil.Process(pid).memory_info().rss
        except (psutil.Error, OSError):
            rss = None
        rows.append({"pid": pid, "rss_bytes": rss})
    return rows


def _plain(event: Any) -> dict[str, Any]:
    """An event as JSON-able fields (``repr`` for what JSON cannot hold)."""
    if dataclasses.is_dataclass(event) and not isinstance(event, type):
        fields = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    else:
        fields = dict(getattr(event, "__dict__", {}))
    plain = {k: v if isinstance(v, (str, int, float, bool, type(None))) else repr(v) for k, v in fields.items()}
    return {"event": type(event).__name__, **plain}


def _strict(value: Any, depth: int = 0) -> Any:
    """``value`` as RFC 8259 data: a non-finite float is ``null``, a string is scrubbed
    (valid UTF-8), keys are strings, anything else (or past 64 levels) is its ``repr``."""
    if value is None or type(value) in (bool, int):
        return value
    if isinstance(value, int):  # an IntEnum, a bool subclass...
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        return scrub_text(value)
    if depth < 64 and isinstance(value, dict):
        return {scrub_text(k if isinstance(k, str) else _repr(k)): _strict(v, depth + 1) for k, v in value.items()}
    if depth < 64 and isinstance(value, (list, tuple)):
        return [_strict(v, depth + 1) for v in value]
    return _repr(value)


def _repr(value: Any) -> str:
    try:
        return scrub_text(repr(value))
    except Exception:
        return f"<{type(value).__qualname__}>"


def json_line(message: dict[str, Any]) -> bytes:
    """``message`` as one line of the observer's stream: a strict RFC 8259 JSON object
    (no ``NaN``/``Infinity``: a non-finite number is ``null``), UTF-8, ending in ``\\n``."""
    return json.dumps(_strict(message), ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n"


class _Viewer:
    """One connected viewer: a bounded queue the system adds to without blocking."""

    def __init__(self, max_queued: int) -> None:
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue(max_queued)
        self.dropped = 0

    def offer(self, message: dict[str, Any] | None) -> None:
        try:
            self.queue.put_nowait(message)
        except queue.Full:
            self.dropped += 1


class Observer:
    """Serves the live view of one system (see the module docstring). Use
    :meth:`rho_actors.ActorSystem.observe` to start one.

    ``address``: a Unix socket path (created; an existing socket file there is replaced)
    or a TCP port on 127.0.0.1 (an ``int``; 0 picks a free one). Attributes:
    ``address`` (the path, or ``"127.0.0.1:PORT"``), ``token`` (None for a Unix socket,
    whose file is made readable by its owner only), ``dropped`` (updates dropped for
    slow viewers, in all). ``max_unauthenticated`` and ``token_deadline_s`` (seconds)
    bound TCP connections that have not given their token yet (module doc).
    Raises ``ValueError`` for an ``interval_s``, ``max_unauthenticated`` or
    ``token_deadline_s`` that is not more than 0.
    """

    def __init__(self, system: ObservedSystem, address: str | Path | int, *, interval_s: float = 1.0,
                 max_queued: int = MAX_QUEUED, max_unauthenticated: int = MAX_UNAUTHENTICATED,
                 token_deadline_s: float = TOKEN_DEADLINE_S) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be more than 0, got {interval_s}")
        if max_unauthenticated < 1:
            raise ValueError(f"max_unauthenticated must be at least 1, got {max_unauthenticated}")
        if not token_deadline_s > 0:
            raise ValueError(f"token_deadline_s must be more than 0, got {token_deadline_s}")
        self.max_unauthenticated = max_unauthenticated
        self.token_deadline_s = token_deadline_s
        self._waiting = 0  # TCP connections not yet past the token check (under _lock)
        self.refused = 0  # connections refused because max_unauthenticated were waiting
        self.timed_out = 0  # connections closed at token_deadline_s
        self._system = system
        self._interval_s = interval_s
        self._max_queued = max_queued
        self._lock = threading.Lock()
        self._viewers: set[_Viewer] = set()
        self._reports: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self._events: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self._closed = threading.Event()
        self.dropped = 0
        handler = self._handler_class()
        self._server: socketserver.BaseServer
        if isinstance(address, int) and not isinstance(address, bool):
            self.token: str | None = secrets.token_hex(24)
            self._server = _TCPServer(("127.0.0.1", address), handler, self._admit)
            self.address = f"127.0.0.1:{self._server.server_address[1]}"
        else:
            path = Path(str(address))
            if path.is_socket():
                path.unlink()
            self.token = None
            self._server = _UnixServer(str(path), handler)
            os.chmod(path, 0o600)
            self.address = str(path)
        self._unsubscribe = system.subscribe(self._on_event)
        self._threads = [
            threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                             name="rho-observer", daemon=True),
            threading.Thread(target=self._tick, name="rho-observer-snapshots", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    # --- the system's side (never blocks) -------------------------------------------------

    def _on_event(self, event: Any) -> None:
        plain = _plain(event)
        if isinstance(event, CallEvent):
            message = {"type": "event", **plain}
            self._events.append(message)
        else:
            message = {"type": "report", **plain}
            self._reports.append(message)
        for viewer in tuple(self._viewers):
            before = viewer.dropped
            viewer.offer(message)
            if viewer.dropped != before:
                self.dropped += 1

    # --- the observer's own threads -----------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The current view (see :func:`snapshot`), with the recent reports and events."""
        view = snapshot(self._system)  # first: the recent reports and events are then at least as new
        view["reports"], view["events"] = list(self._reports), list(self._events)
        return view

    def _tick(self) -> None:
        while not self._closed.wait(self._interval_s):
            if self._viewers and not self._system.stopped:
                self._broadcast_snapshot()

    def _broadcast_snapshot(self) -> None:
        try:
            view = self.snapshot()
        except Exception:
            logger.exception("the observer could not take a snapshot")
            return
        for viewer in tuple(self._viewers):
            viewer.offer({**view, "dropped": viewer.dropped})

    def _handler_class(self) -> type[socketserver.StreamRequestHandler]:
        observer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                observer._serve(self.connection, self.rfile, self.wfile)

        return Handler

    def stats(self) -> dict[str, Any]:
        """``{"viewers": int, "unauthenticated": int, "max_unauthenticated": int,
        "token_deadline_s": float, "refused": int, "timed_out": int, "dropped": int}``:
        connected viewers, TCP connections waiting to give their token now and the cap,
        connections refused at the cap, and closed at the token deadline, so far."""
        with self._lock:
            return {"viewers": len(self._viewers), "unauthenticated": self._waiting,
                    "max_unauthenticated": self.max_unauthenticated, "token_deadline_s": self.token_deadline_s,
                    "refused": self.refused, "timed_out": self.timed_out, "dropped": self.dropped}

    def _admit(self, connection: socket.socket) -> bool:
        """In the accepting thread, before a thread is given to ``connection``: take one of
        the ``max_unauthenticated`` places, or answer with an error line and refuse."""
        with self._lock:
            if self._waiting < self.max_unauthenticated:
                self._waiting += 1
                return True
            self.refused += 1
        logger.warning("the observer refused a connection: {} are already waiting to give their token",
                       self.max_unauthenticated)
        with contextlib.suppress(OSError):
            connection.setblocking(False)
            connection.send(b'{"type": "error", "error": "too many connections are waiting to give their token"}\n')
        return False

    def _serve(self, connection: socket.socket, rfile: Any, wfile: Any) -> None:
        if self.token is not None:
            try:
                authorised = self._authorised(connection, wfile)
            finally:
                with self._lock:
                    self._waiting -= 1
            if not authorised:
                return
        viewer = _Viewer(self._max_queued)
        try:
            view = self.snapshot()
        except Exception as exc:
            logger.exception("the observer could not take a snapshot")
            view = {"type": "error", "error": f"no snapshot: {exc!r}"}
        viewer.offer({**view, "dropped": 0})
        with self._lock:
            self._viewers.add(viewer)
        try:
            while not self._closed.is_set():
                try:
                    message = viewer.queue.get(timeout=0.2)
                except queue.Empty:
                    continue
                if message is None:
                    break
                wfile.write(json_line(message))
                wfile.flush()
        except OSError:
            pass  # the viewer went away
        finally:
            with self._lock:
                self._viewers.discard(viewer)

    def _authorised(self, connection: socket.socket, wfile: Any) -> bool:
        """Whether the first line is ``{"token": ...}`` with this observer's token, read
        within ``token_deadline_s`` in all (each ``recv`` waits at most what is left)."""
        deadline = time.monotonic() + self.token_deadline_s
        line = b""
        try:
            while b"\n" not in line and len(line) < _MAX_TOKEN_LINE:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                connection.settimeout(left)
                chunk = connection.recv(_MAX_TOKEN_LINE - len(line))
                if not chunk:
                    break
                line += chunk
            token = json.loads(line.split(b"\n", 1)[0]).get("token") if line else None
        except TimeoutError:
            with self._lock:
                self.timed_out += 1
            token = None
        except (OSError, ValueError, AttributeError):
            token = None
        connection.settimeout(None)
        if isinstance(token, str) and self.token is not None and secrets.compare_digest(token, self.token):
            return True
        try:
            wfile.write(b'{"type": "error", "error": "a valid {\\"token\\": ...} line is needed first"}\n')
        except OSError:
            pass
        return False

    def close(self) -> None:
        """Stop serving and disconnect every viewer (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._unsubscribe()
        for viewer in tuple(self._viewers):
            viewer.offer(None)
        self._server.shutdown()
        self._server.server_close()
        if self.token is None:
            try:
                os.unlink(self.address)
            except OSError:
                pass

    def __enter__(self) -> Observer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], handler: Any, admit: Callable[[socket.socket], bool]) -> None:
        super().__init__(address, handler)
        self._admit = admit

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for ``request`` only once it has a place (see :meth:`Observer._admit`)."""
        if self._admit(request):
            super().process_request(request, client_address)
        else:
            self.shutdown_request(request)


class _UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
