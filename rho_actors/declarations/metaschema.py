"""The JSON Schema Draft 2020-12 meta-schema as one document, for checking declarations
fast (DESIGN §3).

``Draft202012Validator.check_schema`` follows the meta-schema's ``$dynamicRef: "#meta"``
through the dynamic scope and across its seven vocabulary documents at every subschema:
most of its time. :func:`metaschema_validator` validates against the same
meta-schema as one document: its vocabularies inlined, each ``$dynamicRef: "#meta"`` as
``$ref: "#"`` (what that dynamic reference resolves to when the meta-schema itself is
the root), and every other ``$ref`` replaced in place by an ``allOf`` of its target, so
a schema gets the same first error (``tests/test_register_many.py``
compares both). Built once, from the copy ``jsonschema`` ships.
"""

from __future__ import annotations

import functools
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema_specifications import REGISTRY  # type: ignore[import-untyped]  # jsonschema's own dependency

__all__ = ["flat_metaschema", "metaschema_validator"]

_BASE = "https://json-schema.org/draft/2020-12/"
_DROPPED = frozenset({"$id", "$schema", "$vocabulary", "$dynamicAnchor"})
_SCHEMA_MAPS = frozenset({"properties", "$defs", "patternProperties", "dependentSchemas", "definitions"})
_DATA = frozenset({"enum", "const", "default", "examples"})


def _inlined(node: Any, prefix: str) -> Any:
    """``node`` (a part of the document whose ``$defs`` will be at ``prefix``) with its
    references made local to the one document."""
    if isinstance(node, list):
        return [_inlined(item, prefix) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "$dynamicRef":
            if value != "#meta":
                raise ValueError(f"unexpected $dynamicRef {value!r} in the meta-schema")
            out["$ref"] = "#"
        elif key == "$ref":
            if value.startswith("#"):
                out["$ref"] = prefix + value[1:]
            elif value.startswith("meta/"):
                vocabulary, _, pointer = value[len("meta/"):].partition("#")
                out["$ref"] = f"#/$defs/{vocabulary}{pointer}"
            else:
                raise ValueError(f"unexpected $ref {value!r} in the meta-schema")
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _inlined(sub, prefix) for name, sub in value.items()}
        elif key in _DATA:
            out[key] = value
        else:
            out[key] = _inlined(value, prefix)
    return out


@functools.cache
def flat_metaschema() -> dict[str, Any]:
    """The Draft 2020-12 meta-schema with its vocabularies inlined (a new dict once per
    process; do not change it). Raises ``ValueError`` if the shipped meta-schema uses a
    reference this does not know how to inline."""
    root = Draft202012Validator.META_SCHEMA
    flat: dict[str, Any] = _inlined(root, "#")
    definitions = flat.setdefault("$defs", {})
    for part in root["allOf"]:
        vocabulary = part["$ref"][len("meta/"):]
        definitions[vocabulary] = _inlined(REGISTRY.contents(_BASE + part["$ref"]), f"#/$defs/{vocabulary}")
    expanded: dict[str, Any] = _expanded(flat, flat)
    del expanded["$defs"]  # nothing refers to it any more
    return expanded


def _expanded(node: Any, document: dict[str, Any]) -> Any:
    """``node`` with every ``$ref`` but ``"#"`` replaced, in its place, by an ``allOf``
    of its target (expanded too): the same errors in the same order, without a look-up
    per subschema."""
    if isinstance(node, list):
        return [_expanded(item, document) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and value != "#":
            target: Any = document
            for step in value[2:].split("/"):
                target = target[step]
            if "allOf" in node:
                raise ValueError(f"unexpected $ref beside allOf in the meta-schema: {value!r}")
            out["allOf"] = [_expanded(target, document)]
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _expanded(sub, document) for name, sub in value.items()}
        elif key in _DATA:
            out[key] = value
        else:
            out[key] = _expanded(value, document)
    return out


@functools.cache
def metaschema_validator() -> Draft202012Validator:
    """A validator of schemas against :func:`flat_metaschema` (no format checker, as
    ``check_schema(schema, format_checker=None)``); safe to share between threads."""
    return Draft202012Validator(flat_metaschema())
