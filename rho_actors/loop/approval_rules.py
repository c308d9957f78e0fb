"""What a tool says about its calls waiting for a decision and running again (DESIGN §4
"Approvals"): read from a trusted tool's code, from an untrusted tool's checked
declaration only."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator

from rho_actors.declarations.toolset import ToolEntry

__all__ = ["approval_rule", "idempotent", "output_problems"]


def approval_rule(entry: ToolEntry) -> bool | Callable[..., Any]:
    """What a tool says of approval: ``True``/``False``, or its policy
    ``requires_approval(args, ctx)``. An untrusted tool's code is never read in the host:
    its checked declaration says (it may ask; the loop's policy applies to it all the
    same). A ``requires_approval()`` that raises, or returns anything but
    ``False``/``None``, means ``True``; one that cannot be read is absent."""
    if entry.placement.untrusted:  # (ToolEntry.untrusted, without the property's frame)
        return entry.info.requires_approval
    try:
        rule = getattr(entry.tool, "requires_approval", None)
    except BaseException:  # an attribute that cannot be read is absent (a policy that raises requires)
        return False
    if rule is None or isinstance(rule, bool):
        return bool(rule)
    if not callable(rule):
        return True
    try:
        takes = len(inspect.signature(rule).parameters)
    except (TypeError, ValueError):
        takes = 0
    if takes >= 2:
        return rule  # type: ignore[no-any-return]
    try:
        return rule() not in (False, None)
    except BaseException:
        return True


def output_problems(entry: ToolEntry | None, output: Any) -> list[str]:
    """What is wrong with ``output`` (or the ``output`` of an ``Ok``/``Details``) for
    the output schema a trusted tool declares (an ``output_schema()`` method, as an MCP
    tool has: JSON Schema); ``[]`` when it has none or the output fits."""
    if entry is None or entry.untrusted:
        return []
    try:
        declared = getattr(entry.tool, "output_schema", None)
        schema = declared() if callable(declared) else None
    except Exception:
        return []
    if not isinstance(schema, dict):
        return []
    value = getattr(output, "output", output)  # Ok(...), Details(...)
    validator = Draft202012Validator(schema)
    return [f"{'$' + ''.join(f'[{p!r}]' for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(value)]


def idempotent(entry: ToolEntry) -> bool:
    """Whether a trusted tool declared that running a call of it twice does no harm: its
    checked declaration's one idempotence fact (``idempotent`` attribute or method, or its
    own ``idempotentHint``; docs/design/tool-contract.md "Idempotence"), the one the
    governor retries by. An untrusted tool's call is not run again: ``False``."""
    return not entry.untrusted and entry.info.policy.idempotent
