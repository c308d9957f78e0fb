"""Output encoding: turning what a tool returned into the text a model reads (DESIGN §2).

- A ``str`` goes as it is (lone surrogates replaced by U+FFFD, so the text is valid
  UTF-8 and survives any provider's JSON encoder).
- Anything else is encoded as strict JSON (RFC 8259): ``NaN`` and infinities become
  ``null`` (as JavaScript's ``JSON.stringify`` and pydantic's default do); datetime,
  date and time as ISO 8601; a set or frozenset as a sorted list; ``Decimal``,
  ``UUID`` and ``Path`` as strings; an ``Enum`` as its value; dataclasses and pydantic
  models as objects; tuples as arrays; non-string dict keys as strings.
- What still cannot be encoded (an arbitrary object, a cycle, bytes) falls back to its
  ``repr``, marked so by :data:`REPR_MARK` at the start of the text.
- Text longer than ``max_chars`` is cut, with a notice that gives the original size.

Example::

    >>> encode_output({"when": datetime.date(2026, 1, 2), "tags": {"b", "a"}}).text
    '{"when": "2026-01-02", "tags": ["a", "b"]}'
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import math
import pathlib
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_MAX_OUTPUT_CHARS",
    "REPR_MARK",
    "EncodedOutput",
    "cap_text",
    "describe_exception",
    "encode_output",
    "scrub_strings",
    "scrub_text",
    "shown_text",
    "strip_controls",
    "text_length",
]

DEFAULT_MAX_OUTPUT_CHARS = 100_000
"""Default cap, in characters, on the text one result gives the model."""

REPR_MARK = "[not JSON-encodable; Python repr follows]\n"
"""Starts the text of an output that fell back to ``repr``."""

_MAX_DEPTH = 100


class _Unencodable(Exception):
    pass


@dataclass(frozen=True, slots=True)
class EncodedOutput:
    """``text`` for the model; ``is_repr`` when it fell back to ``repr``;
    ``original_chars`` the length before the cap (``truncated`` when it was cut)."""

    text: str
    is_repr: bool = False
    truncated: bool = False
    original_chars: int = 0


def scrub_strings(value: Any, fix: Callable[[str], str] | None = None) -> Any:
    """``value`` (JSON-like data: dicts, lists, tuples, scalars) with every string, dict
    keys included, through ``fix`` (default :func:`scrub_text`): the containers are new
    (a tuple becomes a list), ``value``'s own untouched; any other value as it is. A loop,
    not a recursion: no depth is too deep for it. The one walk for every store of
    strings that must be valid UTF-8 (a transcript record) or a child's plain data.
    Raises ``ValueError`` naming them when two keys of a dict become one key (``"a\\ud800"``
    and ``"a\\udc00"``): one value would be lost without a word."""
    fix = scrub_text if fix is None else fix
    if isinstance(value, str):
        return fix(value)
    root: list[Any] = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        parent, key = stack.pop()
        item = parent[key]
        if isinstance(item, str):
            parent[key] = fix(item)
        elif isinstance(item, (list, tuple)):
            parent[key] = copy = list(item)
            stack.extend((copy, i) for i in range(len(copy)))
        elif isinstance(item, dict):
            parent[key] = clean = {fix(k) if isinstance(k, str) else k: v for k, v in item.items()}
            if len(clean) != len(item):
                raise ValueError(_collision(item, fix))
            stack.extend((clean, k) for k in clean)
    return root[0]


def _collision(item: dict[Any, Any], fix: Callable[[str], str]) -> str:
    seen: dict[Any, Any] = {}
    for k in item:
        clean = fix(k) if isinstance(k, str) else k
        if clean in seen:
            return f"the keys {seen[clean]!r} and {k!r} of a dict both become {clean!r} once scrubbed"
        seen[clean] = k
    return "two keys of a dict become one once scrubbed"


def text_length(text: str | bytes | bytearray) -> int:
    """The characters of ``text`` (its bytes, for ``bytes`` or ``bytearray``) as held,
    whatever a subclass's ``__len__`` says (a bound on input size counts these)."""
    return str.__len__(text) if isinstance(text, str) else memoryview(text).nbytes


def scrub_text(text: str) -> str:
    """``text`` as an exact ``str`` with every lone surrogate replaced by U+FFFD (paired
    ones are joined): valid UTF-8, the one rule for every string that reaches a model, an
    SDK or a transcript. A ``str`` subclass is copied first (its methods are not called)."""
    text = str.__str__(text)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f"  # C0 but tab and newline, DEL, C1 (ESC of OSC 52, clear-screen...)
    "\u061c\u200b-\u200f\u2028\u2029\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"  # bidi, zero-width, line breaks
)


def strip_controls(text: str) -> tuple[str, int]:
    """``text`` without its unsafe characters (see :func:`replace_controls`), and how
    many were removed."""
    stripped, count = _UNSAFE.subn("", text)
    return stripped, count


def replace_controls(text: str, replacement: str | Callable[[re.Match[str]], str] = "\ufffd") -> str:
    """``text`` with every unsafe character replaced by ``replacement`` (a string, or a
    function of the match as for :func:`re.sub`): C0/C1 control characters other than
    newline and tab (carriage return included: it overwrites a line), DEL, bidi
    controls (U+061C, U+200E/F, U+202A-E, U+2066-9), zero-width characters (U+200B-D,
    U+2060-4, U+FEFF) and the line/paragraph separators U+2028/9. What is left cannot
    move a terminal's cursor, set its clipboard (OSC 52), clear it, or reorder or break
    what a reader sees. The one rule for text from a tool, a child or a peer."""
    return _UNSAFE.sub(replacement, text)


def shown_text(text: object, max_chars: int = 200) -> str:
    """Someone else's text (an upstream's words, a plugin file's name, a reason a child
    gave) as the host shows or logs it: one line, every control, bidi and zero-width
    character, newlines and tabs included, escaped as Python writes it (``\\x1b``,
    ``\\n``), cut to ``max_chars`` characters (``...`` marks a cut). It can neither move
    a terminal's cursor nor forge a line of a log."""
    raw = str(text).encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate as \\udcff
    cut = len(raw) > max_chars
    escaped = replace_controls(raw[:max_chars], lambda m: ascii(m.group())[1:-1])
    escaped = escaped.replace("\n", "\\n").replace("\t", "\\t")
    return escaped + ("..." if cut else "")


def shown_bytes(raw: bytes) -> str:
    """Bytes a child or a server wrote (a line of its output), as the host logs them:
    invalid UTF-8 and every unsafe character (:func:`replace_controls`) escaped as
    Python writes them (``\\x1b``, ``\\u202e``)."""
    return replace_controls(raw.decode("utf-8", errors="backslashreplace"), lambda m: ascii(m.group())[1:-1])


def _jsonable(value: Any, depth: int, seen: set[int]) -> Any:
    """``value`` as plain JSON data (dict/list/str/int/float/bool/None)."""
    if value is None or value is True or value is False:
        return value
    if isinstance(value, enum.Enum):  # before str and int: a StrEnum is a str too
        return _jsonable(value.value, depth, seen)
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID, pathlib.PurePath)):
        return str(value)
    if depth >= _MAX_DEPTH:
        raise _Unencodable("nested too deeply")
    if id(value) in seen:
        raise _Unencodable("contains a cycle")
    seen.add(id(value))
    try:
        if isinstance(value, dict):
            return {_key(k): _jsonable(v, depth + 1, seen) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_jsonable(v, depth + 1, seen) for v in value]
        if isinstance(value, (set, frozenset)):
            items = [_jsonable(v, depth + 1, seen) for v in value]
            try:
                return sorted(items)
            except TypeError:
                return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {
                f.name: _jsonable(getattr(value, f.name), depth + 1, seen)
                for f in dataclasses.fields(value)
            }
        dump = getattr(value, "model_dump", None)  # pydantic v2 models
        if callable(dump) and not isinstance(value, type):
            return _jsonable(dump(mode="json"), depth + 1, seen)
    finally:
        seen.discard(id(value))
    raise _Unencodable(type(value).__qualname__)


def _key(key: Any) -> str:
    if isinstance(key, enum.Enum):
        key = key.value
    if isinstance(key, str):
        return scrub_text(key)
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)
    if isinstance(key, (decimal.Decimal, uuid.UUID, pathlib.PurePath, datetime.date, datetime.time)):
        return str(_jsonable(key, 0, set()))
    raise _Unencodable(f"dict key of type {type(key).__qualname__}")


def describe_exception(exc: BaseException) -> str:
    """``"TypeName: message"`` (``"TypeName"`` when the message is empty) for an
    exception, even one whose ``__str__`` raises."""
    try:
        text = scrub_text(str(exc))
    except BaseException:  # an exception whose __str__ raises, or exits
        text = "<str() raised>"
    name = scrub_text(type(exc).__name__)
    return f"{name}: {text}" if text else name


def _safe_repr(value: Any) -> str:
    try:
        return scrub_text(repr(value))
    except BaseException:  # a broken __repr__ must not escape: it is the tool's output
        try:
            return f"<{scrub_text(type(value).__qualname__)} object (repr raised)>"
        except BaseException:
            return "<object (repr raised)>"


def cap_text(text: str, max_chars: int) -> tuple[str, bool]:
    """``text`` cut to ``max_chars`` characters with a notice giving the original size
    (the one cap for every result text, refusals included)."""
    return _cut(scrub_text(text), max_chars)


def _cut(text: str, max_chars: int) -> tuple[str, bool]:
    """:func:`cap_text` of a ``text`` already scrubbed."""
    if len(text) <= max_chars:
        return text, False
    notice = f"\n[output truncated: {len(text):,} characters in all, the first {max_chars:,} shown]"
    return text[:max_chars] + notice, True


def encode_output(value: Any, max_chars: int = DEFAULT_MAX_OUTPUT_CHARS) -> EncodedOutput:
    """Encode ``value`` as the text a model reads, capped at ``max_chars`` characters.

    Never raises: an unencodable value (or one whose encoding raises) falls back to its
    ``repr`` behind :data:`REPR_MARK`.
    """
    if type(value) is str:  # the usual case: scrubbed once, then cut
        text = scrub_text(value)
        capped, truncated = _cut(text, max_chars)
        return EncodedOutput(capped, False, truncated, len(text))
    is_repr = False
    try:
        if isinstance(value, str):
            text = scrub_text(value)
        else:
            text = json.dumps(_jsonable(value, 0, set()), ensure_ascii=False, allow_nan=False)
    except BaseException:  # a model_dump (or an __eq__, a __hash__...) that raises or exits is the tool's output too
        text, is_repr = REPR_MARK + _safe_repr(value), True
    capped, truncated = cap_text(text, max_chars)
    return EncodedOutput(capped, is_repr, truncated, len(text))
