"""What a turn holds for a decision (DESIGN §4 "Approvals", "Background calls"), as
:class:`~rho_actors.loop.turns.Turns` keeps it (internal: a half of ``Turns``, which
inherits it):

- **holding**: the calls the session's approvals hold leave the turn's waiting ones;
  one of a tool run in the background waits as a task, ``input_required``
  (:meth:`TurnHolds._hold`);
- **announced once recorded**: a turn awaited on an event loop records its held calls on
  a pool thread, so its results are held back until they are in the transcript
  (:class:`~rho_actors.loop.turn.Gate`): whoever learns that a call waits (the turn's
  result, an MCP client's task, the log naming ``rho-actors approve``) finds it decidable
  from any process;
- **let go**: a turn interrupted while it is prepared, or not admitted (its loop stopped
  meanwhile), lets go of all it held: each held call stops waiting and each task made
  for one ends with its call's one result (:meth:`TurnHolds._let_go`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rho_actors.encoding import describe_exception
from rho_actors.lifecycle import PendingCall, held_by, pending_call
from rho_actors.lifecycle.tasks import runs_as_task
from rho_actors.loop.turn import Gate, ResultSink, Slot, Turn, when_failed
from rho_actors.results import failure
from rho_actors.tool import ToolCall, ToolResult

if TYPE_CHECKING:
    from rho_actors.loop.approvals import SessionApprovals
    from rho_actors.tasks import TaskRegistry

__all__ = ["TurnHolds"]


class TurnHolds:
    """The held half of :class:`~rho_actors.loop.turns.Turns` (see the module doc): the
    attributes below are set by ``Turns``."""

    session_id: str
    approvals: SessionApprovals | None
    _tasks: TaskRegistry
    _data_dir: Path
    _deps: Any

    def _fail_open(self, turn: Turn, failed: ToolResult) -> None:
        raise NotImplementedError

    @staticmethod
    def _gated(turn: Turn) -> Callable[[], None]:
        """Hold ``turn``'s results back until the returned callable is called (its
        waiting calls recorded in the transcript: :class:`Gate`)."""
        gate = turn.future if isinstance(turn.future, Gate) else None
        if gate is None:
            turn.future = gate = Gate(turn.future)
        return gate.hold()

    def _hold(self, turn: Turn, refused: list[Slot], version: int) -> list[tuple[ToolCall, PendingCall]]:
        """Calls held for a decision (``loop/approvals.py``) leave ``waiting``: they never
        start. Returns them, each with its :class:`PendingCall`."""
        assert self.approvals is not None
        prepared = [(i, s.call, s.entry, s.args) for i in turn.waiting for s in (turn.slots[i],)]
        ctx = {"session_id": self.session_id, "data_dir": self._data_dir, "deps": self._deps}
        held = self.approvals.hold(prepared, turn.exclusive, version, ctx, journal=turn.journal)  # type: ignore[arg-type]
        calls: list[tuple[ToolCall, PendingCall]] = []
        try:
            for index, pending in held.items():
                slot = turn.slots[index]
                as_task = slot.entry is not None and runs_as_task(slot.entry.info.policy.background, turn.background,
                                                                    slot.call.id, slot.asked)  # it waits as a task
                slot.result = self._tasks.held(self.session_id, self._data_dir, pending) if as_task else pending
                refused.append(turn.slots[index])
                turn.waiting.remove(index)
                turn.open -= 1
                if as_task and not slot.result.ok:  # no task to wait as (a bound reached): refused, not left waiting
                    self.approvals.forget([pending])
                elif (waits := pending_call(pending)) is not None:
                    calls.append((slot.call, waits))
        except BaseException as exc:  # an interrupt: the turn is let go (_unprepared), these with it: a task made
            self.approvals.forget(list(held.values()))  # for one (its slot maybe not told yet) ends as its call
            gone = failure("turn_interrupted", "", "", problem=describe_exception(exc))
            for index, pending in held.items():
                if pending_call(pending) is not None:  # registered by this turn: a task held for its id is this one
                    slot = turn.slots[index]
                    self._tasks.let_go(self.session_id, slot.call.id, when_failed(gone, slot, time.monotonic()))
            raise
        return calls

    def _unprepared(self, turn: Turn | None, calls: tuple[ToolCall, ...], future: ResultSink, problem: str) -> None:
        """A turn not admitted (an interrupt in the host's thread as it was made or
        prepared) is answered ``turn_interrupted``: the calls its preparing held for a
        decision are let go (none waits for a person, each task made for one ends so)
        and no refusal stands, so each call gets that one answer."""
        if turn is None:
            with contextlib.suppress(Exception):  # (set already: the loop had closed)
                future.set_result([failure("turn_interrupted", c.id, c.name, problem=problem) for c in calls])
            return
        failed = failure("turn_interrupted", "", "", problem=problem)
        self._let_go(turn.slots, failed)
        for slot in turn.slots:
            slot.result = None
        self._fail_open(turn, failed)

    def _let_go(self, slots: list[Slot], failed: ToolResult) -> None:
        """Let go of what ``slots``' results hold (a turn that will not run): their calls
        waiting for a decision stop waiting, and a task made for one ends with the
        result of ``failed``'s kind and text (:func:`when_failed`), the one its call gets."""
        held = [slot for slot in slots if slot.result is not None and held_by(slot.result) is not None]
        if not held:
            return
        if self.approvals is not None:
            self.approvals.forget([slot.result for slot in held if slot.result is not None])
        now = time.monotonic()
        for slot in held:
            assert slot.result is not None
            if slot.result.ok:  # the acknowledgement of the task it waits as
                self._tasks.let_go(self.session_id, slot.call.id, when_failed(failed, slot, now))

