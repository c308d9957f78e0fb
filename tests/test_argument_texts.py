"""Arguments crossing the API: an integer too long for JSON text is refused alike as
text or as a mapping, and an arguments text's length is its own, not what ``len`` says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rho_actors import (
    ActorSystem,
    ErrorKind,
    ToolCall,
    tool,
)

from .conftest import WAIT_S
from .helpers import make_tool

pytestmark = pytest.mark.timeout(120)


def test_an_integer_too_long_for_json_text_is_refused_the_same_as_text_or_as_a_mapping(system: ActorSystem) -> None:
    """Before: as a decoded mapping it reached the tool (whose str() of it then raised);
    as text its refusal read Python's advice (``use sys.set_int_max_str_digits()``)."""

    @tool
    def takes(v: dict[str, int]) -> str:
        """Take a mapping of integers."""
        return "ran"

    system.register(takes)
    loop = system.start_loop("n")
    huge = 10**5000
    as_text = '{"v": {"n": ' + "9" * 5000 + "}}"
    results = loop.run_turn([ToolCall("t", "takes", as_text), ToolCall("m", "takes", {"v": {"n": huge}}),
                             ToolCall("ok", "takes", {"v": {"n": 10**600}})], timeout_s=WAIT_S)
    assert [r.error_kind for r in results[:2]] == [ErrorKind.INVALID_JSON] * 2
    assert results[0].content.endswith("an integer of more than 4,300 digits (the most JSON text here may hold)")
    assert results[1].content.endswith("$.v.n: an integer of more than 4,300 digits (the most JSON text here may hold)")
    assert "sys." not in results[0].content
    assert results[2].ok


class _Short(str):
    """Arguments text whose ``len()`` says it is empty."""

    __slots__ = ()

    def __len__(self) -> int:
        return 0


def test_the_length_of_arguments_text_is_its_own_not_what_len_says(tmp_path: Path) -> None:
    """A ``str`` subclass whose ``__len__`` lied passed the 1,000,000-character bound
    and, said to be empty, had a linear schema's arguments of any size checked
    uncounted: both now count the text's own characters."""
    ran: list[int] = []
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}}

    def count(args: Any, ctx: Any) -> str:
        ran.append(len(args["a"]))
        return "ok"

    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        system.register(make_tool("count", count, schema=schema))
        loop = system.start_loop("lying")
        huge = _Short(json.dumps({"a": [0] * 600_000}, separators=(",", ":")))
        large = _Short(json.dumps({"a": [0] * 250_000}, separators=(",", ":")))
        results = loop.run_turn([ToolCall("c1", "count", huge), ToolCall("c2", "count", large)], timeout_s=WAIT_S * 3)
    assert [r.error_kind for r in results] == [ErrorKind.INVALID_JSON, ErrorKind.INVALID_ARGUMENTS], results
    assert "1,200,007 characters long" in results[0].content
    assert "$: validation stopped after " in results[1].content  # its budget, or its time bound
    assert ran == []
