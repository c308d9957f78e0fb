"""A session's call counts rebuilt from its transcript as its loop starts (DESIGN §4
"The governor"): the budgets (``max_calls_per_session``, a tool's ``max_calls``) and the
repeat breaker (``max_repeats``) belong to the session, not to its loop's life, so a
session stopped and started again (an MCP client reaped as absent and back, a new host
serving it) keeps what it spent.

The transcript (``agent/transcript.py``) records each call of a reply with its name and
arguments, then its result. A call counts as started unless its result says it was
refused before its tool ran (:data:`NOT_STARTED`: the governor's refusals, invalid or
unknown calls, a rejection), as :class:`~rho_actors.governor.session_counts.SessionBudgets`
gives such a call's count back; a call without a result does not count: its host stopped
or died while it waited or ran, and it is either run again (an idempotent task, an
approved call: counted then, as it is admitted again) or ended unrun by the next host.
The transcript is read only when the session's calls are counted
(the system's or the session's bounds, or a tool's ``max_calls``) and its loop has no
counts already (a loop restarted after a crash keeps them)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from loguru import logger

from rho_actors.agent.lines import read_records
from rho_actors.agent.transcript import TRANSCRIPT_NAME
from rho_actors.declarations.toolset import ToolEntry
from rho_actors.encoding import describe_exception
from rho_actors.governor.session_counts import SessionBudgets

__all__ = ["NOT_STARTED", "recount", "started_calls"]

NOT_STARTED: Final = frozenset({
    "invalid_json", "invalid_arguments", "unknown_tool", "withheld", "unavailable", "budget_exhausted",
    "repeated_call", "rate_limited", "pending_approval", "rejected", "approval_expired"})
"""The error kinds of a recorded result whose call never ran (not counted)."""

def started_calls(records: Iterable[Mapping[str, Any]]) -> list[tuple[str, Any]]:
    """The ``(name, arguments)`` of each call the transcript ``records`` hold as started
    (the module doc), in order; arguments as recorded (JSON text or an object)."""
    calls: dict[tuple[Any, Any], tuple[str, Any]] = {}  # (step, index) -> (name, arguments)
    refused: set[tuple[Any, Any]] = set()
    answered: set[tuple[Any, Any]] = set()
    for record in records:
        kind, step = record.get("type"), record.get("step")
        if kind == "reply" and isinstance(record.get("tool_calls"), list):
            for index, call in enumerate(record["tool_calls"]):
                if isinstance(call, Mapping) and isinstance(call.get("name"), str):
                    calls.setdefault((step, index), (call["name"], call.get("arguments")))
        elif kind == "result":
            place = (step, record.get("index"))
            if place not in answered:  # the first result counts
                answered.add(place)
                if record.get("error_kind") in NOT_STARTED:
                    refused.add(place)
    return [call for place, call in calls.items() if place in answered and place not in refused]


def recount(budgets: SessionBudgets, session: str, session_dir: Path, entries: Mapping[str, ToolEntry],
            found: frozenset[str] | None) -> int | None:
    """Give ``session`` its counts from its transcript in ``session_dir`` as its loop
    starts, when they are counted (``budgets``'s bounds for it, or a tool of ``entries``
    has ``max_calls``) and it has none yet; each tool's parameters' schema fills the
    arguments' defaults, as at admission. ``found``: the folder's names as the start
    listed them (``None``: looked for). Returns the calls counted, ``None`` when nothing
    was read. A transcript that cannot be read is logged; its counts start empty."""
    if budgets.has_counts(session):
        return None
    if (TRANSCRIPT_NAME not in found) if found is not None else not os.path.lexists(session_dir / TRANSCRIPT_NAME):
        return None
    if not budgets.counts(session) and not any(e.info.policy.max_calls for e in entries.values()):
        return None
    try:  # a transcript that cannot be read, or a hostile record in it (nested past the parser's depth...)
        records, _, _ = read_records(session_dir / TRANSCRIPT_NAME)
        calls = []
        for name, recorded in started_calls(records):
            arguments = recorded
            if isinstance(recorded, str):
                try:
                    arguments = json.loads(recorded)
                except (ValueError, RecursionError):
                    pass
            entry = entries.get(name)
            calls.append((name, arguments if isinstance(arguments, Mapping) else {"": arguments},
                          None if entry is None else entry.info.parameter_schema))
        budgets.restore(session, calls)
    except Exception as exc:
        logger.error("session {}: its transcript could not be read to count its calls; they start from 0: {}",
                     session, describe_exception(exc))
        return None
    return len(calls)
