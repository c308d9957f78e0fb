"""What an upstream MCP server sends that no call of ours asked for: each notification
kind relayed to the clients of a gateway (``rho-actors mcp serve --mcp ...``) or
dropped, on purpose:

- ``notifications/progress`` of a call: relayed to that call's client as the call's own
  progress (``ctx["progress"]``: :meth:`rho_actors.mcp.MCPServer.call`);
- ``notifications/message`` (a log message): relayed to the clients of the calls in
  flight on that server's connection (the message names no request), its ``logger``
  prefixed with the server's name, at most :data:`MAX_RELAYED_LOGS` a call, each
  client's own level filter applied; with no call in flight it goes to the host's log,
  escaped (:func:`relay_log`). It is relayed as it is read, before a response read
  after it can end the call it belongs to;
- ``notifications/tools/list_changed``: the server is listed again (at most once a
  second), and a change reaches the clients as the registry's ``list_changed``;
- ``notifications/resources/list_changed``, ``notifications/resources/updated``,
  ``notifications/prompts/list_changed``: dropped (a gateway serves tools only);
- ``notifications/cancelled`` of a request of the server's own, and
  ``notifications/elicitation/complete``: dropped (a gateway sends the server no
  request that could be cancelled or completed).

A handshake-era server's own requests that ask for input (``elicitation/create``,
``sampling/createMessage``, ``roots/list``) name no call of ours: each is relayed to the
client of the one call in flight on that connection (:func:`relay_question`), and
refused when there is none or several (which one asked cannot be told). At 2026-07-28 a
server asks inside its call's result (``input_required``), relayed by
:meth:`rho_actors.mcp.MCPServer.call`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from loguru import logger

from rho_actors.encoding import replace_controls, scrub_text
from rho_actors.mcp.bounds import shown_text
from rho_actors.mcp.client_requests import ClientRequestError

__all__ = ["MAX_RELAYED_LOGS", "Listener", "forget", "listen", "relay_log", "relay_question"]

MAX_RELAYED_LOGS = 100
"""The most log messages of an upstream relayed to one served call (the rest dropped)."""


@dataclass(slots=True)
class Listener:
    """A served call's MCP client (:class:`rho_actors.mcp.MCPClient`) waiting on an
    upstream call, and how many log messages it was relayed."""

    client: Any
    relayed: int = 0
    asked: int = 0  # the server's own questions relayed so far (their keys: elicitation-1, sampling-2...)


def listen(lock: threading.Lock, listeners: dict[int, Listener], client: Any) -> Callable[..., None]:
    """Relay the server's log messages to ``client`` (a served call's MCP client, or
    None: nothing to relay to) from now on, until the returned function is called (the
    upstream call's done callback). Called before the request is sent: a server may log
    before the request's send has even returned."""
    if client is None:
        return _nothing
    listener = Listener(client)
    with lock:
        listeners[id(listener)] = listener
    return lambda *_: forget(lock, listeners, id(listener))


def _nothing(*_: Any) -> None:
    return None


def forget(lock: threading.Lock, listeners: dict[int, Listener], key: int) -> None:
    """Drop listener ``key`` (its upstream call has ended)."""
    with lock:
        listeners.pop(key, None)


def relay_log(lock: threading.Lock, listeners: dict[int, Listener], server: str,
              params: types.LoggingMessageNotificationParams) -> None:
    """Relay server ``server``'s log message to ``listeners`` (the calls in flight on its
    connection; see the module doc), or to the host's log when there is none."""
    who = f"{server}/{params.logger}"[:200] if params.logger else server
    with lock:
        waiting = list(listeners.values())
    if not waiting:
        logger.info("MCP server {} logged ({}): {}", server, params.level,
                    replace_controls(scrub_text(repr(params.data)[:500])))
        return
    for listener in waiting:
        if listener.relayed >= MAX_RELAYED_LOGS:
            continue
        listener.relayed += 1
        with contextlib.suppress(Exception):  # a client gone: its call ends on its own
            listener.client.log(params.level, params.data, who, wait=False)


def relay_question(lock: threading.Lock, listeners: dict[int, Listener], request: Any) -> Any:
    """Ask ``request`` (a server's own ``ElicitRequest``, ``CreateMessageRequest`` or
    ``ListRootsRequest``) of the client of the one call in flight on its connection, and
    return its answer (the SDK's result), or ``ErrorData`` saying why not: no call, or
    several, in flight; the client cannot or did not answer (on a 2026-07-28 served call
    the question goes to its client in rho's own ``input_required`` result, and is
    answered when the call comes again). Blocks (from a worker thread) at most until
    that call's deadline."""
    with lock:
        waiting = list(listeners.values())
        if len(waiting) == 1:
            waiting[0].asked += 1
    if len(waiting) != 1:
        return types.ErrorData(code=types.INVALID_REQUEST, message=(
            "no call in flight on this connection has an MCP client to ask" if not waiting else
            f"{len(waiting)} calls with MCP clients are in flight on this connection: which one asks cannot be told"))
    listener = waiting[0]
    kind = str(request.method).split("/")[0]
    try:
        [answer] = listener.client.ask({f"{kind}-{listener.asked}": request}).values()
    except ClientRequestError as err:
        return types.ErrorData(code=types.INVALID_REQUEST, message=shown_text(str(err), 500))
    return answer
