"""Background calls run again after a crash (DESIGN §4 "Background calls"): when a
session's loop starts, each task of an idempotent tool that a host died running is
started again, once (:meth:`rho_actors.tasks.TaskRegistry.resume`)."""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from loguru import logger

from rho_actors.declarations.toolset import ToolEntry
from rho_actors.loop.approval_rules import idempotent
from rho_actors.tasks import Task, TaskRegistry, records
from rho_actors.tool import ToolCall, ToolResult

__all__ = ["rerun_tasks"]


def rerun_tasks(session_id: str, session_dir: Path, entries: Mapping[str, ToolEntry], registry: TaskRegistry,
                resumed: dict[str, Task], submit: Callable[..., Any], *, found: frozenset[str] | None = None) -> None:
    """Start again each task :meth:`~rho_actors.tasks.TaskRegistry.resume` gives for the
    session (its tool, among ``entries``, background and idempotent), as a turn of its
    own (``submit``, approved) whose acknowledgement nobody waits for: put in
    ``resumed`` (by call id) for the turn's dispatch to take instead of opening a new
    task. A call refused now (its tool withheld or gone) gives its task that refusal.
    ``found``: the names in the session's folder as its start found them: no task
    record is read when its ``tasks`` folder was not there (``None``: read)."""
    if found is not None and records.FOLDER not in found:
        return

    def rerun(name: str) -> bool:
        entry = entries.get(name)
        return entry is not None and bool(entry.info.policy.background) and idempotent(entry)

    for task in registry.resume(session_id, session_dir, rerun):
        resumed[task.call_id] = task
        future: concurrent.futures.Future[list[ToolResult]] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        future.add_done_callback(functools.partial(_answered, registry, resumed, task))
        logger.warning("session {}: task {} ({}) was running when its host stopped; its tool is idempotent: run "
                       "again", session_id, task.task_id, task.name)
        submit((ToolCall(task.call_id, task.name, task.arguments or {}),), future, approved=True)


def _answered(registry: TaskRegistry, resumed: dict[str, Task], task: Task,
              future: concurrent.futures.Future[list[ToolResult]]) -> None:
    resumed.pop(task.call_id, None)
    [result] = future.result()
    if not (isinstance(result.details, Mapping) and result.details.get("task_id") == task.task_id):
        registry.settle(task, result)  # not started again: its refusal is the task's result
