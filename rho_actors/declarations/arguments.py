"""A call's arguments: strict decoding and validation against the checked schema (DESIGN §4).

Decoding accepts exactly one JSON object (RFC 8259) and repairs nothing: a non-object,
trailing data (``{..}{..}``), ``NaN``/``Infinity``, a duplicate key, a lone surrogate
escape (``"\\ud800"``) or nesting past ``max_depth`` levels is refused with
:class:`ArgumentsError` of kind ``invalid_json``. Validation lists every JSON Schema
violation with its JSON path (kind ``invalid_arguments``).

Example::

    >>> decode_arguments('{"a": 1}{"a": 2}')
    Traceback (most recent call last):
    ArgumentsError: arguments are not valid JSON: Extra data: line 1 column 9 (char 8)
"""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any

import re2
from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators
from jsonschema._utils import find_evaluated_item_indexes_by_schema
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource

from rho_actors.declarations.integral import integral_floats
from rho_actors.declarations.linear import quick_verdict
from rho_actors.declarations.patterns import ecma_to_re2
from rho_actors.encoding import scrub_text, text_length
from rho_actors.errors import RhoError
from rho_actors.tool import ErrorKind

__all__ = [
    "DEFAULT_MAX_ARGUMENT_CHARS", "DEFAULT_MAX_ARGUMENT_DEPTH", "MAX_KEYWORD_CHECKS", "MAX_REFUSAL_CHARS",
    "MAX_VALIDATION_S", "ArgumentsError", "compile_pattern", "decode_arguments", "json_text", "make_validator",
    "no_retrieval", "violations",
]

DEFAULT_MAX_ARGUMENT_DEPTH = 64
"""How deeply call arguments may nest objects and arrays."""

DEFAULT_MAX_ARGUMENT_CHARS = 1_000_000
"""The longest argument text (characters) a call may send; longer is ``invalid_json``."""

MAX_KEYWORD_CHECKS = 200_000
"""The most JSON Schema keyword evaluations one call's validation may take; past it the
call is refused (``invalid_arguments``). With :data:`DEFAULT_MAX_ARGUMENT_CHARS` this
bounds validation of one call (``benchmarks/bench_validation.py`` measures it)."""

MAX_VALIDATION_S = 1.0
"""The longest the loop lets one call's validation take, in seconds (less when the
tool's timeout is shorter: validation counts against the call's deadline); past it the
call is refused (``invalid_arguments``)."""

MAX_REFUSAL_CHARS = 2_000
"""The longest refusal text (decoding or validation) this module gives, before the
loop's own output cap."""

_MAX_SHOWN = 120
_MAX_PATH = 80
_MAX_LISTED = 20
_MAX_COLLECTED = 200
"""Validation stops after this many violations (a refusal lists at most :data:`_MAX_LISTED`)."""


class ArgumentsError(RhoError, ValueError):
    """Arguments refused before the tool runs: ``kind`` is ``invalid_json`` or
    ``invalid_arguments``; ``str(err)`` is the message for the model."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(_bounded(scrub_text(message)))
        self.kind = kind


def _no_constants(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) == len(pairs):  # no key twice (the usual case): made in C
        return result
    result = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_constant=_no_constants)
_SCAN: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]  # what decode() runs
_SPACE: Callable[[str, int], re.Match[str]] = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]  # its blanks


_Link = tuple[Any, "str | int"] | None
"""An item's place in decoded arguments: ``(parent's link, key or index)``; ``None`` is ``$``."""


def _problem(value: Any, max_depth: int) -> str | None:
    """Why decoded ``value`` is not plain JSON data within ``max_depth`` levels, or None.

    Iterative, so a hostile depth cannot exhaust the stack; each item's path is a link
    to its parent's (its text is built only for the item named in the answer), so a
    long key over a large array costs no more than the input.
    """
    stack: list[tuple[Any, int, _Link]] = [(value, 1, None)]
    while stack:
        item, depth, link = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return f"{_path_text(link)}: a string holds a lone surrogate"
        elif isinstance(item, dict):
            if depth > max_depth:
                return f"{_path_text(link)}: nested deeper than {max_depth} levels"
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"{_path_text(link)}: key {key!r} is not a string"
                try:
                    key.encode("utf-8")
                except UnicodeEncodeError:
                    return f"{_path_text(link)}: a key holds a lone surrogate"
                stack.append((child, depth + 1, (link, key)))
        elif isinstance(item, (list, tuple)):
            if depth > max_depth:
                return f"{_path_text(link)}: nested deeper than {max_depth} levels"
            for i, child in enumerate(item):  # a plain loop: no generator's frame per list
                stack.append((child, depth + 1, (link, i)))
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{_path_text(link)}: {item} is not JSON"
        elif type(item) is int and item.bit_length() > 2_000 and _too_many_digits(item):  # fewer: < 640 digits
            return f"{_path_text(link)}: {_DIGITS_TEXT.format(limit=sys.get_int_max_str_digits())}"
        elif item is not None and not isinstance(item, (bool, int)):
            return f"{_path_text(link)}: a {type(item).__name__} is not JSON data"
    return None


_WALKED = (dict, list, float)  # what decoded plain JSON text may hold that _problem walks or looks at
_DIGITS_TEXT = "an integer of more than {limit:,} digits (the most JSON text here may hold)"


def _too_many_digits(value: int) -> bool:
    """Whether ``value`` has more digits than JSON text may hold (``sys.get_int_max_str_digits()``, 0: no limit)."""
    limit = sys.get_int_max_str_digits()
    return limit > 0 and abs(value) >= 10**limit


def _path_text(link: _Link) -> str:
    """The JSON path (``$.a[0].b``) of ``link``, each key cut to :data:`_MAX_SHOWN` characters."""
    steps: list[str] = []
    while link is not None:
        link, step = link
        steps.append(f"[{step}]" if isinstance(step, int) else f".{_shorten(step)}")
    return "$" + "".join(reversed(steps))


def _shorten(text: str, limit: int = _MAX_SHOWN) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_REFUSAL_CHARS else text[:MAX_REFUSAL_CHARS] + "..."


_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number",
               type(None): "null"}


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def json_text(value: Any, limit: int = _MAX_SHOWN) -> str:
    """``value`` as JSON text for a message (``null``, ``true``, ``"x"``), cut to about
    ``limit`` characters; never raises (what JSON cannot hold falls back to ``repr``)."""
    try:  # lazily: a large value is encoded only as far as shown
        chunks: list[str] = []
        size = 0
        for chunk in _PREVIEW.iterencode(value):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                break
        text = "".join(chunks)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return _shorten(scrub_text(text), limit)


_PREVIEW = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def decode_arguments(
    arguments: str | bytes | bytearray | Mapping[str, Any],
    max_depth: int = DEFAULT_MAX_ARGUMENT_DEPTH,
    max_chars: int = DEFAULT_MAX_ARGUMENT_CHARS,
) -> dict[str, Any]:
    """Decode a call's arguments: raw JSON text (``str``, or UTF-8 ``bytes``; at most
    ``max_chars`` characters), or a mapping already decoded.

    Returns a new ``dict`` with string keys. Raises :class:`ArgumentsError`
    (``invalid_json``) naming what is wrong and where; empty text is refused with a
    message saying ``{}`` is expected.
    """
    value: Any
    plain = False  # decoded from ASCII JSON text without a \u escape (below)
    if type(arguments) is not str and isinstance(arguments, Mapping):  # (a str is none: no ABC look for it)
        value = dict(arguments)
    elif isinstance(arguments, (str, bytes, bytearray)):
        length = len(arguments) if type(arguments) is str else text_length(arguments)  # (a str: no frame)
        if length > max_chars:
            raise ArgumentsError(
                ErrorKind.INVALID_JSON,
                f"arguments are {length:,} characters long; at most {max_chars:,} are accepted",
            )
        try:
            text = str.__str__(arguments) if isinstance(arguments, str) else bytes(arguments).decode("utf-8")
            if not text.strip():
                raise ArgumentsError(
                    ErrorKind.INVALID_JSON,
                    "arguments were empty: send a JSON object, {} when the tool takes no arguments",
                )
            # _DECODER.decode(text), inline (its frame and raw_decode's): the same value and errors
            begin = _SPACE(text, 0).end()  # (matches the empty string too)
            try:
                value, end = _SCAN(text, begin)
            except StopIteration as err:
                raise json.JSONDecodeError("Expecting value", text, err.value) from None
            end = _SPACE(text, end).end()
            if end != len(text):
                raise json.JSONDecodeError("Extra data", text, end)
        except RecursionError:
            raise ArgumentsError(
                ErrorKind.INVALID_JSON, f"arguments are not valid JSON: nested deeper than {max_depth} levels"
            ) from None
        except ArgumentsError:
            raise
        except ValueError as err:  # UnicodeDecodeError included (JSON text is UTF-8); an int past Python's limit
            said = _DIGITS_TEXT.format(limit=sys.get_int_max_str_digits()) if "integer string" in str(err) else str(err)
            raise ArgumentsError(ErrorKind.INVALID_JSON, f"arguments are not valid JSON: {said}") from None
        if not isinstance(value, dict):
            raise ArgumentsError(
                ErrorKind.INVALID_JSON,
                f"arguments must be a JSON object, got {_json_type(value)}: {_shorten(text.strip())}",
            )
        plain = text.isascii() and "\\u" not in text
    else:
        raise ArgumentsError(
            ErrorKind.INVALID_JSON,
            f"arguments must be JSON text or a mapping, got {type(arguments).__name__}",
        )
    if plain and max_depth >= 1:  # its keys are strs, no string holds a lone surrogate, no int is past the digits
        for item in value.values():  # limit (the scanner's int() refused it): only a float (1e999 is inf) or a
            if type(item) in _WALKED and not (type(item) is float and math.isfinite(item)):  # nested value can
                break  # be wrong: arguments of neither (and finite floats) need no walk
        else:
            return value  # type: ignore[no-any-return]
    problem = _problem(value, max_depth)
    if problem:
        raise ArgumentsError(ErrorKind.INVALID_JSON, f"arguments are not valid JSON: {problem}")
    decoded: dict[str, Any] = value
    return decoded


# --------------------------------------------------------------------------- validation

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
_PATTERNS: dict[str, Any] = {}


def compile_pattern(pattern: str) -> Any:
    """``pattern`` (ECMA-262, JSON Schema's dialect) compiled by RE2 (linear-time
    matching, no backtracking), cached; ``\\s``, ``\\S`` and ``.`` keep their ECMA-262
    meaning (:func:`rho_actors.declarations.patterns.ecma_to_re2`). Raises ``ValueError`` naming the
    problem when RE2 cannot compile it (a lookaround, a backreference, a repetition
    over 1000...)."""
    compiled = _PATTERNS.get(pattern)
    if compiled is None:
        try:
            compiled = re2.compile(ecma_to_re2(pattern), _RE2_OPTIONS)
        except re2.error as err:
            detail = err.args[0].decode("utf-8", "replace") if err.args and isinstance(err.args[0], bytes) else err
            raise ValueError(f"RE2 cannot compile {json_text(pattern, 80)}: {detail}") from None
        except (TypeError, UnicodeError, OverflowError) as err:
            raise ValueError(f"RE2 cannot compile {json_text(pattern, 80)}: {err}") from None
        if len(_PATTERNS) > 4096:
            _PATTERNS.clear()
        _PATTERNS[pattern] = compiled
    return compiled


def _search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches in ``text``; remembered for the running validation
    (``patternProperties``, ``additionalProperties`` and ``unevaluatedProperties`` ask
    the same of each key)."""
    seen = _BUDGET.searched
    if seen is None:
        return compile_pattern(pattern).search(text) is not None
    key = (pattern, text)
    found = seen.get(key)
    if found is None:
        found = seen[key] = compile_pattern(pattern).search(text) is not None
    return found


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{json_text(instance)} does not match {json_text(pattern)}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            _charge(1)  # one search per key and pattern
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, extra_schema: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = sorted(k for k in instance if _charge(1 + len(patterns))  # a look-up, a search per pattern
                    and k not in properties and not any(_search(p, k) for p in patterns))
    if validator.is_type(extra_schema, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], extra_schema, path=extra)
    elif not extra_schema and extras:
        yield ValidationError(f"unexpected properties: {', '.join(json_text(e, 60) for e in extras[:_MAX_LISTED])}")


def _canonical(value: Any) -> Any:
    """A hashable form of JSON data under JSON Schema equality (1 == 1.0, true != 1)."""
    if isinstance(value, bool) or value is None:
        return ("b", value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return ("o", frozenset((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("a", tuple(_canonical(v) for v in value))
    return value


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:  # linear: hashing, not pairwise comparison
        _charge(1)
        key = _canonical(item)
        if key in seen:
            yield ValidationError(f"has non-unique elements ({json_text(item, 60)} repeats)")
            return
        seen.add(key)


def _required(validator: Any, required: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for name in required:
        if name not in instance:
            yield ValidationError(f"{json_text(name, 80)} is a required property")


class _Budget(threading.local):
    left: int | None = None
    deadline: float = math.inf
    next_clock: int = 0
    searched: dict[tuple[str, str], bool] | None = None


_BUDGET = _Budget()


class _BudgetExceeded(Exception):
    pass


class _TimeUp(Exception):
    pass


def _charge(units: int) -> bool:
    """Count ``units`` of work inside one keyword (a key looked up, a pattern searched)
    against the running validation's budget and deadline; ``True`` (for use in a
    condition), or :class:`_BudgetExceeded`/:class:`_TimeUp` raised."""
    left = _BUDGET.left
    if left is None:
        return True
    _BUDGET.left = left = left - units
    if left < 0:
        raise _BudgetExceeded
    if left <= _BUDGET.next_clock:  # the clock is read every 64 units
        _BUDGET.next_clock = left - 64
        if time.monotonic() > _BUDGET.deadline:
            raise _TimeUp
    return True


def _counted(keyword: Callable[..., Any]) -> Callable[..., Any]:
    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _charge(1)
        return keyword(validator, value, instance, schema)

    run.__wrapped__ = keyword  # type: ignore[attr-defined]  # the check uncounted (declarations.linear)
    return run


def _scanning(keyword: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`_counted` for ``enum`` and ``const``, one unit that compares the instance
    with every value they hold: the clock is read before each, so a large one cannot run
    the validation past its time bound by 64 scans."""
    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _charge(1)
        if _BUDGET.left is not None and time.monotonic() > _BUDGET.deadline:
            raise _TimeUp
        return keyword(validator, value, instance, schema)

    run.__wrapped__ = keyword  # type: ignore[attr-defined]
    return run


def _evaluated_keys(validator: Any, instance: dict[str, Any], schema: Any) -> set[str]:
    """The keys of ``instance`` that ``schema`` evaluates (JSON Schema's annotation
    results for ``unevaluatedProperties``), as a set: what jsonschema's own helper
    finds, with RE2 for ``patternProperties`` and every key and pattern counted."""
    if not isinstance(schema, dict):
        return set()
    found: set[str] = set()
    for ref_keyword in ("$ref", "$dynamicRef"):
        ref = schema.get(ref_keyword)
        if isinstance(ref, str):
            resolved = validator._resolver.lookup(ref)
            found |= _evaluated_keys(validator.evolve(schema=resolved.contents, _resolver=resolved.resolver),
                                     instance, resolved.contents)
    properties = schema.get("properties")
    if isinstance(properties, dict):
        _charge(len(properties))
        found |= properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        subschema = schema.get(keyword)
        if subschema is True or (isinstance(subschema, dict) and not subschema):
            found |= instance.keys()
        elif subschema is not None and subschema is not False:
            found |= {k for k, v in instance.items()
                      if _charge(1) and next(validator.descend(v, subschema), None) is None}
    patterns = schema.get("patternProperties")
    if isinstance(patterns, dict):
        for pattern in patterns:
            found |= {k for k in instance if _charge(1) and _search(pattern, k)}
    dependents = schema.get("dependentSchemas")
    if isinstance(dependents, dict):
        for key, subschema in dependents.items():
            if key in instance:
                found |= _evaluated_keys(validator, instance, subschema)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword, []):
            if validator.evolve(schema=subschema).is_valid(instance):
                found |= _evaluated_keys(validator, instance, subschema)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            found |= _evaluated_keys(validator, instance, schema["if"])
            found |= _evaluated_keys(validator, instance, schema.get("then"))
        else:
            found |= _evaluated_keys(validator, instance, schema.get("else"))
    return found


def _unevaluated_properties(validator: Any, unevaluated: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    extras = sorted(k for k in instance if _charge(1) and k not in evaluated)
    if unevaluated is False:
        if extras:
            yield ValidationError(f"unexpected properties: {', '.join(json_text(e, 60) for e in extras[:_MAX_LISTED])}")
        return
    for key in extras:
        yield from validator.descend(instance[key], unevaluated, path=key, schema_path=key)


def _unevaluated_items(validator: Any, unevaluated: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "array"):
        return
    evaluated = set(find_evaluated_item_indexes_by_schema(validator, instance, schema))
    for index, item in enumerate(instance):
        _charge(1)
        if index not in evaluated:
            yield from validator.descend(item, unevaluated, path=index, schema_path=index)


def _exact(number: int | float) -> Fraction:
    """A JSON number as the decimal it was written as: a float's shortest repr is the
    text it was parsed from (``4.02``, not 4.019999999999999573674358543939888477325439453125)."""
    return Fraction(number) if isinstance(number, int) else Fraction(Decimal(repr(number)))


def _multiple_of(validator: Any, divisor: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """``multipleOf`` on the numbers as written (``4.02`` is a multiple of ``0.01``),
    exactly, not by float division."""
    if not validator.is_type(instance, "number"):
        return
    if not (math.isfinite(instance) and isinstance(divisor, (int, float)) and math.isfinite(divisor) and divisor):
        yield from Draft202012Validator.VALIDATORS["multipleOf"](validator, divisor, instance, schema)
        return
    if (_exact(instance) / _exact(divisor)).denominator != 1:
        yield ValidationError(f"{json_text(instance)} is not a multiple of {json_text(divisor)}")


def _regex_format(instance: object) -> bool:
    if isinstance(instance, str):
        compile_pattern(instance)
    return True


_FORMATS = FormatChecker()
_FORMATS.checkers = dict(Draft202012Validator.FORMAT_CHECKER.checkers)
_FORMATS.checks("regex", raises=ValueError)(_regex_format)

_KEYWORDS: dict[str, Callable[..., Any]] = {
    **Draft202012Validator.VALIDATORS,
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
    "required": _required,
    "unevaluatedProperties": _unevaluated_properties,
    "unevaluatedItems": _unevaluated_items,
    "multipleOf": _multiple_of,
}
_Validator = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, {k: (_scanning if k in ("enum", "const") else _counted)(v) for k, v in _KEYWORDS.items()}
)


def _refuse(uri: str) -> Resource[Any]:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


def no_retrieval() -> Registry[Any]:
    """A ``referencing`` registry that never retrieves: an unknown URI is unresolvable,
    nothing is fetched from the network or read from a file."""
    return Registry(retrieve=_refuse)  # type: ignore[call-arg]


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("prefixItems", "allOf", "anyOf", "oneOf")
_SCHEMA_ONE = ("items", "additionalItems", "unevaluatedItems", "contains", "propertyNames", "not", "if", "then",
               "else", "additionalProperties", "unevaluatedProperties")
_LISTING = ("additionalProperties", "unevaluatedProperties")
"""Keywords whose ``false`` is refused with the list of the keys it does not allow."""
_NEVER: dict[str, Any] = {"not": {}}
"""The ``false`` schema as one that names the refused value's path (jsonschema's own
refusal by ``false`` has none: ``$: 1 fails None null``)."""


def _named_false(schema: Any, depth: int = 0) -> Any:
    """A copy of ``schema`` with each ``false`` subschema (but ``additionalProperties``
    and ``unevaluatedProperties``, refused with a list of keys) as :data:`_NEVER`: the
    same verdicts, each refusal at its path, said as "not allowed"."""
    if schema is False and depth:
        return dict(_NEVER)
    if not isinstance(schema, dict) or depth > 200:
        return schema
    copy = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(copy.get(key), dict):
            copy[key] = {name: _named_false(sub, depth + 1) for name, sub in copy[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(copy.get(key), list):
            copy[key] = [_named_false(sub, depth + 1) for sub in copy[key]]
    for key in _SCHEMA_ONE:
        if key in copy and not (key in _LISTING and copy[key] is False):
            copy[key] = _named_false(copy[key], depth + 1)
    return copy


def make_validator(schema: dict[str, Any]) -> Draft202012Validator:
    """A Draft 2020-12 validator for a checked parameter schema, asserting ``format``,
    that never fetches a ``$ref`` (:func:`no_retrieval`), matches ``pattern`` and
    ``patternProperties`` with RE2 (:func:`compile_pattern`) and checks ``uniqueItems``
    in linear time; ``multipleOf`` is exact on the numbers as written; a refusal by a
    ``false`` subschema names its path and says the value is not allowed there."""
    validator: Draft202012Validator = _Validator(_named_false(schema), registry=no_retrieval(),
                                                 format_checker=_FORMATS)
    return validator


def _message(err: ValidationError, root: Any) -> str:
    """The violation in JSON's words (``null``, ``true``, ``object``), with a hint to
    omit an optional field sent as ``null``."""
    keyword, value, instance = err.validator, err.validator_value, err.instance
    shown = json_text(instance)
    if keyword == "type":
        types = value if isinstance(value, list) else [value]
        text = f"{shown} is not of type {' or '.join(json_text(t) for t in types)}"
        if instance is None and err.path and isinstance(err.path[-1], str):
            text += "; to leave an optional field out, omit it instead of sending null"
        return text
    if keyword == "not" and value == _NEVER["not"]:
        where = err.path[-1] if err.path else None
        if isinstance(where, str):
            return f"property {json_text(where, 80)} is not allowed here"
        if isinstance(where, int):
            return f"item {where} is not allowed here"
        return f"{shown} is not allowed here"
    if keyword is None:  # a false schema met without a path (a validator not made by make_validator)
        return f"{shown} is not allowed here"
    if keyword in ("enum", "const"):
        return f"{shown} is not {'one of' if keyword == 'enum' else 'equal to'} {json_text(value)}"
    if keyword == "format":
        return f"{shown} is not a valid {json_text(value)}"
    if keyword in ("pattern", "additionalProperties", "uniqueItems", "patternProperties", "required",
                   "unevaluatedProperties"):
        return str(err.message)
    if keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength",
                   "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"):
        return f"{shown} fails {keyword} {json_text(value)}"
    if keyword in ("anyOf", "oneOf", "not", "allOf", "if", "then", "else", "contains", "dependentRequired",
                   "propertyNames", "unevaluatedItems", "items", "prefixItems"):
        return f"{shown} is not valid under {keyword}"
    return f"{shown} fails {keyword} {json_text(value)}"


def violations(
    validator: Draft202012Validator, args: dict[str, Any], max_s: float | None = None, size: int | None = None
) -> list[str]:
    """Every violation of the schema by ``args``, as ``"<json path>: <message>"`` in
    JSON's words, sorted by path (at most :data:`MAX_REFUSAL_CHARS` characters in all;
    the count of those not shown is given). Empty when ``args`` is valid: then floats
    with an integral value where the schema asks for an ``integer`` (JSON Schema
    counts ``3.0`` as one) are replaced in ``args`` by ``int`` s.

    Validation takes at most :data:`MAX_KEYWORD_CHECKS` units of work (a keyword
    evaluated, a key looked up or searched by a pattern inside one) and, when
    ``max_s`` is given, at most ``max_s`` seconds (the loop gives the tool's timeout, at
    most :data:`MAX_VALIDATION_S`); past either it stops with one violation saying so.
    Never raises for a checked schema: a validator that raises (a ``$ref`` cycle's
    ``RecursionError``...) gives one violation naming the error. ``size``: the length of the
    JSON text ``args`` came from, if known: a linear schema is then checked uncounted first
    (:func:`~rho_actors.declarations.linear.quick_valid`; counted only to find violations).
    """
    verdict = quick_verdict(validator, args, size, MAX_KEYWORD_CHECKS)  # linear, checked uncounted: the same verdict
    if verdict:
        if verdict == 2:  # its schema names integer (needs_integral): else no integer position to look at
            integral_floats(validator.schema, args)
        return []
    limit_s = math.inf if max_s is None else max(0.0, max_s)
    _BUDGET.left, _BUDGET.next_clock = MAX_KEYWORD_CHECKS, MAX_KEYWORD_CHECKS
    _BUDGET.deadline, _BUDGET.searched = time.monotonic() + limit_s, {}
    try:
        found = [(err.json_path, _message(err, validator.schema))
                 for err in itertools.islice(validator.iter_errors(args), _MAX_COLLECTED)]
    except _BudgetExceeded:
        return [f"$: validation stopped after {MAX_KEYWORD_CHECKS:,} schema checks; send smaller arguments"]
    except _TimeUp:
        return [f"$: validation stopped after {limit_s:g} s; send smaller arguments"]
    except (RecursionError, Exception) as err:  # an unresolvable $ref, a format check that raises...
        return [f"$: the arguments could not be validated: {type(err).__name__}: {_shorten(scrub_text(str(err)))}"]
    finally:
        _BUDGET.left, _BUDGET.deadline, _BUDGET.searched = None, math.inf, None
    if not found:
        integral_floats(validator.schema, args)
        return []
    lines: list[str] = []
    total = 0
    for path, message in sorted(found):
        line = scrub_text(f"{_shorten(path, _MAX_PATH)}: {_shorten(message)}")
        if len(lines) >= _MAX_LISTED or total + len(line) > MAX_REFUSAL_CHARS:
            more = "" if len(found) < _MAX_COLLECTED else " at least (validation stopped there)"
            lines.append(f"... and {len(found) - len(lines)} more{more}")
            break
        lines.append(line)
        total += len(line) + 2
    return lines
