"""What a framework's executor gives a tool beside its JSON arguments, for a call it
makes through rho to a tool that rho runs in this process (DESIGN §6c): LangGraph's
injected values and run config, the Agents SDK's ``ToolContext``. The adapter holds a
:class:`HostSideCall` under the call's session and id while the rho turn runs; the
adopted tool's ``run`` finds it from its ``ctx`` and keeps what the framework's tool
returned or raised, as the very object, for the adapter to hand back. A call rho makes
on its own (or in a worker process) finds none and runs on its JSON arguments."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["HOST_SIDE_CALLS", "HostSideCall", "HostSideCalls"]


_UNSET = object()


class HostSideCall:
    """One call a framework's executor makes through rho: ``given`` (what the framework
    gives its tool, by name); after the call, ``output`` (what the tool returned, when
    ``returned``) or ``raised`` (the exception it raised). A tool run as a task on the
    host's event loop (:meth:`running`) also leaves ``task`` (that task) and
    ``context_set`` (the context variables it set, with their values)."""

    def __init__(self, given: Mapping[str, Any]) -> None:
        self.given = dict(given)
        self.returned = False
        self.output: Any = None
        self.raised: BaseException | None = None
        self.task: asyncio.Task[Any] | None = None
        self.context_set: dict[contextvars.ContextVar[Any], Any] = {}

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around the framework's tool as it runs on the host's event loop, in its call's
        task (kept in :attr:`task`): keeps in :attr:`context_set` the context variables
        it set meanwhile, however it ends (the call's task runs in a copy of the
        caller's context: see :meth:`apply_context`)."""
        self.task = asyncio.current_task()
        before = contextvars.copy_context()
        try:
            yield
        finally:
            self.context_set = {var: value for var, value in contextvars.copy_context().items()
                                if before.get(var, _UNSET) is not value}

    def apply_context(self) -> None:
        """Set in the calling context the context variables the tool set (what a
        framework's executor that runs its tool in its own task shows the code after
        it: hooks and guardrails)."""
        for var, value in self.context_set.items():
            var.set(value)

    def keep(self, output: Any) -> Any:
        """Keep ``output`` and give rho its text: a message's ``content``, else
        ``output`` itself when it is plain data, else its ``str``."""
        self.output, self.returned = output, True
        content = getattr(output, "content", output)
        plain = content is None or isinstance(content, str | int | float | bool | list | dict)
        return content if plain else str(content)


class HostSideCalls:
    """The calls adapters make now, by (session id, call id)."""

    def __init__(self) -> None:
        self._calls: dict[tuple[str, str], HostSideCall] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def holding(self, session_id: str, call_id: str, call: HostSideCall | None) -> Iterator[None]:
        """``call`` known under (``session_id``, ``call_id``) while the block runs
        (nothing for ``None``)."""
        if call is None:
            yield
            return
        key = (session_id, call_id)
        with self._lock:
            self._calls[key] = call
        try:
            yield
        finally:
            with self._lock:
                if self._calls.get(key) is call:
                    del self._calls[key]

    def get(self, ctx: Mapping[str, Any]) -> HostSideCall | None:
        """The host-side call of a rho call's context ``ctx``, or ``None``."""
        with self._lock:
            return self._calls.get((str(ctx.get("session_id", "")), str(ctx.get("call_id", ""))))


HOST_SIDE_CALLS = HostSideCalls()
"""The process's host-side calls."""
