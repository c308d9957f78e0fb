"""What a served call answers (``rho-actors mcp serve``): a rho :class:`ToolResult` as
MCP's ``CallToolResult`` (:func:`call_tool_result`: its text, pictures and content
blocks, and a JSON object's ``structuredContent``), checked against the tool's
``outputSchema`` (:func:`output_schema`) when it declares one (MCP: structured results
MUST conform)."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from typing import Any

import mcp_types as types
from loguru import logger

from rho_actors.declarations.arguments import MAX_VALIDATION_S, make_validator, violations
from rho_actors.declarations.checks import output_schema_problems
from rho_actors.encoding import describe_exception
from rho_actors.mcp.content import mcp_content
from rho_actors.results import text
from rho_actors.tool import ToolResult, is_untrusted

__all__ = ["call_tool_result", "checked_output_schema", "entry_output_schema", "output_schema"]


def output_schema(system: Any, name: str) -> dict[str, Any] | None:
    """The ``outputSchema`` of tool ``name`` in ``system``'s tool set now (see
    :func:`entry_output_schema`)."""
    return entry_output_schema(system.tool_set().entries.get(name), name)


def entry_output_schema(entry: Any, name: str) -> dict[str, Any] | None:
    """The ``outputSchema`` of tool ``name`` whose tool-set entry is ``entry`` (None: not
    registered): what its ``output_schema()`` returns (an optional callback: a JSON
    Schema of an object), for a trusted tool only (an untrusted tool's code is never run
    in this process). None without one (or when it returns None), or when it is not a
    valid schema of an object (logged). A caller that decides more than this of one call
    passes the entry it read once, so a re-registration meanwhile cannot mix versions."""
    declare = getattr(entry.tool, "output_schema", None) if entry is not None else None
    if entry is None or is_untrusted(entry.tool) or not callable(declare):
        return None
    try:
        schema = declare()
        if schema is None:  # declares none (an MCP server's tool without one, say)
            return None
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise ValueError('an outputSchema must be a schema of an object ("type": "object")')
        checked = checked_output_schema(json.dumps(schema, sort_keys=True, allow_nan=False))
        if isinstance(checked, str):
            raise ValueError(checked)
    except Exception as exc:
        logger.warning("MCP: tool {!r}: its output_schema() is not served: {}", name, describe_exception(exc))
        return None
    return copy.deepcopy(schema)


@functools.lru_cache(maxsize=1024)
def checked_output_schema(text: str) -> Any:
    """The validator of the outputSchema whose JSON text (keys sorted) is ``text``, or why
    it is not served: the checks and bounds of a parameter schema
    (:func:`~rho_actors.declarations.checks.output_schema_problems`), so an upstream's
    schema cannot make checking a result slow; its validator matches patterns with RE2
    and is bounded in work (:func:`~rho_actors.declarations.arguments.violations`)."""
    schema = json.loads(text)
    problems = output_schema_problems(schema)
    if problems:
        return "; ".join(problems)
    return make_validator(schema)


def _structured(result: ToolResult) -> Any:
    """The result's ``structuredContent``: an upstream MCP server's own, kept in its
    details (a gateway passes it on), else the result's text as a JSON object, else None."""
    if not result.ok:
        return None
    details = result.details
    if isinstance(details, Mapping) and isinstance(details.get("structuredContent"), dict):
        return details["structuredContent"]
    if not result.content.startswith("{"):
        return None
    try:
        value = json.loads(result.content)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def call_tool_result(result: ToolResult, schema: dict[str, Any] | None = None,
                     meta: dict[str, Any] | None = None) -> types.CallToolResult:
    """``result`` as MCP's ``CallToolResult``: the text, the images, and, when the text
    is a JSON object, the same object as ``structuredContent``. With ``schema`` (the
    tool's outputSchema) an ok result must be an object matching it, else the client
    gets an error result saying why (MCP: structured results MUST conform). ``meta``:
    its ``_meta``, either way."""
    structured = _structured(result)
    if schema is not None and result.ok:
        problem = "it is not a JSON object" if structured is None else None
        if structured is not None:
            checked = checked_output_schema(json.dumps(schema, sort_keys=True, allow_nan=False))
            if isinstance(checked, str):
                problem = f"the outputSchema cannot be used: {checked[:300]}"
            else:
                found = violations(checked, copy.deepcopy(structured), MAX_VALIDATION_S)
                problem = f"at {found[0][:300]}" if found else None
        if problem is not None:
            message = text("mcp_output_schema", tool=result.name, problem=problem)
            return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True,
                                        _meta=meta)
    content: list[Any] = []
    if result.blocks:
        content.extend(mcp_content(block) for block in result.blocks if not isinstance(block, str) or block)
    else:
        if result.content or not result.images:
            content.append(types.TextContent(type="text", text=result.content))
        content.extend(mcp_content(image) for image in result.images)
    if not content:
        content.append(types.TextContent(type="text", text=""))
    return types.CallToolResult(content=content, is_error=not result.ok, structured_content=structured, _meta=meta)
