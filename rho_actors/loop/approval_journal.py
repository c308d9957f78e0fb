"""The transcript side of a session's pending calls (DESIGN §4 "Approvals"):
:class:`ApprovalJournal`, the base of :class:`~rho_actors.loop.approval_decisions.ApprovalDecisions`
and so of :class:`~rho_actors.loop.approvals.SessionApprovals`.

- **recording**: the calls a turn run directly holds (``run_turn``, ``submit_turn``,
  ``arun_turn``, an MCP session's calls) are recorded in the session's transcript as a
  prompt records its own (:func:`~rho_actors.loop.decisions.record_held`: their reply,
  then ``pending``), so they are durable and decidable from another process alike;
- **deciding under the lock**: every decision is appended under the transcript's
  ``flock`` after checking that no other process decided first (:meth:`_journal`);
- **from another process**: a host with recorded pending calls stats the transcript every
  :data:`POLL_S` seconds (a timer, no thread of its own), reads only what was appended
  since its last look or decision (:meth:`_read_on`), and acts on a decision it finds
  (:meth:`_act`): an approval runs only the arguments its SHA-256 is bound to
  (:func:`~rho_actors.loop.decisions.bound_arguments`);
- **after a restart**: the transcript's open calls are taken back (:meth:`_recover`):
  pending ones listed again, decided ones acted on (a decision recorded past the call's
  ``expires_at`` loses to the expiry), an approved call a host died running run again
  only when its tool is idempotent (:meth:`_rerun`);
- **the expiry never waits on the transcript**: its record not written is logged, the
  call answered all the same (:meth:`_expiry_journal`); a claim let go past the deadline
  expires the call (:meth:`_claim_let_go`).
"""

from __future__ import annotations

import contextlib
import functools
import marshal
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from loguru import logger

from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, load
from rho_actors.declarations.toolset import ToolEntry
from rho_actors.encoding import describe_exception
from rho_actors.lifecycle import CallTrack, PendingCall, arguments_sha256
from rho_actors.loop.approval_rules import idempotent
from rho_actors.loop.decisions import (
    LOCK_WAIT_S,
    ApprovalError,
    bound_arguments,
    decided_result,
    decoded_or_empty,
    first_decision,
    locked_transcript,
    record_held,
)
from rho_actors.results import failure
from rho_actors.tool import ToolCall, ToolResult

if TYPE_CHECKING:
    from rho_actors.otp.timers import Timer, Timers

__all__ = ["POLL_S", "ApprovalJournal", "Held", "copy_args"]

POLL_S: Final = 0.25
"""How often (seconds) a host with pending calls looks for decisions made by another process."""


@dataclass(slots=True)
class Held:
    """A call that waits for a decision, as its session keeps it."""

    pending: PendingCall
    args: dict[str, Any]
    after: str | None = None  # the earlier call of its exclusive turn it waits behind
    timer: Timer | None = None
    claimed: bool = False  # a decision is being made
    size: int = 0  # its arguments' JSON text, bytes (what MAX_PENDING_ARGUMENT_BYTES counts)
    recorded: threading.Event | None = None  # set once its pending record is written (a turn run directly)
    elsewhere: CallTrack | None = None  # its claim found it decided in the transcript: acted on once let go
    deadline: float | None = None  # an approval's expiry, a time.monotonic() instant (its expires_at in this host)



class ApprovalJournal:
    """The transcript side of one session's pending calls (see the module doc); the
    session's :class:`~rho_actors.loop.approvals.SessionApprovals` holds the state, and
    its base :class:`~rho_actors.loop.approval_decisions.ApprovalDecisions` makes the
    decisions."""

    session_id: str
    timeout_s: float
    _held: dict[str, Held]
    _decided: dict[str, str]
    _in_flight: dict[str, str]
    _lock: threading.Lock
    _turns: Any
    _timers: Timers | None

    def __init__(self, folder: Path) -> None:
        self._folder = folder  # the session's; its transcript's path is made at the first look that needs it
        self._path: Path | None = None
        self._poll: Timer | None = None
        self._seen: tuple[int, int] | None = None  # the transcript's (size, mtime) at the last look
        self._file: Transcript | None = None  # made at the first use (most sessions have none): read whole once,
        # then only what was appended since
        self._file_lock = threading.Lock()  # one decision at a time uses it
        self._syncing = False  # a look's read runs on a pool thread: one at a time

    @property
    def path(self) -> Path:
        """The session's transcript (``<folder>/transcript.jsonl``)."""
        path = self._path
        if path is None:
            path = self._path = self._folder / TRANSCRIPT_NAME
        return path

    def transcript_exists(self) -> bool:
        """Whether the session's transcript is there now, as ``os.path.lexists`` says (a
        dangling symlink is there), without its ``FileNotFoundError`` raised and caught
        where it is not (most sessions) and without a ``Path`` made."""
        return os.access(os.path.join(self._folder, TRANSCRIPT_NAME), os.F_OK, follow_symlinks=False)

    # what deciding is, in ApprovalDecisions (_later, _arm, _announce: in SessionApprovals)

    def _later(self, job: Callable[[], object], what: str) -> bool:
        raise NotImplementedError

    def _claim(self, call_id: Any, kind: str) -> Held:
        raise NotImplementedError

    def _unclaim(self, held: Held) -> None:
        raise NotImplementedError

    def _decide(self, held: Held, decision: str, decided_by: str | None, *, running: bool = False,
                first: str | None = None, result: ToolResult | None = None) -> None:
        raise NotImplementedError

    def _claim_let_go(self, held: Held, track: CallTrack | None) -> None:
        """What is left to do once ``held``'s claim is let go without a decision: act on
        the decision ``track`` found made by another process meanwhile, else expire the
        call if its deadline passed while it was claimed (its timer found it claimed and
        let it be: a decision that failed, a record that could not be written, never
        leaves it waiting with no timer)."""
        if track is not None:
            self._later(functools.partial(self._act, held, track), "act")
        elif held.deadline is not None and time.monotonic() >= held.deadline and \
                self._held.get(held.pending.call_id) is held:
            self._arm(held)

    def _run(self, held: Held, args: dict[str, Any]) -> ToolResult:
        """Run the approved ``held`` call with ``args``, record its result and return it."""
        raise NotImplementedError

    def _record(self, held: Held, result: ToolResult) -> None:
        raise NotImplementedError

    def _entry(self, name: str) -> ToolEntry | None:
        raise NotImplementedError

    def _arm(self, held: Held) -> None:
        raise NotImplementedError

    def _answered(self, call_id: str, result: ToolResult, held: Held | None = None) -> None:
        raise NotImplementedError

    def _announce(self, pending: list[PendingCall]) -> None:
        raise NotImplementedError

    def record(self, calls: list[tuple[ToolCall, PendingCall]], off_thread: bool,
               then: Callable[[], None] | None = None) -> None:
        """Record ``calls``, held by a turn run directly (and marked by :meth:`_awaited`
        when they were held), in the session's transcript
        (:func:`~rho_actors.loop.decisions.record_held`): here, or, ``off_thread`` (the
        caller is an event loop), on a pool thread; a decision on one of them waits for it
        meanwhile. A transcript that cannot be written is logged: they wait in memory only.
        Only then are they announced (their ``pending`` events) and ``then()`` called
        (the turn gives its results: :class:`~rho_actors.loop.turn.Gate`), so whoever
        learns that a call waits finds it recorded, decidable from any process."""
        with self._lock:
            done = {h.recorded for _, p in calls if (h := self._held.get(p.call_id)) and h.recorded is not None}

        def write() -> None:
            try:
                with self._locked() as transcript:
                    record_held(transcript, calls)
            except Exception as exc:
                logger.warning("session {}: calls {} wait for a decision in memory only: {}", self.session_id,
                               ", ".join(p.call_id for _, p in calls), describe_exception(exc))
            finally:
                for event in done:
                    event.set()
                try:
                    self._watch()
                    self._announce([p for _, p in calls])
                finally:
                    if then is not None:
                        then()

        if not (off_thread and self._later(write, "record")):
            write()

    def _awaited(self, held: list[Held]) -> None:
        """Mark ``held`` as to be recorded (:meth:`record`): a decision waits for it."""
        done = threading.Event()
        with self._lock:
            for one in held:
                one.recorded = done

    @contextlib.contextmanager
    def _journal(self, held: Held | None, claimed: bool = True) -> Iterator[tuple[Transcript, CallTrack] | None]:
        """The session's transcript, locked (waiting at most :data:`LOCK_WAIT_S` for a
        prompt holding it), and ``held``'s track in it; ``None`` when the transcript does
        not record the call (a turn run directly). With ``claimed``, raises
        :class:`ApprovalError` when the transcript says it was decided already (by
        another process)."""
        if held is not None and held.recorded is not None:
            held.recorded.wait(LOCK_WAIT_S)  # its pending record first
        if held is None or not os.path.lexists(self.path):
            yield None
            return
        with self._locked() as transcript:
            track = transcript.history.calls.get(held.pending.call_id)
            if track is None:
                yield None
                return
            if claimed and track.state != "pending":
                with self._lock:
                    if track.state == "decided":  # by another process, not acted on yet: once the claim is let
                        held.elsewhere = track  # go (_unclaim), as the look for decisions would have
                    else:
                        self._held.pop(held.pending.call_id, None)
                        self._decided[held.pending.call_id] = first_decision(track)
                raise ApprovalError(f"call {held.pending.call_id} of session {self.session_id!r} is decided "
                                    f"already: {first_decision(track)}")
            yield transcript, track

    @contextlib.contextmanager
    def _expiry_journal(self, held: Held) -> Iterator[tuple[Transcript, CallTrack] | None]:
        """:meth:`_journal` for a decision the host makes itself (the expiry), which never
        depends on the transcript being writable: when its record cannot be written (the
        transcript unreadable, a line in it failing its checks, the disk full, its lock
        held past :data:`LOCK_WAIT_S`), the failure is logged, naming the session and the
        call, and the decision goes on unrecorded (the call gets its one result in this
        host; the transcript keeps it pending: the next host expires it by its
        ``expires_at``). :class:`ApprovalError` (decided by another process first) is raised."""
        opened = False
        try:
            with self._journal(held) as journal:
                opened = True
                yield journal
        except ApprovalError:
            raise
        except Exception as exc:
            logger.error("session {}: the expiry of call {} could not be recorded in {}: {}; the call ends "
                         "approval_expired all the same", self.session_id, held.pending.call_id, self.path,
                         describe_exception(exc))
            if not opened:
                yield None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[Transcript]:
        """The session's transcript under its lock, read only past what this host read
        of it last (:meth:`~rho_actors.agent.transcript.Transcript.reopen`); its folder
        made first, and the session's lease held, while the loop runs (raises
        :class:`~rho_actors.agent.session_lease.SessionLeaseError` when another host
        serves the session: its transcript is not this host's to write)."""
        turns = self._turns
        if turns is not None and not turns.folder_made and turns.closed is None:
            turns.make_folder()
        with self._file_lock:
            if self._file is None:
                self._file = Transcript(self.path)
            with locked_transcript(self.path, transcript=self._file) as transcript:
                transcript.history.messages = []  # only the calls' tracks are kept between decisions
                yield transcript

    def _watch(self) -> None:
        """Look at the transcript every :data:`POLL_S` seconds while calls are pending
        (not for a session with no transcript: nothing can decide its calls elsewhere)."""
        if self._poll is not None or self._timers is None or not os.path.lexists(self.path):
            return
        self._poll = self._timers.call_at(time.monotonic() + POLL_S, self._look)

    def _look(self) -> None:
        """On the timer thread: a stat of the transcript; a change is read on a pool thread."""
        self._poll = None
        with self._lock:
            if not self._held or self._turns is None or self._turns.closed is not None:
                return  # nothing waits, or the loop stopped (a restart's attach looks again)
        try:
            st = os.stat(self.path)
            seen = (st.st_size, st.st_mtime_ns)
        except OSError:
            seen = None
        with self._lock:
            start = seen is not None and seen != self._seen and not self._syncing  # else at a later look
            self._syncing |= start
        if start:
            self._seen = seen
            if not self._later(self._sync, "sync"):
                with self._lock:
                    self._syncing, self._seen = False, None
        self._watch()

    def _sync(self) -> None:
        """Act on decisions the transcript holds for this host's pending calls, read on from
        where this host's last look or decision left it (:meth:`_read_on`)."""
        try:
            tracks = self._read_on()
        except Exception as exc:
            logger.warning("session {}: its transcript could not be read for decisions: {}", self.session_id,
                           describe_exception(exc))
            return
        finally:
            with self._lock:
                self._syncing = False
        for call_id, track in tracks.items():
            with self._lock:
                held = self._held.get(call_id)
                ours = held is not None and not held.claimed
            if ours and track.state != "pending":
                assert held is not None
                self._act(held, track)

    def _read_on(self) -> dict[str, CallTrack]:
        """The tracks of this host's pending calls as the transcript has them now, read
        without its lock by the reader its decisions use (:meth:`_locked`): the whole file at
        its first use, then only what was appended since, by any process (never this host's
        own records again). ``{}`` while a decision uses the reader: it reads the tail
        itself, and the next look reads on (the stat it saw is forgotten)."""
        if not self._file_lock.acquire(blocking=False):
            with self._lock:
                self._seen = None
            return {}
        try:
            if self._file is None:
                self._file = Transcript(self.path)
            self._file.read_unlocked()
            self._file.history.messages = []  # only the calls' tracks are kept between looks
            calls = self._file.history.calls
            with self._lock:
                return {call_id: track for call_id in self._held if (track := calls.get(call_id)) is not None}
        finally:
            self._file_lock.release()

    def _act(self, held: Held, track: CallTrack, late: bool = False) -> None:
        """``held`` was decided in the transcript (by another process, or before a
        restart): run it once when approved and not started, else give it its result;
        ``late`` (a decision recorded past the call's ``expires_at``, found at a host's
        start: :meth:`_recover`): the expiry wins, the call ends ``approval_expired``.
        Nothing while the loop is stopped: the next host or restart acts on it."""
        if self._turns is None or self._turns.closed is not None:
            return
        try:
            held = self._claim(held.pending.call_id, held.pending.kind)
        except ApprovalError:
            return
        decided = track.states.get("decided", {})
        if late:
            logger.warning("session {}: call {} was {} past its approval deadline, while no host held it: it ends "
                           "approval_expired", self.session_id, held.pending.call_id, first_decision(track))
            decided = {"decision": "expired"}
        approved = decided.get("decision") == "approved"
        args = bound_arguments(held.pending, held.args, decided) if approved else held.args
        result: ToolResult | None = None
        try:
            with self._locked() as transcript:
                now = transcript.history.calls.get(held.pending.call_id)
                if now is None or now.state != "decided":  # settled or started meanwhile: nothing to do here
                    self._decide(held, "", None, first=first_decision(track if now is None else now),
                                 result=failure("interrupted", held.pending.call_id, held.pending.name))
                    return
                if isinstance(args, dict) and approved:
                    transcript.call(now.step, now.index, "running", call_id=now.call_id, name=now.name,
                                    arguments_sha256=arguments_sha256(args), attempt=1)
                else:
                    result = decided_result(held.pending, decided, self.timeout_s) if not approved else failure(
                        "decision_unbound", now.call_id, now.name, call=now.call_id, problem=args)
                    transcript.result(now.step, now.index, result)
        except BaseException:
            self._unclaim(held)
            raise
        if isinstance(args, str):
            logger.error("session {}: call {} was not run: the approval recorded for it {}", self.session_id,
                         held.pending.call_id, args)
        by = decided.get("decided_by")
        self._decide(held, str(decided.get("decision"))[:40], by[:200] if isinstance(by, str) else None,
                     running=result is None, result=result)
        if result is None:
            assert isinstance(args, dict)
            self._run(held, args)

    def _recover(self) -> frozenset[str]:
        """Rebuild the pending calls a transcript left open (a restart of the host) and act
        on those decided meanwhile; returns the ids of the calls taken back (to wait, to
        run once decided, or to run again)."""
        taken: set[str] = set()
        try:
            history = load(self.path)
        except Exception as exc:
            logger.warning("session {}: its transcript could not be read for pending calls: {}", self.session_id,
                           describe_exception(exc))
            return frozenset()
        calls = {c.id: c for m in history.messages for c in m.tool_calls}
        decided: list[tuple[Held, CallTrack, bool]] = []
        for call_id, track in history.open_calls.items():
            call = calls.get(call_id)
            pending = track.states.get("pending", {})
            if call is None or call_id in self._held:
                continue
            args = decoded_or_empty(call.arguments)
            if arguments_sha256(args) != pending["arguments_sha256"]:  # the reply's arguments were altered
                logger.error("session {}: call {} is not taken back as pending: its recorded arguments do not match "
                             "the SHA-256 its pending record is bound to", self.session_id, call_id)
                continue
            expires = pending.get("expires_at")
            info = PendingCall(call_id, track.name, MappingProxyType(copy_args(args)), pending["arguments_sha256"],
                               pending.get("at", time.time()), pending["kind"], expires, pending.get("reason", ""))
            held = Held(info, args)
            if expires is not None:  # the wall clock read once: in this host its expiry runs on the monotonic one
                held.deadline = time.monotonic() + max(0.0, expires - time.time())
            with self._lock:
                self._held[call_id] = held
            taken.add(call_id)
            if track.state == "decided":  # recorded past its deadline (as no host held it): the expiry wins
                at = track.states["decided"].get("at")
                late = expires is not None and (not isinstance(at, (int, float)) or at >= expires)
                decided.append((held, track, late))
            elif expires is not None:
                self._arm(held)
        if history.open_calls:
            self._watch()
        for held, track, late in decided:
            self._later(functools.partial(self._act, held, track, late), "act")
        for _, _, interrupted in history.pending:  # started once approved, no result: again only if idempotent
            started = history.calls.get(interrupted.call_id)
            call = calls.get(interrupted.call_id)
            entry = None if started is None else self._entry(started.name)
            if started is None or call is None or started.state != "running" or entry is None or not idempotent(entry):
                continue
            args = started.states.get("decided", {}).get("arguments") or decoded_or_empty(call.arguments)
            if arguments_sha256(args) != started.states["running"].get("arguments_sha256"):
                continue  # its records bind it to other arguments: not run again
            held = Held(PendingCall(call.id, started.name, MappingProxyType(copy_args(args)), arguments_sha256(args),
                                     time.time()), args)
            with self._lock:
                self._in_flight[call.id] = started.name  # a prompt meanwhile waits for it
            taken.add(call.id)
            self._later(functools.partial(self._rerun, held), "rerun")
        return frozenset(taken)

    def _rerun(self, held: Held) -> None:
        """Run again an approved call of an idempotent tool that a host died running
        (its ``running`` record has no result): that attempt ``retried``, the next one
        ``running``, then its result."""
        try:
            with self._locked() as transcript:
                now = transcript.history.calls.get(held.pending.call_id)
                if now is None or now.state != "running":  # answered meanwhile (a prompt recovered it)
                    return
                attempt = int(now.states["running"].get("attempt") or 1)
                transcript.call(now.step, now.index, "retried", call_id=now.call_id, name=now.name, attempt=attempt,
                                error_kind="cancelled", sync=False)  # the attempt the host died in
                transcript.call(now.step, now.index, "running", call_id=now.call_id, name=now.name,
                                arguments_sha256=held.pending.arguments_sha256, attempt=attempt + 1)
        except BaseException:
            with self._lock:
                self._in_flight.pop(held.pending.call_id, None)
            raise
        logger.warning("session {}: call {} ({}) was running when its host stopped; its tool is idempotent: run "
                       "again (attempt {})", self.session_id, held.pending.call_id, held.pending.name, attempt + 1)
        self._run(held, held.args)


def copy_args(args: dict[str, Any]) -> dict[str, Any]:
    """A copy of a call's arguments (nested values copied too)."""
    try:
        return marshal.loads(marshal.dumps(args))  # type: ignore[no-any-return]
    except ValueError:
        return dict(args)
