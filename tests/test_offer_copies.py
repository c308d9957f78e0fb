"""What ``Loop.offered()`` hands out is the caller's own: each ``ToolInfo`` equal to the
checked declaration, in registration order, its schema copied on its first read
(``tool.lazy_copies``) so that no change to it reaches the registry, the loop, other
sessions or a later offer; every dataclass use (equality, repr, pickle, replace, asdict,
pydantic) sees the values. A large offer is copied with the garbage collector paused
(declarations.toolset): the collector's state is the host's again after every block,
nested or concurrent."""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from rho_actors import ActorSystem, ToolCall, ToolInfo, to_dialect
from rho_actors.declarations.arguments import make_validator
from rho_actors.declarations.checks import check_declaration, read_declaration
from rho_actors.declarations.toolset import MarshalledSchema, ToolEntry, copied_infos, no_collection, offer_chunks
from rho_actors.tool import lazy_copies
from tests.conftest import WAIT_S


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
            release.wait(WAIT_S)

    thread = threading.Thread(target=other)
    with no_collection():
        with no_collection():
            assert not gc.isenabled()
        assert not gc.isenabled()
        thread.start()
        assert inside.wait(WAIT_S)
    assert not gc.isenabled()  # the other thread's block still runs
    release.set()
    thread.join(WAIT_S)
    assert gc.isenabled()


def test_a_collector_the_host_disabled_stays_disabled() -> None:
    gc.disable()
    try:
        with no_collection():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


# --- each returned ToolInfo copies its schema on its first read (tool.lazy_copies) -----------


NESTED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "enum": ["a", "b"], "default": "a"},
        "items": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "integer"}}}},
        "ratio": {"type": "number", "minimum": 0.5},
        "flag": {"type": ["boolean", "null"]},
    },
    "required": ["text"],
    "additionalProperties": False,
}


class Nested:
    def __init__(self, index: int) -> None:
        self.index = index

    def name(self) -> str:
        return f"nested_{self.index}"

    def description(self) -> str:
        return f"Tool number {self.index}."

    def parameter_schema(self) -> dict[str, Any]:
        return copy.deepcopy(NESTED)

    def timeout_ms(self) -> int:
        return 1_000 + self.index

    def concurrency(self) -> str:
        return "exclusive" if self.index % 2 else "parallel"

    def run(self, args: dict[str, Any], ctx: Any) -> str:
        return str(args["text"])


def _vandalise(schema: dict[str, Any]) -> None:
    """Change every level of ``schema`` in place (values, lists, nested dicts, keys)."""
    props = schema["properties"]
    props["text"]["enum"].append("c")
    props["text"]["type"] = "integer"
    props["items"]["items"]["properties"]["n"]["type"] = "string"
    props["flag"]["type"].clear()
    props["ratio"]["minimum"] = -1
    del props["items"]
    schema["required"].append("ratio")
    schema["additionalProperties"] = True
    schema["new"] = {"x": 1}


def _checked(tool: Any) -> ToolInfo:
    return check_declaration(read_declaration(tool))


@pytest.mark.parametrize("count", [3, 300])  # below and above the collector pause
def test_mutating_any_returned_schema_or_the_list_changes_nothing_else(tmp_path: Path, count: int) -> None:
    tools = [Nested(i) for i in range(count)]
    with ActorSystem(data_dir=tmp_path) as system:
        system.register_many(tools)
        loop, other = system.start_loop("s1"), system.start_loop("s2")
        mine, before_other = loop.offered(), other.offered()
        declarations = loop.declarations("openai")
        for info in mine:
            _vandalise(info.parameter_schema)
        assert mine[0].parameter_schema["properties"]["text"]["type"] == "integer"  # the change is kept
        mine.clear()
        expected = [_checked(t) for t in tools]
        assert loop.offered() == expected  # a later offer of the same loop
        assert other.offered() == expected == before_other  # another session's, before and after
        assert [e.info for e in loop.offered_entries()] == expected  # the registry's entries
        assert system.tools() == expected
        assert loop.declarations("openai") == declarations == [to_dialect(i, "openai") for i in expected]
        # the validator still checks the registered schema: "text" is required and a string
        [missing, typed, ok] = loop.run_turn([ToolCall("c1", "nested_0", '{"ratio": 1}'),
                                              ToolCall("c2", "nested_0", '{"text": 5}'),
                                              ToolCall("c3", "nested_0", '{"text": "b", "items": []}')],
                                             timeout_s=WAIT_S)
        assert (missing.error_kind, typed.error_kind) == ("invalid_arguments", "invalid_arguments")
        assert ok.ok and ok.content == "b"


def test_offered_values_equal_the_checked_declarations_in_registration_order(tmp_path: Path) -> None:
    tools = [Nested(i) for i in (5, 2, 9, 0)]
    with ActorSystem(data_dir=tmp_path) as system:
        system.register_many(tools[:2])
        system.register(tools[2])
        system.register_many(tools[3:])
        offered = system.start_loop().offered()
        assert [i.name for i in offered] == ["nested_5", "nested_2", "nested_9", "nested_0"]
        for info, tool in zip(offered, tools, strict=True):
            checked = _checked(tool)
            assert type(info) is ToolInfo and info == checked and checked == info
            assert (info.name, info.description, info.timeout_ms, info.concurrency) == (
                tool.name(), tool.description(), tool.timeout_ms(), tool.concurrency())
            assert info.parameter_schema == NESTED
        assert offered[0] != offered[1]  # equality compares values, not only types


def _info(i: int) -> ToolInfo:  # what _checked(Nested(i)) gives
    return ToolInfo(f"nested_{i}", f"Tool number {i}.", copy.deepcopy(NESTED), 1_000 + i,
                    "exclusive" if i % 2 else "parallel")


_VALIDATOR = make_validator({"type": "object"})
KINDS = ["own", "chunked"]  # each copy from its entry's MarshalledSchema, or 512 decoded together


def _unread(count: int = 2, kind: str = "own") -> tuple[list[ToolInfo], list[ToolInfo]]:
    """Fresh lazy copies (no schema read yet) and the declarations they copy; chunked:
    copies 510.. of an offer of 600 (its first two chunks, of 512 and 88)."""
    if kind == "own":
        originals = [_info(i) for i in range(count)]
        return lazy_copies(originals, [MarshalledSchema(i.parameter_schema) for i in originals]), originals
    entries = [ToolEntry(tool=None, info=_info(i), validator=_VALIDATOR, origin="test") for i in range(600)]
    copies = copied_infos(entries, offer_chunks(entries))
    return copies[510:510 + count], [entry.info for entry in entries[510:510 + count]]


@pytest.mark.parametrize("kind", KINDS)
def test_equality_repr_and_hash_of_unread_copies_give_the_values(kind: str) -> None:
    [a, b], [oa, ob] = _unread(kind=kind)
    assert repr(a) == repr(oa) and "'enum': ['a', 'b']" in repr(a) and "MarshalledSchema" not in repr(a)
    [c], _ = _unread(1, kind)
    assert c == oa and a == c and a != b and b == ob and str(b) == str(ob)
    with pytest.raises(TypeError, match="unhashable"):  # as any ToolInfo: its schema is a dict
        hash(c)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_unread_copies_pickle_to_their_values(protocol: int, kind: str) -> None:
    copies, originals = _unread(kind=kind)
    for dumps in (pickle.dumps, cloudpickle.dumps):
        data = dumps(copies, protocol=protocol)
        assert b"MarshalledSchema" not in data
        back = pickle.loads(data)
        assert back == originals and type(back[0]) is ToolInfo
        _vandalise(back[0].parameter_schema)
        assert copies[0] == originals[0]


@pytest.mark.parametrize("kind", KINDS)
def test_copies_cross_to_another_process_by_cloudpickle(tmp_path: Path, kind: str) -> None:
    copies, originals = _unread(kind=kind)
    script = ("import pickle, sys, json, dataclasses\n"
              "infos = pickle.loads(sys.stdin.buffer.read())\n"
              "print(json.dumps([dataclasses.asdict(i) for i in infos]))\n")
    proc = subprocess.run([sys.executable, "-c", script], input=cloudpickle.dumps(copies), capture_output=True,
                          timeout=WAIT_S, check=True, cwd=tmp_path)
    assert json.loads(proc.stdout) == json.loads(json.dumps([dataclasses.asdict(i) for i in originals]))


@pytest.mark.parametrize("kind", KINDS)
def test_replace_asdict_astuple_and_copies_give_own_values(kind: str) -> None:
    [a, b, c, d, e], [original, _, of_c, *_] = _unread(5, kind)
    moved = dataclasses.replace(a, name="other")
    assert moved.name == "other" and moved.parameter_schema == original.parameter_schema
    assert dataclasses.replace(b, parameter_schema={"type": "object"}).parameter_schema == {"type": "object"}
    as_dict = dataclasses.asdict(c)
    assert as_dict == {"name": of_c.name, "description": of_c.description, "parameter_schema": NESTED,
                       "timeout_ms": of_c.timeout_ms, "concurrency": of_c.concurrency,
                       "policy": dataclasses.asdict(of_c.policy), "annotations": ()}
    assert json.loads(json.dumps(as_dict)) == {**as_dict, "annotations": []}  # plain JSON data
    assert dataclasses.astuple(c)[2] == NESTED
    own, deep, shallow = d.copy(), copy.deepcopy(d), copy.copy(e)
    assert own == deep == d and shallow == e
    _vandalise(own.parameter_schema)
    _vandalise(deep.parameter_schema)
    assert d.parameter_schema == NESTED  # d's copy is its own; copy.copy shares, as for any ToolInfo
    assert shallow.parameter_schema is e.parameter_schema
    read = e.copy()  # a copy of one already read deep-copies its value, changes included
    e.parameter_schema["extra"] = 1
    assert "extra" not in read.parameter_schema and e.copy().parameter_schema["extra"] == 1


@pytest.mark.parametrize("kind", KINDS)
def test_pydantic_reads_unread_copies(kind: str) -> None:
    pydantic = pytest.importorskip("pydantic")
    [a], [original] = _unread(1, kind)
    adapter = pydantic.TypeAdapter(ToolInfo)
    assert adapter.dump_python(a) == dataclasses.asdict(original)
    assert json.loads(adapter.dump_json(a)) == json.loads(json.dumps(dataclasses.asdict(original)))


@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_keeps_one_schema_across_reads_and_threads(kind: str) -> None:
    copies, _ = _unread(64, kind)
    barrier = threading.Barrier(4)
    seen: list[list[int]] = [[] for _ in range(4)]

    def read(slot: list[int]) -> None:
        barrier.wait(WAIT_S)
        slot.extend(id(info.parameter_schema) for info in copies)

    threads = [threading.Thread(target=read, args=(slot,)) for slot in seen]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert seen[0] == seen[1] == seen[2] == seen[3] == [id(info.parameter_schema) for info in copies]
    assert len(set(seen[0])) == 64  # and each copy its own


@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_is_frozen_as_any_tool_info(kind: str) -> None:
    [a], _ = _unread(1, kind)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.parameter_schema = {}  # type: ignore[misc]
    object.__setattr__(a, "parameter_schema", {"type": "object"})  # what __init__ and pickle do
    assert a.parameter_schema == {"type": "object"}


def test_a_schema_marshal_cannot_copy_is_deep_copied_at_once() -> None:
    class Schema(dict[str, Any]):
        pass

    info = ToolInfo("t", "d", Schema(type="object", properties={"a": {"type": "string"}}))
    with pytest.raises(ValueError, match="unmarshallable"):
        MarshalledSchema(info.parameter_schema)
    entry = ToolEntry(tool=None, info=info, validator=make_validator({"type": "object"}), origin="test")
    [copied] = copied_infos([entry])
    assert copied == info and type(copied.parameter_schema) is Schema
    copied.parameter_schema["properties"]["a"]["type"] = "integer"
    assert info.parameter_schema["properties"]["a"]["type"] == "string"
    assert entry.offered_info() == info


def test_lazy_copies_refuses_unequal_lengths() -> None:
    info = _checked(Nested(0))
    with pytest.raises(ValueError, match="zip"):
        lazy_copies([info, info], [MarshalledSchema(info.parameter_schema)])


@pytest.mark.parametrize("count", [3, 300])
def test_declarations_and_system_tools_are_the_callers_own_too(tmp_path: Path, count: int) -> None:
    tools = [Nested(i) for i in range(count)]
    with ActorSystem(data_dir=tmp_path) as system:
        system.register_many(tools)
        loop = system.start_loop()
        expected = [_checked(t) for t in tools]
        for dialect, key in (("openai", None), ("anthropic", "input_schema"), ("mcp", "inputSchema"),
                             ("neutral", "parameters")):
            for declaration in loop.declarations(dialect):  # type: ignore[arg-type]
                _vandalise(declaration["function"]["parameters"] if key is None else declaration[key])
        for info in system.tools():
            _vandalise(info.parameter_schema)
        assert system.tools() == expected == loop.offered()
        assert loop.declarations("mcp") == [to_dialect(i, "mcp") for i in expected]
        assert loop.declarations("mcp")[0]["inputSchema"] == NESTED
        assert gc.isenabled()


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_marshalled_schema_pickles_by_value(protocol: int) -> None:
    schema = MarshalledSchema(NESTED)
    back = pickle.loads(pickle.dumps(schema, protocol=protocol))
    [info] = lazy_copies([ToolInfo("t", "d", {})], [back])
    assert type(back) is MarshalledSchema and info.parameter_schema == NESTED


def test_a_fork_child_decodes_although_another_thread_held_the_lock() -> None:
    decoding = ToolInfo.__dict__["parameter_schema"].lock
    [info], _ = _unread(1)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # another thread mid-decode when the host forks
        with decoding:
            held.set()
            release.wait(WAIT_S)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(WAIT_S)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first read must not wait for a lock nobody there will release
        os.write(write, json.dumps(info.parameter_schema).encode())
        os._exit(0)
    release.set()
    holder.join(WAIT_S)
    os.close(write)
    ready: list[int] = []
    try:
        ready, _, _ = select.select([read], [], [], WAIT_S)
        assert ready, "the child hung on the decoding lock"
        with os.fdopen(read, "rb") as pipe:
            assert json.loads(pipe.read()) == NESTED
    finally:
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_chunked_copies_map_to_their_entries_across_chunk_boundaries() -> None:
    entries = [ToolEntry(tool=None, info=_info(i), validator=_VALIDATOR, origin="test") for i in range(1_100)]
    chunks = offer_chunks(entries)
    assert chunks is not None and len(chunks) == 3  # 512, 512, 76
    assert offer_chunks(entries[:255]) is None  # a small offer: each copy from its own entry
    copies = copied_infos(entries, chunks)
    order = [*range(1_099, 1_020, -1), 0, 511, 512, 513, 1_020, *range(600, 700)]
    assert len(set(order)) == len(order)
    for index in order:  # first reads in any order, each chunk decoded on its first
        copies[index].parameter_schema["properties"]["text"]["enum"].append(index)
    for index, (made, entry) in enumerate(zip(copies, entries, strict=True)):
        enum = NESTED["properties"]["text"]["enum"]
        expected = [*enum, index] if index in order else enum
        assert made.name == entry.info.name and made.parameter_schema["properties"]["text"]["enum"] == expected
        assert entry.info.parameter_schema == NESTED
    again = copied_infos(entries, chunks)  # the cached chunks give fresh copies again
    assert again == [entry.info for entry in entries]
    fresh = copied_infos(entries, chunks)
    del fresh[:700]  # copies dropped unread leave the others of their chunks theirs
    assert [(c.name, c.parameter_schema) for c in fresh] == [(f"nested_{i}", NESTED) for i in range(700, 1_100)]


def test_a_large_offer_of_a_loop_copies_in_chunks(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path) as system:
        system.register_many([Nested(i) for i in range(600)])
        loop = system.start_loop()
        offered = loop.offered()
        assert type(ToolInfo.__dict__["parameter_schema"]._get(offered[0])).__name__ == "_Chunk"
        _vandalise(offered[599].parameter_schema)
        assert offered[598].parameter_schema == NESTED == loop.offered()[599].parameter_schema
