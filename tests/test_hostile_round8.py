"""Hostile tests of round 8: the uncounted check of linear schemas
(``declarations/linear.py``) doing work its bound does not count, and its caches
keeping the schemas of dropped validators; a LoopActor whose first message found no
thread to start on."""

from __future__ import annotations

import gc
import json
import threading
import types
from pathlib import Path
from typing import Any

import jsonschema._keywords
import pykka
import pytest

from rho_actors import ActorSystem, CancelToken, ErrorKind, ToolCall
from rho_actors.declarations import arguments
from rho_actors.declarations.arguments import decode_arguments, make_validator, violations
from rho_actors.declarations.checks import check_declaration
from rho_actors.declarations.linear import QUICK_MAX_CHECKS, quick_valid
from rho_actors.loop.messages import SetWithheld
from rho_actors.otp.actor import monitor

from .conftest import WAIT_S
from .helpers import make_tool

pytestmark = pytest.mark.timeout(120)


def checked(schema: dict[str, Any]) -> Any:
    return make_validator(check_declaration({"name": "t", "description": "d", "parameter_schema": schema})
                          .parameter_schema)


def _count_comparisons(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """jsonschema's value comparisons (``enum``, ``const``) counted from now on: the
    list's one item is the count so far."""
    compared = [0]
    equal = jsonschema._keywords.equal  # type: ignore[attr-defined]

    def counted(one: Any, two: Any) -> bool:
        compared[0] += 1
        return bool(equal(one, two))

    monkeypatch.setattr(jsonschema._keywords, "equal", counted)
    return compared


def test_a_large_enum_counts_each_value_it_compares(monkeypatch: pytest.MonkeyPatch) -> None:
    """An enum of 2,000 values is one keyword, but each value checked against it is
    compared with all 2,000: 1,300 array items took 2.6 M uncounted comparisons (a
    second of the loop's thread, where the budgeted validation stops at its time bound)."""
    items = {"enum": list(range(2000))}
    validator = checked({"type": "object", "properties": {"a": {"type": "array", "items": items}}})
    text = json.dumps({"a": [1999] * 1300}, separators=(",", ":"))
    compared = _count_comparisons(monkeypatch)
    quick_valid(validator, decode_arguments(text), len(text))
    assert compared[0] <= QUICK_MAX_CHECKS
    small = json.dumps({"a": [1999] * 3}, separators=(",", ":"))
    assert violations(validator, decode_arguments(small), 1.0, len(small)) == []
    assert not quick_valid(validator, decode_arguments('{"a":[2000]}'), 12)


class _Looked(dict):  # type: ignore[type-arg]
    """An object instance counting the keys looked up in it."""

    looked = 0

    def __contains__(self, key: object) -> bool:
        _Looked.looked += 1
        return dict.__contains__(self, key)


def test_many_properties_are_not_looked_up_per_object() -> None:
    """``properties`` of 1,000 names looked each name up in every object of the instance:
    ``[{}, {}, ...]`` cost 1,000 look-ups per three characters, uncounted."""
    item = {"type": "object", "properties": {f"p{i}": {} for i in range(1000)}}
    validator = checked({"type": "object", "properties": {"a": {"type": "array", "items": item}}})
    count = 2000
    args = {"a": [_Looked() for _ in range(count)]}
    size = len(json.dumps({"a": [{}] * count}, separators=(",", ":")))
    _Looked.looked = 0
    assert quick_valid(validator, args, size) in (True, False)
    assert _Looked.looked <= QUICK_MAX_CHECKS
    assert violations(validator, {"a": [{"p1": 1}, {}]}, 1.0, 24) == []


def _held_by_other_than(target: Any, *allowed: Any) -> list[Any]:
    return [r for r in gc.get_referrers(target) if not isinstance(r, types.FrameType) and
            not any(r is a for a in allowed)]


def test_a_dropped_validator_leaves_nothing_of_its_schema_in_the_caches() -> None:
    """The plain validators of a schema were kept after its validator was dropped (a tool
    re-registered): with a reused address only the subschemas' entries grew, up to 65,536
    of them, each holding its schema's large ``enum`` (172 MB for 1,000 re-registrations
    of one 60 KB schema)."""
    roots, subs = [], []
    for i in range(50):
        validator = checked({"type": "object", "properties": {"a": {"enum": [f"{i}-{j}" for j in range(200)]}}})
        assert quick_valid(validator, {"a": f"{i}-5"}, 16)
        roots.append(validator.schema)
        subs.append(validator.schema["properties"]["a"])
        del validator
    gc.collect()
    for i in range(len(roots)):
        assert _held_by_other_than(roots[i], roots) == [], i
        assert _held_by_other_than(subs[i], subs, roots[i]["properties"]) == [], i


class _NoThreads:
    """A thread pool that cannot start a thread (the host at its thread or pid limit)."""

    def submit(self, job: Any, name: str, *, may_take_over: bool = False) -> None:
        raise RuntimeError("can't start new thread")


def test_a_loop_whose_first_message_found_no_thread_is_still_ended_by_its_stop(tmp_path: Path) -> None:
    """A LoopActor takes its thread at its first message: when that thread could not be
    started, the actor stayed claimed as started, with no loop: its stop was queued and
    never run (``Loop.stop`` waited its bound and abandoned it), its monitors never fired,
    its turns never closed. Now the start is undone: the teller gets the error, and the
    stop ends the actor in the stopping thread, the queued message first."""
    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        system.register(make_tool("echo", lambda args, ctx: "ok"))
        loop = system.start_loop("no-threads")
        ref = loop.ref
        actor = ref._actor_weakref()
        assert actor is not None
        actor.thread_pool = _NoThreads()
        with pytest.raises(RuntimeError, match="can't start new thread"):
            ref.tell(SetWithheld(frozenset({"echo"})))
        ended = threading.Event()
        reasons: list[object] = []

        def down(_ref: Any, reason: object) -> None:
            reasons.append(reason)
            ended.set()

        monitor(ref, down)
        loop.stop(timeout_s=WAIT_S)
        assert ended.wait(WAIT_S) and reasons == ["normal"]
        assert not ref.is_alive()
        assert actor.turns.closed is not None
        assert actor.turns._kept.names == frozenset({"echo"})  # the queued message ran before the stop
        with pytest.raises(pykka.ActorDeadError):
            loop.run_turn([ToolCall("c1", "echo", "{}")], timeout_s=WAIT_S)


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


def test_a_large_enum_cannot_hold_the_validation_past_its_time_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock was read every 64 units of work, and one unit (an ``enum`` of 2,030
    values) compares each of them: a validation ran 64 scans, 130,000 comparisons, past
    its bound (0.15 s for a tool of a 10 ms timeout). Now an ``enum`` or ``const`` reads
    the clock before its scan. The clock here is a count of comparisons, in ms."""
    items = {"enum": list(range(2030))}
    validator = checked({"type": "object", "properties": {"a": {"type": "array", "items": items}}})
    compared = _count_comparisons(monkeypatch)
    monkeypatch.setattr(arguments, "time", types.SimpleNamespace(monotonic=lambda: compared[0] / 1000))
    found = violations(validator, {"a": [2029] * 1000}, 0.05)  # 50 comparisons' time
    assert found == ["$: validation stopped after 0.05 s; send smaller arguments"]
    assert compared[0] <= 50 + 2 * 2030


class _Hostile(str):
    """A reason text whose methods raise: none of them may be called by the runtime."""

    __slots__ = ()

    def __len__(self) -> int:
        raise RuntimeError("len")

    def __format__(self, spec: str) -> str:
        raise RuntimeError("format")


class _Reason:
    def __str__(self) -> str:
        return _Hostile("its own words")


def test_a_cancel_reason_whose_str_gives_a_str_subclass_is_kept_as_plain_text() -> None:
    """``str()`` returns what ``__str__`` gives, a ``str`` subclass included: the reason
    was kept as that subclass, whose methods ran wherever the reason was used."""
    token = CancelToken()
    assert token.cancel(_Reason())  # type: ignore[arg-type]
    assert type(token.reason) is str and token.reason == "its own words"
    other = CancelToken()
    other.abandon(_Reason(), object())  # type: ignore[arg-type]
    assert type(other.reason) is str and other.reason == "its own words"


def test_a_cancel_whose_message_finds_no_thread_for_the_loop_still_cancels_the_turn(tmp_path: Path) -> None:
    """The host's cancel of a turn is a ``CancelTurn`` told to the loop: when that first
    message could not start the loop's thread, the cancel was lost (the calls ran on to
    their end). Now the turn is cancelled in the cancelling thread instead."""
    def wait(args: Any, ctx: Any) -> str:
        return "cancelled" if ctx["cancel"].wait(WAIT_S) else "ran to its end"

    with ActorSystem(tmp_path / "data", shutdown_ms=2_000) as system:
        system.register(make_tool("wait", wait, timeout_ms=60_000))
        loop = system.start_loop("no-threads")
        actor = loop.ref._actor_weakref()
        assert actor is not None
        actor.thread_pool = _NoThreads()
        token = CancelToken()
        future = loop.submit_turn([ToolCall("c1", "wait", "{}")], cancel=token)
        token.cancel("enough")
        results = future.result(WAIT_S)
        loop.stop(timeout_s=WAIT_S)
    assert [r.error_kind for r in results] == [ErrorKind.CANCELLED], results
