"""Which checked schemas validate in work linear in the instance, and their unbudgeted check.

:func:`~rho_actors.declarations.arguments.violations` counts every keyword a validation
evaluates against a budget, so that hostile arguments cannot make a schema with
applicators (``anyOf``, ``$ref``, ``unevaluatedProperties``...) or patterns take
unbounded host work. Most tool schemas need no such bound: an object of ``properties``
with ``type``, ``required``, ``enum``, ``items`` and size limits validates each value of
the instance against at most one subschema, so its work is at most the instance's size
times the most work one subschema does for a value (its keywords, and the values of
its ``enum`` or ``const`` compared one by one). For such a schema and arguments text of
``size`` characters (a JSON text of ``size`` characters holds at most ``size`` values),
:func:`quick_valid` gives the verdict of jsonschema's validator of the same keywords,
without the per-keyword count, when that bound is within :data:`QUICK_MAX_CHECKS`; the
budgeted validation then could not have stopped, so the verdict is the same. Messages
for invalid arguments still come from the budgeted validation.

Example::

    >>> linear_cost({"type": "object", "properties": {"a": {"type": "string"}}})
    3
    >>> linear_cost({"anyOf": [{"type": "string"}]}) is None
    True
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator, _keywords

from rho_actors.declarations.integral import integral_floats

__all__ = ["LINEAR_KEYWORDS", "QUICK_MAX_CHECKS", "linear_cost", "quick_valid"]

LINEAR_KEYWORDS = frozenset({
    "type", "properties", "required", "enum", "const", "items", "additionalProperties",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "minItems", "maxItems", "minProperties", "maxProperties",
    "description", "title", "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment",
})
"""The keywords a schema may use for :func:`linear_cost` to find it linear (and ``not``
of the empty schema, which :func:`~rho_actors.declarations.arguments.make_validator`
puts for a ``false`` subschema)."""

QUICK_MAX_CHECKS = 20_000
"""The most keyword evaluations (bounded as :func:`linear_cost` says) that
:func:`quick_valid` lets a validation take uncounted: a few milliseconds at most, so
that the budgeted validation's time bound could not have stopped it earlier by much
(and validation counts against the call's deadline anyway)."""

_MAX_DEPTH = 64
_ABSENT = object()


def linear_cost(schema: Any) -> int | None:
    """The work bound of validating against ``schema`` per value of the instance (the
    most work one of its subschemas does for a value: one per keyword, one per JSON
    value of an ``enum`` or ``const`` it is compared with, one per name of ``required``
    or of a ``type`` list; plus one for a key looked up by ``properties`` or
    ``additionalProperties``), or None when ``schema`` uses a keyword outside
    :data:`LINEAR_KEYWORDS` (a ``$ref``, an applicator, a ``pattern``, ``format``,
    ``uniqueItems``, ``multipleOf``...) or nests past 64 levels. Never raises."""
    most = 0
    stack: list[tuple[Any, int]] = [(schema, 0)]
    while stack:
        sub, depth = stack.pop()
        if isinstance(sub, bool):
            continue
        if not isinstance(sub, dict) or depth > _MAX_DEPTH:
            return None
        work = 0
        for key, value in sub.items():
            if key == "not" and value == {}:
                work += 1
                continue
            if key not in LINEAR_KEYWORDS:
                return None
            if key == "properties":
                if not isinstance(value, dict):
                    return None
                stack.extend((child, depth + 1) for child in value.values())
            elif key in ("items", "additionalProperties"):
                stack.append((value, depth + 1))
            work += _work(key, value)
        most = max(most, work)
    return most + 1


def _work(keyword: str, value: Any) -> int:
    """The most units keyword ``keyword`` of value ``value`` takes for one value of the
    instance: an ``enum`` or ``const`` is compared value by value (jsonschema's
    ``equal`` stops at the smaller side), ``required`` and a ``type`` list test each name."""
    if keyword in ("enum", "const"):
        return _values(value)
    if keyword in ("required", "type") and isinstance(value, list):
        return 1 + len(value)
    return 1


def _values(value: Any) -> int:
    """How many JSON values ``value`` holds, itself included (keys not counted)."""
    count = 0
    stack = [value]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


_LOCK = threading.Lock()
_QUICK: dict[int, tuple[weakref.ref[Any], Any, int, bool]] = {}
# id(validator) -> (it, its compiled check or None, cost, whether an integer position may need a rewrite);
# an entry goes when its validator is collected (_forgetter)
_KEPT = 4096

_Check = Callable[[Any], bool]
_TYPE_CHECKER = Draft202012Validator.TYPE_CHECKER
_EXACT: dict[str, tuple[type, ...]] = {  # the Python types JSON decodes to, per JSON Schema type
    "string": (str,), "boolean": (bool,), "null": (type(None),), "object": (dict,), "array": (list,),
    "number": (int, float), "integer": (int,),
}


def _never(instance: Any) -> bool:
    return False


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) or bool(_TYPE_CHECKER.is_type(value, "number"))


def _equal(one: Any, two: Any) -> bool:
    return bool(_keywords.equal(one, two))  # type: ignore[attr-defined]  # jsonschema's own JSON equality (true != 1, 1 == 1.0), read at the call


def _compile(sub: Any) -> _Check | None:
    """A check of a linear (sub)schema giving jsonschema's verdict for a value (``None``:
    every value is valid): each keyword's test inline, by the value's exact type first
    (what JSON decodes to) and jsonschema's type checker for any other type."""
    if sub is True or not isinstance(sub, dict):
        return None
    if sub is False or sub.get("not", _ABSENT) == {}:  # the false schema, as make_validator writes it
        return _never
    parts = [p for p in (_value_part(sub), _object_part(sub), _array_part(sub), _number_part(sub)) if p is not None]
    if not parts:
        return None  # annotations only
    if len(parts) == 1:
        return parts[0]
    return lambda value: all(part(value) for part in parts)


def _value_part(sub: dict[str, Any]) -> _Check | None:
    """``type``, ``enum``, ``const`` and the string lengths."""
    kind = sub.get("type")
    names = () if kind is None else tuple(kind) if isinstance(kind, list) else (kind,)
    exact = None if kind is None else frozenset(t for n in names for t in _EXACT.get(n, ()))
    integral = "integer" in names and "number" not in names  # an integral float is an integer too
    enum = sub.get("enum", _ABSENT)
    strings = frozenset(enum) if isinstance(enum, list) and enum and all(type(e) is str for e in enum) else None
    const = sub.get("const", _ABSENT)
    lengths = tuple((k == "minLength", sub[k]) for k in ("minLength", "maxLength") if k in sub)
    if exact is None and enum is _ABSENT and const is _ABSENT and not lengths:
        return None

    def check(value: Any) -> bool:
        tv = type(value)
        if exact is not None and tv not in exact and not (integral and tv is float and value.is_integer()) and (
                tv in _JSON_TYPES or not any(_TYPE_CHECKER.is_type(value, n) for n in names)):
            return False
        if enum is not _ABSENT and not (
                (isinstance(value, str) and value in strings) if strings is not None
                else any(_equal(each, value) for each in enum)):
            return False
        if const is not _ABSENT and not _equal(const, value):
            return False
        return not lengths or not isinstance(value, str) or _sized(len(value), lengths)

    return check


def _object_part(sub: dict[str, Any]) -> _Check | None:
    """``properties``, ``required``, ``additionalProperties`` and the property counts, of an object."""
    properties = sub.get("properties")
    known = frozenset(properties) if isinstance(properties, dict) else frozenset()
    children = ({k: c for k, c in ((k, _compile(v)) for k, v in properties.items()) if c is not None}
                if isinstance(properties, dict) else {})
    required = tuple(sub.get("required") or ())
    extra = sub.get("additionalProperties", _ABSENT)
    no_extra = extra is False
    extra_check: _Check | None = None if extra is _ABSENT or no_extra else _compile(extra)
    counts = tuple((k == "minProperties", sub[k]) for k in ("minProperties", "maxProperties") if k in sub)
    if not (children or required or no_extra or extra_check is not None or counts):
        return None

    def check(value: Any) -> bool:
        if not isinstance(value, dict):
            return True
        for name in required:
            if name not in value:
                return False
        if children:
            if len(children) < len(value):
                for name, child in children.items():
                    if name in value and not child(value[name]):
                        return False
            else:  # by the value's keys: one look-up each
                for name, item in value.items():
                    found = children.get(name)
                    if found is not None and not found(item):
                        return False
        if no_extra and any(name not in known for name in value):
            return False
        if extra_check is not None:
            for name, item in value.items():
                if name not in known and not extra_check(item):
                    return False
        return not counts or _sized(len(value), counts)

    return check


def _array_part(sub: dict[str, Any]) -> _Check | None:
    """``items`` and the item counts, of an array."""
    items = sub.get("items", _ABSENT)
    no_items = items is False
    items_check = None if items is _ABSENT or no_items else _compile(items)
    sizes = tuple((k == "minItems", sub[k]) for k in ("minItems", "maxItems") if k in sub)
    if not (no_items or items_check is not None or sizes):
        return None

    def check(value: Any) -> bool:
        if not isinstance(value, list):
            return True
        if no_items and value:
            return False
        if items_check is not None:
            for item in value:
                if not items_check(item):
                    return False
        return not sizes or _sized(len(value), sizes)

    return check


def _sized(size: int, limits: tuple[tuple[bool, Any], ...]) -> bool:
    """Whether ``size`` is within each ``(at_least, limit)`` (a minimum when ``at_least``, else a maximum)."""
    return all((size >= limit) if at_least else (size <= limit) for at_least, limit in limits)


_BOUNDS: dict[str, Callable[[Any, Any], bool]] = {  # keyword -> whether a number is within it
    "minimum": lambda v, limit: v >= limit, "maximum": lambda v, limit: v <= limit,
    "exclusiveMinimum": lambda v, limit: v > limit, "exclusiveMaximum": lambda v, limit: v < limit,
}


def _number_part(sub: dict[str, Any]) -> _Check | None:
    """``minimum``, ``maximum`` and the exclusive ones, of a number."""
    bounds = tuple((_BOUNDS[k], sub[k]) for k in _BOUNDS if k in sub)
    if not bounds:
        return None

    def check(value: Any) -> bool:
        return not _is_number(value) or all(within(value, limit) for within, limit in bounds)

    return check


_JSON_TYPES = frozenset({str, bool, type(None), dict, list, int, float})


def _has_integer(schema: Any) -> bool:
    """Whether linear ``schema`` has an ``integer`` position (where an integral float
    would be rewritten as an ``int``)."""
    stack = [schema]
    while stack:
        sub = stack.pop()
        if not isinstance(sub, dict):
            continue
        kind = sub.get("type")
        if kind == "integer" or (isinstance(kind, list) and "integer" in kind):
            return True
        properties = sub.get("properties")
        if isinstance(properties, dict):
            stack.extend(properties.values())
        stack.extend(sub[k] for k in ("items", "additionalProperties") if k in sub)
    return False


def _quick_of(validator: Any) -> tuple[Any, int, bool]:
    """The compiled check of ``validator``'s schema (None when every value is valid),
    its :func:`linear_cost` (0 when it is not linear) and whether it has an integer
    position; made once per validator and kept while ``validator`` lives (forgotten when
    it is collected), for at most :data:`_KEPT` live validators: then all are forgotten
    at once, and made again as they are used."""
    key = id(validator)
    known = _QUICK.get(key)
    if known is not None and known[0]() is validator:
        return known[1], known[2], known[3]
    cost = linear_cost(validator.schema)
    check = None if cost is None else _compile(validator.schema)
    integers = cost is not None and _has_integer(validator.schema)
    with _LOCK:
        if len(_QUICK) >= _KEPT:
            _QUICK.clear()
        _QUICK[key] = (weakref.ref(validator, _forgetter(key)), check, cost or 0, integers)
    return check, cost or 0, integers


def _forgetter(key: int) -> Any:
    """The weakref callback that drops the entry of a collected validator (at ``key`` of
    :data:`_QUICK`) if it is still its own: run wherever the collector runs, it takes no
    lock (a look-up and a removal racing one of another thread costs at most a check
    compiled again)."""

    def forget(ref: Any) -> None:
        known = _QUICK.get(key)
        if known is not None and known[0] is ref:
            _QUICK.pop(key, None)

    return forget


def quick_valid(
    validator: Any, instance: Any, size: int | None, max_checks: int = QUICK_MAX_CHECKS, *, rewrite: bool = False
) -> bool:
    """Whether ``instance``, decoded from JSON text of ``size`` characters, is known valid
    for ``validator`` without a budget: ``True`` only when ``validator``'s schema is
    linear (:func:`linear_cost`), ``size`` times its cost is at most both
    :data:`QUICK_MAX_CHECKS` and ``max_checks`` (the budget this check stands for), and
    the schema's compiled check (jsonschema's verdict for the same keywords) finds no
    violation. ``False`` says nothing (``size`` None: not known; not linear; too large;
    invalid; a check that raised): the caller validates with its budget. ``rewrite``:
    when valid, integral floats at ``integer`` positions are made ``int`` s in place
    (:func:`~rho_actors.declarations.integral.integral_floats`). Never raises."""
    if size is None:
        return False
    try:
        check, cost, integers = _quick_of(validator)
        if not cost or size * cost > min(QUICK_MAX_CHECKS, max_checks) or (check is not None and not check(instance)):
            return False
        if rewrite and integers:
            integral_floats(validator.schema, instance)
        return True
    except Exception:  # the budgeted validation says what is wrong
        return False
