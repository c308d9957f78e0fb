"""A call on its way through a :class:`~rho_actors.sandbox.pool.WorkerPool` (internal):
what the pool keeps of it from its start to its one result (:class:`Sending`), and the
start bound it had (:func:`start_ms`)."""

from __future__ import annotations

from collections.abc import Callable, Hashable

from rho_actors.sandbox import wire
from rho_actors.sandbox.replies import Waiter
from rho_actors.sandbox.slots import Grant
from rho_actors.sandbox.wire import WorkerCall
from rho_actors.sandbox.worker_handle import WorkerHandle
from rho_actors.tool import ToolResult

__all__ = ["Sending", "start_ms"]


def start_ms(call: WorkerCall) -> int:
    """The start bound ``call`` had, in milliseconds: from its start to its ``start_by``."""
    return round(((call.start_by if call.start_by is not None else call.deadline) - call.started) * 1000)


class Sending:
    """A call on its way through the pool: the ``call``, its ``request`` and
    ``tool_bytes``, its ``scope`` and ``env_key``, its place under the cap (``grant``),
    ``done`` (given its result once), ``here`` (the thread that writes it waits for its
    reply itself), ``waiter`` (the :class:`Waiter` that may hold it: the thread that
    writes it waits for its reply later), ``tries``, the workers that ended before it
    reached them, ``opened``: its reader (the pool's, or the thread that waits) has it,
    ``held``: the worker taken for it that no reader has yet (given back if the call
    never reaches it), ``answered``: it has its one result."""

    __slots__ = ("answered", "call", "done", "env_key", "grant", "held", "here", "opened", "request", "scope",
                 "tool_bytes", "tries", "waiter")

    def __init__(self, call: WorkerCall, request: wire.CallRequest, tool_bytes: bytes, scope: Hashable,
                 env_key: tuple[tuple[str, str], ...], grant: Grant, done: Callable[[ToolResult], None],
                 here: bool = False, waiter: Waiter | None = None) -> None:
        self.call, self.request, self.tool_bytes, self.scope = call, request, tool_bytes, scope
        self.env_key, self.grant, self.done, self.here, self.tries = env_key, grant, done, here, 0
        self.waiter, self.opened, self.answered = waiter, False, False
        self.held: list[WorkerHandle] = []
