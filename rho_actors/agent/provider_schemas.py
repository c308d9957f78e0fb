"""Provider-ready schemas: the copy of a tool's parameter schema each provider accepts.

A checked declaration (DESIGN §3) is a valid JSON Schema whose top level is an object
schema, but providers refuse some such schemas with HTTP 400, on every request that
offers the tool (langchain-mcp-adapters #137: MCP servers declare a tool without
parameters as ``{"type": "object"}``). Each adapter sends :func:`provider_schema`'s copy;
what the loop validates a call against is never changed, so a call is held to the whole
schema whatever the provider was sent.

=====================================  ============================================  =========
rule (each a documented 400)           what is sent                                  providers
=====================================  ============================================  =========
top level ``"type": "object"``         set                                           both
``properties`` present (an object)     ``"properties": {}`` added when missing       both
no ``oneOf``/``anyOf``/``allOf`` at    left out of the copy; the ``properties`` of   both
the top level                          their object branches merged into the top
                                       level (``required``: all of ``allOf``'s, what
                                       every ``anyOf``/``oneOf`` branch requires)
no ``enum``/``not`` at the top level   left out of the copy                          openai
property names ``^[a-zA-Z0-9_.-]       no form can carry another name (renaming      anthropic
{1,64}$``                              would change the arguments): the tool is
                                       left out of the request, with the reason
=====================================  ============================================  =========

Example::

    provider_schema({"type": "object"}, "openai")
    # ({"type": "object", "properties": {}}, None)
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any, Final

from loguru import logger

__all__ = ["COMBINATORS", "provider_schema", "provider_tools"]

COMBINATORS: Final = ("allOf", "anyOf", "oneOf")
"""The combinators no provider takes at a parameter schema's top level."""
_OPENAI_TOP_REFUSED: Final = ("enum", "not")
_ANTHROPIC_PROPERTY: Final = re.compile(r"[a-zA-Z0-9_.-]{1,64}")
_LOGGED: set[tuple[str, str, str]] = set()
_MAX_LOGGED: Final = 1024


def provider_schema(schema: Mapping[str, Any], provider: str) -> tuple[dict[str, Any] | None, str | None]:
    """The copy of ``schema`` (a checked parameter schema) to send to ``provider``
    (``"openai"``, ``"anthropic"``; any other name gets the rules of both):
    ``(copy, None)``, or ``(None, reason)`` when no form the provider takes can carry it.
    ``schema`` itself is never changed. Never raises."""
    sent: dict[str, Any] = copy.deepcopy(dict(schema))
    sent["type"] = "object"
    merged: dict[str, Any] = {}
    required: list[str] | None = None
    for keyword in COMBINATORS:
        branches = sent.pop(keyword, None)
        if not isinstance(branches, list):
            continue
        wanted: set[str] | None = None
        for branch in branches:
            props = branch.get("properties") if isinstance(branch, dict) else None
            if isinstance(props, dict):
                for name, sub in props.items():
                    merged.setdefault(name, sub)
            needs = set(_names(branch.get("required") if isinstance(branch, dict) else None))
            if keyword == "allOf":
                required = sorted(set(required or ()) | needs)
            else:
                wanted = needs if wanted is None else wanted & needs
        if wanted:
            required = sorted(set(required or ()) | wanted)
    properties = sent.get("properties")
    if not isinstance(properties, dict):
        properties = {}
    for name, sub in merged.items():
        properties.setdefault(name, sub)
    sent["properties"] = properties
    if required:
        sent["required"] = sorted(set(_names(sent.get("required"))) | set(required))
    if provider != "anthropic":
        for keyword in _OPENAI_TOP_REFUSED:
            sent.pop(keyword, None)
    if provider != "openai":
        for name in properties:
            if not _ANTHROPIC_PROPERTY.fullmatch(name):
                shown = name[:40] + ("..." if len(name) > 40 else "")
                return None, (f"its parameter {shown!r} is not a name the Messages API takes "
                              "(^[a-zA-Z0-9_.-]{1,64}$), and renaming it would change the arguments")
    return sent, None


def _names(value: Any) -> list[str]:
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def provider_tools(tools: Any, provider: str) -> list[tuple[Mapping[str, Any], dict[str, Any]]]:
    """The neutral declarations of ``tools`` a request to ``provider`` can carry, each
    with its :func:`provider_schema` copy: ``[(declaration, schema)]``. A declaration
    left out is logged (a loguru warning, once per tool, provider and reason). Raises
    ``KeyError`` for a declaration without ``name`` or ``parameters``."""
    kept: list[tuple[Mapping[str, Any], dict[str, Any]]] = []
    for decl in tools:
        schema, reason = provider_schema(decl["parameters"], provider)
        if schema is None:
            key = (str(decl["name"]), provider, str(reason))
            if key not in _LOGGED:
                if len(_LOGGED) >= _MAX_LOGGED:
                    _LOGGED.clear()
                _LOGGED.add(key)
                logger.warning("tool {} is left out of requests to {}: {}", decl["name"], provider, reason)
            continue
        kept.append((decl, schema))
    return kept
