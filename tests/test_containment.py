"""DESIGN §2, §4 step 3, §5 (thread): nothing a tool does takes the loop or the system down,
every call gets one result, deadlines hold, and the tool sees its cancellation."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import pykka
import pytest

from rho_actors import ActorSystem, Details, Error, ErrorKind, Image, ToolCall, tool
from rho_actors.encoding import REPR_MARK

from .conftest import WAIT_S, Recorder, extra_threads, wait_for


class StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


class CustomBase(BaseException):
    pass


RAISERS: dict[str, tuple[Any, ErrorKind, str]] = {
    "value_error": (lambda: (_ for _ in ()).throw(ValueError("bad value")), ErrorKind.RAISED, "ValueError: bad value"),
    "sys_exit": (lambda: sys.exit(3), ErrorKind.EXITED, "SystemExit: 3"),
    "keyboard_interrupt": (lambda: (_ for _ in ()).throw(KeyboardInterrupt()), ErrorKind.EXITED, "KeyboardInterrupt"),
    "custom_base": (lambda: (_ for _ in ()).throw(CustomBase("x")), ErrorKind.EXITED, "CustomBase: x"),
    "generator_exit": (lambda: (_ for _ in ()).throw(GeneratorExit()), ErrorKind.EXITED, "GeneratorExit"),
    "str_raises": (lambda: (_ for _ in ()).throw(StrRaises()), ErrorKind.RAISED, "StrRaises: <str() raised>"),
}


def test_every_failure_becomes_a_result_and_the_system_keeps_serving(system: ActorSystem) -> None:
    def failing(fail: Any) -> Any:
        def body() -> None:
            fail()

        return body

    for name, (fail, _, _) in RAISERS.items():
        system.register(tool(name=name, description=f"Fails with {name}.")(failing(fail)))

    @tool
    def fine() -> str:
        """Works."""
        return "fine"

    system.register(fine)
    loop = system.start_loop()
    actors_before = len(pykka.ActorRegistry.get_all())
    calls = [ToolCall(name, name, "{}") for name in RAISERS] + [ToolCall("fine", "fine", "{}")]
    for _ in range(2):  # and again: the same loop still serves
        results = loop.run_turn(calls)
        for result, (name, (_, kind, text)) in zip(results, RAISERS.items(), strict=False):
            assert (result.call_id, result.ok, result.error_kind) == (name, False, kind)
            assert text in result.content
        assert results[-1].content == "fine"
    assert wait_for(lambda: len(pykka.ActorRegistry.get_all()) == actors_before)
    assert loop.alive
    assert system.start_loop().run_turn([ToolCall("x", "fine", "{}")])[0].content == "fine"


def test_a_returned_error_is_an_error_result(system: ActorSystem) -> None:
    @tool
    def refuse() -> Error:
        """Refuse politely."""
        return Error({"why": "no"})

    system.register(refuse)
    [result] = system.start_loop().run_turn([ToolCall("c", "refuse", "{}")])
    assert (result.ok, result.error_kind, result.content) == (False, ErrorKind.TOOL_ERROR, '{"why": "no"}')


def test_details_and_images_reach_the_host_not_the_text(system: ActorSystem) -> None:
    png = b"\x89PNG\r\n\x1a\nfake"

    @tool
    def shot() -> list[Any]:
        """A caption and a picture."""
        return ["caption", Image(png, "image/png"), {"n": 1}]

    @tool
    def rich() -> Details:
        """Text plus details."""
        return Details({"summary": 1}, {"rows": [1, 2, 3]})

    system.register(shot)
    system.register(rich)
    a, b = system.start_loop().run_turn([ToolCall("a", "shot", "{}"), ToolCall("b", "rich", "{}")])
    assert a.ok and a.content == 'caption\n{"n": 1}' and a.images == (Image(png, "image/png"),)
    assert b.ok and b.content == '{"summary": 1}' and b.details == {"rows": [1, 2, 3]}


def test_output_is_encoded_capped_and_falls_back_to_repr(tmp_path: Any) -> None:
    with ActorSystem(data_dir=tmp_path, max_output_chars=100) as system:
        @tool
        def big() -> str:
            """Too much."""
            return "x" * 1000

        @tool
        def odd() -> Any:
            """Not JSON."""
            return {"obj": object()}

        @tool
        def nan() -> Any:
            """Not finite."""
            return [float("nan"), 1.5]

        for t in (big, odd, nan):
            system.register(t)
        a, b, c = system.start_loop().run_turn([ToolCall(n, n, "{}") for n in ("big", "odd", "nan")])
    assert a.ok and a.content.startswith("x" * 100 + "\n[output truncated") and "1,000 characters in all" in a.content
    assert b.ok and b.content.startswith(REPR_MARK) and "object object at" in b.content
    assert c.ok and c.content == "[null, 1.5]"


def test_a_hung_call_times_out_at_its_deadline_and_sees_its_cancellation(system: ActorSystem) -> None:
    release = threading.Event()
    seen_cancel: list[str | None] = []
    recorder = Recorder()
    system.subscribe(recorder)

    @tool(timeout_ms=150)
    def hang(ctx: Mapping[str, Any]) -> str:
        """Hang until released."""
        ctx["cancel"].wait(WAIT_S)
        seen_cancel.append(ctx["cancel"].reason)
        release.wait(WAIT_S)
        return "late"

    system.register(hang)
    started = time.monotonic()
    [result] = system.start_loop().run_turn([ToolCall("h", "hang", "{}")])
    elapsed = time.monotonic() - started
    assert result.error_kind is ErrorKind.TIMEOUT and result.retryable
    assert "within its timeout of 150 ms" in result.content
    assert result.duration_ms >= 150 and elapsed < WAIT_S  # answered before the tool ended
    assert wait_for(lambda: seen_cancel == ["timeout"])
    stats = system.stats()
    assert (stats["abandoned_threads_running"], stats["abandoned_threads_total"]) == (1, 1)
    release.set()
    assert wait_for(lambda: recorder.kinds("h") == ["started", "timed_out", "late"])
    assert wait_for(lambda: system.stats()["abandoned_threads_running"] == 0)


def test_an_async_tool_is_really_cancelled_at_its_deadline(system: ActorSystem) -> None:
    cancelled = threading.Event()

    @tool(timeout_ms=100)
    async def slow() -> str:
        """Sleep asynchronously."""
        try:
            await asyncio.sleep(WAIT_S)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    @tool
    async def quick(n: int) -> int:
        """Await a little."""
        await asyncio.sleep(0)
        return n * 2

    system.register(slow)
    system.register(quick)
    a, b = system.start_loop().run_turn([ToolCall("a", "slow", "{}"), ToolCall("b", "quick", '{"n": 21}')])
    assert a.error_kind is ErrorKind.TIMEOUT
    assert b.ok and b.content == "42"
    assert cancelled.wait(WAIT_S)


def test_a_slow_call_does_not_delay_the_others_of_a_parallel_turn(system: ActorSystem) -> None:
    """The quick call's result comes before the stuck call's deadline. A loaded machine's
    thread can begin the quick call after 200 ms: then again with a stuck call of a longer
    deadline (a quick call held behind the stuck one would end after it at any length)."""
    release = threading.Event()

    def stuck_for(ms: int) -> Any:
        @tool(name=f"stuck_{ms}", timeout_ms=ms)
        def stuck() -> str:
            """Stuck."""
            release.wait(WAIT_S)
            return "late"

        return stuck

    @tool
    def quick() -> str:
        """Quick."""
        return "quick"

    system.register(quick)
    try:
        for ms in (200, 800, 3200):
            system.register(stuck_for(ms))
            results = system.start_loop(f"s{ms}").run_turn(
                [ToolCall("s", f"stuck_{ms}", "{}"), ToolCall("q", "quick", "{}")])
            assert [r.error_kind for r in results] == [ErrorKind.TIMEOUT, None]
            if results[1].duration_ms < results[0].duration_ms:
                break
        assert results[1].duration_ms < results[0].duration_ms, [r.duration_ms for r in results]
    finally:
        release.set()


def test_ctx_carries_the_session_and_call(system: ActorSystem) -> None:
    seen: dict[str, Any] = {}

    @tool
    def look(ctx: Mapping[str, Any]) -> str:
        """Look at ctx."""
        seen.update(ctx)
        (ctx["data_dir"] / "note.txt").write_text("hi")
        return "ok"

    system.register(look)
    deps = {"db": object()}
    loop = system.start_loop("sess-1", withheld=["b", "a"], deps=deps)
    loop.run_turn([ToolCall("call-9", "look", "{}")])
    assert seen["session_id"] == "sess-1" and seen["call_id"] == "call-9"
    assert seen["data_dir"] == (system.data_dir / "sessions" / "sess-1").resolve()
    assert (seen["data_dir"] / "note.txt").read_text() == "hi"
    assert seen["withheld"] == ("a", "b") and seen["deps"] is deps
    assert seen["loop"] == loop.ref
    assert seen["deadline"] > time.monotonic() and not seen["cancel"].cancelled


def test_a_session_folder_is_made_on_first_use_only(system: ActorSystem) -> None:
    folder = system.data_dir / "sessions" / "quiet"
    loop = system.start_loop("quiet")
    loop.run_turn([])
    loop.run_turn([ToolCall("c", "no_such_tool", "{}")])  # refused: nothing ran
    assert not folder.exists()
    assert loop.data_dir.is_dir() and loop.data_dir.resolve() == folder.resolve()  # the host asked for it


@pytest.mark.parametrize("session_id", ["..", "../x", "a/b", "", "/abs", "a\\b", ".hidden", "x" * 129, "a..b"])
def test_a_session_id_that_could_escape_data_dir_is_refused(system: ActorSystem, session_id: str) -> None:
    with pytest.raises(ValueError, match="session id"):
        system.start_loop(session_id)


def test_arun_turn_never_blocks_the_event_loop(system: ActorSystem) -> None:
    ticked = threading.Event()  # the caller's event loop ticked 5 times while the call ran

    @tool
    def wait_a_bit() -> str:
        """Block until the caller's event loop has ticked 5 times."""
        return "done" if ticked.wait(WAIT_S) else "the event loop was blocked"

    system.register(wait_a_bit)
    loop = system.start_loop()

    async def main() -> tuple[list[Any], int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
                if ticks >= 5:
                    ticked.set()

        task = asyncio.create_task(ticker())
        results = await loop.arun_turn([ToolCall("a", "wait_a_bit", "{}")])
        task.cancel()
        return results, ticks

    results, ticks = asyncio.run(main())
    assert results[0].content == "done"
    assert ticks >= 5  # the event loop kept running while the call did


def test_submit_turn_returns_a_future(system: ActorSystem) -> None:
    @tool
    def one() -> int:
        """One."""
        return 1

    system.register(one)
    future = system.start_loop().submit_turn([ToolCall("a", "one", "{}")])
    assert future.result(WAIT_S)[0].content == "1"
    assert not future.cancel()


def test_stopping_a_loop_answers_its_running_calls_as_cancelled(system: ActorSystem) -> None:
    entered = threading.Event()

    @tool
    def wait_for_cancel(ctx: Mapping[str, Any]) -> str:
        """Wait to be cancelled."""
        entered.set()
        ctx["cancel"].wait(WAIT_S)
        return "stopped"

    system.register(wait_for_cancel)
    loop = system.start_loop()
    future = loop.submit_turn([ToolCall("w", "wait_for_cancel", "{}")])
    assert entered.wait(WAIT_S)
    loop.stop()
    [result] = future.result(WAIT_S)
    assert result.error_kind is ErrorKind.CANCELLED and "session stopped" in result.content
    assert not loop.alive
    with pytest.raises(pykka.ActorDeadError):
        loop.submit_turn([])


def test_stop_leaves_no_thread_running(tmp_path: Any) -> None:
    before = set(threading.enumerate())
    entered = threading.Event()

    @tool
    def cooperative(ctx: Mapping[str, Any]) -> str:
        """Runs until cancelled."""
        entered.set()
        ctx["cancel"].wait(WAIT_S)
        return "bye"

    system = ActorSystem(data_dir=tmp_path)
    system.register(cooperative)
    loops = [system.start_loop() for _ in range(3)]
    futures = [loop.submit_turn([ToolCall("c", "cooperative", "{}")]) for loop in loops]
    assert entered.wait(WAIT_S)
    for loop in loops[:2]:
        loop.run_turn([])
    system.stop()
    for future in futures:
        assert future.result(WAIT_S)[0].error_kind is ErrorKind.CANCELLED
    assert extra_threads(before) == []
    with pytest.raises(RuntimeError, match="stopped"):
        system.start_loop()
    system.stop()  # idempotent


def test_a_raising_event_subscriber_cannot_fail_a_call(system: ActorSystem) -> None:
    def broken(event: Any) -> None:
        raise RuntimeError("subscriber bug")

    system.subscribe(broken)

    @tool
    def ok() -> str:
        """Ok."""
        return "ok"

    system.register(ok)
    assert system.start_loop().run_turn([ToolCall("a", "ok", "{}")])[0].content == "ok"
