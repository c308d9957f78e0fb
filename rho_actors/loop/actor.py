"""The LoopActor: one agent session (DESIGN §4).

A turn does not pass through the LoopActor's inbox: the host's
:class:`~rho_actors.loop.handle.Loop` prepares and starts it in its own thread through
the session's :class:`~rho_actors.loop.turns.Turns`, which the LoopActor builds and
owns, and each call's result is settled in the thread that has it. The LoopActor keeps
what must be serial and what supervision needs: the host's cancels (``CancelTurn``),
the view of running calls (``Running``; the handle reads it directly), a ``SetWithheld``
told to it (the handle sets the withheld snapshot on the :class:`Turns` itself), and
the session's end: at its stop or crash,
:meth:`Turns.close` refuses new turns and answers every open call (``session_stopped``
or ``loop_crashed``); its supervisor restarts a crashed loop with a fresh
:class:`~rho_actors.loop.turns.Turns`, which the handle finds by the new actor's urn.
A ``RunTurn`` told to it (the message path) runs the turn the same way, from its
thread. Its messages are in :mod:`rho_actors.loop.messages`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

from rho_actors.loop.messages import (
    Allowlist,
    CancelTurn,
    FolderAtStart,
    Offered,
    Running,
    RunTurn,
    SessionWithheld,
    SetWithheld,
)
from rho_actors.loop.turns import Turns
from rho_actors.otp.actor import Actor
from rho_actors.results import failure

if TYPE_CHECKING:
    from rho_actors.agent.session_lease import SessionLease
    from rho_actors.loop.approvals import SessionApprovals
    from rho_actors.runtime import Runtime

__all__ = ["LoopActor"]


class LoopActor(Actor):
    """One agent session: owns its :class:`Turns` (DESIGN §4). Start it through
    :meth:`rho_actors.ActorSystem.start_loop`, which returns a :class:`Loop`.
    ``withheld`` is a set of names, or the session's :class:`SessionWithheld`, which
    ``SetWithheld`` updates too, so a restart starts with the names withheld last. Its
    turns run in the host's threads, so it takes a thread only at its first message (a
    cancel, a kill, a message told by a tool), and a session that got none is ended in
    the thread of :meth:`Loop.stop` (:attr:`rho_actors.Actor.starts_on_first_message`)."""

    starts_on_first_message = True

    def __init__(
        self, *, session_id: str, data_dir: Path, deps: Any, withheld: frozenset[str] | SessionWithheld,
        runtime: Runtime, allowed: Allowlist | None = None, approvals: SessionApprovals | None = None,
        folder: tuple[int, int] | None = None, at_start: FolderAtStart | None = None,
        lease: SessionLease | None = None,
    ) -> None:
        super().__init__()
        self.session_id = session_id
        self._runtime = runtime
        self.thread_pool = runtime.threads
        self.turns = Turns(ref=self._actor_ref, session_id=session_id, data_dir=data_dir, deps=deps,
                           withheld=withheld, runtime=runtime, allowed=allowed, approvals=approvals, folder=folder,
                           at_start=at_start, lease=lease)
        runtime.loop_turns[self.actor_urn] = self.turns  # how the host's handle finds them

    # --- messages ---------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, RunTurn):
            telemetry = self._runtime.telemetry.turn(message.trace_context, current=False)
            self.turns.submit(message.calls, message.future, telemetry=telemetry,
                              cancel=message.cancel, context=message.context, on_result=message.on_result)
        elif isinstance(message, CancelTurn):
            self.turns.cancel_turn(message.turn)
        elif isinstance(message, Offered):
            return self.turns.offered()
        elif isinstance(message, Running):
            return self.turns.running()
        elif isinstance(message, SetWithheld):
            self.turns.set_withheld(message.names)  # kept for a restart too
        else:
            logger.warning("loop {} ignored an unknown message {!r}", self.session_id, message)
        return None

    # --- lifecycle --------------------------------------------------------------------

    def on_stop(self) -> None:
        self._runtime.budgets.forget(self.session_id)
        self._runtime.governor.forget(self.session_id)
        # a normal stop, or killed / exited: a crash of the loop, not of the calls
        self.turns.close("session_stopped" if self._exit_cause is None else "loop_crashed")
        if self._exit_cause is None and self.turns.approvals is not None:  # its held calls' waiters are told
            self.turns.approvals.host_stopped()
        self._runtime.loop_turns.pop(self.actor_urn, None)
        lease = self.turns.lease
        if self._exit_cause is None and lease is not None:  # the session ends: another host may serve it
            lease.release()  # (a crash keeps it: the loop is restarted, or given up, still this host's)

    def on_failure(self, *exc_info: Any) -> None:
        self.turns.close("loop_crashed")
        self._runtime.loop_turns.pop(self.actor_urn, None)

    def on_undelivered(self, message: Any) -> bool:
        """Answer the turns still in the inbox too (pykka answers only ``ask``s), so every
        call id gets its result even when a turn races the loop's stop."""
        if not isinstance(message, RunTurn):
            return False
        message.future.set_result([failure("turn_not_started", c.id, c.name) for c in message.calls])
        return True
