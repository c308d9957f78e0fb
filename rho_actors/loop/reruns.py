"""A session's tasks taken back when its loop starts (DESIGN §4 "Background calls"):
each task of an idempotent tool that a host died running is started again, once
(:meth:`rho_actors.tasks.TaskRegistry.resume`), and each task whose call waited for a
decision when the host before stopped or died is held for that call again (it ends with
the call's one result)."""

from __future__ import annotations

import concurrent.futures
import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from loguru import logger

from rho_actors.agent.transcript import TRANSCRIPT_NAME, load
from rho_actors.declarations.toolset import ToolEntry
from rho_actors.encoding import describe_exception
from rho_actors.loop.approval_rules import idempotent
from rho_actors.results import failure
from rho_actors.tasks import Task, TaskRegistry, records
from rho_actors.tool import ErrorKind, ToolCall, ToolResult

__all__ = ["held_outcome", "rerun_tasks"]


def rerun_tasks(session_id: str, session_dir: Path, entries: Mapping[str, ToolEntry], registry: TaskRegistry,
                resumed: dict[str, Task], submit: Callable[..., Any], *, found: frozenset[str] | None = None,
                attach: Callable[[], frozenset[str]] | None = None) -> None:
    """Take the session's tasks back as its loop starts, in this order:

    1. the registry reads the session's task records
       (:meth:`~rho_actors.tasks.TaskRegistry.resume`): a task of an idempotent tool
       (among ``entries``, background) found running is kept to run again, and a task
       whose call waited for a decision is held for its call again, ``input_required``;
    2. ``attach()`` (the session's approvals taking back the transcript's open calls,
       returning their ids): from then on a decision on one of them (one recorded while
       no host ran is acted on at once, on a pool thread) finds its task held;
    3. a held task whose call the transcript does not hold open (decided and answered
       while no host ran it, or never recorded) ends with the call's result there
       (:func:`held_outcome`): one outcome per call, whoever looks;
    4. each task to run again is started as a turn of its own (``submit``, approved)
       whose acknowledgement nobody waits for: put in ``resumed`` (by call id) for the
       turn's dispatch to take instead of opening a new task. A call refused now (its
       tool withheld or gone) gives its task that refusal.

    ``found``: the names in the session's folder as its start found them: no task
    record is read when its ``tasks`` folder was not there (``None``: read)."""
    def rerun(name: str) -> bool:
        entry = entries.get(name)
        return entry is not None and bool(entry.info.policy.background) and idempotent(entry)

    again, held = ([], []) if found is not None and records.FOLDER not in found else \
        registry.resume(session_id, session_dir, rerun)
    waiting = attach() if attach is not None else frozenset()
    for task in held:
        if task.call_id not in waiting:
            registry.let_go(session_id, task.call_id, held_outcome(task, session_dir))
    for task in again:
        resumed[task.call_id] = task
        future: concurrent.futures.Future[list[ToolResult]] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        future.add_done_callback(functools.partial(_answered, registry, resumed, task))
        logger.warning("session {}: task {} ({}) was running when its host stopped; its tool is idempotent: run "
                       "again", session_id, task.task_id, task.name)
        submit((ToolCall(task.call_id, task.name, task.arguments or {}),), future, approved=True)


def held_outcome(task: Task, session_dir: Path) -> ToolResult:
    """The result of ``task``'s call, held for a decision when the host before stopped,
    as the session's transcript has it now that it holds the call open no more: its
    recorded result (a rejection, an expiry), ``cancelled`` when it started and has no
    result (interrupted, never run again), or ``held_task_lost`` when the transcript
    does not hold the call (its ``pending`` record was never written, or was removed)."""
    try:
        history = load(session_dir / TRANSCRIPT_NAME) if os.path.lexists(session_dir / TRANSCRIPT_NAME) else None
    except Exception as exc:
        logger.warning("session {}: its transcript could not be read for call {}: {}", task.session_id, task.call_id,
                       describe_exception(exc))
        history = None
    if history is not None:
        for _, _, interrupted in history.pending:
            if interrupted.call_id == task.call_id:
                return interrupted
        track = history.calls.get(task.call_id)
        answers = [m for m in history.messages if m.role == "tool" and m.tool_call_id == task.call_id]
        if track is not None and track.state == "settled" and answers:
            decision = track.states.get("decided", {}).get("decision")
            kind = None if not answers[-1].is_error else ErrorKind.REJECTED if decision in ("rejected", "expired") \
                else ErrorKind.TOOL_ERROR
            return ToolResult(task.call_id, task.name, kind is None, answers[-1].text, kind)
    return failure("held_task_lost", task.call_id, task.name, task=task.task_id)


def _answered(registry: TaskRegistry, resumed: dict[str, Task], task: Task,
              future: concurrent.futures.Future[list[ToolResult]]) -> None:
    resumed.pop(task.call_id, None)
    [result] = future.result()
    if not (isinstance(result.details, Mapping) and result.details.get("task_id") == task.task_id):
        registry.settle(task, result)  # not started again: its refusal is the task's result
