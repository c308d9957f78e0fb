"""Copies of a large offer of tools: a copy kept keeps no other schemas, copies are each
their own, first reads from many threads agree, and copies dropped by many threads at
once are each counted by their chunk."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, Loop
from rho_actors.declarations.toolset import MarshalledSchema
from rho_actors.tool import SCHEMA_SLOT, ToolInfo

from .conftest import WAIT_S

pytestmark = pytest.mark.timeout(120)


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


def _offer_of(count: int) -> tuple[list[Any], tuple[bytes, ...]]:
    from rho_actors.declarations.arguments import make_validator
    from rho_actors.declarations.toolset import ToolEntry, offer_chunks

    validator = make_validator({"type": "object"})
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    entries = [ToolEntry(tool=None, info=ToolInfo(f"t{i}", "d", dict(schema), 1_000, "parallel"), validator=validator,
                         origin="test") for i in range(count)]
    chunks = offer_chunks(entries)
    assert chunks is not None
    return entries, chunks


def test_copies_dropped_by_many_threads_at_once_are_each_counted_by_their_chunk() -> None:
    """A chunk of 512 copies counts the drops of one copy in 8 and lets go of its bytes
    once at most an eighth of those are left: ``_left -= 1`` from the dropping threads
    was a read and a write, and two drops at once could count one (the chunk then kept
    its bytes, and every decoded schema of them, for as long as one copy lived). With
    exactly that eighth kept, every other copy dropped by 16 threads at once, the
    chunk must have let go, and the kept copies still read their schemas."""

    from rho_actors.declarations import toolset

    entries, chunks = _offer_of(512)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # thread switches as often as they can come
    try:
        for _ in range(20):
            copies = toolset.copied_infos(entries, chunks)
            chunk = ToolInfo.__dict__["parameter_schema"]._get(copies[0])
            assert type(chunk) is toolset._Chunk
            tellers = len(copies[::toolset._SAMPLE])
            kept = copies[:tellers // 8 * toolset._SAMPLE:toolset._SAMPLE]  # the floor's telling copies
            assert len(kept) == tellers // 8
            shares: list[list[Any]] = [[] for _ in range(16)]
            for index, made in enumerate(copies):
                if index % toolset._SAMPLE or index >= len(kept) * toolset._SAMPLE:
                    shares[index % 16].append(made)
            del copies, made
            barrier = threading.Barrier(16)

            def drop(share: list[Any], barrier: threading.Barrier = barrier) -> None:
                barrier.wait(WAIT_S)
                share.clear()

            threads = [threading.Thread(target=drop, args=(share,)) for share in shares]
            del shares
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(WAIT_S)
                assert not thread.is_alive()
            assert chunk._blob is None and chunk.copies == []  # let go: every drop was counted
            schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
            assert [made.parameter_schema for made in kept] == [schema] * len(kept)
    finally:
        sys.setswitchinterval(switch)
