"""Cancel tokens against the runtime: callbacks that block, exit or cannot get a thread;
a tool cancelling or abandoning its own token; a host token reused for many turns and
prompts; reasons whose text blocks, raises, lies about its class or is a ``str``
subclass; a cancel carried out in the cancelling thread racing the turn's end."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rho_actors import (
    ActorSystem,
    CancelToken,
    ErrorKind,
    ToolCall,
    ToolContext,
    tool,
)
from rho_actors.agent.driver import prompt
from rho_actors.agent.model import Reply, ScriptedModel
from rho_actors.loop.messages import Offered

from .conftest import WAIT_S, slack, wait_for
from .helpers import echo, echoed, make_tool

pytestmark = pytest.mark.timeout(120)


def test_a_cancel_callback_that_blocks_holds_up_no_deadline(tmp_path: Path) -> None:
    """Before: the callback ran on the deadlines thread, so the call's own timeout and
    every later one of the system waited for it (the turn did not finish in 5 s)."""
    hold = threading.Event()

    @tool(timeout_ms=100)
    def trap(ctx: ToolContext) -> str:
        """Block the canceller."""
        ctx.cancel.add_callback(lambda: hold.wait(WAIT_S))
        ctx.cancel.wait(WAIT_S)
        return "late"

    @tool(timeout_ms=100)
    def slow(ctx: ToolContext) -> str:
        """Overrun the deadline."""
        ctx.cancel.wait(WAIT_S)
        return "late"

    with ActorSystem(data_dir=tmp_path, shutdown_ms=300) as system:
        system.register(trap)
        system.register(slow)
        try:
            [trapped] = system.start_loop("a").run_turn([ToolCall("t", "trap", "{}")], timeout_s=WAIT_S)
            [other] = system.start_loop("b").run_turn([ToolCall("s", "slow", "{}")], timeout_s=WAIT_S)
            assert trapped.error_kind is ErrorKind.TIMEOUT and other.error_kind is ErrorKind.TIMEOUT
            assert max(trapped.duration_ms, other.duration_ms) < WAIT_S * 1000 / 2
        finally:
            hold.set()


def test_a_cancel_callback_that_exits_loses_no_result_and_crashes_no_loop(tmp_path: Path) -> None:
    """Before: the host's cancel ran the callback on the LoopActor's thread; its
    SystemExit ended the loop in the middle of the turn, whose future was never set."""
    ran = threading.Event()

    @tool(timeout_ms=int(WAIT_S * 1000))  # only a hang reaches it: the cancel comes first
    def exiter(ctx: ToolContext) -> str:
        """Exit from the cancel callback."""
        ctx.cancel.add_callback(lambda: sys.exit(3))
        ran.set()
        ctx.cancel.wait(WAIT_S)
        return "late"

    with ActorSystem(data_dir=tmp_path, shutdown_ms=300) as system:
        system.register(exiter)
        system.register(echo)
        loop = system.start_loop("c")
        first = loop.ref
        token = CancelToken()
        future = loop.submit_turn([ToolCall("x", "exiter", "{}")], cancel=token)
        assert ran.wait(WAIT_S)
        token.cancel()
        [result] = future.result(WAIT_S)
        assert result.error_kind is ErrorKind.CANCELLED
        assert loop.ref is first and echoed(loop, "alive") == "alive"
        ran.clear()
        future = loop.submit_turn([ToolCall("y", "exiter", "{}")])
        assert ran.wait(WAIT_S)
        loop.stop()  # the stop's cancel runs the callback too
        [result] = future.result(WAIT_S)
        assert result.error_kind is ErrorKind.CANCELLED


def test_cancel_callbacks_run_once_in_order_apart_from_the_canceller() -> None:
    token = CancelToken()
    seen: list[tuple[str, bool]] = []
    done = threading.Event()
    here = threading.current_thread()

    def note(name: str) -> None:
        seen.append((name, threading.current_thread() is here))
        if name == "last":
            done.set()

    token.add_callback(lambda: note("first"))
    token.add_callback(lambda: sys.exit(1))  # logged; the next one still runs
    token.add_inline_callback(lambda: note("inline"))
    token.add_callback(lambda: note("last"))
    assert token.cancel("timeout") and not token.cancel("again")
    assert done.wait(WAIT_S)
    assert seen == [("inline", True), ("first", False), ("last", False)]
    late = threading.Event()
    token.add_callback(late.set)  # already cancelled: run at once, apart
    assert late.wait(WAIT_S)


def test_a_tool_cancelling_its_own_token_leaves_the_thread_counts_true(tmp_path: Path) -> None:
    """Before: its return was counted as an abandoned thread returning although none was
    abandoned: ``abandoned_threads_running`` went to -3, and the stop waited its whole
    ``shutdown_ms`` for call threads that did not exist."""
    gate = threading.Event()

    @tool
    def self_cancel(ctx: ToolContext) -> str:
        """Cancel its own token, then return."""
        ctx.cancel.cancel("mine")
        return "done"

    @tool(timeout_ms=100)
    def self_cancel_then_hang(ctx: ToolContext) -> str:
        """Cancel its own token, then overrun its deadline."""
        ctx.cancel.cancel("mine")
        gate.wait(WAIT_S)
        return "late"

    system = ActorSystem(data_dir=tmp_path, shutdown_ms=5_000)
    try:
        system.register(self_cancel)
        system.register(self_cancel_then_hang)
        loop = system.start_loop("s")
        results = loop.run_turn([ToolCall(f"t{i}", "self_cancel", "{}") for i in range(3)], timeout_s=WAIT_S)
        assert [r.content for r in results] == ["done"] * 3
        assert system.stats()["abandoned_threads_running"] == 0
        [hung] = loop.run_turn([ToolCall("h", "self_cancel_then_hang", "{}")], timeout_s=WAIT_S)
        assert hung.error_kind is ErrorKind.TIMEOUT
        assert system.stats()["abandoned_threads_running"] == 1  # abandoned at its deadline all the same
        assert system.stats()["abandoned_threads_by_session"] == {"s": 1}
        gate.set()
        assert wait_for(lambda: system.stats()["abandoned_threads_running"] == 0)
        began = time.monotonic()
        system.stop()
        assert time.monotonic() - began < slack(2.5)  # nothing left to wait for (its shutdown_ms is 5 s)
    finally:
        gate.set()
        system.stop()


def test_a_tool_abandoning_its_own_token_leaves_the_thread_counts_true(tmp_path: Path) -> None:
    """Before: ``ctx["cancel"].abandon(...)`` by the tool made its return undo counts no
    one had made (``abandoned_threads_running`` -1, a stop waiting its whole
    ``shutdown_ms``); an abandonment counts only for the isolation that made it."""

    @tool
    def self_abandon(ctx: ToolContext) -> str:
        """Abandon its own token, then return."""
        ctx.cancel.abandon("mine", object())
        return "done"

    system = ActorSystem(data_dir=tmp_path, shutdown_ms=5_000)
    try:
        system.register(self_abandon)
        loop = system.start_loop("s")
        results = loop.run_turn([ToolCall(f"a{i}", "self_abandon", "{}") for i in range(3)], timeout_s=WAIT_S)
        assert [r.content for r in results] == ["done"] * 3
        assert system.stats()["abandoned_threads_running"] == 0
        began = time.monotonic()
        system.stop()
        assert time.monotonic() - began < slack(2.5)  # nothing to wait for (its shutdown_ms is 5 s)
    finally:
        system.stop()


def test_a_cancel_whose_callback_thread_cannot_start_still_cancels(
    monkeypatch: pytest.MonkeyPatch, logs: list[str]
) -> None:
    """Out of threads, ``cancel()`` keeps its word: it never raises, the token is set and
    the runtime's inline callbacks run; the callbacks that needed a thread are logged as
    not run."""
    start = threading.Thread.start

    def refuse(thread: threading.Thread) -> None:
        if thread.name == "rho_actors-cancel-callbacks":
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refuse)
    token = CancelToken()
    ran: list[str] = []
    token.add_inline_callback(lambda: ran.append("inline"))
    token.add_callback(lambda: ran.append("apart"))
    assert token.cancel("timeout") is True
    token.add_callback(lambda: ran.append("late"))  # already cancelled: started at once, refused too
    assert token.cancelled and token.reason == "timeout" and ran == ["inline"]
    assert sum("cancel callbacks were not run" in line for line in logs) == 2


def _waiting(token: CancelToken) -> int:
    return len(token._inline) + len(token._callbacks)


def test_a_host_token_reused_for_many_turns_keeps_no_callback_per_turn(tmp_path: Path) -> None:
    """Before: each turn left its cancel callback on the token: 300 after 300 turns,
    growing without bound for a host that keeps one token for a session."""
    with ActorSystem(data_dir=tmp_path) as system:
        system.register(echo)
        loop = system.start_loop("t")
        token = CancelToken()
        call = [ToolCall("c", "echo", '{"text": "x"}')]
        for _ in range(100):
            [result] = loop.run_turn(call, cancel=token, timeout_s=WAIT_S)
            assert result.ok
        for _ in range(100):
            [result] = loop.submit_turn(call, cancel=token).result(WAIT_S)
            assert result.ok

        async def turns() -> None:
            for _ in range(100):
                [result] = await loop.arun_turn(call, cancel=token, timeout_s=WAIT_S)
                assert result.ok

        asyncio.run(turns())
        assert _waiting(token) == 0
        token.cancel()  # still cancels the next turn
        [result] = loop.run_turn(call, cancel=token, timeout_s=WAIT_S)
        assert result.error_kind == "cancelled"


def test_a_host_token_reused_for_many_prompts_keeps_no_callback_per_request(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path) as system:
        system.register(echo)
        loop = system.start_loop("p")
        token = CancelToken()
        for i in range(30):
            model = ScriptedModel([Reply("", (ToolCall(f"c{i}", "echo", '{"text": "x"}'),)), Reply("done")])
            result = prompt(loop, "go", model=model, cancel=token)
            assert result.ok and result.text == "done", result.error
        assert _waiting(token) == 0


def test_remove_callback_forgets_only_a_waiting_callback() -> None:
    token = CancelToken()
    ran: list[str] = []

    def first() -> None:
        ran.append("first")

    def second() -> None:
        ran.append("second")

    token.add_inline_callback(first)
    token.add_inline_callback(second)
    assert token.remove_callback(first)
    assert not token.remove_callback(first)  # once
    token.cancel()
    assert ran == ["second"]
    assert not token.remove_callback(second)  # it ran


class _SlowText:
    """A reason whose text waits: ``str()`` of it blocks until ``release``."""

    entered = threading.Event()
    release = threading.Event()

    def __str__(self) -> str:
        type(self).entered.set()
        type(self).release.wait(WAIT_S)
        return "slow"


def test_a_cancel_reason_whose_text_blocks_holds_up_no_other_token() -> None:
    """Before: the reason was turned into text under the lock every token shares, so a
    tool cancelling its own token with such a reason stopped every cancel and deadline
    of the process until it returned."""
    _SlowText.entered.clear()
    _SlowText.release.clear()
    own = CancelToken()
    blocked = threading.Thread(target=own.cancel, args=(_SlowText(),), daemon=True)
    blocked.start()
    try:
        assert _SlowText.entered.wait(WAIT_S)
        other = CancelToken()
        done = threading.Event()

        def cancel_other() -> None:
            other.cancel("timeout")
            done.set()

        threading.Thread(target=cancel_other, daemon=True).start()
        assert done.wait(WAIT_S)
        assert other.reason == "timeout"
    finally:
        _SlowText.release.set()
        blocked.join(WAIT_S)
    assert own.reason == "slow"


def test_a_cancel_reason_of_a_str_subclass_is_its_own_text() -> None:
    class Lying(str):
        def __str__(self) -> str:
            raise AssertionError("not called")

    token = CancelToken()
    assert token.abandon(Lying("timeout"), owner=object())
    assert token.reason == "timeout" and type(token.reason) is str


def test_a_cancel_reason_whose_text_raises_still_cancels() -> None:
    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    token = CancelToken()
    assert token.cancel(Broken())  # type: ignore[arg-type]
    assert token.cancelled and token.reason == "cancelled"


class _Hostile(str):
    """A reason text whose methods raise: none of them may be called by the runtime."""

    __slots__ = ()

    def __len__(self) -> int:
        raise RuntimeError("len")

    def __format__(self, spec: str) -> str:
        raise RuntimeError("format")


class _Reason:
    def __str__(self) -> str:
        return _Hostile("its own words")


def test_a_cancel_reason_whose_str_gives_a_str_subclass_is_kept_as_plain_text() -> None:
    """``str()`` returns what ``__str__`` gives, a ``str`` subclass included: the reason
    was kept as that subclass, whose methods ran wherever the reason was used."""
    token = CancelToken()
    assert token.cancel(_Reason())  # type: ignore[arg-type]
    assert type(token.reason) is str and token.reason == "its own words"
    other = CancelToken()
    other.abandon(_Reason(), object())  # type: ignore[arg-type]
    assert type(other.reason) is str and other.reason == "its own words"


class _ClaimsStr:
    """A reason whose ``__class__`` says ``str`` (``isinstance`` believes it)."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return str

    def __str__(self) -> str:
        return "claims str"


class _ClassRaises:
    """A reason whose ``__class__`` raises."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise ValueError("no class")

    def __str__(self) -> str:
        return "class raises"


@pytest.mark.parametrize(("kind", "text"), [(_ClaimsStr, "claims str"), (_ClassRaises, "class raises")])
def test_a_reason_whose_class_lies_or_raises_is_still_made_text(kind: Any, text: str) -> None:
    """``CancelToken.cancel`` never raises, but a reason whose ``__class__`` claimed
    ``str`` (``isinstance`` asks it) had ``str.__str__`` called on a non-str (a
    ``TypeError``), and one whose ``__class__`` raised made the cancel raise that:
    the cancel, the abandon and a turn's cancel through its host's token."""
    reason = kind()
    token = CancelToken()
    assert token.cancel(reason)
    assert type(token.reason) is str and token.reason == text
    other = CancelToken()
    assert other.abandon(reason, object())
    assert type(other.reason) is str and other.reason == text


def test_a_turn_cancelled_by_a_reason_whose_class_lies_is_cancelled(tmp_path: Path) -> None:
    def wait(args: Any, ctx: Any) -> str:
        return "cancelled" if ctx["cancel"].wait(WAIT_S) else "ran to its end"

    started = threading.Event()

    def waiting(args: Any, ctx: Any) -> str:
        started.set()
        return wait(args, ctx)

    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        system.register(make_tool("wait", waiting, timeout_ms=60_000))
        loop = system.start_loop("liar")
        token = CancelToken()
        future = loop.submit_turn([ToolCall("c1", "wait", "{}")], cancel=token)
        assert started.wait(WAIT_S)
        token.cancel(_ClaimsStr())  # type: ignore[arg-type]
        results = future.result(WAIT_S)
        loop.stop(timeout_s=WAIT_S)
    assert [r.error_kind for r in results] == [ErrorKind.CANCELLED], results


class _FailsFirst:
    """A thread pool whose first ``failures`` starts fail (from any thread)."""

    def __init__(self, real: Any, failures: int) -> None:
        self._real = real
        self._left = failures
        self._lock = threading.Lock()

    def submit(self, job: Any, name: str, *, may_take_over: bool = False, alone: bool = False) -> None:
        with self._lock:
            fail, self._left = self._left > 0, self._left - 1
        if fail:
            raise RuntimeError("can't start new thread")
        self._real.submit(job, name, may_take_over=may_take_over, alone=alone)


@pytest.mark.parametrize("failures", [1, 100])
@pytest.mark.parametrize("racer", ["finish", "stop", "both"])
def test_a_cancel_carried_out_in_the_cancelling_thread_races_the_turn_end_once(
        tmp_path: Path, failures: int, racer: str) -> None:
    """The cancel's ``CancelTurn`` finds no thread (the loop's starts fail), so the
    cancelling thread ends the turn itself, while its calls finish on their own, the
    loop stops, or both, and (one failure only) another message starts the loop,
    which then runs the queued ``CancelTurn`` too: each call gets one result, one
    ``finished`` event, the future completes once."""
    from rho_actors.events import CallEvent

    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        events: list[CallEvent] = []
        system.subscribe(lambda e: events.append(e) if isinstance(e, CallEvent) else None)
        for round_ in range(6):
            go = threading.Event()
            started = threading.Barrier(3)

            def hold(args: Any, ctx: Any, go: threading.Event = go, started: threading.Barrier = started) -> str:
                started.wait(WAIT_S)
                go.wait(WAIT_S)
                return "done"

            name = f"hold{round_}"
            system.register(make_tool(name, hold, timeout_ms=60_000))
            loop = system.start_loop(f"cancel-race-{round_}")
            actor = loop.ref._actor_weakref()
            assert actor is not None
            actor.thread_pool = _FailsFirst(actor.thread_pool, failures)
            token = CancelToken()
            calls = [ToolCall(f"r{round_}-c{i}", name, "{}") for i in range(2)]
            future = loop.submit_turn(calls, cancel=token)
            started.wait(WAIT_S)
            barrier = threading.Barrier(3)

            def cancel(barrier: threading.Barrier = barrier, token: CancelToken = token) -> None:
                barrier.wait(WAIT_S)
                token.cancel("enough")
                token.cancel("again")

            def other(barrier: threading.Barrier = barrier, go: threading.Event = go, loop: Any = loop) -> None:
                barrier.wait(WAIT_S)
                if racer in ("finish", "both"):
                    go.set()
                if racer in ("stop", "both"):
                    loop.stop(timeout_s=WAIT_S)
                else:
                    try:
                        loop.ref.tell(Offered())  # may start the loop: the queued CancelTurn runs there too
                    except RuntimeError:
                        pass

            threads = [threading.Thread(target=cancel), threading.Thread(target=other)]
            for thread in threads:
                thread.start()
            barrier.wait(WAIT_S)
            for thread in threads:
                thread.join(WAIT_S)
                assert not thread.is_alive()
            results = future.result(WAIT_S)
            go.set()
            loop.stop(timeout_s=WAIT_S)
            assert [r.call_id for r in results] == [c.id for c in calls]
            assert all(r.error_kind in (None, ErrorKind.CANCELLED) for r in results), results
            for call in calls:
                finished = [e for e in events if e.call_id == call.id and e.kind == "finished"]
                assert len(finished) == 1, (call.id, finished)


def test_finish_and_abandon_agree_on_which_came_first_without_a_lock_at_the_finish() -> None:
    """``finish`` takes no lock (PROFILE §48): one atomic pop, which an ``abandon`` makes
    too, decides which came first. Abandoned first: the owner's ``finish`` gets the reason
    (its thread counted back), another's nothing; finished first: the abandon abandons
    nothing (only the signal is set). Raced on two threads, each pair agrees: the abandon
    returned ``True`` exactly when the finish gave the reason."""
    owner = object()
    first = CancelToken()
    assert first.abandon("timeout", owner)
    assert first.finish(object()) is None and first.finish(owner) == "timeout"
    second = CancelToken()
    assert second.finish(owner) is None
    assert not second.abandon("timeout", owner) and second.cancelled  # set, nothing abandoned
    inline = CancelToken()
    inline.finish()  # an inline call's (no owner)
    assert not inline.abandon("stopping", owner)
    for _ in range(300):
        token = CancelToken()
        gate = threading.Barrier(2)
        said: list[str | None] = []

        def finish(t: CancelToken = token, g: threading.Barrier = gate, out: list[str | None] = said) -> None:
            g.wait(WAIT_S)
            out.append(t.finish(owner))

        thread = threading.Thread(target=finish)
        thread.start()
        gate.wait(WAIT_S)
        abandoned = token.abandon("timeout", owner)
        thread.join(WAIT_S)
        assert said == (["timeout"] if abandoned else [None])
