"""Hostile tests of round 7: the cyclic collector's pause of a large offer across a fork,
a host's cancel token reused for many turns and prompts, and stops racing a lazy
session's first turn, its crash and a start of the same id."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from rho_actors import (
    ActorSystem,
    CancelToken,
    ChildSpec,
    Loop,
    Names,
    StartChild,
    Supervisor,
    ToolCall,
    kill,
    start_link,
    which_children,
)
from rho_actors.agent.driver import prompt
from rho_actors.agent.model import Reply, ScriptedModel
from rho_actors.declarations.toolset import MarshalledSchema, no_collection
from rho_actors.loop.messages import loop_name
from rho_actors.otp.actor import Actor, monitor, stop
from rho_actors.tool import SCHEMA_SLOT, ToolInfo

from .conftest import WAIT_S, supervisors_labelled, wait_for
from .helpers import echo, echoed


def _sessions(system: ActorSystem) -> list[str]:
    node = next(c for c in system.tree()["children"] if c["id"] == "sessions")
    return [s["id"] for s in node["children"]]


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


# --------------------------------------------------------------------------- the collector and a fork


def _forked_collector(child_work: str) -> str:
    """Fork; the child reports ``gc.isenabled()`` (``"1"``/``"0"``) now and after
    ``child_work`` (``"block"``: one :func:`no_collection` block), then exits."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing but the report
        try:
            seen = "1" if gc.isenabled() else "0"
            if child_work == "block":
                with no_collection():
                    pass
                seen += "1" if gc.isenabled() else "0"
            os.write(write, seen.encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        with os.fdopen(read, "rb") as pipe:
            return pipe.read().decode()
    finally:
        os.waitpid(pid, 0)


@pytest.mark.skipif(sys.platform == "win32", reason="os.fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_child_forked_while_another_thread_pauses_the_collector_gets_it_back(collector_on: None) -> None:
    """Before: the child inherited the pause of a thread it does not have; no block of
    its own ever ended the last one, so it ran without a cyclic collector for good
    (``"00"``: off at once, and still off after a block of its own)."""
    entered, release = threading.Event(), threading.Event()

    def pause() -> None:
        with no_collection():
            entered.set()
            release.wait(WAIT_S)

    holder = threading.Thread(target=pause)
    holder.start()
    try:
        assert entered.wait(WAIT_S)
        assert not gc.isenabled()  # paused here, by the other thread
        assert _forked_collector("block") == "11"
    finally:
        release.set()
        holder.join(WAIT_S)
    assert gc.isenabled()  # the parent's pause ended as before


@pytest.mark.skipif(sys.platform == "win32", reason="os.fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_child_forked_inside_its_own_pause_keeps_it_until_the_block_ends(collector_on: None) -> None:
    read, write = os.pipe()
    with no_collection():
        pid = os.fork()
        if pid == 0:
            try:
                seen = "1" if gc.isenabled() else "0"
            except BaseException:
                seen = "?"
            os.write(write, seen.encode())
            os._exit(0)
    if pid == 0:  # pragma: no cover - the child has exited above
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        assert pipe.read() == b"0"  # the forking thread's block still runs in the child
    os.waitpid(pid, 0)
    assert gc.isenabled()


# --------------------------------------------------------------------------- a token for many turns


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


# --------------------------------------------------------------------------- a lazy loop ended as it starts


def _ended_as_registered(system: ActorSystem, session_id: str, end: Callable[[pykka.ActorRef[Any]], object]) -> None:
    """Make the system's next registration of ``session_id``'s loop name run ``end`` on
    the new loop at once (another thread that found it by name, before its start was
    over)."""
    names = system._names
    register = names.register

    def ending(name: str, ref: pykka.ActorRef[Any]) -> None:
        register(name, ref)
        if name == loop_name(session_id):
            names.register = register  # type: ignore[method-assign]
            end(ref)

    names.register = ending  # type: ignore[method-assign]


def _settled(system: ActorSystem) -> None:
    system.tree()  # the sessions supervisor has handled what it was told before (a wake-up)


def test_a_lazy_loop_stopped_as_it_starts_stays_stopped(tmp_path: Path) -> None:
    """Before: the stop came before the loop was watched, its monitor said ``noproc``,
    taken for a crash: the session's supervisor woke up and brought the stopped session
    back."""
    with ActorSystem(data_dir=tmp_path) as system:
        system.register(echo)
        _ended_as_registered(system, "x", lambda ref: stop(ref, WAIT_S))
        loop = system.start_loop("x")
        _settled(system)
        assert supervisors_labelled("session:x") == []
        assert not loop.alive and loop.exit_reason == "normal"
        assert "x" not in _sessions(system)
        assert echoed(system.start_loop("x"), "again") == "again"  # its id is free


def test_a_lazy_loop_killed_as_it_starts_is_restarted(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path) as system:
        system.register(echo)
        _ended_as_registered(system, "k", kill)
        loop = system.start_loop("k")
        assert wait_for(lambda: len(supervisors_labelled("session:k")) == 1)
        assert echoed(loop, "back") == "back"  # a crash is a crash, whenever it comes
        loop.stop()
        assert not loop.alive and "k" not in _sessions(system)


# --------------------------------------------------------------------------- watching an actor that is stopping


class _SlowStop(Actor):
    def __init__(self, entered: threading.Event, release: threading.Event) -> None:
        super().__init__()
        self.entered, self.release = entered, release

    def on_stop(self) -> None:
        self.entered.set()
        self.release.wait(WAIT_S)


def test_a_monitor_of_an_actor_that_is_stopping_reports_its_real_end() -> None:
    """Before: the actor counted as dead from the start of its stop, so a monitor made
    while its ``on_stop`` ran reported ``noproc`` at once: a supervisor's stop that
    waited for it (a session's, woken by a crash) returned while its ``on_stop`` still
    stopped its children (a stopped session's loop seen alive after ``stop``)."""
    entered, release = threading.Event(), threading.Event()
    ref = _SlowStop.start(entered, release)
    ref.stop(block=False)
    assert entered.wait(WAIT_S)
    seen: list[object] = []
    ended = threading.Event()

    def down(_ref: pykka.ActorRef[Any], reason: object) -> None:
        seen.append(reason)
        ended.set()

    monitor(ref, down)
    assert seen == []  # it has not ended: its on_stop runs
    release.set()
    assert ended.wait(WAIT_S)
    assert seen == ["normal"]
    late: list[object] = []
    monitor(ref, lambda _ref, reason: late.append(reason))
    assert late == ["noproc"]  # ended: at once, as OTP's


# --------------------------------------------------------------------------- copies of a large offer


class _Numbered:
    def __init__(self, number: int) -> None:
        self.number = number

    def name(self) -> str:
        return f"n{self.number}"

    def description(self) -> str:
        return "A numbered tool."

    def parameter_schema(self) -> dict[str, Any]:
        return {"type": "object", "properties": {"x": {"type": "string", "enum": ["a", str(self.number)]}}}

    def run(self, args: dict[str, Any], ctx: Any) -> str:
        return "ok"


@pytest.fixture
def large_loop(tmp_path: Path) -> Iterator[Loop]:
    with ActorSystem(data_dir=tmp_path) as system:
        system.register_many([_Numbered(i) for i in range(1_100)])  # three chunks of copies
        yield system.start_loop("big")


def test_one_copy_kept_of_a_large_offer_keeps_no_other_schemas(large_loop: Loop) -> None:
    """Before: the one copy kept held its chunk, the marshalled schemas of 511 others
    (and 512 weak references), until read, for as long as it lived."""
    kept = [large_loop.offered()[i] for i in (3, 700, 1_099)]
    for info in kept:
        held = SCHEMA_SLOT.__get__(info, ToolInfo)
        assert isinstance(held, MarshalledSchema)  # its entry's own: no chunk of 512 behind it
    numbers = [info.parameter_schema["properties"]["x"]["enum"][1] for info in kept]
    assert numbers == ["3", "700", "1099"]


def test_copies_of_a_large_offer_are_each_their_own(large_loop: Loop) -> None:
    first, second = large_loop.offered(), large_loop.offered()
    first[5].parameter_schema["properties"]["x"]["enum"].append("mine")
    first[5].parameter_schema["type"] = "changed"
    assert first[6].parameter_schema["properties"]["x"]["enum"] == ["a", "6"]  # a sibling of its chunk
    assert second[5].parameter_schema == {"type": "object", "properties": {"x": {"type": "string", "enum": ["a", "5"]}}}
    assert large_loop.offered()[5] == second[5]
    assert first[5].parameter_schema is not first[5].copy().parameter_schema


def test_first_reads_of_a_large_offer_from_many_threads_agree(large_loop: Loop) -> None:
    offer = large_loop.offered()
    start = threading.Barrier(8)
    seen: list[list[int]] = []

    def read(offset: int) -> None:
        start.wait(WAIT_S)
        seen.append([id(info.parameter_schema) for info in offer[offset::7]])

    threads = [threading.Thread(target=read, args=(i % 7,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert len(seen) == 8
    by_info = [id(info.parameter_schema) for info in offer]
    assert len(set(by_info)) == len(offer)  # one dict per copy, the same for every reader
    for ids in seen:
        assert set(ids) <= set(by_info)
    assert [info.parameter_schema["properties"]["x"]["enum"][1] for info in offer] == [str(i) for i in range(1_100)]


# --------------------------------------------------------------------------- a cancel reason that blocks


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


# --------------------------------------------------------------------------- a child ended as it is watched


class _Idle(Actor):
    def on_receive(self, message: Any) -> Any:
        return message


def test_a_transient_child_stopped_as_its_name_is_given_is_not_restarted() -> None:
    """Before: a stop from a thread that found the child by its name came before its
    supervisor watched it; the monitor said ``noproc``, taken for a crash: the stopped
    child was restarted."""
    names = Names()
    register = names.register
    stopped: list[pykka.ActorRef[Any]] = []

    def ending(name: str, ref: pykka.ActorRef[Any]) -> None:
        register(name, ref)
        if not stopped:
            stopped.append(ref)
            stop(ref, WAIT_S)

    names.register = ending  # type: ignore[method-assign]
    reports: list[str] = []
    child = ChildSpec("w", StartChild(_Idle), restart="transient", name="w")
    sup = start_link(Supervisor, [child], names=names, report=lambda event: reports.append(event.kind))
    try:
        assert len(stopped) == 1 and not stopped[0].is_alive()
        assert which_children(sup)  # the supervisor has handled what it was told (the child's end)
        assert names.whereis("w") is None and names.exit_reason("w") == "normal"
        assert "restarted" not in reports
    finally:
        sup.stop(timeout=WAIT_S)
