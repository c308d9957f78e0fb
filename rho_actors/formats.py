"""Provider dialects: a checked declaration in the shape each provider's API takes.

==============  ===================================================================
dialect         shape
==============  ===================================================================
``openai``      Chat Completions function tool:
                ``{"type": "function", "function": {"name", "description", "parameters"}}``
``anthropic``   Messages API tool: ``{"name", "description", "input_schema"}``
``mcp``         Model Context Protocol ``Tool``: ``{"name", "description", "inputSchema"}``
``neutral``     ``{"name", "description", "parameters", "timeout_ms", "concurrency"}``
==============  ===================================================================
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from rho_actors.declarations import DeclarationError, check_declaration, read_declaration
from rho_actors.tool import ToolInfo

__all__ = ["DIALECTS", "Dialect", "declaration", "to_dialect"]

Dialect = Literal["openai", "anthropic", "mcp", "neutral"]
DIALECTS: tuple[Dialect, ...] = ("openai", "anthropic", "mcp", "neutral")


def to_dialect(info: ToolInfo, dialect: Dialect) -> dict[str, Any]:
    """``info`` in a provider's format (a fresh dict; the schema is a deep copy).

    Raises ``ValueError`` for a dialect not in :data:`DIALECTS`.
    """
    schema = copy.deepcopy(info.parameter_schema)
    if dialect == "openai":
        return {
            "type": "function",
            "function": {"name": info.name, "description": info.description, "parameters": schema},
        }
    if dialect == "anthropic":
        return {"name": info.name, "description": info.description, "input_schema": schema}
    if dialect == "mcp":
        return {"name": info.name, "description": info.description, "inputSchema": schema}
    if dialect == "neutral":
        return {
            "name": info.name,
            "description": info.description,
            "parameters": schema,
            "timeout_ms": info.timeout_ms,
            "concurrency": info.concurrency,
        }
    raise ValueError(f"unknown dialect {dialect!r}; expected one of {', '.join(DIALECTS)}")


def declaration(tool: Any, dialect: Dialect = "neutral") -> dict[str, Any] | None:
    """The declaration sent to a model for ``tool`` (a tool or a :class:`ToolInfo`),
    or ``None`` when its declaration fails the checks of DESIGN §3 (it is not offered).

    A tool (not a ``ToolInfo``) is read and checked in the caller's thread, so use this
    on trusted tools; a system's loops use the DeclarationActor's cache instead.
    Raises ``ValueError`` for an unknown dialect.
    """
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}; expected one of {', '.join(DIALECTS)}")
    if not isinstance(tool, ToolInfo):
        try:
            tool = check_declaration(read_declaration(tool))
        except DeclarationError:
            return None
    return to_dialect(tool, dialect)
