"""A worker whose start fails on its own, and a spare killed (``kill -9``, a real process)
right after its ``READY``: the call that meets either did not run, so it is sent to a
fresh worker when the dead one provably never had it (its end of the pipe still held
the whole ``CALL`` frame unread: ``Channel.unread_by_child``), and once starts keep
failing it is ``unavailable`` naming the start's failure (it was ``crashed``:
``killed_outside``, or ``no_worker`` of kind ``crashed``), the same answer on every path
(``WorkerPool._start_failed``). A call its worker may have begun is never sent again
(tools are not idempotent): the tool that kills its own worker runs once, ``crashed``.

Each kill is sent before the call is written: a process with a ``SIGKILL`` pending reads
nothing more, so the frame stays unread whatever the timing. Every wait is bounded by
``WAIT_S``."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from rho_actors.function_tool import tool
from rho_actors.sandbox import WorkerCall, WorkerPool
from rho_actors.sandbox.taking import DELIVERY_ATTEMPTS
from rho_actors.sandbox.warm_workers import WarmWorkers
from rho_actors.tool import ErrorKind

from .conftest import WAIT_S

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(4 * WAIT_S)


@tool
def echo(text: str) -> str:
    """Give ``text`` back."""
    return text


@tool
def self_destruct(marks: str) -> str:
    """Note that it began, then kill its own worker process."""
    with open(marks, "a") as f:
        f.write("began\n")
    os.kill(os.getpid(), signal.SIGKILL)
    return "never"


@tool
def forge_need_tool_then_die(marks: str) -> str:
    """Note that it began, ask for its own tool again (a forged ``NEED_TOOL``, as a
    malicious tool would), wait until the host's frame sent again has arrived, unread,
    then kill its own worker process."""
    import gc
    import select

    from rho_actors.sandbox import wire
    from rho_actors.sandbox.channel import Channel

    with open(marks, "a") as f:
        f.write("began\n")
    channel = next(o for o in gc.get_objects() if isinstance(o, Channel))
    channel.send(wire.NEED_TOOL, b"")
    select.select([channel.fd], [], [], 60)
    os.kill(os.getpid(), signal.SIGKILL)
    return "never"


def a_call(tool_: Any, args: dict[str, Any], call_id: str, start_bound: bool) -> WorkerCall:
    call = WorkerCall.of(tool_, args, {"session_id": "s1", "call_id": call_id}, time.monotonic() + WAIT_S, 10_000)
    return dataclasses.replace(call, start_by=time.monotonic() + WAIT_S) if start_bound else call


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    made = WorkerPool(warm=1, codec="pickle")
    try:
        yield made
    finally:
        made.stop()


def _kill_starts(monkeypatch: pytest.MonkeyPatch, count: int | None) -> list[int]:
    """The next ``count`` (None: every) worker processes started are killed with
    ``SIGKILL`` as soon as they exist (a start failing on its own); their pids."""
    real = WarmWorkers._spawn
    killed: list[int] = []

    def spawn(self: WarmWorkers, *args: Any, **kwargs: Any) -> Any:
        worker = real(self, *args, **kwargs)
        if count is None or len(killed) < count:
            killed.append(worker.pid)
            os.kill(worker.pid, signal.SIGKILL)
        return worker

    monkeypatch.setattr(WarmWorkers, "_spawn", spawn)
    return killed


@pytest.mark.parametrize("start_bound", [False, True])
def test_a_spare_killed_right_after_ready_has_the_next_call_sent_to_a_fresh_worker(
        pool: WorkerPool, start_bound: bool) -> None:
    """The pool's spare says ``READY`` and is killed (``kill -9``) before the next call:
    that call is served by a fresh worker (it was ``crashed``, ``killed_outside``: its
    frame went into the dead worker's pipe, never read). Only a spare no tool's code ran in
    proves so by its unread bytes (``OpenCall.may_have_begun``; one that ran a call may have
    peeked at the next frame: ``test_hostile_round16``), so the pool's first spares, each fresh."""
    assert pool.wait_warm(WAIT_S)
    spares = pool.pids()  # one, or under load one more: all killed just before the call
    for spare in spares:
        os.kill(spare, signal.SIGKILL)
    result = pool.run_call(a_call(echo, {"text": "hi"}, "c0", start_bound))
    assert result.ok and result.content == "hi", result
    assert not set(spares) & set(pool.pids())


@pytest.mark.parametrize("start_bound", [False, True])
def test_a_worker_whose_start_fails_on_its_own_once_has_the_call_served_by_another(
        pool: WorkerPool, monkeypatch: pytest.MonkeyPatch, start_bound: bool) -> None:
    """The worker started for a call (no spare idle) dies (``kill -9``) before ``READY``:
    the call goes to the next worker started, and is served."""
    pool.stop()
    fresh = WorkerPool(warm=0, codec="pickle")
    try:
        killed = _kill_starts(monkeypatch, 1)
        result = fresh.run_call(a_call(echo, {"text": "served"}, "c1", start_bound))
        assert len(killed) == 1
        assert result.ok and result.content == "served", result
    finally:
        fresh.stop()


@pytest.mark.parametrize("start_bound", [False, True])
def test_a_call_whose_worker_starts_keep_failing_is_unavailable_naming_the_start(
        monkeypatch: pytest.MonkeyPatch, start_bound: bool) -> None:
    """Every worker started dies (``kill -9``) at once: after :data:`DELIVERY_ATTEMPTS`
    starts (or tries of the call) it is ``unavailable``, "no worker process could be started", naming
    why, on both paths (a call with a start bound, whose workers start in the
    background, and one without, whose worker has the call before its ``READY``): it
    was ``crashed`` (``killed_outside``, blamed on the tool; or ``no_worker``)."""
    fresh = WorkerPool(warm=0, codec="pickle")
    try:
        killed = _kill_starts(monkeypatch, None)
        result = fresh.run_call(a_call(echo, {"text": "never"}, "c1", start_bound))
    finally:
        fresh.stop()
    # each try of the call starts up to DELIVERY_ATTEMPTS workers; one that said READY before its kill (the host's
    # thread slow to return from its spawn, under load) takes the call, which is then tried again
    assert DELIVERY_ATTEMPTS <= len(killed) <= DELIVERY_ATTEMPTS ** 2, killed
    assert result.error_kind is ErrorKind.UNAVAILABLE, result
    assert result.content.startswith("tool 'echo' did not run: no worker process could be started for it ("), result
    assert ("ended before it was ready" in result.content or "ended before the call reached them" in result.content), \
        result


def test_a_call_whose_worker_may_have_begun_it_is_never_sent_again(pool: WorkerPool, tmp_path: Path) -> None:
    """A tool that kills its own worker mid-call: ``crashed``, and it ran once (its
    worker had the whole frame: never sent to another)."""
    marks = tmp_path / "marks"
    result = pool.run_call(a_call(self_destruct, {"marks": str(marks)}, "c1", True))
    assert result.error_kind is ErrorKind.CRASHED, result
    assert marks.read_text() == "began\n"


def test_a_call_whose_tool_forged_a_need_tool_is_never_sent_again(pool: WorkerPool, tmp_path: Path) -> None:
    """A running tool that forges ``NEED_TOOL`` leaves the host's frame sent again unread
    in its pipe, then kills its worker: the unread bytes prove nothing of the call it
    began; ``crashed``, and it ran once."""
    marks = tmp_path / "marks"
    result = pool.run_call(a_call(forge_need_tool_then_die, {"marks": str(marks)}, "c1", True))
    assert result.error_kind is ErrorKind.CRASHED, result
    assert marks.read_text() == "began\n"
