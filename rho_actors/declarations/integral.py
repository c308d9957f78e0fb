"""Integral floats at ``integer`` positions of valid arguments made ``int`` s.

JSON Schema counts ``3.0`` as an integer, so arguments sent as ``{"n": 3.0}`` are valid
for ``{"type": "integer"}``; a tool declaring an integer should still get an ``int``.
:func:`integral_floats` rewrites such values in place once validation found the
arguments valid (:func:`rho_actors.declarations.arguments.violations`).

Example::

    >>> args = {"n": 3.0}
    >>> integral_floats({"type": "object", "properties": {"n": {"type": "integer"}}}, args)
    >>> args
    {'n': 3}
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["integral_floats"]


def _integer_only(schema: Any) -> bool:
    kind = schema.get("type") if isinstance(schema, dict) else None
    kinds = kind if isinstance(kind, list) else [kind]
    return "integer" in kinds and "number" not in kinds


def integral_floats(schema: Any, args: dict[str, Any]) -> None:
    """Replace integral floats at ``integer`` positions of ``args`` (in place), following
    ``properties``, ``additionalProperties``, ``items``, ``prefixItems``, ``allOf`` and
    local ``$ref`` s; positions reached only through ``anyOf``/``oneOf`` are left as sent.
    Arguments holding no float, list or object at their first level (most calls) hold no
    float anywhere: they are left at once, whatever the schema."""
    for item in args.values():
        if isinstance(item, (float, dict, list)):
            break
    else:
        return
    root = schema
    stack: list[tuple[Any, Any, int]] = [(schema, args, 0)]
    while stack:
        sub, value, hops = stack.pop()
        if not isinstance(sub, dict) or hops > 64:
            continue
        ref = sub.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target: Any = root
            for escaped in ref[2:].split("/"):
                key = escaped.replace("~1", "/").replace("~0", "~")
                target = target.get(key) if isinstance(target, dict) else None
            stack.append((target, value, hops + 1))
        for part in sub.get("allOf", []) if isinstance(sub.get("allOf"), list) else []:
            stack.append((part, value, hops + 1))
        children: Iterator[tuple[Any, Any, Any]]  # (key or index, item, its subschema or None)
        if isinstance(value, dict):
            props: dict[str, Any] = sub["properties"] if isinstance(sub.get("properties"), dict) else {}
            extra = sub.get("additionalProperties")
            default = extra if isinstance(extra, dict) else None
            children = ((key, item, props.get(key, default)) for key, item in value.items())
        elif isinstance(value, list):
            prefix: list[Any] = sub["prefixItems"] if isinstance(sub.get("prefixItems"), list) else []
            rest = sub.get("items")
            tail = rest if isinstance(rest, dict) else None
            children = ((i, item, prefix[i] if i < len(prefix) else tail) for i, item in enumerate(value))
        else:
            continue
        for key, item, child in children:  # a value replaced in place: the container's size is unchanged
            if child is None:
                continue
            if isinstance(item, float) and item.is_integer() and _integer_only(child):
                value[key] = int(item)
            else:
                stack.append((child, item, hops + 1))
