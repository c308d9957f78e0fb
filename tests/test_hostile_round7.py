"""Hostile tests of round 7: the cyclic collector's pause of a large offer across a fork,
a host's cancel token reused for many turns and prompts, and stops racing a lazy
session's first turn, its crash and a start of the same id."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rho_actors import ActorSystem, CancelToken, ToolCall, tool
from rho_actors.agent.driver import prompt
from rho_actors.agent.model import Reply, ScriptedModel
from rho_actors.declarations.toolset import no_collection

from .conftest import WAIT_S


@tool
def echo(text: str) -> str:
    """Return the text."""
    return text


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
