"""A tool's annotations: MCP's ``title`` and its four behaviour hints.

A tool may declare ``annotations() -> dict`` (``@tool(annotations={...})``), with MCP's
keys (the ``ToolAnnotations`` of the MCP schema):

- ``title``: a display name for people (at most :data:`MAX_TITLE_CHARS` characters);
- ``readOnlyHint``: the tool changes nothing;
- ``destructiveHint``: it may destroy or overwrite (meaningful when not read-only);
- ``idempotentHint``: calling it again with the same arguments does nothing more;
- ``openWorldHint``: it reaches an open world (the web, other people), not a closed one.

They are hints, said by the tool's author (or an upstream MCP server): ``mcp serve``
lists them and a gateway passes an upstream's on, but nothing in rho grants a tool
more because of them, and a host policy is never lifted by a tool's own hint. One is
more than a hint: ``idempotentHint`` is the tool's declared idempotence as served
(:func:`idempotent_hinted`; docs/design/tool-contract.md "Idempotence"), and an upstream
server's is taken only where the host trusts its hints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rho_actors.encoding import scrub_text, strip_controls

__all__ = ["HINTS", "MAX_TITLE_CHARS", "Annotations", "checked_annotations", "idempotent_hinted"]

HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
"""MCP's behaviour hints, each a ``bool``."""
MAX_TITLE_CHARS = 200
"""The longest ``title``, in characters."""

Annotations = tuple[tuple[str, Any], ...]
"""Checked annotations as :class:`~rho_actors.tool.ToolInfo` keeps them: ``(key, value)``
pairs in MCP's order (``title`` first), immutable."""


def checked_annotations(value: Any) -> Annotations:
    """``value`` (a mapping of MCP's annotation keys, or None) checked: the title a
    string of at most :data:`MAX_TITLE_CHARS` characters (control characters
    removed), each hint a ``bool``. Raises ``TypeError`` for a value that is no mapping
    or a key of the wrong type, ``ValueError`` for an unknown key or a long title."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise TypeError(f"annotations must be a mapping of MCP's keys (title, {', '.join(HINTS)}), "
                        f"not a {type(value).__name__}")
    unknown = sorted(str(key)[:40] for key in value if key not in ("title", *HINTS))
    if unknown:
        raise ValueError(f"annotations: unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"MCP's are title, {', '.join(HINTS)}")
    checked: list[tuple[str, Any]] = []
    title = value.get("title")
    if title is not None:
        if type(title) is not str:
            raise TypeError(f"annotations: title must be a str, not a {type(title).__name__}")
        if len(title) > MAX_TITLE_CHARS:
            raise ValueError(f"annotations: title is {len(title)} characters; at most {MAX_TITLE_CHARS}")
        shown, _ = strip_controls(scrub_text(str.__str__(title)))
        if shown.strip():
            checked.append(("title", shown))
    for hint in HINTS:
        said = value.get(hint)
        if said is None:
            continue
        if type(said) is not bool:
            raise TypeError(f"annotations: {hint} must be a bool, not a {type(said).__name__}")
        checked.append((hint, said))
    return tuple(checked)


def idempotent_hinted(annotations: Annotations, idempotent: bool) -> Annotations:
    """``annotations`` with MCP's ``idempotentHint`` derived from the tool's declared
    idempotence: ``True`` when it is idempotent, else left out (MCP's default, false)."""
    kept = {key: value for key, value in annotations if key != "idempotentHint"}
    if idempotent:
        kept["idempotentHint"] = True
    return checked_annotations(kept) if kept != dict(annotations) else annotations
