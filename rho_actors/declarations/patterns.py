"""JSON Schema's ``pattern`` dialect (ECMA-262) on RE2, which matches in linear time.

RE2 reads most of an ECMA-262 pattern alike, but not every class: RE2's ``\\s`` is ASCII
(tab, newline, form feed, carriage return, space), ECMA-262's is every ``WhiteSpace`` and
``LineTerminator`` (vertical tab, no-break space, U+2028, the BOM, the Unicode space
separators...); RE2's ``.`` excludes only ``\\n``, ECMA-262's every line terminator.
(``\\d``, ``\\w`` and ``\\b`` are ASCII in both without the ``u`` and ``i`` flags, which JSON
Schema patterns do not have.) :func:`ecma_to_re2` rewrites those classes into explicit RE2
classes, so ``^\\S+$`` refuses ``"a\\u00a0b"`` as ECMA-262 does. The result is still an
RE2 pattern: matching stays linear.

For example ``ecma_to_re2(r"^\\S+$")`` is ``^[^\\x{9}\\x{a}\\x{b}...\\x{feff}]+$``.
"""

from __future__ import annotations

import re2

__all__ = ["ECMA_SPACE", "ecma_to_re2"]

ECMA_SPACE = ("\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
              "\u2028\u2029\u202f\u205f\u3000\ufeff")
"""The characters ECMA-262's ``\\s`` matches: ``WhiteSpace`` and ``LineTerminator``."""

_LINE_ENDS = "\n\r\u2028\u2029"
"""ECMA-262's ``LineTerminator``: what ``.`` does not match."""


def _members(chars: str) -> str:
    """``chars`` as the inside of an RE2 class, each one escaped (``\\x{..}``)."""
    return "".join(f"\\x{{{ord(c):x}}}" for c in chars)


_SPACE = _members(ECMA_SPACE)
_QUIET = re2.Options()
_QUIET.log_errors = False


def _class_end(pattern: str, start: int) -> int:
    """The index just past the class that opens at ``pattern[start] == "["`` (RE2's
    reading: a ``]`` first, or after ``^``, is a member), or -1 when it is not closed."""
    i = start + 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[" and pattern.startswith("[:", i):
            close = pattern.find(":]", i + 2)
            if close != -1:
                i = close + 2
                continue
        if c == "]":
            return i + 1
        i += 1
    return -1


def _class(body: str, negated: bool) -> str:
    """An RE2 class with members ``body`` (its inside, ``[``/``^``/``]`` excluded) with
    ``\\s`` and ``\\S`` in ECMA-262's meaning."""
    parts: list[str] = []
    complements = False
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            escape = body[i + 1]
            if escape == "s":
                parts.append(_SPACE)
            elif escape == "S":
                complements = True
            else:
                parts.append(body[i:i + 2])
            i += 2
            continue
        parts.append(c)
        i += 1
    rest = "".join(parts)
    if not complements:
        return f"[{'^' if negated else ''}{rest}]"
    # \S in a class: the class is "not a space" or one of the others
    if not negated:
        return f"(?:[^{_SPACE}]|[{rest}])" if rest else f"[^{_SPACE}]"
    # [^...\S...]: the spaces that are none of the others (RE2 has no class intersection)
    if not rest:
        return f"[{_SPACE}]"
    try:
        others = re2.compile(f"[{rest}]", _QUIET)
    except re2.error:
        return f"[^{body}]"  # as written: RE2 names what is wrong with it
    kept = "".join(c for c in ECMA_SPACE if others.fullmatch(c) is None)
    return f"[{_members(kept)}]" if kept else "[^\\x{0}-\\x{10ffff}]"


def ecma_to_re2(pattern: str) -> str:
    """``pattern`` (ECMA-262, as JSON Schema's ``pattern`` and ``patternProperties``
    read it) as an RE2 pattern of the same meaning for ``\\s``, ``\\S`` and ``.``; other
    text is left as written (RE2 then refuses what it cannot match in linear time,
    lookarounds and backreferences). Never raises; a class left open is copied as is
    (for RE2 to refuse)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            escape = pattern[i + 1]
            if escape == "s":
                out.append(f"[{_SPACE}]")
            elif escape == "S":
                out.append(f"[^{_SPACE}]")
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[":
            end = _class_end(pattern, i)
            if end == -1:
                out.append(pattern[i:])
                break
            negated = pattern.startswith("[^", i)
            out.append(_class(pattern[i + (2 if negated else 1):end - 1], negated))
            i = end
            continue
        out.append(f"[^{_members(_LINE_ENDS)}]" if c == "." else c)
        i += 1
    return "".join(out)
