"""A large offer is copied with the garbage collector paused (declarations.toolset):
each caller still gets its own copies, and the collector's state is the host's again
after every block, nested or concurrent."""

from __future__ import annotations

import gc
import threading
from pathlib import Path
from typing import Any

from rho_actors import ActorSystem
from rho_actors.declarations.toolset import no_collection


class Echo:
    def __init__(self, index: int) -> None:
        self.index = index

    def name(self) -> str:
        return f"echo_{self.index}"

    def description(self) -> str:
        return "Echo a text."

    def parameter_schema(self) -> dict[str, Any]:
        return {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    def run(self, args: dict[str, Any], ctx: Any) -> str:
        return str(args["text"])


def test_a_large_offer_gives_own_copies_and_leaves_the_collector_on(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path) as system:
        system.register_many([Echo(i) for i in range(300)])
        loop = system.start_loop()
        first, second = loop.offered(), loop.offered()
        assert gc.isenabled()
        assert [i.name for i in first] == [f"echo_{i}" for i in range(300)]
        first[0].parameter_schema["properties"]["text"]["type"] = "integer"
        assert second[0].parameter_schema["properties"]["text"]["type"] == "string"
        assert loop.offered()[0].parameter_schema["properties"]["text"]["type"] == "string"


def test_nested_and_concurrent_pauses_restore_the_collector_once_all_have_left() -> None:
    assert gc.isenabled()
    inside = threading.Event()
    release = threading.Event()

    def other() -> None:
        with no_collection():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    with no_collection():
        with no_collection():
            assert not gc.isenabled()
        assert not gc.isenabled()
        thread.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other thread's block still runs
    release.set()
    thread.join(10)
    assert gc.isenabled()


def test_a_collector_the_host_disabled_stays_disabled() -> None:
    gc.disable()
    try:
        with no_collection():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
