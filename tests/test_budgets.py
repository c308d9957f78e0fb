"""Result budgets (DESIGN §4 "Budgets"): the results of one turn and of one session are
bounded in bytes; a result past either is an ``output_limit`` error saying so, and
``stats()`` shows the caps and each session's use. Images over the largest provider
limit are refused before they leave a worker (and when its reply is decoded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ErrorKind, Image, ToolCall, ToolResult
from rho_actors.budgets import result_bytes
from rho_actors.sandbox import wire
from tests.conftest import WAIT_S

MIB = 2**20


class Pictures:
    """Returns two fresh images of ``mib`` MiB each."""

    name = staticmethod(lambda: "pictures")
    description = staticmethod(lambda: "Two pictures.")
    parameter_schema = staticmethod(lambda: {"type": "object", "properties": {"mib": {"type": "number"}}})

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> Any:
        size = int(args["mib"] * 2**20)
        return [Image(b"\x89PNG" + bytes(size - 4), "image/png"), Image(b"\x89PNG" + bytes(size - 4)), "two"]


def _turn(loop: Any, count: int, mib: float, prefix: str = "c") -> list[Any]:
    calls = [ToolCall(f"{prefix}{i}", "pictures", {"mib": mib}) for i in range(count)]
    results: list[Any] = loop.run_turn(calls, timeout_s=WAIT_S)
    return results


def test_a_wide_turn_of_big_images_is_held_to_its_budget(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, max_turn_result_bytes=10 * MIB, max_session_result_bytes=24 * MIB,
                     shutdown_ms=1_000) as system:
        system.register(Pictures)
        loop = system.start_loop("s1")
        results = _turn(loop, 16, 1.0)  # 16 x 2 MiB: 32 MiB asked of a 10 MiB turn
        kept = [r for r in results if r.ok]
        refused = [r for r in results if not r.ok]
        assert len(results) == 16 and len(kept) == 4 and len(refused) == 12
        for r in refused:
            assert r.error_kind is ErrorKind.OUTPUT_LIMIT and r.images == ()
            assert "over this turn's result budget of 10485760 bytes" in r.content
        budgets = system.stats()["budgets"]
        assert budgets["max_turn_result_bytes"] == 10 * MIB and budgets["max_session_result_bytes"] == 24 * MIB
        use = budgets["sessions"]["s1"]
        assert use["refused"] == 12 and use["turn_bytes"] == 0
        assert 8 * MIB <= use["session_bytes"] <= 10 * MIB

        # the session's budget does not refill: the next turns run into it
        _turn(loop, 4, 1.0, "d")
        third = _turn(loop, 4, 1.0, "e")
        assert any("over this session's result budget of 25165824 bytes" in r.content for r in third)
        assert system.stats()["budgets"]["sessions"]["s1"]["session_bytes"] <= 24 * MIB

        # another session has its own budget
        [fresh] = _turn(system.start_loop("s2"), 1, 1.0, "f")
        assert fresh.ok and len(fresh.images) == 2


def test_the_default_budgets_are_documented_settings(system: ActorSystem) -> None:
    budgets = system.stats()["budgets"]
    assert budgets["max_turn_result_bytes"] == 64 * MIB
    assert budgets["max_session_result_bytes"] == 512 * MIB
    assert budgets["max_transcript_image_bytes"] == 256 * MIB
    with pytest.raises(ValueError, match="max_turn_result_bytes must be a positive int"):
        ActorSystem(max_turn_result_bytes=0)


def test_an_image_over_the_largest_provider_limit_is_refused_when_sent_back(system: ActorSystem) -> None:
    assert wire.MAX_IMAGE_BYTES == 20 * MIB
    system.register(Pictures, untrusted=True)
    loop = system.start_loop("s1")
    [big] = _turn(loop, 1, 21.0)
    assert big.error_kind is ErrorKind.RAISED  # the worker refuses to send it (the host would refuse it too)
    assert "returned content blocks that cannot be sent back" in big.content
    assert f"{21 * MIB:,} bytes of data, more than the limit of {wire.MAX_IMAGE_BYTES:,}" in big.content
    [small] = _turn(loop, 1, 0.5, "g")
    assert small.ok and len(small.images) == 2


@pytest.mark.parametrize(("text", "size"), [
    ("", 0), ("ok", 2), ("x" * 1000, 1000), ("é", 2), ("😀", 4), ("a\ud800b", 5), ("tab\tand\nnewline", 15),
])
def test_a_texts_budget_cost_is_its_utf8_bytes(text: str, size: int) -> None:
    """A result's text costs its UTF-8 bytes (a lone surrogate three, as it is written
    out): an ASCII text its length, counted without encoding it."""
    assert result_bytes(ToolResult("c1", "t", True, text)) == size
