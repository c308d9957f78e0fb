"""JSON text from a peer that is not trusted, decoded within bounds (DESIGN §5, §6b).

:func:`loads_bounded` counts the arrays and objects of a JSON text, and how deeply they
nest, *before* :func:`json.loads` builds a single Python object, so a peer's text cannot
make the host build millions of containers (32 MiB of nested empty objects are about
1.2 GiB of Python objects) or recurse without end. The count runs over the text at C
speed: brackets are counted as they stand, and only when that count is over a bound are
the strings taken out first (escaped quotes and backslashes dropped, then every
``"..."``), so the structure is measured exactly and linearly whatever the strings hold.

Example::

    >>> loads_bounded('{"a": [1, 2]}', max_containers=2, max_depth=2)
    {'a': [1, 2]}
    >>> loads_bounded('[[[]]]', max_containers=10, max_depth=2)
    Traceback (most recent call last):
    ...
    rho_actors.bounded_json.JSONBoundError: JSON nested deeper than 2 levels
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final

__all__ = ["JSONBoundError", "bound_problem", "loads_bounded"]

_STRING: Final = re.compile(r'"[^"]*"')  # a string once its escaped quotes are dropped
_NOT_BRACKET: Final = re.compile(r"[^\[\]{}]+")


class JSONBoundError(ValueError):
    """A JSON text over a bound (its size, its arrays and objects, its depth); the
    message names the bound."""


def _outside_strings(text: str) -> str:
    """``text`` without its strings (escaped backslashes and quotes dropped first)."""
    return _STRING.sub("", text.replace("\\\\", "").replace('\\"', ""))


def bound_problem(text: str, *, max_containers: int, max_depth: int) -> str | None:
    """Why the JSON ``text`` is over ``max_containers`` arrays and objects or nested
    deeper than ``max_depth`` (``"JSON of more than 10 arrays and objects (12)"``), or
    ``None``; counted on the text, nothing decoded. Linear in the text."""
    rough = text.count("[") + text.count("{")  # brackets in strings too: at least the containers
    if rough <= max_containers and rough <= max_depth:
        return None
    bare = _outside_strings(text)
    containers = bare.count("[") + bare.count("{")
    if containers > max_containers:
        return f"JSON of more than {max_containers:,} arrays and objects ({containers:,})"
    skeleton = _NOT_BRACKET.sub("", bare).replace("{", "[").replace("}", "]")
    for _ in range(max_depth):  # each pass takes the innermost level away
        skeleton = skeleton.replace("[]", "")
        if not skeleton:
            return None
    return f"JSON nested deeper than {max_depth} levels" if skeleton else None


def loads_bounded(text: str | bytes, *, max_containers: int, max_depth: int, max_bytes: int | None = None,
                  parse_constant: Callable[[str], Any] | None = None) -> Any:
    """``json.loads(text)`` once ``text`` is known to hold at most ``max_containers``
    arrays and objects nested at most ``max_depth`` deep (and, with ``max_bytes``, to be
    at most that many bytes or characters). ``parse_constant`` is :func:`json.loads`'s
    (raise in it to refuse ``NaN`` and infinities). Raises :class:`JSONBoundError` (a
    ``ValueError``) naming the bound passed, before anything is decoded; ``ValueError``
    for text that is not JSON (or bytes not UTF-8)."""
    if max_bytes is not None and len(text) > max_bytes:
        raise JSONBoundError(f"JSON text of {len(text):,} bytes, over the bound of {max_bytes:,}")
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")
    problem = bound_problem(text, max_containers=max_containers, max_depth=max_depth)
    if problem is not None:
        raise JSONBoundError(problem)
    try:
        return json.loads(text, parse_constant=parse_constant)
    except RecursionError:  # unbalanced brackets the count did not pair
        raise JSONBoundError(f"JSON nested deeper than {max_depth} levels") from None
