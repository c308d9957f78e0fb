"""Hostile tests of round 9: a waking actor's first messages racing a thread start that
fails, a host's cancel carried out in the cancelling thread, the linear schemas' caches
under threads, a chunk of offered schemas told of its copies' drops from many threads,
and cancel reasons whose text misbehaves."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CancelToken, ErrorKind, ToolCall
from rho_actors.loop.messages import Offered
from rho_actors.otp.actor import monitor

from .conftest import WAIT_S
from .helpers import make_tool

pytestmark = pytest.mark.timeout(120)


class _CountingQueue:
    """A ``SimpleQueue`` that sets ``second`` once it holds a second message."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.second = threading.Event()
        self._puts = 0

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        self._queue.put(item)
        self._puts += 1
        if self._puts >= 2:
            self.second.set()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        return self._queue.get(block, timeout)

    def empty(self) -> bool:
        return self._queue.empty()


class _FailsOnceWhenSecondQueued:
    """A thread pool whose first start fails, once a second message is queued (another
    teller put it while the first start was under way); later starts work."""

    def __init__(self, real: Any, second: threading.Event) -> None:
        self._real, self._second = real, second
        self.failed = False

    def submit(self, job: Any, name: str, *, may_take_over: bool = False) -> None:
        if not self.failed:
            self.failed = True
            assert self._second.wait(WAIT_S)
            raise RuntimeError("can't start new thread")
        self._real.submit(job, name, may_take_over=may_take_over)


def test_a_message_told_while_a_failing_first_start_is_under_way_is_not_stranded(tmp_path: Path) -> None:
    """The first message of a waking actor claims its start; a second teller, seeing it
    claimed, returned at once with its message queued. When that start then failed and
    was undone, the second message waited with no loop for it (its ``ask`` unanswered
    until some later message or the stop): a put that returns has its message run.
    Now a teller that finds a start under way waits for its outcome, and starts the loop
    itself when it failed."""
    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        system.register(make_tool("echo", lambda args, ctx: "ok"))
        loop = system.start_loop("racing-starts")
        ref = loop.ref
        actor = ref._actor_weakref()
        assert actor is not None
        inbox = ref.actor_inbox
        counting = _CountingQueue()
        inbox._queue = counting
        pool = _FailsOnceWhenSecondQueued(actor.thread_pool, counting.second)
        actor.thread_pool = pool
        downs: list[object] = []
        ended = threading.Event()

        def down(_ref: Any, reason: object) -> None:
            downs.append(reason)
            ended.set()

        monitor(ref, down)
        first_error: list[BaseException] = []

        def first() -> None:
            try:
                ref.tell(Offered())
            except RuntimeError as exc:
                first_error.append(exc)

        teller = threading.Thread(target=first)
        teller.start()
        answers: list[Any] = []
        second = threading.Thread(target=lambda: answers.append(ref.ask(Offered(), block=False)))
        second.start()
        second.join(WAIT_S)
        teller.join(WAIT_S)
        assert not second.is_alive() and not teller.is_alive()
        assert pool.failed and len(first_error) == 1
        assert len(answers) == 1
        assert answers[0].get(timeout=WAIT_S) is not None  # run by a loop, not left for the stop
        loop.stop(timeout_s=WAIT_S)
        assert ended.wait(WAIT_S) and downs == ["normal"]


class _FailsFirst:
    """A thread pool whose first ``failures`` starts fail (from any thread)."""

    def __init__(self, real: Any, failures: int) -> None:
        self._real = real
        self._left = failures
        self._lock = threading.Lock()

    def submit(self, job: Any, name: str, *, may_take_over: bool = False) -> None:
        with self._lock:
            fail, self._left = self._left > 0, self._left - 1
        if fail:
            raise RuntimeError("can't start new thread")
        self._real.submit(job, name, may_take_over=may_take_over)


def _ask_four(ref: Any, barrier: threading.Barrier, told: list[Any], raised: list[BaseException]) -> None:
    barrier.wait(WAIT_S)
    for _ in range(4):
        try:
            told.append(ref.ask(Offered(), block=False))
        except RuntimeError as exc:
            raised.append(exc)


@pytest.mark.parametrize("failures", [0, 1, 3, 7, 100])
def test_many_first_messages_racing_failing_starts_and_a_stop_each_get_one_answer(
        tmp_path: Path, failures: int) -> None:
    """Eight threads ask a waking loop at once while its thread starts fail for a while,
    then it is stopped: every ask that was told is answered (by the loop or, for those
    the stop found queued, in the stopping thread), a tell that raised raised the start's
    error, the monitor fires once, nothing hangs."""
    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        system.register(make_tool("echo", lambda args, ctx: "ok"))
        for round_ in range(5):
            loop = system.start_loop(f"racing-{round_}")
            ref = loop.ref
            actor = ref._actor_weakref()
            assert actor is not None
            actor.thread_pool = _FailsFirst(actor.thread_pool, failures)
            downs: list[object] = []
            ended = threading.Event()

            def down(_ref: Any, reason: object, downs: list[object] = downs, ended: threading.Event = ended) -> None:
                downs.append(reason)
                ended.set()

            monitor(ref, down)
            barrier = threading.Barrier(9)
            told: list[Any] = []
            raised: list[BaseException] = []

            threads = [threading.Thread(target=_ask_four, args=(ref, barrier, told, raised)) for _ in range(8)]
            for thread in threads:
                thread.start()
            barrier.wait(WAIT_S)
            for thread in threads:
                thread.join(WAIT_S)
                assert not thread.is_alive()
            loop.stop(timeout_s=WAIT_S)
            assert ended.wait(WAIT_S) and downs == ["normal"]
            assert not ref.is_alive()
            assert len(told) + len(raised) == 32
            assert len(raised) <= failures
            assert all("can't start new thread" in str(exc) for exc in raised)
            for future in told:
                assert future.get(timeout=WAIT_S) is not None


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


def _offer_of(count: int) -> tuple[list[Any], tuple[bytes, ...]]:
    from rho_actors import ToolInfo
    from rho_actors.declarations.arguments import make_validator
    from rho_actors.declarations.toolset import ToolEntry, offer_chunks

    validator = make_validator({"type": "object"})
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    entries = [ToolEntry(tool=None, info=ToolInfo(f"t{i}", "d", dict(schema), 1_000, "parallel"), validator=validator,
                         origin="test") for i in range(count)]
    chunks = offer_chunks(entries)
    assert chunks is not None
    return entries, chunks


def test_copies_dropped_by_many_threads_at_once_are_each_counted_by_their_chunk() -> None:
    """A chunk of 512 copies counts the drops of one copy in 8 and lets go of its bytes
    once at most an eighth of those are left: ``_left -= 1`` from the dropping threads
    was a read and a write, and two drops at once could count one (the chunk then kept
    its bytes, and every decoded schema of them, for as long as one copy lived). With
    exactly that eighth kept, every other copy dropped by 16 threads at once, the
    chunk must have let go, and the kept copies still read their schemas."""
    import sys

    from rho_actors.declarations import toolset

    entries, chunks = _offer_of(512)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # thread switches as often as they can come
    try:
        for _ in range(20):
            copies = toolset.copied_infos(entries, chunks)
            chunk = toolset.ToolInfo.__dict__["parameter_schema"]._get(copies[0])
            assert type(chunk) is toolset._Chunk
            tellers = len(copies[::toolset._SAMPLE])
            kept = copies[:tellers // 8 * toolset._SAMPLE:toolset._SAMPLE]  # the floor's telling copies
            assert len(kept) == tellers // 8
            shares: list[list[Any]] = [[] for _ in range(16)]
            for index, made in enumerate(copies):
                if index % toolset._SAMPLE or index >= len(kept) * toolset._SAMPLE:
                    shares[index % 16].append(made)
            del copies, made
            barrier = threading.Barrier(16)

            def drop(share: list[Any], barrier: threading.Barrier = barrier) -> None:
                barrier.wait(WAIT_S)
                share.clear()

            threads = [threading.Thread(target=drop, args=(share,)) for share in shares]
            del shares
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(WAIT_S)
                assert not thread.is_alive()
            assert chunk._blob is None and chunk.copies == []  # let go: every drop was counted
            schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
            assert [made.parameter_schema for made in kept] == [schema] * len(kept)
    finally:
        sys.setswitchinterval(switch)
