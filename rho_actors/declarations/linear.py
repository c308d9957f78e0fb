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

The quick verdict is jsonschema-rs's (``jsonschema_rs.Draft202012Validator``, the schema
compiled once per validator: ~1 µs a call where jsonschema's own validator of the same
keywords took ~7-25 µs), which gives jsonschema's verdict for these keywords (integers
of any size compared exactly, ``1.0`` an integer, ``true`` never equal to ``1``; a
schema it cannot compile falls back to jsonschema's validator of the same keywords,
uncounted). It is asked only of plain JSON data as
:func:`~rho_actors.declarations.arguments.decode_arguments` makes it (finite numbers,
``str`` keys); a value it cannot take is a ``False`` (then the budgeted validation decides).

Example::

    >>> linear_cost({"type": "object", "properties": {"a": {"type": "string"}}})
    3
    >>> linear_cost({"anyOf": [{"type": "string"}]}) is None
    True
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
from jsonschema import Draft202012Validator, ValidationError, validators

__all__ = ["LINEAR_KEYWORDS", "QUICK_MAX_CHECKS", "linear_cost", "needs_integral", "prepare_quick", "quick_valid",
           "quick_verdict"]

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
_PLAIN: dict[type, type] = {}  # a budgeted validator class -> the same keywords, uncounted
_QUICK: dict[int, tuple[weakref.ref[Any], Any, int, bool]] = {}
# id(validator) -> (it, plain validator, cost, whether its schema names the type integer)
# (an entry and its subschemas' go when the validator is collected: _forgetter)
_CHILDREN: dict[int, Any] = {}  # id(subschema) of a linear schema -> its plain validator, made once
_KEPT = 4096
_KEPT_CHILDREN = 65_536


def _descend(validator: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """``validator.descend(instance, schema)`` by the plain validator made once for
    ``schema`` (a linear schema resolves no reference: the subresource jsonschema's
    ``descend`` makes for each value, and its fresh validator, change nothing)."""
    child = _CHILDREN.get(id(schema))
    if child is None or child.schema is not schema:  # not made (or forgotten): as jsonschema does it
        return validator.descend(instance, schema)  # type: ignore[no-any-return]
    return child.iter_errors(instance)  # type: ignore[no-any-return]


def _properties(validator: Any, properties: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    if len(properties) < len(instance):  # as jsonschema does it
        for name, subschema in properties.items():
            if name in instance:
                yield from _descend(validator, instance[name], subschema)
        return
    for name, value in instance.items():  # by the instance's keys: at most one look-up per key, counted
        subschema = properties.get(name, _ABSENT)
        if subschema is not _ABSENT:
            yield from _descend(validator, value, subschema)


def _items(validator: Any, items: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "array") or not instance:
        return
    if items is False:
        yield ValidationError("items are not allowed")
        return
    for item in instance:
        yield from _descend(validator, item, items)


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    if validator.is_type(extra, "object"):
        for key, value in instance.items():
            if key not in properties:
                yield from _descend(validator, value, extra)
    elif not extra and any(key not in properties for key in instance):
        yield ValidationError("unexpected properties")


_APPLICATORS = {"properties": _properties, "items": _items, "additionalProperties": _additional_properties}
"""The keywords of a linear schema that reach into its subschemas, for verdicts only:
the errors they give carry no path or message of their own (messages come from the
budgeted validation)."""


def _plain_class(cls: type) -> type:
    """``cls``'s keywords unwrapped of their budget count (``__wrapped__``), with
    :data:`_APPLICATORS`, as a Draft 2020-12 validator class (for linear schemas)."""
    plain = _PLAIN.get(cls)
    if plain is None:
        keywords = {k: getattr(f, "__wrapped__", f) for k, f in cls.VALIDATORS.items()}  # type: ignore[attr-defined]
        keywords.update(_APPLICATORS)
        plain = _PLAIN[cls] = validators.extend(Draft202012Validator, keywords)  # type: ignore[no-untyped-call]
    return plain


def _subschemas(schema: Any) -> Iterator[dict[str, Any]]:
    """Every object subschema of linear ``schema`` that a value is validated against."""
    stack = [schema]
    while stack:
        sub = stack.pop()
        if not isinstance(sub, dict):
            continue
        for key, value in sub.items():
            if key == "properties":
                children = [c for c in value.values() if isinstance(c, dict)]
                yield from children
                stack.extend(children)
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                yield value
                stack.append(value)


def _quick_of(validator: Any) -> tuple[Any, int]:
    """The plain validator of ``validator``'s schema and its :func:`linear_cost`
    (``None, 0`` when it is not linear); made once per validator, with one plain
    validator per subschema, and kept while ``validator`` lives (it is forgotten, with
    its subschemas' validators, when ``validator`` is collected), for at most
    :data:`_KEPT` live validators and :data:`_KEPT_CHILDREN` subschemas: then all are
    forgotten at once, and made again as they are used."""
    key = id(validator)
    known = _QUICK.get(key)
    if known is not None and known[0]() is validator:
        return known[1], known[2]
    return _made(validator, key)[:2]


def needs_integral(validator: Any) -> bool:
    """Whether valid arguments of ``validator``'s schema may hold an integral float to be
    made an ``int`` (:func:`~rho_actors.declarations.integral.integral_floats`): False
    only for a linear schema that names the type ``integer`` nowhere (made once per
    validator, with its quick check)."""
    known = _QUICK.get(id(validator))
    if known is not None and known[0]() is validator:
        return known[3]
    return _made(validator, id(validator))[2]


def _made(validator: Any, key: int) -> tuple[Any, int, bool]:
    """Make and keep :data:`_QUICK`'s entry of ``validator`` (at ``key``, its id)."""
    cost = linear_cost(validator.schema)
    plain = None
    made: list[tuple[int, Any]] = []
    with _LOCK:
        if len(_QUICK) >= _KEPT or len(_CHILDREN) >= _KEPT_CHILDREN:
            _QUICK.clear()
            _CHILDREN.clear()
        if cost is not None:
            plain = _compiled(validator.schema)
        if cost is not None and plain is None:  # jsonschema's own, uncounted
            cls = _plain_class(type(validator))
            plain = cls(validator.schema)
            made = [(id(sub), cls(sub)) for sub in _subschemas(validator.schema)]
            _CHILDREN.update(made)
        integers = cost is None or _names_integer(validator.schema)
        _QUICK[key] = (weakref.ref(validator, _forgetter(key, made)), plain, cost or 0, integers)
    return plain, cost or 0, integers


def _names_integer(schema: Any) -> bool:
    """Whether linear ``schema`` has a ``type`` of ``integer`` (alone or in a list) anywhere."""
    stack = [schema]
    while stack:
        sub = stack.pop()
        if not isinstance(sub, dict):
            continue
        kind = sub.get("type")
        if kind == "integer" or (isinstance(kind, list) and "integer" in kind):
            return True
        for key, value in sub.items():
            if key == "properties" and isinstance(value, dict):
                stack.extend(value.values())
            elif key in ("items", "additionalProperties"):
                stack.append(value)
    return False


def _compiled(schema: Any) -> Any:
    """jsonschema-rs's validator of linear ``schema`` (Draft 2020-12), or None when it
    cannot compile it."""
    try:
        return jsonschema_rs.Draft202012Validator(schema)
    except Exception:  # a construct it refuses: jsonschema's own validator gives the verdict
        return None


def _forgetter(key: int, made: list[tuple[int, Any]]) -> Any:
    """The weakref callback that drops the entries of a collected validator (at ``key``
    of :data:`_QUICK`, its subschemas' ``made`` in :data:`_CHILDREN`), each only if it is
    still its own: run wherever the collector runs, it takes no lock (a look-up and a
    removal racing one of another thread costs at most a validator made again)."""

    def forget(ref: Any) -> None:
        known = _QUICK.get(key)
        if known is not None and known[0] is ref:
            _QUICK.pop(key, None)
        for sub_key, child in made:  # each child holds its subschema: no other can take its id meanwhile
            if _CHILDREN.get(sub_key) is child:
                _CHILDREN.pop(sub_key, None)

    return forget


def prepare_quick(validator: Any) -> None:
    """Make ``validator``'s uncounted check now (what :func:`quick_valid` makes on its
    first use): at registration, so that a tool's first call does not pay for it. Never
    raises."""
    with contextlib.suppress(Exception):  # quick_valid says False then, and the budgeted validation runs
        _quick_of(validator)


def quick_valid(validator: Any, instance: Any, size: int | None, max_checks: int = QUICK_MAX_CHECKS) -> bool:
    """Whether ``instance``, decoded from JSON text of ``size`` characters, is known valid
    for ``validator`` without a budget: ``True`` only when ``validator``'s schema is
    linear (:func:`linear_cost`), ``size`` times its cost is at most both
    :data:`QUICK_MAX_CHECKS` and ``max_checks`` (the budget this check stands for), and
    the schema's compiled validator (jsonschema-rs's; jsonschema's of the same keywords,
    uncounted, where that cannot compile it) finds no violation. ``instance`` is plain
    JSON data (finite numbers, ``str`` keys: as decoded). ``False`` says nothing
    (``size`` None: not known; not linear; too large; invalid; a check that raised or
    a value it cannot take): the caller validates with its budget. ``validator`` is one of
    :func:`~rho_actors.declarations.arguments.make_validator`'s (its keywords carry
    their uncounted function as ``__wrapped__``). Never raises."""
    if size is None:
        return False
    try:
        plain, cost = _quick_of(validator)
        return (plain is not None and size * cost <= min(QUICK_MAX_CHECKS, max_checks)
                and bool(plain.is_valid(instance)))
    except Exception:  # the budgeted validation says what is wrong
        return False



def quick_verdict(validator: Any, instance: Any, size: int | None, max_checks: int = QUICK_MAX_CHECKS) -> int:
    """:func:`quick_valid` and :func:`needs_integral` in one look at the validator's
    entry (on every call's arguments): ``0`` not known valid (what ``False`` says
    there), ``1`` valid, ``2`` valid and its schema names ``integer`` (integral floats
    may be made ``int`` s). Never raises."""
    if size is None:
        return 0
    try:
        key = id(validator)
        known = _QUICK.get(key)  # _quick_of, inline
        plain, cost, integers = ((known[1], known[2], known[3]) if known is not None and known[0]() is validator
                                 else _made(validator, key))
        bound = max_checks if max_checks < QUICK_MAX_CHECKS else QUICK_MAX_CHECKS  # (min(): ~700 instructions)
        if plain is None or size * cost > bound or not plain.is_valid(instance):
            return 0
    except Exception:  # the budgeted validation says what is wrong
        return 0
    return 2 if integers else 1
