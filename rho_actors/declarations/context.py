"""The call's context as a tool receives it: :class:`ToolContext` (a read-only mapping
with typed properties), and which ``@tool`` parameters receive it (one annotated
``ToolContext``, or named :data:`CONTEXT_NAME`; :func:`looks_like_context` names the
ones that look meant for it). Re-exported by :mod:`rho_actors.tool`."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

__all__ = ["CONTEXT_NAME", "ToolContext", "looks_like_context"]

CONTEXT_NAME: Final = "ctx"
"""The parameter name that receives the context whatever its annotation."""
_CONTEXT_LIKE: Final = re.compile(r"(^|_)(ctx|context|run_?context|tool_?context)(_|$)", re.IGNORECASE)


class ToolContext(Mapping[str, Any]):
    """The context of one call, read-only: a :class:`~collections.abc.Mapping` of the
    context's keys (``ctx["call_id"]`` and ``ctx.get("withheld", [])`` work as on the
    plain mapping) with typed properties for the common ones. ``context``: the mapping
    the runtime gave the call."""

    __slots__ = ("_context",)

    def __init__(self, context: Mapping[str, Any]) -> None:
        self._context = context

    def __getitem__(self, key: str) -> Any:
        return self._context[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._context)

    def __len__(self) -> int:
        return len(self._context)

    @property
    def session_id(self) -> str:
        """The session's id."""
        return str(self._context.get("session_id", ""))

    @property
    def call_id(self) -> str:
        """The call's id (the model's)."""
        return str(self._context.get("call_id", ""))

    @property
    def data_dir(self) -> Path:
        """The session's private folder (an untrusted tool's: its worker's)."""
        return Path(self._context["data_dir"])

    @property
    def deadline(self) -> float | None:
        """The call's deadline, a ``time.monotonic()`` instant (``None`` outside a loop)."""
        value = self._context.get("deadline")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def cancel(self) -> Any:
        """The call's :class:`~rho_actors.CancelToken` (``None`` outside a loop)."""
        return self._context.get("cancel")

    @property
    def deps(self) -> Any:
        """The session's dependencies (``None`` when there are none)."""
        return self._context.get("deps")

    @property
    def withheld(self) -> list[str]:
        """The names of the tools the call's loop does not offer now."""
        return list(self._context.get("withheld", []))

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report progress (a ``ProgressEvent``) where the isolation gives a reporter;
        else nothing."""
        report = self._context.get("progress")
        if callable(report):
            report(done, total, message)

    def __repr__(self) -> str:
        return f"ToolContext(session_id={self.session_id!r}, call_id={self.call_id!r})"


def looks_like_context(name: str) -> bool:
    """Whether a parameter's ``name`` says it is meant for the call's context."""
    return bool(_CONTEXT_LIKE.search(name))
