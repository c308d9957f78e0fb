""":class:`HeldCalls`: the approvals half of a :class:`~rho_actors.Loop` (DESIGN §4
"Approvals"; internal: the methods are the loop's, re-exported as ``rho_actors.Loop``'s).

A call that waits for a decision (its tool ``requires_approval``, the loop's ``approval``
policy holds it, or its tool returned :class:`~rho_actors.Deferred`) is held by the
session's :class:`~rho_actors.loop.approvals.SessionApprovals`; :class:`HeldCalls` is the
host's way to it: :meth:`~HeldCalls.pending` lists the held calls,
:meth:`~HeldCalls.approve`, :meth:`~HeldCalls.reject` and :meth:`~HeldCalls.resolve`
decide one, :meth:`~HeldCalls.when_decided` waits for a decision. The turn half (turns,
prompts, the offer, background tasks) is :mod:`rho_actors.loop.handle`.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rho_actors.lifecycle import PendingCall
from rho_actors.loop.approvals import ApprovalError
from rho_actors.tool import ToolCall, ToolResult

if TYPE_CHECKING:
    from rho_actors.loop.approvals import SessionApprovals
    from rho_actors.loop.turns import Turns

__all__ = ["HeldCalls"]


class HeldCalls:
    """The calls of one session that wait for a decision (see the module doc);
    :class:`~rho_actors.Loop` sets every attribute below."""

    session_id: str
    _data_dir: Path
    _turns: Callable[[], Turns]

    def _approvals(self) -> SessionApprovals:
        approvals = self._turns().approvals
        if approvals is None:  # a LoopActor started by hand, not by start_loop
            raise ApprovalError(f"the loop of session {self.session_id!r} keeps no pending calls")
        return approvals

    def pending(self) -> list[PendingCall]:
        """The calls of this session waiting for a decision, oldest first: each a
        :class:`~rho_actors.PendingCall` (``call_id``, ``name``, decoded and validated
        ``arguments``, ``arguments_sha256``, ``requested_at``, ``kind``: ``"approval"``
        or ``"external"``, ``expires_at``, ``reason``). Raises as :attr:`ref` when the
        loop is not running."""
        approvals = self._turns().approvals
        return [] if approvals is None else approvals.pending()

    @property
    def approval_policy(self) -> Callable[[Any], Any] | None:
        """The loop's ``approval`` policy (``start_loop(approval=...)``), or ``None``."""
        approvals = self._turns().approvals
        return None if approvals is None else approvals.policy

    def requires_approval(self, call: ToolCall) -> bool:
        """Whether ``call`` would wait for a decision if run now (by its tool's
        ``requires_approval`` or the loop's ``approval`` policy; ``False`` for a call
        that would be refused: an unknown tool, invalid arguments). For a framework
        adapter that asks its own approval first. Raises as :attr:`ref` when the loop is
        not running."""
        approvals = self._turns().approvals
        ctx = {"session_id": self.session_id, "data_dir": self._data_dir}
        return approvals is not None and approvals.would_hold(call, ctx)

    def approve(self, call_id: str, arguments: Mapping[str, Any] | str | None = None,
                decided_by: str | None = None) -> ToolResult:
        """Approve pending call ``call_id``: it runs once, now (its deadline counts from
        here), in its tool's isolation, and its :class:`ToolResult` is returned (and
        recorded in the session's transcript when the agent loop recorded the call).
        ``arguments``: edited arguments (an object or JSON text) to run instead, decoded
        and validated again; invalid ones return an ``invalid_json``/``invalid_arguments``
        result and leave the call pending. The approval binds to the SHA-256 of the
        arguments that run (recorded). ``decided_by``: who decided (recorded). Raises
        :class:`~rho_actors.ApprovalError` naming the call for an unknown call id (or
        another session's), a call decided already (naming the first decision, also one
        made by another process), a deferred call, or one behind an undecided earlier
        call of its exclusive turn; ``TypeError`` for a ``call_id`` that is not a ``str``.
        Blocks while the call runs (at most its timeout plus 10 s)."""
        return self._approvals().approve(call_id, arguments, decided_by)

    def reject(self, call_id: str, message: str, decided_by: str | None = None) -> ToolResult:
        """Reject pending call ``call_id``: it never runs; its result is ``rejected`` with
        ``message`` (a non-empty ``str``, ``ValueError`` otherwise) as the model's text,
        returned and recorded. Raises :class:`~rho_actors.ApprovalError` as :meth:`approve`."""
        return self._approvals().reject(call_id, message, decided_by)

    def when_decided(self, call_id: str) -> concurrent.futures.Future[ToolResult]:
        """A future of pending call ``call_id``'s result (a :class:`~rho_actors.ToolResult`), set once
        it is decided, here or by another process (``rho-actors approve``: acted on within a second),
        and, approved, has run; its host stopping first fails it at once with an ``ApprovalError``
        saying so (the call stays held for the next host). A turn run
        directly's call decided before this is asked is found too (its result kept until asked for).
        Raises :class:`~rho_actors.ApprovalError` when no such call waits, runs or was so decided."""
        return self._approvals().when_decided(call_id)

    def resolve(self, call_id: str, output: Any) -> ToolResult:
        """Give deferred call ``call_id`` (its tool returned :class:`~rho_actors.Deferred`)
        its result: ``output`` is taken as ``run`` would return it (a value, ``Ok``,
        ``Error``, ``Details``, pictures...), returned and recorded. Raises
        :class:`~rho_actors.ApprovalError` for an unknown call id, one decided already or
        one that waits for an approval, and ``ValueError`` naming each problem for an
        output that does not match the tool's output schema (a tool with an
        ``output_schema()``, as an MCP tool has; the call stays pending)."""
        return self._approvals().resolve(call_id, output)

