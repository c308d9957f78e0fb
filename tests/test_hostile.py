"""Regressions from a hostile review: inputs and tools that once stopped a deadline, lost a
result or took actors down."""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import Any

import pykka
import pytest

from rho_actors import ActorSystem, ErrorKind, ToolCall, tool
from rho_actors.encoding import REPR_MARK
from rho_actors.runtime import DEFAULT_MAX_TIMEOUT_MS

from .conftest import WAIT_S
from .helpers import make_tool


def schema_tool(name: str, schema: dict[str, Any], result: Any = "ok", **options: Any) -> Any:
    return make_tool(name, result, schema=schema, **options)


def test_a_huge_timeout_is_cut_to_the_systems_bound_and_deadlines_keep_working(system: ActorSystem) -> None:
    release = threading.Event()
    system.register(schema_tool("forever", {"type": "object"}, lambda a, c: release.wait(WAIT_S),
                                timeout_ms=sys.maxsize))
    system.register(schema_tool("short", {"type": "object"}, lambda a, c: release.wait(WAIT_S), timeout_ms=100))
    assert [i.timeout_ms for i in system.tools()] == [DEFAULT_MAX_TIMEOUT_MS, 100]  # ActorSystem(max_timeout_ms=)
    loop = system.start_loop()
    forever = loop.submit_turn([ToolCall("f", "forever", "{}")])
    [short] = loop.run_turn([ToolCall("s", "short", "{}")])
    assert short.error_kind is ErrorKind.TIMEOUT
    release.set()
    assert forever.result(WAIT_S)[0].content == "true"


def test_turns_racing_a_stop_all_get_their_results(tmp_path: Any) -> None:
    system = ActorSystem(data_dir=tmp_path, shutdown_ms=500)
    system.register(schema_tool("quick", {"type": "object"}))
    loops = [system.start_loop() for _ in range(4)]
    futures: list[Any] = []
    go = threading.Event()

    def submit(loop: Any) -> None:
        go.wait(WAIT_S)
        for i in range(300):
            try:
                futures.append(loop.submit_turn([ToolCall(str(i), "quick", "{}")]))
            except pykka.ActorDeadError:
                return

    threads = [threading.Thread(target=submit, args=(loop,)) for loop in loops]
    for thread in threads:
        thread.start()
    go.set()
    system.stop()
    for thread in threads:
        thread.join(WAIT_S)
    for future in futures:
        [result] = future.result(WAIT_S)
        assert result.ok or result.error_kind is ErrorKind.CANCELLED


def test_a_subscriber_that_exits_cannot_stop_the_system(system: ActorSystem) -> None:
    def exits(event: Any) -> None:
        raise KeyboardInterrupt

    system.subscribe(exits)
    system.register(schema_tool("quick", {"type": "object"}))
    loop = system.start_loop()
    for _ in range(2):
        assert loop.run_turn([ToolCall("q", "quick", "{}")])[0].ok
    assert loop.alive and system.whereis("registry") is not None


def test_a_tool_whose_getattr_exits_is_read_with_defaults(system: ActorSystem) -> None:
    class Nasty:
        def name(self) -> str:
            return "nasty"

        def description(self) -> str:
            return "Attributes it lacks exit the process."

        def parameter_schema(self) -> dict[str, Any]:
            return {"type": "object"}

        def run(self, args: Any, ctx: Any) -> str:
            return "fine"

        def __getattr__(self, name: str) -> Any:
            raise SystemExit(f"no {name}")

    registration = system.register(Nasty())
    assert registration.info is not None and registration.info.timeout_ms == 30_000
    assert system.start_loop().run_turn([ToolCall("n", "nasty", "{}")])[0].content == "fine"
    assert system.whereis("declarations") is not None and system.whereis("registry") is not None


def test_a_checker_that_breaks_fails_only_its_own_call(system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    from rho_actors.loop import prepare

    # the checks' time bound (1 s) is not what this tests: at a load of 28 the cycle's recursion took longer
    monkeypatch.setattr(prepare, "MAX_VALIDATION_S", WAIT_S)
    system.register(schema_tool("pattern", {"type": "object", "properties": {"re": {"type": "string",
                                                                                    "format": "regex"}}}))
    system.register(schema_tool("cycle", {"type": "object", "$defs": {"a": {"$ref": "#/$defs/a"}},
                                          "properties": {"x": {"$ref": "#/$defs/a"}}}))
    system.register(schema_tool("quick", {"type": "object"}))
    results = system.start_loop().run_turn([
        ToolCall("p", "pattern", '{"re": "(?=a)"}'),  # RE2 checks format "regex": no lookaround
        ToolCall("c", "cycle", '{"x": 1}'),
        ToolCall("q", "quick", "{}"),
    ])
    assert [r.error_kind for r in results] == [ErrorKind.INVALID_ARGUMENTS, ErrorKind.INVALID_ARGUMENTS, None]
    assert 'is not a valid "regex"' in results[0].content and "RecursionError" in results[1].content


def test_odd_host_input_gets_a_clear_error(system: ActorSystem) -> None:
    class Name(str):
        def __hash__(self) -> int:
            raise RuntimeError("no hash")

        def __str__(self) -> str:
            raise RuntimeError("no str")

    system.register(schema_tool("quick", {"type": "object"}))
    loop = system.start_loop("s1")
    [result] = loop.run_turn([ToolCall("q", Name("quick"), "{}")])
    assert result.ok and type(result.name) is str
    with pytest.raises(TypeError, match=r"call 1 of the turn: ToolCall.name must be a str, got int"):
        loop.run_turn([ToolCall("a", "quick"), ToolCall("b", 5)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="single string"):
        loop.set_withheld("quick")
    with pytest.raises(TypeError, match="must be a str"):
        loop.set_withheld(["quick", 3])  # type: ignore[list-item]
    assert [i.name for i in loop.offered()] == ["quick"]  # nothing half-applied
    with pytest.raises(ValueError, match="held by"):
        system.start_loop("s1")
    assert loop.alive


def test_a_generator_is_output_not_a_coroutine(system: ActorSystem) -> None:
    system.register(schema_tool("gen", {"type": "object"}, lambda a, c: (i for i in range(3))))
    [result] = system.start_loop().run_turn([ToolCall("g", "gen", "{}")])
    assert result.ok and result.content.startswith(REPR_MARK + "<generator object")


def test_declarations_handed_out_are_copies(system: ActorSystem) -> None:
    @tool
    def count(n: int) -> int:
        """Echo n."""
        return n

    system.register(count)
    loop = system.start_loop()
    loop.offered()[0].parameter_schema["properties"]["n"]["type"] = "string"
    system.tools()[0].parameter_schema["required"] = []
    assert loop.run_turn([ToolCall("c", "count", '{"n": "x"}')])[0].error_kind is ErrorKind.INVALID_ARGUMENTS
    assert loop.declarations("mcp")[0]["inputSchema"]["properties"]["n"]["type"] == "integer"


def test_a_renamed_tool_is_offered_under_its_new_name_only(system: ActorSystem) -> None:
    names = ["before"]

    class Renamed:
        @staticmethod
        def name() -> str:
            return names[0]

        description = staticmethod(lambda: "It changes its name.")
        parameter_schema = staticmethod(lambda: {"type": "object"})
        run = staticmethod(lambda args, ctx: names[0])

    system.register(Renamed)
    names[0] = "after"
    system.register(Renamed)
    assert [i.name for i in system.tools()] == ["after"]
    [old] = system.start_loop().run_turn([ToolCall("o", "before", "{}")])
    assert old.error_kind is ErrorKind.UNAVAILABLE and "renamed to 'after'" in old.content


def test_ctx_offers_whereis_for_named_actors(system: ActorSystem) -> None:
    seen: list[Any] = []

    @tool
    def look(ctx: Mapping[str, Any]) -> str:
        """Look up the registry by name."""
        seen.append(ctx["whereis"]("registry"))
        return "ok"

    system.register(look)
    system.start_loop().run_turn([ToolCall("l", "look", "{}")])
    assert seen == [system.whereis("registry")]
