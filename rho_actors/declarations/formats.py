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

from typing import Any, Literal

from rho_actors.declarations.checks import DeclarationError, check_declaration, checked_untrusted, read_declaration
from rho_actors.declarations.toolset import plain_copy
from rho_actors.tool import ToolInfo, is_untrusted

__all__ = ["DIALECTS", "Dialect", "declaration", "to_dialect"]

Dialect = Literal["openai", "anthropic", "mcp", "neutral"]
DIALECTS: tuple[Dialect, ...] = ("openai", "anthropic", "mcp", "neutral")


def to_dialect(info: ToolInfo, dialect: Dialect) -> dict[str, Any]:
    """``info`` in a provider's format (a fresh dict; the schema is a deep copy: one
    ``marshal`` round trip for plain JSON data).

    Raises ``ValueError`` for a dialect not in :data:`DIALECTS`.
    """
    schema = plain_copy(info.parameter_schema)
    if dialect == "openai":
        return {
            "type": "function",
            "function": {"name": info.name, "description": info.description, "parameters": schema},
        }
    if dialect == "anthropic":
        return {"name": info.name, "description": info.description, "input_schema": schema}
    if dialect == "mcp":
        declared = {"name": info.name, "description": info.description, "inputSchema": schema}
        if info.annotations:  # MCP's title (also the tool's) and hints
            declared["annotations"] = dict(info.annotations)
            title = declared["annotations"].get("title")
            if title is not None:
                declared["title"] = title
        return declared
    if dialect == "neutral":
        return {
            "name": info.name,
            "description": info.description,
            "parameters": schema,
            "timeout_ms": info.timeout_ms,
            "concurrency": info.concurrency,
            **({"annotations": dict(info.annotations)} if info.annotations else {}),
        }
    raise ValueError(f"unknown dialect {dialect!r}; expected one of {', '.join(DIALECTS)}")


def declaration(tool: Any, dialect: Dialect = "neutral") -> dict[str, Any] | None:
    """The declaration sent to a model for ``tool`` (a tool or a :class:`ToolInfo`),
    or ``None`` when its declaration fails the checks of DESIGN §3 (it is not offered).

    A trusted tool is read and checked in the caller's thread. An untrusted one
    (:func:`rho_actors.untrusted`) is never read here: its declaration is the one a
    system read in a throwaway process, and ``None`` while none has or when it failed.
    Raises ``ValueError`` for an unknown dialect.
    """
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}; expected one of {', '.join(DIALECTS)}")
    if is_untrusted(tool):
        checked = checked_untrusted(tool)
        return to_dialect(checked, dialect) if isinstance(checked, ToolInfo) else None
    if not isinstance(tool, ToolInfo):
        try:
            tool = check_declaration(read_declaration(tool))
        except DeclarationError:
            return None
    return to_dialect(tool, dialect)
