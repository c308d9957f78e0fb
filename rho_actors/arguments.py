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

import json
import math
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator

from rho_actors.tool import ErrorKind

__all__ = ["DEFAULT_MAX_ARGUMENT_DEPTH", "ArgumentsError", "decode_arguments", "make_validator", "violations"]

DEFAULT_MAX_ARGUMENT_DEPTH = 64
"""How deeply call arguments may nest objects and arrays."""

_MAX_SHOWN = 120


class ArgumentsError(ValueError):
    """Arguments refused before the tool runs: ``kind`` is ``invalid_json`` or
    ``invalid_arguments``; ``str(err)`` is the message for the model."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _no_constants(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_constant=_no_constants)


def _problem(value: Any, max_depth: int) -> str | None:
    """Why decoded ``value`` is not plain JSON data within ``max_depth`` levels, or None.

    Iterative, so a hostile depth cannot exhaust the stack.
    """
    stack: list[tuple[Any, int, str]] = [(value, 1, "$")]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return f"{path}: a string holds a lone surrogate"
        elif isinstance(item, dict):
            if depth > max_depth:
                return f"{path}: nested deeper than {max_depth} levels"
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"{path}: key {key!r} is not a string"
                try:
                    key.encode("utf-8")
                except UnicodeEncodeError:
                    return f"{path}: a key holds a lone surrogate"
                stack.append((child, depth + 1, f"{path}.{key}"))
        elif isinstance(item, (list, tuple)):
            if depth > max_depth:
                return f"{path}: nested deeper than {max_depth} levels"
            stack.extend((child, depth + 1, f"{path}[{i}]") for i, child in enumerate(item))
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{path}: {item} is not JSON"
        elif item is not None and not isinstance(item, (bool, int)):
            return f"{path}: a {type(item).__name__} is not JSON data"
    return None


def _shorten(text: str) -> str:
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "..."


def decode_arguments(arguments: str | Mapping[str, Any], max_depth: int = DEFAULT_MAX_ARGUMENT_DEPTH) -> dict[str, Any]:
    """Decode a call's arguments: raw JSON text, or a mapping already decoded.

    Returns a new ``dict`` with string keys. Raises :class:`ArgumentsError`
    (``invalid_json``) naming what is wrong and where.
    """
    value: Any
    if isinstance(arguments, Mapping):
        value = dict(arguments)
    elif isinstance(arguments, (str, bytes, bytearray)):
        try:
            text = arguments if isinstance(arguments, str) else bytes(arguments).decode("utf-8")
            value = _DECODER.decode(text)
        except RecursionError:
            raise ArgumentsError(
                ErrorKind.INVALID_JSON, f"arguments are not valid JSON: nested deeper than {max_depth} levels"
            ) from None
        except ValueError as err:  # UnicodeDecodeError included: JSON text is UTF-8 (RFC 8259)
            raise ArgumentsError(ErrorKind.INVALID_JSON, f"arguments are not valid JSON: {err}") from None
        if not isinstance(value, dict):
            raise ArgumentsError(
                ErrorKind.INVALID_JSON,
                f"arguments must be a JSON object, got {type(value).__name__}: {_shorten(text.strip())}",
            )
    else:
        raise ArgumentsError(
            ErrorKind.INVALID_JSON,
            f"arguments must be JSON text or a mapping, got {type(arguments).__name__}",
        )
    problem = _problem(value, max_depth)
    if problem:
        raise ArgumentsError(ErrorKind.INVALID_JSON, f"arguments are not valid JSON: {problem}")
    decoded: dict[str, Any] = value
    return decoded


def make_validator(schema: dict[str, Any]) -> Draft202012Validator:
    """A Draft 2020-12 validator for a checked parameter schema, asserting ``format``."""
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def violations(validator: Draft202012Validator, args: dict[str, Any]) -> list[str]:
    """Every violation of the schema by ``args``, as ``"<json path>: <message>"``,
    sorted by path. Empty when ``args`` is valid."""
    found = [(err.json_path, _shorten(err.message)) for err in validator.iter_errors(args)]
    return [f"{path}: {message}" for path, message in sorted(found)]
