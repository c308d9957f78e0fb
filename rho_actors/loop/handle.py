""":class:`Loop`: the host's handle to one session's LoopActor (DESIGN §4).

The LoopActor itself is :class:`rho_actors.loop.actor.LoopActor`; the handle finds it
by name (so it follows restarts). A turn is prepared and started in the caller's thread
through the LoopActor's :class:`~rho_actors.loop.turns.Turns` (no message, no thread
woken on the way in); the offer and the running calls are read there too, and withheld
changes are set there. Stops are messages to the LoopActor. The calls held for a
decision are reached through :class:`~rho_actors.loop.held_calls.HeldCalls`, the
handle's other half.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pykka

from rho_actors.cancel import CancelToken
from rho_actors.declarations.formats import Dialect, to_dialect
from rho_actors.declarations.toolset import ToolEntry, paused_for
from rho_actors.lifecycle.tasks import with_choice
from rho_actors.loop.approvals import ApprovalError
from rho_actors.loop.held_calls import HeldCalls
from rho_actors.loop.landing import Bounds, Landing, Latch
from rho_actors.loop.messages import loop_name, make_session_folder
from rho_actors.otp.actor import NORMAL, stop
from rho_actors.sandbox import Waiter
from rho_actors.tool import DEFAULT_TIMEOUT_MS, ToolCall, ToolInfo, ToolResult

if TYPE_CHECKING:
    from rho_actors.agent.driver import PromptEvent, PromptResult
    from rho_actors.agent.model import Model
    from rho_actors.agent.session_lease import SessionLease
    from rho_actors.loop.turn import ResultSink
    from rho_actors.loop.turns import Turns
    from rho_actors.runtime import Runtime
    from rho_actors.tasks import TaskInfo

__all__ = ["Loop", "withheld_names"]

_GRACE_S = 10.0

RESTART_PATIENCE_S = 5.0
"""How long a turn (or another look at the loop) waits for a crashed loop's restart by
its session's supervisor before it raises (seconds)."""


# The withheld names given lately as lists or tuples of plain strs, each as its one set:
# sessions withholding the same names share it (and so its sorted list, loop.turn.withheld_set).
_KNOWN: dict[tuple[str, ...], frozenset[str]] = {}
_KNOWN_KEPT = 64  # lists kept (all dropped when full)
_KNOWN_MAX_NAMES = 1_024  # longer lists are made into a set each time


def withheld_names(names: Iterable[str]) -> frozenset[str]:
    """``names`` as a frozenset of plain ``str``; ``TypeError`` for a lone ``str`` or a
    name that is not a ``str``."""
    if isinstance(names, (str, bytes)):
        raise TypeError(f"withheld takes a collection of tool names, got the single string {names!r}")
    if type(names) in (list, tuple, set, frozenset):  # the usual case: plain strs, hashed and compared as str
        items = tuple(names)
        if type(names) is not frozenset:
            # the same names given lately, as a list or tuple: their one set, looked up before the
            # names' types are (~7k instructions for 100 names, against ~30k): a key holds plain strs
            # only, so a name found equal to one (a str subclass's own __eq__ and __hash__) is that str
            try:
                known = _KNOWN.get(items)
            except Exception:  # an unhashable name, or a name's __eq__ raised: checked below
                known = None
            if known is not None:
                return known
        if not items or set(map(type, items)) == {str}:
            if type(names) is frozenset:
                return names
            known = frozenset(items)
            if len(items) <= _KNOWN_MAX_NAMES:
                if len(_KNOWN) >= _KNOWN_KEPT:
                    _KNOWN.clear()
                _KNOWN[items] = known
            return known
    checked = set()
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"a withheld tool name must be a str, got {type(name).__name__}")
        checked.add(str.__str__(name))
    return frozenset(checked)


def _checked_calls(calls: Iterable[Any]) -> tuple[ToolCall, ...]:
    batch = tuple(calls)
    for call in batch:  # the usual case: ToolCalls with plain str ids and names, kept as they are
        if type(call) is not ToolCall or type(call.id) is not str or type(call.name) is not str:
            return tuple(_checked_call(i, call) for i, call in enumerate(batch))
    return batch


def _checked_call(index: int, call: Any) -> ToolCall:
    """``call`` with a plain ``str`` id and name (a model's are always strings)."""
    if not isinstance(call, ToolCall):
        raise TypeError(f"call {index} of the turn: a turn takes ToolCall values, got {type(call).__name__}")
    for field_name in ("id", "name"):
        if not isinstance(getattr(call, field_name), str):
            raise TypeError(
                f"call {index} of the turn: ToolCall.{field_name} must be a str, "
                f"got {type(getattr(call, field_name)).__name__}"
            )
    if type(call.id) is str and type(call.name) is str:
        return call
    return ToolCall(str.__str__(call.id), str.__str__(call.name), call.arguments)


def _checked_cancel(cancel: Any) -> CancelToken | None:
    if cancel is not None and not isinstance(cancel, CancelToken):
        raise TypeError(f"cancel must be a rho_actors.CancelToken or None, got {type(cancel).__name__}")
    return cancel


def _checked_timeout(timeout_s: Any) -> None:
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))):
        raise TypeError(f"timeout_s must be a number of seconds or None, got {timeout_s!r}")


def _checked_background(background: Any) -> bool | frozenset[str]:
    if isinstance(background, bool):
        return background
    if isinstance(background, str) or not isinstance(background, Iterable):
        raise TypeError(f"background must be a bool or call ids (an iterable of str), got {background!r}")
    chosen = frozenset(background)
    if not all(isinstance(call_id, str) for call_id in chosen):
        raise TypeError(f"background call ids must be str, got {sorted(map(repr, chosen))}")
    return chosen


class Loop(HeldCalls):
    """The host's handle to one session's LoopActor.

    Example::

        loop = system.start_loop("s1", deps={"db": conn})
        results = loop.run_turn([ToolCall("c1", "add", '{"a": 1, "b": 2}')])
        assert results[0].content == "3"
    """

    def __init__(self, session_id: str, data_dir: Path, runtime: Runtime,
                 folder: tuple[int, int] | None = None, lease: SessionLease | None = None) -> None:
        self.session_id = session_id
        self._data_dir = data_dir
        self._folder = folder  # the identity start_loop checked the folder with (None: it was missing)
        self._folder_made = False
        self._lease = lease  # the session's: held from the folder's making on (agent/session_lease.py)
        self._names = runtime.names
        self._whereis = runtime.names.whereis
        self._tools = runtime.tools
        self._isolations = runtime.isolations
        self._settings = runtime.limits
        self._loop_turns = runtime.loop_turns
        self._sessions = runtime.sessions
        self.task_registry = runtime.tasks
        """The system's background calls (:class:`rho_actors.tasks.TaskRegistry`): what the agent loop delivers."""
        self._governor = runtime.governor
        self._current: tuple[pykka.ActorRef[Any], Turns] | None = None  # the running LoopActor's
        self._bounds: Bounds | None = None  # the bounds of the turns awaited on the last event loop used
        # the bound of the last one-call turn run_turn bounded: (the tool set it read, the tool's name, seconds)
        self._one_bound: tuple[object, str, float] = (None, "", 0.0)
        self.instructions: str | None = None
        """The system prompt of this session's prompts that give none (not recorded)."""
        self.model_chooses: bool = runtime.tasks.settings.model_chooses
        """Whether this session's model may choose to run a call of a ``background="optional"``
        tool in the background (its ``run_in_background``: shown by :meth:`declarations`,
        taken out of each call's arguments); ``TaskSettings.model_chooses`` unless the host
        sets it. A host serving callers who choose otherwise (an MCP client asks for a
        task) sets it ``False``: such a call is then ``invalid_arguments``."""
        self.telemetry = runtime.telemetry
        """The system's :class:`rho_actors.Telemetry` (the spans of this session's prompts)."""

    @property
    def data_dir(self) -> Path:
        """The session's private folder, ``data_dir/sessions/<session_id>`` of its system
        (created with mode ``0700`` on first use: here, or before the session's first
        call), the session's lease held from then on. Raises :class:`rho_actors.files.UnsafePathError`
        (an ``OSError``) when it, or ``sessions``, is a symlink or no folder,
        :class:`rho_actors.SessionLeaseError` (an ``OSError`` too) when another host serves
        the session, and ``OSError`` when it cannot be made."""
        if not self._folder_made:
            make_session_folder(self._data_dir, self._folder, self._lease)
            self._folder_made = True
        return self._data_dir

    @property
    def ref(self) -> pykka.ActorRef[Any]:
        """The session's LoopActor now (a restart by its supervisor gives a new one).
        Raises :class:`rho_actors.NotRunningError` (a ``pykka.ActorDeadError``) naming
        why when it is not running: stopped, restarting, or given up by its supervisor."""
        return self._names.lookup(loop_name(self.session_id), f"the loop of session {self.session_id!r}")

    def _turns(self) -> Turns:
        """The running LoopActor's turns, waiting up to :data:`RESTART_PATIENCE_S` for
        a crashed one's restart; raises as :attr:`ref` when it was stopped, given up, or
        not back by then. Kept until they close (the LoopActor's stop or crash closes
        them first): no name look-up per turn."""
        current = self._current
        if current is not None and current[1].closed is None:
            return current[1]
        name = loop_name(self.session_id)
        until = time.monotonic() + RESTART_PATIENCE_S
        while True:
            ref = self._whereis(name)
            turns: Turns | None = None if ref is None else self._loop_turns.get(ref.actor_urn)
            if ref is not None and turns is not None:
                self._current = (ref, turns)
                return turns
            left = until - time.monotonic()
            if left <= 0 or self._not_restarting() or self._names.exit_reason(name) == NORMAL:
                break
            # crashed an instant ago: its supervisor is restarting it (await_name stops at a give-up)
            if self._names.await_name(name, left, self._not_restarting, unless_stopped=True) is None:
                break
        ref = self.ref  # raises naming why
        raise pykka.ActorDeadError(f"the loop of session {self.session_id!r} is not running: it has just ended")

    def found(self, ref: pykka.ActorRef[Any]) -> None:
        """Keep ``ref``, the session's LoopActor just started, and its turns (when it is
        still running): :meth:`_turns` then finds them without a look-up by name."""
        turns = self._loop_turns.get(ref.actor_urn)
        if turns is not None and turns.closed is None:
            self._current = (ref, turns)

    def _not_restarting(self) -> bool:
        """Whether nothing will bring this session's loop back: the system is stopping, or
        ``sessions`` holds no subtree of it (a restart under way keeps it held)."""
        sessions = self._sessions
        return sessions is None or sessions.closed or not sessions.holds(self.session_id)


    def submit_turn(
        self, calls: Iterable[ToolCall], *, cancel: CancelToken | None = None,
        on_result: Callable[[int, ToolResult], None] | None = None, background: bool | Iterable[str] = False,
    ) -> concurrent.futures.Future[list[ToolResult]]:
        """Start a turn without waiting: returns a future of the results, one per call,
        in the calls' order. Setting ``cancel`` (:meth:`CancelToken.cancel`, from any
        thread) cancels the turn: each running call is cancelled by its isolation (its
        ``ctx["cancel"]`` is set; a ``process`` worker is killed) and each call still
        without a result gets a ``cancelled`` one; a token set before the turn starts
        runs no call. The calls run in copies of the caller's ``contextvars`` context
        (``thread`` isolation, ``async`` tools included; a trusted tool's ``process``
        worker gets the variables holding plain values, by name; an untrusted one none).
        Raises ``TypeError`` for an item that is not a :class:`ToolCall` or
        whose ``id`` or ``name`` is not a ``str``, or a ``cancel`` that is not a
        :class:`CancelToken`, and :class:`pykka.ActorDeadError` when the loop has
        stopped. ``on_result(index, result)`` is called with each started call's result
        as soon as it has one (from the thread that settled it: keep it quick; what it
        raises is logged), before the future completes: a host can record each result
        while the turn's other calls still run. ``background``: which calls of tools
        declared ``background="optional"`` run as tasks (DESIGN §4 "Background calls"):
        ``True`` all of them, else their call ids (a ``TypeError`` for another value);
        a ``background=True`` tool's calls always do, others never.

        The turn is prepared in the calling thread (arguments decoded, tools looked up
        among those offered now, arguments validated: a bounded step, at most 1 s per
        call) and its calls are started from it; the future may be complete on return
        (every call refused)."""
        return self._submit(_checked_calls(calls), _checked_cancel(cancel), on_result, _checked_background(background))

    def _submit(
        self, batch: tuple[ToolCall, ...], cancel: CancelToken | None = None,
        on_result: Callable[[int, ToolResult], None] | None = None, background: bool | frozenset[str] = False,
    ) -> concurrent.futures.Future[list[ToolResult]]:
        future: concurrent.futures.Future[list[ToolResult]] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        self._start_turn(batch, future, cancel, on_result, background=background)
        return future

    def _start_turn(
        self, batch: tuple[ToolCall, ...], sink: ResultSink, cancel: CancelToken | None = None,
        on_result: Callable[[int, ToolResult], None] | None = None, aio: asyncio.AbstractEventLoop | None = None,
        background: bool | frozenset[str] = False, on_start: Callable[[int], None] | None = None,
        waiter: Waiter | None = None, turns: Turns | None = None,
    ) -> tuple[Turns, int | None]:
        """Start the turn; returns its ``Turns`` and its id (``None``: not admitted)."""
        telemetry = self.telemetry.turn()  # decided once a turn: the calls' parent span is the one current here
        turns = turns or self._turns()
        return turns, turns.submit(
            batch, sink, telemetry=telemetry, cancel=cancel, context=contextvars.copy_context(), on_result=on_result,
            aio=aio, background=background, chooses=self.model_chooses is True, on_start=on_start, waiter=waiter,
            own_context=True)

    def turn_bound_s(self, calls: Sequence[ToolCall]) -> float:
        """An upper bound, in seconds, on how long a turn of ``calls`` can take: the sum
        of their tools' timeouts and of what their isolations may take to start them
        (``start_timeout_ms`` of a ``process`` call), plus a grace period."""
        tools = self._tools.current
        if len(calls) == 1:  # a one-call turn of the tool bounded last, in the same tool set: as worked out then
            kept, name = self._one_bound, calls[0].name
            if kept[0] is tools and type(name) is str and kept[1] == name:
                return kept[2]
        entries = tools.entries
        total_s = 0.0
        for c in calls:  # a plain loop: no generator made per turn
            entry = entries.get(c.name) if type(c.name) is str else None
            if entry is None:
                total_s += DEFAULT_TIMEOUT_MS / 1000
            else:
                isolation = self._isolations.get(entry.isolation)
                total_s += entry.info.timeout_ms / 1000 + (isolation.start_bound_s if isolation is not None else 0.0)
        total_s += _GRACE_S
        if len(calls) == 1 and type(calls[0].name) is str:
            self._one_bound = (tools, calls[0].name, total_s)
        return total_s

    def run_turn(
        self, calls: Iterable[ToolCall], timeout_s: float | None = None, *, cancel: CancelToken | None = None,
        background: bool | Iterable[str] = False,
    ) -> list[ToolResult]:
        """Run a turn and wait for its results (one per call, in order); ``cancel``
        and ``background`` as in :meth:`submit_turn` (set ``cancel`` from another thread).

        Waits at most ``timeout_s`` seconds (default :meth:`turn_bound_s`); raises
        ``TimeoutError`` past that, which only a broken runtime can cause; ``TypeError``,
        before the turn starts, when ``timeout_s`` is not a number.

        A turn of one call written to an idle worker process from this thread has its
        reply read by this thread, which waits for it anyway (DESIGN §5 "A call's path":
        no reader thread woken between the worker and the caller).
        """
        batch = tuple(calls)  # _checked_calls' look at one call, inline (its frame for any other turn)
        one = batch[0] if len(batch) == 1 else None
        if one is None or type(one) is not ToolCall or type(one.id) is not str or type(one.name) is not str:
            batch, one = _checked_calls(batch), None
        if timeout_s is not None:
            _checked_timeout(timeout_s)  # before the turn starts: a bad bound must not strand its held call
            bound_s = timeout_s
        else:  # a one-call turn of the tool bounded last, in the same tool set: its bound as worked out then
            tools, kept = self._tools.current, self._one_bound
            if one is not None and kept[0] is tools and kept[1] == one.name:
                bound_s = kept[2]
            else:
                bound_s = self.turn_bound_s(batch)  # (which keeps it)
        token = None if cancel is None else _checked_cancel(cancel)
        chosen = False if background is False else _checked_background(background)
        waiter = latch = Latch()  # the turn's sink, and the thread waiting for it (one object)
        try:  # _start_turn, inline (the running loop's turns as _turns finds them, without its frame)
            current = self._current
            turns = current[1] if current is not None and current[1].closed is None else self._turns()
            turns.submit(batch, latch, telemetry=self.telemetry.turn(), cancel=token,
                         context=contextvars.copy_context(), background=chosen, chooses=self.model_chooses is True,
                         waiter=waiter, own_context=True)
            until = time.monotonic() + bound_s
            if latch._call is not None:  # the turn's one process call was left for this thread: its reply read here
                waiter.serve(until)
            else:  # none was (only this thread holds one, and it has started the turn): closed, as serve closes it
                latch._thread = None
            done = latch.wait(latch.held, until)  # its one thread call's deadline kept here till its instant
        except BaseException:  # raised or interrupted: the held call goes to its pool's reader, the kept deadline
            waiter.hand_over()  # to the timers
            raise
        if not done:
            raise TimeoutError(f"the turn did not finish within {bound_s} s")
        return latch.results

    async def arun_turn(
        self, calls: Iterable[ToolCall], timeout_s: float | None = None, *, cancel: CancelToken | None = None,
        background: bool | Iterable[str] = False, on_result: Callable[[int, ToolResult], None] | None = None,
        on_start: Callable[[int], None] | None = None,
    ) -> list[ToolResult]:
        """:meth:`run_turn` for asyncio hosts: awaits the results without ever blocking
        the event loop; ``on_result`` as in :meth:`submit_turn` (called from the thread
        that settled the call: a call thread, or this event loop's for a call run on it).
        ``on_start(index)``: called in a call's own thread just before its tool runs, for a call run on a
        ``thread`` call thread (not a task); a call run anywhere else, or not run, never calls it.
        A call of a trusted ``async`` tool in ``thread`` isolation runs
        as a task on this event loop, with its deadline (DESIGN §4: no thread is
        crossed; a tool that blocks the event loop blocks it as the host's own code
        would), its first step run at once (:mod:`rho_actors.loop.inline`): a turn
        whose every call is refused or returns without suspending is answered without
        this coroutine suspending. Every other call runs in its isolation and its result
        comes back with one hop. Cancelling the awaiting task cancels the turn (as
        ``cancel`` does) and waits (at most the system's ``ask_timeout_s``) for its
        ``cancelled`` results before re-raising ``CancelledError``. Raises
        ``TimeoutError`` past ``timeout_s`` seconds (default :meth:`turn_bound_s`),
        which only a broken runtime can cause.

        No file work runs on the event loop: the session's folder is made (and checked)
        in a thread of rho's before the loop's first turn that calls a registered tool,
        which so suspends once (a folder that cannot be used is then the turn's
        ``not_started`` results, as in :meth:`run_turn`)."""
        batch = tuple(calls)  # _checked_calls' look at one call, inline (as in run_turn)
        one = batch[0] if len(batch) == 1 else None
        if one is None or type(one) is not ToolCall or type(one.id) is not str or type(one.name) is not str:
            batch, one = _checked_calls(batch), None
        chosen = False if background is False else _checked_background(background)  # the default as it is
        kept = self._one_bound  # a one-call turn of the tool bounded last, in the same tool set: as in run_turn
        bound = (timeout_s if timeout_s is not None else kept[2]
                 if one is not None and kept[0] is self._tools.current and kept[1] == one.name
                 else self.turn_bound_s(batch))
        token = None if cancel is None else _checked_cancel(cancel)  # none made: the turn is cancelled by its id
        aio = asyncio.get_running_loop()
        current = self._current  # the running loop's turns as _turns finds them, without its frame
        turns: Turns | None = current[1] if current is not None and current[1].closed is None else self._turns()
        assert turns is not None
        if not turns.folder_made and any(type(c.name) is str and c.name in self._tools.current.entries
                                         for c in batch):
            await self._make_folder_off_loop(turns)
            turns = None  # suspended meanwhile: the turn looks its loop up again (restarted, maybe)
        landing = Landing(aio, bound)
        bounds = self._bounds
        if bounds is None or bounds.aio is not aio:
            bounds = self._bounds = Bounds(aio)
        bounds.add(landing)  # armed first (one timer per event loop): the calls' hand-off goes last
        stop: Callable[[], object] | None = None  # cancels the turn
        waiter: asyncio.Future[list[ToolResult]] | None = None
        try:
            if turns is None:  # suspended since: its loop looked up again (restarted, maybe)
                turns = self._turns()
            turn_id = turns.submit(  # _start_turn, inline
                batch, landing, telemetry=self.telemetry.turn(), cancel=token, context=contextvars.copy_context(),
                on_result=on_result, aio=aio, background=chosen, chooses=self.model_chooses is True,
                on_start=on_start, own_context=True)
            if landing.results is not None:  # landed already: every call refused, or settled in its first step
                return landing.results
            stop = (functools.partial(token.cancel, "cancelled") if token is not None else
                    functools.partial(turns.cancel_from_host, turn_id) if turn_id is not None else None)
            waiter = landing.wait(stop)
            return await waiter
        except asyncio.CancelledError:
            if stop is not None and waiter is not None and not waiter.cancelled():  # else its cancel has stopped it
                stop()
            if landing.results is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(landing.wait_landed(), self._settings.ask_timeout_s)
            raise
        finally:
            bounds.discard(landing)

    async def _make_folder_off_loop(self, turns: Turns) -> None:
        """Make the session's folder in a thread of its own (never on the event loop)
        and tell ``turns``; an ``OSError`` is left for the turn to report."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def make() -> None:  # the awaiting task, cancelled, has cancelled ``done``: nothing to tell
            try:
                turns.make_folder()
                self._folder_made = True
            except OSError:
                pass
            except BaseException as exc:  # surfaced to the awaiting task
                if done.set_running_or_notify_cancel():
                    done.set_exception(exc)
                return
            if done.set_running_or_notify_cancel():
                done.set_result(None)

        threading.Thread(target=make, name=f"rho-folder-{self.session_id}", daemon=True).start()
        await asyncio.wrap_future(done)

    def offered(self) -> list[ToolInfo]:
        """The checked declarations this loop offers now, in registration order (each
        its own copy; read in the calling thread)."""
        return self._turns().offered()

    def offered_entries(self) -> tuple[ToolEntry, ...]:
        """The registry entries this loop offers now, in registration order: shared,
        immutable values (their ``info`` must not be changed), read in the calling
        thread without a copy; for adapters that build a framework's tools from the
        offer at every step."""
        return self._turns().offered_entries()

    def declarations(self, dialect: Dialect = "neutral") -> list[dict[str, Any]]:
        """:meth:`offered` in a provider's format (see :mod:`rho_actors.declarations.formats`):
        fresh dicts, each schema its own deep copy; what the agent loop shows the model.
        A ``background="optional"`` tool's schema gains the optional boolean
        ``run_in_background`` here, unless :attr:`model_chooses` is off (DESIGN §4
        "Background calls": the model's choice, taken out before validation)."""
        entries = self.offered_entries()
        chooses = self.model_chooses is True
        with paused_for(len(entries)):  # a large offer: tens of thousands of new dicts
            return [to_dialect(with_choice(entry.info) if chooses else entry.info, dialect) for entry in entries]

    def set_withheld(self, names: Iterable[str]) -> None:
        """Replace the set of tool names this loop does not offer, from its next turn: a
        turn started after this returns (from any thread) sees the new set, one being
        prepared meanwhile sees the old or the new set whole, never a mix. Set in the
        calling thread, on the running loop's turns (no message), and kept for the
        session: a restart of the loop starts with these names (one under way is waited
        for, as a turn waits). Raises ``TypeError`` for a single ``str`` (a name list is
        wanted) or a name that is not a ``str``, and :class:`rho_actors.NotRunningError`
        (a ``pykka.ActorDeadError``) naming why when the loop is not running."""
        turns = self._turns()  # the running loop, waiting for a restart under way (a stop is what is wrong first)
        turns.set_withheld(withheld_names(names))  # the session's: its loop's restarts read the same names

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the loop (a normal exit: not restarted, even when it crashed an instant
        before or is being restarted) and end its session's subtree, waiting at most
        ``timeout_s`` seconds for it; calls still running get ``cancelled`` results."""
        sessions = self._sessions
        if sessions is not None:
            try:
                if sessions.stop(self.session_id, timeout_s):
                    return
            except pykka.ActorDeadError:  # the system is stopping: its stop ends the loop
                return
        try:
            stop(self.ref, timeout_s)
        except pykka.ActorDeadError:
            pass

    def prompt(self, text: str | None, *, model: Model, **options: Any) -> PromptResult:
        """Run one prompt of this session to its end (see :func:`rho_actors.agent.driver.prompt`
        for ``options``: ``max_steps``, ``cancel``, ``instructions``, ``temperature``,
        ``max_tokens``, ``on_event``): the final text, the steps taken and ``error``
        (None, or why it stopped). The agent layer sits on top of the runtime and is
        imported only here and below, when used."""
        from rho_actors.agent.driver import prompt

        return prompt(self, text, model=model, **options)

    async def aprompt(self, text: str | None, *, model: Model, **options: Any) -> PromptResult:
        """:meth:`prompt` for asyncio hosts; never blocks the event loop. Cancelling the
        awaiting task cancels the prompt and its running turn."""
        from rho_actors.agent.driver import aprompt

        return await aprompt(self, text, model=model, **options)

    def stream(self, text: str | None, *, model: Model, **options: Any) -> Iterator[PromptEvent]:
        """:meth:`prompt`, yielding its events as they happen (see
        :func:`rho_actors.agent.driver.stream`); the last is a ``FinalResult``."""
        from rho_actors.agent.driver import stream

        return stream(self, text, model=model, **options)

    def astream(self, text: str | None, *, model: Model, **options: Any) -> AsyncIterator[PromptEvent]:
        """:meth:`stream` for asyncio hosts (see :func:`rho_actors.agent.driver.astream`)."""
        from rho_actors.agent.driver import astream

        return astream(self, text, model=model, **options)

    def tasks(self) -> list[TaskInfo]:
        """This session's background calls (DESIGN §4 "Background calls"), open and
        ended (an ended one until ``task_ttl_s`` after its end), in the order they
        started: :class:`rho_actors.TaskInfo` values. A task a host that died left
        running is ``failed`` ("interrupted"), never run again."""
        return self.task_registry.tasks(self.session_id, self._data_dir)

    def task_result(self, task_id: str, timeout_s: float | None = None) -> TaskInfo:
        """Task ``task_id`` once it has ended (its ``result`` set), waiting at most
        ``timeout_s`` seconds (``None``: until it ends; its deadline bounds that).
        Raises :class:`rho_actors.TaskError` (a ``LookupError``) when this session has
        no such task and ``TimeoutError`` when it is still open."""
        return self.task_registry.wait(self.session_id, self._data_dir, task_id, timeout_s)

    def cancel_task(self, task_id: str) -> TaskInfo:
        """Cancel task ``task_id`` as a turn's call is cancelled (its worker process
        killed, its thread signalled) and return it ended (``cancelled``, or as it ended
        first); a call that waits for its approval is rejected too (it never runs). Raises
        :class:`rho_actors.TaskError` when this session has no such task."""
        info = self.task_registry.cancel(self.session_id, self._data_dir, task_id)
        if info.status == "cancelled" and self.task_registry.holds(self.session_id, info.call_id):
            with contextlib.suppress(ApprovalError):  # decided meanwhile
                self.reject(info.call_id, f"its task {task_id} was cancelled")
        return info

    def running(self) -> list[dict[str, Any]]:
        """The calls running now: ``call_id``, ``tool``, ``ms_left`` (to the deadline);
        then approved calls being started or whose result is being recorded (``call_id``,
        ``tool``, ``ms_left`` ``None``)."""
        turns = self._turns()
        running = turns.running()
        if turns.approvals is not None:
            listed = {call["call_id"] for call in running}
            running += [{**call, "ms_left": None} for call in turns.approvals.in_flight()
                        if call["call_id"] not in listed]
        return running

    def watch_calls(self, moved: Callable[[str, str, dict[str, Any], str], None]) -> Callable[[], None]:
        """Call ``moved(call_id, state, fields, arguments_sha256)`` for each move the
        governor makes of this session's calls (``queued``, ``retried``, ``running``
        again: the call lifecycle's states and fields, DESIGN §4), from the thread that
        makes it; the agent loop records them in the transcript. One watcher at a time;
        returns the function that stops it (see :meth:`rho_actors.governor.Governor.watch`)."""
        return self._governor.watch(self.session_id, moved)

    @property
    def alive(self) -> bool:
        """Whether the session's LoopActor is running now."""
        return self._whereis(loop_name(self.session_id)) is not None

    @property
    def exit_reason(self) -> object:
        """``None`` while the loop runs; else why it is not running: ``"normal"`` after
        :meth:`stop` (or the system's stop), what killed it while it is being restarted,
        and a :class:`rho_actors.RestartIntensityExceeded` naming the crashes once its
        session supervisor gave up on it (it is not restarted again)."""
        return self._names.exit_reason(loop_name(self.session_id))
