"""The uncounted check of linear schemas (``declarations/linear.py``): every value a
large enum compares counts, properties are not looked up per object, the time bound
holds, and its caches keep nothing of dropped validators, also under threads."""

from __future__ import annotations

import gc
import json
import threading
import types
from typing import Any

import jsonschema._keywords
import pytest

from rho_actors.declarations import arguments
from rho_actors.declarations.arguments import decode_arguments, make_validator, violations
from rho_actors.declarations.checks import check_declaration
from rho_actors.declarations.linear import QUICK_MAX_CHECKS, quick_valid

from .conftest import WAIT_S

pytestmark = pytest.mark.timeout(120)


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


def checked(schema: dict[str, Any]) -> Any:
    return make_validator(check_declaration({"name": "t", "description": "d", "parameter_schema": schema})
                          .parameter_schema)


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


def _held_by_other_than(targets: list[Any], *allowed: Any) -> list[Any]:
    """What refers to any of ``targets``, other than frames and ``allowed``: one scan of
    the heap for all of them (a scan per target took seconds in a worker that has
    imported the whole suite)."""
    return [r for r in gc.get_referrers(*targets) if not isinstance(r, types.FrameType) and
            r is not targets and not any(r is a for a in allowed)]


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
    held = _held_by_other_than([*roots, *subs], roots, subs, *(root["properties"] for root in roots))
    assert held == [], [type(r).__name__ for r in held]


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


_INSTANCES: list[Any] = [
    {"a": 1}, {"a": "x"}, {"a": True}, {"a": 1.5}, {}, {"a": 1, "b": [{"n": 1}, {"n": "s"}]},
    {"a": 1, "b": [{"m": 1}]}, {"a": 1, "c": 0}, {"a": 1, "c": "1"}, {"a": 1, "c": None}, {"a": 1, "z": 2},
    {"a": "x", "b": [{"n": True}, {"n": 2.0}]},
]


def _linear_schema(seed: int) -> dict[str, Any]:
    kinds = ["integer", "string", "boolean", "number"]
    return {
        "type": "object",
        "properties": {
            "a": {"type": kinds[seed % 4]},
            "b": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": kinds[(seed + 1) % 4]}},
                                             "required": ["n"]}},
            "c": {"enum": [seed, str(seed), None]},
        },
        "required": ["a"] if seed % 2 else [],
        "additionalProperties": seed % 3 != 0,
    }


def test_linear_caches_under_threads_registering_collecting_and_validating_give_the_budgeted_verdicts() -> None:
    """Eight threads make validators (fresh schemas and the same schema objects again,
    as a re-registration does), validate, drop them and collect, while the caches'
    entries go by weak-reference callbacks that take no lock: every verdict is the
    budgeted validation's, nothing raises, and once all are dropped the caches hold none
    of their entries."""
    import copy
    import gc

    from rho_actors.declarations import linear
    from rho_actors.declarations.arguments import make_validator, violations

    shared = [_linear_schema(seed) for seed in range(8)]
    expected = {}
    for seed, schema in enumerate(shared):
        budgeted = make_validator(copy.deepcopy(schema))
        for number, instance in enumerate(_INSTANCES):
            expected[seed, number] = violations(budgeted, copy.deepcopy(instance), None, None)
    del budgeted
    errors: list[BaseException] = []
    wrong: list[Any] = []
    barrier = threading.Barrier(8)

    def work(worker: int) -> None:
        try:
            barrier.wait(WAIT_S)
            kept: list[Any] = []
            for round_ in range(40):
                seed = (worker + round_) % 8
                schema = shared[seed] if round_ % 2 else copy.deepcopy(shared[seed])
                validator = make_validator(schema)
                kept.append((seed, validator))
                for held_seed, held in kept[-3:]:
                    for number, instance in enumerate(_INSTANCES):
                        text = json.dumps(instance)
                        got = violations(held, copy.deepcopy(instance), None, len(text))
                        if got != expected[held_seed, number]:
                            wrong.append((held_seed, number, got, expected[held_seed, number]))
                if round_ % 3 == 0:
                    del kept[: len(kept) // 2]
                    # the young generations, where the dropped validators' cycles are: their
                    # callbacks run beside the other threads' validation (a full collection of
                    # the test process's heap took 0.7 s each on a loaded machine, 112 of them)
                    gc.collect(1)
            kept.clear()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 6)
        assert not thread.is_alive()
    gc.collect()
    assert errors == [] and wrong == []
    assert len(linear._QUICK) <= linear._KEPT and len(linear._CHILDREN) <= linear._KEPT_CHILDREN
    children = {id(sub) for schema in shared for sub in linear._subschemas(schema)}
    assert not children & set(linear._CHILDREN)  # the shared schemas' validators all dropped: none kept
