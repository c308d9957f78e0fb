"""``Loop.set_withheld`` sets the withheld names in the caller's thread, on the running
loop's turns: a turn started after it returns sees the new set, a turn being prepared
meanwhile sees the old set or the new one whole (never a mix), and a loop that is not
running refuses it as before."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from rho_actors import ActorSystem, NotRunningError, ToolCall, tool
from rho_actors.loop.handle import withheld_names
from rho_actors.loop.turns import Turns
from rho_actors.otp.actor import kill
from rho_actors.tool import ErrorKind, ToolResult

from .conftest import WAIT_S, wait_for

pytestmark = pytest.mark.timeout(60)


@tool
def x() -> str:
    """Answer x."""
    return "x"


@tool
def y() -> str:
    """Answer y."""
    return "y"


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    system = ActorSystem(data_dir=tmp_path / "data", shutdown_ms=1_000)
    try:
        system.register(x)
        system.register(y)
        yield system
    finally:
        system.stop()


def _outcomes(results: list[ToolResult]) -> list[str]:
    return [r.content if r.ok else str(r.error_kind) for r in results]


XY = [ToolCall("c1", "x", "{}"), ToolCall("c2", "y", "{}")]


def test_a_turn_being_prepared_keeps_the_set_it_started_with(system: ActorSystem, monkeypatch: Any) -> None:
    loop = system.start_loop("s", withheld=["x"])
    turns: Turns = loop._turns()
    preparing, go = threading.Event(), threading.Event()
    prepare = turns._prepare

    def paused(slot: Any, *args: Any) -> Any:
        if slot.index == 1:  # the first call is prepared: change the set before the second is
            preparing.set()
            assert go.wait(WAIT_S)
        return prepare(slot, *args)

    monkeypatch.setattr(turns, "_prepare", paused)
    results: list[list[ToolResult]] = []
    runner = threading.Thread(target=lambda: results.append(loop.run_turn(XY, timeout_s=WAIT_S)))
    runner.start()
    assert preparing.wait(WAIT_S)
    loop.set_withheld(["y"])  # from this thread, while the turn is between its two calls
    go.set()
    runner.join(WAIT_S)
    assert _outcomes(results[0]) == [ErrorKind.WITHHELD, "y"]  # the old set, whole
    monkeypatch.undo()
    assert _outcomes(loop.run_turn(XY, timeout_s=WAIT_S)) == ["x", ErrorKind.WITHHELD]  # the next turn: the new set
    assert [i.name for i in loop.offered()] == ["x"]


def test_turns_racing_set_withheld_from_other_threads_each_see_one_set_whole(system: ActorSystem) -> None:
    loop = system.start_loop("s", withheld=["x"])
    errors: list[BaseException] = []

    def flip(first: list[str], second: list[str]) -> None:
        try:
            for _ in range(1_000):
                loop.set_withheld(first)
                loop.set_withheld(second)
        except BaseException as exc:  # the test fails on it below
            errors.append(exc)

    flippers = [threading.Thread(target=flip, args=(["x"], ["y"])), threading.Thread(target=flip, args=(["y"], ["x"]))]
    for t in flippers:
        t.start()
    seen: set[tuple[str, ...]] = set()
    try:
        for _ in range(100):
            seen.add(tuple(_outcomes(loop.run_turn(XY, timeout_s=WAIT_S))))
            if not any(t.is_alive() for t in flippers):
                break
    finally:
        for t in flippers:
            t.join(WAIT_S)
    assert not errors
    assert seen <= {(ErrorKind.WITHHELD, "y"), ("x", ErrorKind.WITHHELD)}  # never both offered, never both withheld


def test_a_set_made_in_another_thread_applies_to_the_next_turn_here(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    setter = threading.Thread(target=loop.set_withheld, args=(["x", "y"],))
    setter.start()
    setter.join(WAIT_S)
    assert _outcomes(loop.run_turn(XY, timeout_s=WAIT_S)) == [ErrorKind.WITHHELD, ErrorKind.WITHHELD]
    assert loop.offered() == []


def test_set_withheld_on_a_stopped_loop_raises_not_running(system: ActorSystem) -> None:
    loop = system.start_loop("s")
    loop.stop()
    with pytest.raises(NotRunningError, match="stopped") as caught:
        loop.set_withheld(["x"])
    assert isinstance(caught.value, pykka.ActorDeadError)
    with pytest.raises(NotRunningError, match="stopped"):  # the stop is what is wrong, as before
        loop.set_withheld("x")


def test_set_withheld_after_a_restart_lands_on_the_new_loop(system: ActorSystem) -> None:
    loop = system.start_loop("s", withheld=["x"])
    old = loop.ref.actor_urn
    kill(loop.ref)
    assert wait_for(lambda: loop.alive and system.whereis("loop:s") is not None
                    and system.whereis("loop:s").actor_urn != old)  # type: ignore[union-attr]
    loop.set_withheld(["y"])
    assert _outcomes(loop.run_turn(XY, timeout_s=WAIT_S)) == ["x", ErrorKind.WITHHELD]


def test_withheld_names_takes_plain_collections_and_normalises_str_subclasses() -> None:
    class Lying(str):
        def __hash__(self) -> int:
            return 0

        def __eq__(self, other: object) -> bool:
            return True

    for names in (["a", "b"], ("a", "b"), {"a", "b"}, frozenset({"a", "b"}), (n for n in "ab"), {"a": 1, "b": 2}):
        assert withheld_names(names) == frozenset({"a", "b"})
    normalised = withheld_names([Lying("a"), "b"])
    assert normalised == frozenset({"a", "b"}) and all(type(n) is str for n in normalised)
    with pytest.raises(TypeError, match="must be a str, got int"):
        withheld_names(["a", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="single string"):
        withheld_names(b"ab")  # type: ignore[arg-type]


def test_withheld_names_given_again_are_their_one_set_and_still_checked() -> None:
    class Same(str):  # equal to its plain str, hashed as it: found among the names given lately
        pass

    class Raising(str):
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no comparing")

        __hash__ = str.__hash__

    first = withheld_names(["p", "q"])
    assert withheld_names(("p", "q")) is first and withheld_names(["p", "q"]) is first
    again = withheld_names([Same("p"), "q"])
    assert again == first and all(type(n) is str for n in again)
    raising = withheld_names([Raising("p"), "q"])  # its __eq__ raised in the look-up: checked as any other
    assert raising == frozenset({"p", "q"}) and all(type(n) is str for n in raising)
    with pytest.raises(TypeError, match="must be a str, got list"):
        withheld_names(["p", ["q"]])  # type: ignore[list-item]  # unhashable: not found, then refused by name
