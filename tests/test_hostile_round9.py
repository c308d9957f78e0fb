"""Hostile tests of round 9: a waking actor's first messages racing a thread start that
fails, a host's cancel carried out in the cancelling thread, the linear schemas' caches
under threads, a chunk of offered schemas told of its copies' drops from many threads,
and cancel reasons whose text misbehaves."""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, CancelToken, ErrorKind, ToolCall, ToolInfo
from rho_actors.loop.messages import Offered
from rho_actors.otp.actor import Actor, kill, monitor

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
        inbox: Any = ref.actor_inbox
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
            chunk = ToolInfo.__dict__["parameter_schema"]._get(copies[0])
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


def _linear_schema(seed: int) -> dict[str, Any]:
    kinds = ["integer", "string", "boolean", "number"]
    return {
        "type": "object",
        "properties": {
            "a": {"type": kinds[seed % 4]},
            "b": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": kinds[(seed + 1) % 4]}},
                                             "required": ["n"]}},
            "c": {"enum": [seed, str(seed), None]},
        },
        "required": ["a"] if seed % 2 else [],
        "additionalProperties": seed % 3 != 0,
    }


_INSTANCES: list[Any] = [
    {"a": 1}, {"a": "x"}, {"a": True}, {"a": 1.5}, {}, {"a": 1, "b": [{"n": 1}, {"n": "s"}]},
    {"a": 1, "b": [{"m": 1}]}, {"a": 1, "c": 0}, {"a": 1, "c": "1"}, {"a": 1, "c": None}, {"a": 1, "z": 2},
    {"a": "x", "b": [{"n": True}, {"n": 2.0}]},
]


def test_linear_caches_under_threads_registering_collecting_and_validating_give_the_budgeted_verdicts() -> None:
    """Eight threads make validators (fresh schemas and the same schema objects again,
    as a re-registration does), validate, drop them and collect, while the caches'
    entries go by weak-reference callbacks that take no lock: every verdict is the
    budgeted validation's, nothing raises, and once all are dropped the caches hold none
    of their entries."""
    import copy
    import gc

    from rho_actors.declarations import linear
    from rho_actors.declarations.arguments import make_validator, violations

    shared = [_linear_schema(seed) for seed in range(8)]
    expected = {}
    for seed, schema in enumerate(shared):
        budgeted = make_validator(copy.deepcopy(schema))
        for number, instance in enumerate(_INSTANCES):
            expected[seed, number] = violations(budgeted, copy.deepcopy(instance), None, None)
    del budgeted
    errors: list[BaseException] = []
    wrong: list[Any] = []
    barrier = threading.Barrier(8)

    def work(worker: int) -> None:
        try:
            barrier.wait(WAIT_S)
            kept: list[Any] = []
            for round_ in range(40):
                seed = (worker + round_) % 8
                schema = shared[seed] if round_ % 2 else copy.deepcopy(shared[seed])
                validator = make_validator(schema)
                kept.append((seed, validator))
                for held_seed, held in kept[-3:]:
                    for number, instance in enumerate(_INSTANCES):
                        text = json.dumps(instance)
                        got = violations(held, copy.deepcopy(instance), None, len(text))
                        if got != expected[held_seed, number]:
                            wrong.append((held_seed, number, got, expected[held_seed, number]))
                if round_ % 3 == 0:
                    del kept[: len(kept) // 2]
                    gc.collect()
            kept.clear()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 6)
        assert not thread.is_alive()
    gc.collect()
    assert errors == [] and wrong == []
    assert len(linear._QUICK) <= linear._KEPT and len(linear._CHILDREN) <= linear._KEPT_CHILDREN
    children = {id(sub) for schema in shared for sub in linear._subschemas(schema)}
    assert not children & set(linear._CHILDREN)  # the shared schemas' validators all dropped: none kept


class _StartsThenInterrupted:
    """A thread pool whose start is interrupted (Ctrl-C in ``Thread.start``'s wait) once
    the thread runs: the loop has its thread, the teller gets ``KeyboardInterrupt``."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.starts = 0

    def submit(self, job: Any, name: str, *, may_take_over: bool = False) -> None:
        self.starts += 1
        self._real.submit(job, name, may_take_over=may_take_over)
        if self.starts == 1:
            raise KeyboardInterrupt


def test_a_start_interrupted_after_its_thread_runs_never_starts_a_second_loop(tmp_path: Path) -> None:
    """A start that raised anything was undone, so the next message started a second
    loop on the same actor when the first had its thread already (an interrupt arriving
    in ``Thread.start`` once the thread runs): two threads taking one actor's messages.
    Only a start's ``Exception`` (no thread could be started) is undone now."""
    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        loop = system.start_loop("interrupted")
        ref = loop.ref
        actor = ref._actor_weakref()
        assert actor is not None
        pool = _StartsThenInterrupted(actor.thread_pool)
        actor.thread_pool = pool
        with pytest.raises(KeyboardInterrupt):
            ref.tell(Offered())
        assert ref.ask(Offered(), timeout=WAIT_S) is not None
        loop.stop(timeout_s=WAIT_S)
        assert pool.starts == 1


def test_a_thread_that_could_not_be_started_is_not_counted_as_started(monkeypatch: pytest.MonkeyPatch) -> None:
    from rho_actors.otp.threads import ThreadPool

    pool = ThreadPool(idle_s=1.0)

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", refuse)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            pool.submit(lambda: None, "refused")
    assert pool.threads_started == 0
    ran = threading.Event()
    pool.submit(ran.set, "started")
    assert ran.wait(WAIT_S) and pool.threads_started == 1


class _NoThreadsPool:
    def submit(self, job: Any, name: str, *, may_take_over: bool = False) -> None:
        raise RuntimeError("can't start new thread")


def test_a_system_shutdown_at_the_thread_limit_ends_every_idle_loop(tmp_path: Path) -> None:
    """Loops that never got a message are ended by the system's shutdown: at the host's
    thread limit (no thread for any stop message), each must still end once, its
    monitor told, and the shutdown return."""
    reasons: dict[str, list[object]] = {}
    ended: dict[str, threading.Event] = {}

    def down(ref: Any, reason: object) -> None:
        reasons[ref.actor_urn].append(reason)
        ended[ref.actor_urn].set()

    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        refs = [system.start_loop(f"idle-{i}").ref for i in range(3)]
        for ref in refs:
            actor = ref._actor_weakref()
            assert actor is not None
            actor.thread_pool = _NoThreadsPool()
            reasons[ref.actor_urn], ended[ref.actor_urn] = [], threading.Event()
            monitor(ref, down)
    for key, event in ended.items():
        assert event.wait(WAIT_S) and len(reasons[key]) == 1, key
    assert all(not ref.is_alive() for ref in refs)


class _WakingLazy(Actor):
    starts_on_first_message = True

    def __init__(self) -> None:
        super().__init__()
        self.thread_pool = _NoThreadsPool()  # type: ignore[assignment]


def test_a_kill_of_a_waking_actor_with_no_thread_ends_it_with_its_reason() -> None:
    """``kill`` of an actor that never got a message, at the host's thread limit: the
    ``RuntimeError`` of its start escaped ``kill`` and the actor lived on."""
    ref = _WakingLazy.start()
    reasons: list[object] = []
    monitor(ref, lambda _ref, reason: reasons.append(reason))
    kill(ref, "enough")
    assert not ref.is_alive() and reasons == ["enough"]
