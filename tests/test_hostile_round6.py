"""Hostile round 6: a worker pool's call interrupted (the ``KeyboardInterrupt`` a signal
handler raises in the caller's thread) while it waits for its place under the cap, right
as that place is handed to it, right after it was granted, or while a worker is being
started for it (DESIGN §5 "A call's path", "Fair shares"): every call id still gets
exactly one result, no place under the cap, no process slot and no worker process is
lost for good, and the pool serves the next call (under a cap of one, nothing would).

Each interrupt is raised at its exact point by a hook (no timing); the processes are
real. Every wait is bounded by :data:`~tests.conftest.WAIT_S`.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from rho_actors.function_tool import tool
from rho_actors.sandbox import WorkerPool, WorkerSlots
from rho_actors.sandbox import warm_workers as warm_workers_module
from rho_actors.sandbox.taking import WorkerTaking
from rho_actors.sandbox.warm_workers import WarmWorkers
from rho_actors.sandbox.worker_handle import WorkerHandle

from .conftest import WAIT_S, wait_for
from .test_worker_pool_faults import Results, _interrupt_once, a_call

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(180)


def _capped(warm: int) -> tuple[WorkerPool, WorkerSlots]:
    """A pool under a cap of one worker (one call running at once)."""
    slots = WorkerSlots(1)
    p = WorkerPool(warm=warm, codec="pickle", slots=slots)
    assert warm == 0 or p.wait_warm(WAIT_S)
    return p, slots


def _in_thread(job: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    """Run ``job`` on a thread of its own; what it raised is kept."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            job()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, raised


def _ended(pid: int) -> bool:
    """Whether process ``pid`` is gone or a zombie (killed, not yet reaped by its fork server)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].startswith("Z")
    except (FileNotFoundError, ProcessLookupError):
        return True


def _serves_again(p: WorkerPool, slots: WorkerSlots, call_id: str) -> None:
    """The next call gets a place and a worker, and runs."""
    result = p.run_call(a_call({"text": "after"}, call_id))
    assert result.content == "after", result
    assert wait_for(lambda: not slots.shares()), slots.shares()


# --- 1. an interrupt while a call waits for its place under the cap -----------------------------


@pytest.mark.parametrize("when", ["waiting", "as_granted", "after_granted"])
def test_an_interrupt_around_a_calls_grant_answers_it_once_and_loses_no_place(
        monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """Call ``b`` waits for its place under a cap of one (another session holds it). Its
    thread is interrupted while it waits (``waiting``), just as the place is handed to it
    (``as_granted``: the grant is its own, the wait not yet returned), or right after its
    wait returned the grant (``after_granted``). ``b`` gets exactly one result (it was
    interrupted), its place goes back, and the next call runs."""
    p, slots = _capped(1)
    try:
        assert slots.enter("holder", time.monotonic() + WAIT_S)  # the one place, held by another session
        armed = threading.Event()
        raised = threading.Event()
        if when == "after_granted":
            raised = _interrupt_once(monkeypatch, WorkerSlots, "enter", after=True)
        else:
            expire = WorkerSlots._expire_kept

            def expiring(self: WorkerSlots, now: float) -> None:
                # in b's wait: its ticket queued (waiting), or taken off the queue with the grant (as_granted)
                if armed.is_set() and not raised.is_set() and bool(self._queue) == (when == "waiting"):
                    raised.set()
                    raise KeyboardInterrupt
                expire(self, now)

            monkeypatch.setattr(WorkerSlots, "_expire_kept", expiring)
        results = Results()
        thread, got = _in_thread(lambda: p.start(a_call({"text": "b"}, "b", session="s1"), results.done("b")))
        if when == "after_granted":
            assert wait_for(lambda: slots.waiting_calls() == 1)
            slots.leave("holder", 10.0, keep=False)
        else:
            assert wait_for(lambda: slots.waiting_calls() == 1)
            armed.set()
            if when == "as_granted":
                slots.leave("holder", 10.0, keep=False)  # hands the place to b, which is interrupted as it wakes
        thread.join(WAIT_S)
        assert not thread.is_alive()
        assert raised.is_set()
        assert len(got) == 1 and isinstance(got[0], KeyboardInterrupt), got
        [result] = results.wait("b")
        assert not result.ok and "interrupted" in result.content, result
        if when == "waiting":
            slots.leave("holder", 10.0, keep=False)
        monkeypatch.undo()
        assert wait_for(lambda: not slots.shares()), slots.shares()  # b's place went back
        _serves_again(p, slots, "c")
        assert len(results.got["b"]) == 1
    finally:
        p.stop()


# --- 2. an interrupt while a worker is being started for a call -----------------------------------


@pytest.mark.parametrize("point", ["acquire", "spawn", "start_for_call"])
def test_an_interrupt_as_a_worker_is_started_for_a_call_loses_no_process_slot(
        monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    """No worker is idle under a cap of one; the call took the one process slot to start
    a worker and its thread is interrupted as that take returns (``acquire``) or before
    the start began: in its own thread (``spawn``, a call without a start bound) or in a
    thread started for it (``start_for_call``, a call with one). The call gets its one result, the slot goes
    back (else no worker could ever start again), and the next call runs."""
    p, slots = _capped(0)
    try:
        if point == "acquire":  # as the slot's take returns
            raised = _interrupt_once(monkeypatch, WorkerSlots, "try_acquire", after=True)
        else:
            cls, name = (WarmWorkers, "_spawn") if point == "spawn" else (WorkerTaking, "_start_for_call")
            raised = _interrupt_once(monkeypatch, cls, name, after=False)
        results = Results()
        call = a_call({"text": "b"}, "b")
        if point == "start_for_call":
            call = dataclasses.replace(call, start_by=time.monotonic() + WAIT_S)
        with pytest.raises(KeyboardInterrupt):
            p.start(call, results.done("b"))
        assert raised.is_set()
        [result] = results.wait("b")
        assert not result.ok and "interrupted" in result.content, result
        monkeypatch.undo()
        assert wait_for(lambda: slots.alive == 0), slots.alive  # the slot is free again
        assert not p._starts_for_calls[()], p._starts_for_calls  # no start counted that never began
        _serves_again(p, slots, "c")
        start_bound = dataclasses.replace(a_call({"text": "d"}, "d"), start_by=time.monotonic() + WAIT_S)
        assert p.run_call(start_bound).content == "d"
    finally:
        p.stop()


def test_an_interrupt_right_after_a_workers_process_started_kills_it_and_frees_its_slot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The call's thread is interrupted just after its worker's process was started and
    before the pool holds the worker: the process is killed and reaped (no worker
    process runs on that no pool knows), its slot goes back, the call gets its one
    result, and the next call runs."""
    p, slots = _capped(0)
    try:
        made: list[Any] = []
        handle = WorkerHandle

        def handing(*args: Any, **kwargs: Any) -> Any:
            worker = handle(*args, **kwargs)
            if not made:
                made.append(worker)
                raise KeyboardInterrupt
            return worker

        monkeypatch.setattr(warm_workers_module, "WorkerHandle", handing)
        results = Results()
        with pytest.raises(KeyboardInterrupt):
            p.start(a_call({"text": "b"}, "b"), results.done("b"))
        [result] = results.wait("b")
        assert not result.ok and "interrupted" in result.content, result
        [worker] = made
        assert wait_for(lambda: _ended(worker.pid)), f"worker {worker.pid} still runs"
        monkeypatch.undo()
        assert wait_for(lambda: slots.alive == 0), slots.alive
        _serves_again(p, slots, "c")
    finally:
        p.stop()



# --- 3. a cancel token's callbacks across the requests of one MCP call ---------------------------


def test_an_upstream_tasks_polls_leave_no_callback_on_the_calls_token(
        system: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile upstream keeps its task ``working`` and asks to be polled as often as it
    may (every 50 ms): a call that follows it for its whole deadline sends thousands of
    ``tasks/get``. Each request's hook on the call's cancel token (which abandons the
    request) goes once the request is answered: the token holds none of the answered
    requests (each would keep its answer alive until the call ends), and cancelling it
    still ends the call and cancels the upstream's task."""
    pytest.importorskip("mcp")
    from rho_actors.cancel import CancelToken
    from rho_actors.mcp.source import MCPServer
    from rho_actors.tool import ToolFailure

    upstream = Path(__file__).parent / "mcp_fixtures" / "hostile_task_upstream.py"
    (tmp_path / "release").touch()  # late_task's creation is answered at once; the task works until cancelled
    source = MCPServer(command=[sys.executable, str(upstream), str(tmp_path)], name="hostile", connect_timeout_s=WAIT_S)
    system.add_source(source, poll_s=None)
    assert source.connected, source.last_error
    token = CancelToken()
    kept: list[int] = []
    polled = threading.Event()
    send = MCPServer._send

    def sending(self: MCPServer, *args: Any, **kwargs: Any) -> Any:
        answer = send(self, *args, **kwargs)
        kept.append(len(token._inline) + len(token._callbacks))  # the hooks left after an answered request
        if len(kept) >= 10:
            polled.set()
        return answer

    monkeypatch.setattr(MCPServer, "_send", sending)
    ctx = {"cancel": token, "deadline": time.monotonic() + 4 * WAIT_S, "session_id": "s1", "call_id": "c1"}
    thread, ended = _in_thread(lambda: source.call("late_task", {}, ctx))
    assert polled.wait(WAIT_S), f"{len(kept)} requests answered"
    token.cancel("enough")
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert len(ended) == 1 and isinstance(ended[0], ToolFailure) and "cancel" in str(ended[0]), ended
    assert max(kept) == 0, kept  # no answered request's hook kept on the call's token
    assert wait_for(lambda: any(tmp_path.glob("cancelled-task-*")))  # the upstream's task cancelled


@tool
async def awaits(text: str) -> str:
    """Return ``text`` after one suspension."""
    import asyncio

    await asyncio.sleep(0)
    return text


def test_an_async_tools_run_leaves_no_callback_on_a_token_that_outlives_it() -> None:
    """``async def run`` is driven on a private loop whose task the call's token cancels:
    a token given to many calls (a host's) keeps no hook of a call that ended (each
    would keep its closed loop and task alive, and fire into them when set)."""
    from rho_actors.cancel import CancelToken
    from rho_actors.isolation.call import CallSpec, run_here

    token = CancelToken()
    for n in range(200):
        now = time.monotonic()
        spec = CallSpec(f"c{n}", "awaits", awaits, {"text": str(n)}, {}, now, now + WAIT_S, int(WAIT_S * 1000),
                        token, 1000, lambda result: None)
        assert run_here(spec).content == str(n)
    assert not token._inline and not token._callbacks, len(token._inline)


# --- 4. an interrupt as a pooled thread is started ------------------------------------------------


@pytest.mark.parametrize("began", [False, True])
def test_an_interrupt_as_a_pooled_thread_starts_leaves_no_thread_counted_that_never_comes(
        monkeypatch: pytest.MonkeyPatch, began: bool) -> None:
    """``ThreadPool.submit`` in the host's thread (a call started from ``run_turn``) is
    interrupted as it starts the thread for its job: before the OS thread exists, or
    right after (in ``Thread.start``'s wait). Not started, the job is not queued (the
    submitter is told by the interrupt) and no thread is counted as on its way (one
    counted for good would leave later jobs waiting behind a busy thread); started, the
    job runs. Either way a job that blocks does not hold back the next one."""
    from rho_actors.otp.threads import ThreadPool

    pool = ThreadPool(name="h6-pool")
    real = threading._start_new_thread  # type: ignore[attr-defined]
    raised = threading.Event()

    def starting(function: Any, args: Any, *rest: Any) -> Any:
        if raised.is_set() or getattr(getattr(function, "__self__", None), "name", "") != "h6-pool":
            return real(function, args, *rest)
        raised.set()
        if began:
            real(function, args, *rest)
        raise KeyboardInterrupt

    monkeypatch.setattr(threading, "_start_new_thread", starting)
    ran = threading.Event()
    with pytest.raises(KeyboardInterrupt):
        pool.submit(ran.set, "job-a")
    assert raised.is_set()
    monkeypatch.undo()
    if began:
        assert ran.wait(WAIT_S)
    assert wait_for(lambda: pool._coming == 0), pool._coming  # no thread counted that never comes
    assert not any(t.name == "h6-pool" and not t.is_alive() and t in threading._limbo  # type: ignore[attr-defined]
                   for t in list(threading._limbo))  # type: ignore[attr-defined]
    release, second = threading.Event(), threading.Event()
    pool.submit(lambda: release.wait(WAIT_S), "blocks")
    pool.submit(second.set, "next")
    assert second.wait(WAIT_S), "the next job waited behind a blocked one"
    release.set()
    assert ran.is_set() == began
    pool.shutdown()


# --- 5. one SSE stream resumed twice at once -----------------------------------------------------


def test_a_stream_resumed_twice_at_once_gets_what_was_stored_since_its_replay() -> None:
    """A client resumes one stream twice at once (two GETs with the same
    ``Last-Event-ID``): both replay it, then the first registers it for live events (the
    second finds it registered and ends). The event stored between the replays and that
    registration (the call's result, say) reaches the registered stream; the second
    resume's mark goes with that registration, and many resumes that never register
    leave no mark growing without bound."""
    import anyio

    from .test_mcp_session_events import Resumable  # (here: it skips without mcp)

    async def main() -> None:
        r = await Resumable.made()
        events, streams, primed, message, received, nothing = (
            r.events, r.streams, r.primed, r.message, r.received, r.nothing)
        first_replayed, second_replayed = anyio.Event(), anyio.Event()

        async def first() -> None:
            assert await events.replay_events_after(primed, nothing) == "1"
            first_replayed.set()
            await second_replayed.wait()
            await events.store_event("1", message)  # stored in the gap: no stream registered for it yet
            await r.register()

        async def second() -> None:
            await first_replayed.wait()
            assert await events.replay_events_after(primed, nothing) == "1"
            second_replayed.set()

        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(first)
                tasks.start_soon(second)
        assert received[0].receive_nowait().message == message
        assert not events._resumed, events._resumed  # the second resume's mark went with the registration
        del streams["1"]

        async def taken(event: Any) -> None:
            del event

        async def resume_and_leave() -> None:
            assert await events.replay_events_after(primed, taken) == "1"

        for _ in range(200):  # resumes whose clients leave before their stream is registered
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(resume_and_leave)
        assert sum(len(marks) if isinstance(marks, dict) else 1 for marks in events._resumed.values()) <= 16
        for n in range(2, 600):  # streams (request ids) each resumed by a client that leaves
            stream_primed = await events.store_event(str(n), None)
            assert await events.replay_events_after(stream_primed, taken) == str(n)
        assert len(events._resumed) <= 256, len(events._resumed)

    anyio.run(main)
