"""Background calls: calls that outlive their turn, supervised as tasks (DESIGN §4
"Background calls"): :class:`TaskRegistry` and its durable records
(:mod:`rho_actors.tasks.records`)."""

from rho_actors.lifecycle.tasks import OPEN, TaskHostStopped, TaskInfo, TaskStatus, acknowledgement, delivery_text
from rho_actors.tasks.registry import DEFAULT_BACKGROUND_TIMEOUT_MS, Task, TaskError, TaskRegistry, TaskSettings

__all__ = [
    "DEFAULT_BACKGROUND_TIMEOUT_MS",
    "OPEN",
    "Task",
    "TaskError",
    "TaskHostStopped",
    "TaskInfo",
    "TaskRegistry",
    "TaskSettings",
    "TaskStatus",
    "acknowledgement",
    "delivery_text",
]
