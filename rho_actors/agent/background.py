"""The agent loop's side of background calls (DESIGN §4 "Background calls"): the
results of a session's ended tasks given to the model, each once, and a prompt that
waits for its open tasks. A :class:`rho_actors.Loop` is a session with tasks (its
``task_registry``); the agent layer needs only :class:`TaskSource` of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

from rho_actors.agent.model import Message
from rho_actors.agent.transcript import Transcript
from rho_actors.cancel import CancelToken
from rho_actors.lifecycle.tasks import TaskInfo, delivery_text

__all__ = ["TaskSource", "await_tasks", "deliver_tasks"]

POLL_S: Final = 0.25
"""How often, in seconds, a prompt waiting for its tasks looks at its cancel token."""


class TaskSource(Protocol):
    """What the agent loop needs of a session's background calls
    (:class:`rho_actors.tasks.TaskRegistry` is one)."""

    def undelivered(self, session_id: str, session_dir: Path) -> list[TaskInfo]: ...

    def delivered(self, session_id: str, session_dir: Path, task_id: str) -> None: ...

    def has_open(self, session_id: str, session_dir: Path) -> bool: ...

    def wait_any(self, session_id: str, session_dir: Path, timeout_s: float) -> bool: ...


def deliver_tasks(tasks: TaskSource, session_id: str, session_dir: Path, transcript: Transcript, step: int,
                  messages: list[Message], emit: Callable[[TaskInfo], None]) -> bool:
    """Give the model (append to ``messages``, to be sent with request ``step``) the
    results of the session's ended tasks it has not had, each in a user message that is
    recorded before the task is marked delivered: a crash between the two gives it once,
    as the transcript says it was given (``History.delivered_tasks``). ``emit`` gets each
    task given. Returns whether any was given."""
    given, count = transcript.history.delivered_tasks, 0
    for info in tasks.undelivered(session_id, session_dir):
        if info.task_id not in given:
            message = delivery_text(info)
            transcript.user(step, message, tasks=(info.task_id,))
            messages.append(Message.user(message))
            emit(info)
            count += 1
        tasks.delivered(session_id, session_dir, info.task_id)
    return count > 0


def await_tasks(tasks: TaskSource, session_id: str, session_dir: Path, cancel: CancelToken | None) -> bool:
    """Wait until a task of the session has ended with its result not yet given: True
    then; False at once when none is open, or when ``cancel`` is set."""
    while not tasks.undelivered(session_id, session_dir):
        if not tasks.has_open(session_id, session_dir) or (cancel is not None and cancel.cancelled):
            return False
        tasks.wait_any(session_id, session_dir, POLL_S)
    return True
