"""Background calls as tasks: the system's registry of them (DESIGN §4 "Background calls").

A tool declared ``background`` (``@tool(background=True)``, contract ``background()``)
is called as a task: its turn gets at once an ``ok`` result naming task ``T``
(``details={"task_id": T}``) and the call runs on in its isolation with its own deadline
(``background_timeout_ms``, default 1 h, at most :attr:`TaskSettings.max_timeout_ms`).
Its end (a result, a crash, its deadline, a cancel) is the task's result, never a
restart: a task is ``temporary``. :class:`TaskRegistry` (one per system, the ``tasks``
node of ``tree()``) holds every task of this host's sessions and keeps each one's
record in its session's folder (:mod:`rho_actors.tasks.records`), so a host started
after ``kill -9`` lists a task that was running as ``failed`` ("interrupted"; never run
again) and a finished one with its result.

A task of an ``idempotent`` tool found running is run again instead, once (its record
keeps the call's arguments and which run it is: :meth:`TaskRegistry.resume`). A task
whose call waits for a decision (:meth:`TaskRegistry.held`) outlives a stop or a crash
of its host as its call does: left ``input_required``, taken back by the next host with
the call, and ended once by the call's decision there.

Statuses are MCP's: ``working``, ``input_required`` (open), then ``completed``,
``failed`` or ``cancelled``. Bounds: at most ``max_tasks_per_session`` open tasks in a
session and ``max_tasks`` in the system (a background call past either is
``unavailable``, naming the bound); a task's result is charged to its session's result
budget; an ended task stays listed for ``task_ttl_s`` after it ends (``time.monotonic()``
counts it), then its record is removed; as a task starts, its session keeps the
``max_ended_tasks_per_session`` that ended last of its ended tasks (and its ttl is looked at).
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from loguru import logger

from rho_actors.agent import session_lease
from rho_actors.budgets import ResultBudgets, result_bytes
from rho_actors.errors import RhoError
from rho_actors.isolation import RunningCall
from rho_actors.lifecycle.tasks import OPEN, TaskHostStopped, TaskInfo, TaskStatus, acknowledgement
from rho_actors.results import failure
from rho_actors.tasks import records
from rho_actors.tasks.event_loop import TaskLoop
from rho_actors.tool import ErrorKind, ToolInfo, ToolResult

__all__ = ["DEFAULT_BACKGROUND_TIMEOUT_MS", "Task", "TaskError", "TaskRegistry", "TaskSettings"]

DEFAULT_BACKGROUND_TIMEOUT_MS: Final = 3_600_000
"""A background call's deadline when its tool declares none: 1 hour, in milliseconds."""


@dataclass(frozen=True, slots=True)
class TaskSettings:
    """The system's bounds on background calls (``ActorSystem(tasks=TaskSettings(...))``):
    ``max_tasks_per_session`` open tasks in one session (16) and ``max_tasks`` in the
    system (1,024: an open task of an ``async`` tool holds no thread, about 7 KiB);
    ``task_ttl_s``: how long an ended task stays listed, in seconds (1 h);
    ``max_ended_tasks_per_session``: how many ended tasks a session keeps as a new one
    starts (1,024, about 2 KiB and a record file each: the ones that ended first are
    forgotten then, as at their ttl, so a session making background calls without end
    keeps a bounded number; its open ones may end meanwhile);
    ``max_timeout_ms``: the longest deadline a background call may have (1 h,
    milliseconds); ``model_chooses``: whether the model may choose to run a call of a
    ``background="optional"`` tool in the background (its declaration shown to the model
    gains the ``run_in_background`` argument; ``False``: only the caller chooses, and a
    call passing it is refused ``invalid_arguments``). Raises ``ValueError`` for a bound
    below 1 (a negative ttl) or a ``model_chooses`` that is not a bool."""

    max_tasks_per_session: int = 16
    max_tasks: int = 1024
    task_ttl_s: float = 3600.0
    max_timeout_ms: int = DEFAULT_BACKGROUND_TIMEOUT_MS
    model_chooses: bool = True
    max_ended_tasks_per_session: int = 1024

    def __post_init__(self) -> None:
        for name in ("max_tasks_per_session", "max_tasks", "max_timeout_ms", "max_ended_tasks_per_session"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TaskSettings.{name} must be an int >= 1, not {value!r}")
        if isinstance(self.task_ttl_s, bool) or not isinstance(self.task_ttl_s, (int, float)) or \
                not self.task_ttl_s >= 0:
            raise ValueError(f"TaskSettings.task_ttl_s must be a number >= 0, not {self.task_ttl_s!r}")
        if not isinstance(self.model_chooses, bool):
            raise ValueError(f"TaskSettings.model_chooses must be a bool, not {self.model_chooses!r}")


class TaskError(RhoError, LookupError):
    """A task id this session does not have (unknown, expired, or another session's);
    ``str(err)`` names the task and the session."""


class Task:
    """A background call as the registry holds it (the host sees :class:`TaskInfo`)."""

    __slots__ = ("arguments", "attempt", "call_id", "deadline", "delivered", "done", "ended", "finished", "held",
                 "name", "result", "running", "session_dir", "session_id", "started", "status", "task_id", "updated",
                 "writing", "written")

    def __init__(self, task_id: str, session_id: str, session_dir: Path, call_id: str, name: str) -> None:
        self.task_id, self.session_id, self.session_dir = task_id, session_id, session_dir
        self.call_id, self.name = call_id, name
        self.status: TaskStatus = "working"
        self.started: float = time.time()
        self.updated: float = self.started  # Unix s of its last change of status
        self.finished: float | None = None
        self.ended: float | None = None  # time.monotonic() s of its end (what task_ttl_s counts from: no clock jump)
        self.result: ToolResult | None = None
        self.delivered = False
        self.running: RunningCall | None = None
        self.deadline = 0.0  # time.monotonic() s, while open in this host
        self.done = threading.Event()
        self.writing = threading.Lock()  # one writer of its record at a time, each writing its latest state
        self.written = True  # False once its record is removed: never written again
        self.arguments: dict[str, Any] | None = None  # the call's, kept to run it again (an idempotent tool's)
        self.attempt = 1  # 2: run again by a host after the one running it died
        self.held = False  # its call waits for a decision (never started): kept across a stop, taken back after

    def info(self) -> TaskInfo:
        return TaskInfo(self.task_id, self.call_id, self.name, self.session_id, self.status, self.started,
                        self.finished, self.result, self.delivered)

    def record(self) -> dict[str, Any]:
        result = None if self.result is None else {
            "ok": self.result.ok, "content": self.result.content, "duration_ms": self.result.duration_ms,
            "error_kind": None if self.result.error_kind is None else str(self.result.error_kind)}
        return {"task_id": self.task_id, "call_id": self.call_id, "name": self.name, "session_id": self.session_id,
                "status": self.status, "started": self.started, "finished": self.finished, "result": result,
                "delivered": self.delivered, **({} if self.arguments is None else {"arguments": self.arguments}),
                "attempt": self.attempt, **({"held": True} if self.held else {})}

    @classmethod
    def loaded(cls, record: dict[str, Any], session_dir: Path) -> Task:
        task = cls(record["task_id"], record["session_id"], session_dir, record["call_id"], record["name"])
        task.status, task.started, task.finished = record["status"], record["started"], record.get("finished")
        task.updated = task.finished or task.started
        task.delivered = record["delivered"]
        task.arguments, task.attempt = record.get("arguments"), record.get("attempt", 1)
        task.held = record.get("held") is True and task.status == "input_required"
        data = record.get("result")
        if data is not None:
            kind = data.get("error_kind")
            duration = data.get("duration_ms")
            task.result = ToolResult(task.call_id, task.name, data["ok"], data["content"],
                                     ErrorKind(kind) if kind in ErrorKind.__members__.values() else
                                     (None if data["ok"] else ErrorKind.CRASHED),
                                     duration_ms=float(duration) if type(duration) in (int, float) else 0.0)
        if task.status not in OPEN:
            task.ended = time.monotonic() - max(0.0, time.time() - (task.finished or task.started))  # its age now
            task.done.set()
        return task


def _status(result: ToolResult) -> TaskStatus:
    if result.ok:
        return "completed"
    return "cancelled" if result.error_kind is ErrorKind.CANCELLED else "failed"


class TaskRegistry:
    """Every background call of a system's sessions (see the module doc); safe from any
    thread. ``budgets``: the system's result budgets (a task's result is charged to its
    session); ``max_output_chars``: the cap of the refusals it writes; ``decisions(callback)``
    subscribes ``callback`` to the system's ``CallEvent`` values (the decisions of held
    calls), returning the function that unsubscribes it. ``owner``: the host (its
    ``ActorSystem``) whose sessions' leases its records are written under: a record of a
    session it no longer serves is not written (agent/session_lease.py :func:`writing`);
    ``None``: no lease looked at."""

    def __init__(self, settings: TaskSettings, budgets: ResultBudgets,
                 decisions: Callable[[Callable[[Any], None]], Callable[[], None]] | None = None,
                 owner: object | None = None) -> None:
        self.settings = settings
        self._owner = owner
        self._budgets = budgets
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified when a task ends or is delivered
        self._sessions: dict[str, dict[str, Task]] = {}  # by session, by task id: read from its folder once
        self._open_count = 0
        self._counts = {"started": 0, "completed": 0, "failed": 0, "cancelled": 0, "refused": 0, "interrupted": 0,
                        "rerun": 0, "taken_back": 0}
        self.stopped = False
        self._kept_held = False  # the stop left the held tasks open (for the next host): their waiters are told
        self._watchers: dict[object, Callable[[TaskInfo], None]] = {}
        self._held: dict[tuple[str, str], Task] = {}  # (session, call id): tasks whose call waits for a decision
        self._taken: dict[str, list[Task]] = {}  # held tasks read from a session's folder, until resume() gives them
        self._decisions = decisions  # subscribes to the decisions of held calls (only while one is held)
        self._unlisten: Callable[[], None] | None = None
        self.event_loop = TaskLoop()  # where background calls of async tools run (started on the first)

    def watch(self, watcher: Callable[[TaskInfo], None]) -> Callable[[], None]:
        """Call ``watcher(info)`` on each change of a task's status (it waits for input,
        goes on, ends), from the thread that changes it, after its record is written:
        keep it quick; what it raises is logged. Returns the function that stops it."""
        token = object()
        with self._lock:
            self._watchers[token] = watcher

        def unwatch() -> None:
            with self._lock:
                self._watchers.pop(token, None)

        return unwatch

    def _tell(self, task: Task) -> None:
        with self._lock:
            watchers, info = list(self._watchers.values()), task.info()
        for watcher in watchers:
            try:
                watcher(info)
            except Exception:
                logger.exception("a watcher of task {} failed", task.task_id)

    # --- the call path ------------------------------------------------------------------

    def open(self, session_id: str, session_dir: Path, call_id: str, info: ToolInfo,
             arguments: dict[str, Any] | None = None) -> tuple[Task | ToolResult, int]:
        """A new ``working`` task for call ``call_id`` of the tool of ``info``, its record
        written (with ``arguments``, the call's, for an idempotent tool: to run it again
        after a crash), and its deadline in ms (:meth:`timeout_ms`); or the
        ``unavailable`` refusal when a bound is reached (or its record cannot be written:
        ``not_started``); ``cancelled`` when the call's task was cancelled while it waited
        for its approval (an approval racing the cancel runs nothing)."""
        with self._lock:
            self._session(session_id, session_dir)  # read first: a held task a host before this one made is there
            held = self._held.pop((session_id, call_id), None)
            if held is not None:
                held.held = False
        if held is not None and held.status in OPEN:  # approved: the task that waited for it goes on
            held.arguments = arguments
            self.waiting(session_id, session_dir, held.task_id, False)
            return held, self.timeout_ms(info)
        if held is not None and held.status == "cancelled":
            return failure("cancelled", call_id, info.name, reason=f"its task {held.task_id} was cancelled"), 0
        return self._open(session_id, session_dir, call_id, info.name, arguments), self.timeout_ms(info)

    def timeout_ms(self, info: ToolInfo) -> int:
        """A background call's deadline in ms: its ``background_timeout_ms``, or 1 h, at
        most ``max_timeout_ms``."""
        return min(info.policy.background_timeout_ms or DEFAULT_BACKGROUND_TIMEOUT_MS, self.settings.max_timeout_ms)

    def resume(self, session_id: str, session_dir: Path, rerun: Any) -> tuple[list[Task], list[Task]]:
        """The session's tasks read from its folder now (its loop starts, before its
        approvals take back the transcript's open calls): those found running in a host
        that died as :meth:`_session` makes them (``failed``) but for each one
        ``rerun(name)`` says to run again (its tool idempotent) that has its arguments
        and was not run again already: kept ``working`` as its second run (its record
        written so), returned first, for the loop to start again; then the tasks whose
        call waited for a decision when the host before stopped (or died), taken back
        ``input_required`` and held for their call again (:meth:`held`): the caller lets
        go (:meth:`let_go`) of each whose call the transcript no longer holds open.
        No task to run again when the session's tasks were read already (the held ones
        taken back are given once, whoever read them first)."""
        with self._lock:
            first = session_id not in self._sessions
            tasks = self._session(session_id, session_dir, rerun).values()
            again = [t for t in tasks if t.status in OPEN and not t.held] if first else []
            held = [t for t in self._taken.pop(session_id, []) if t.held and t.status in OPEN]
        for task in again:
            self._persist(task)
        if held:
            self._listen()
        return again, held

    def held(self, session_id: str, session_dir: Path, pending: ToolResult) -> ToolResult:
        """A background call held for approval (its ``pending_approval`` result) as a task
        that waits for the decision, ``input_required``: the acknowledgement of its turn
        (``details["pending"]`` the call's ``PendingCall``). Approved, the call runs as
        this task (:meth:`open` finds it); rejected or expired, the task ends ``failed``
        (:meth:`on_event`). A bound reached: its refusal (``tasks_bound``, or
        ``not_started``), no task made; the caller withdraws the call from the pending
        ones (it must not wait for a decision no task shows)."""
        task = self._open(session_id, session_dir, pending.call_id, pending.name, status="input_required", held=True)
        if isinstance(task, ToolResult):
            return task
        with self._lock:
            self._held[(session_id, pending.call_id)] = task
        self._listen()
        ack = acknowledgement(task.task_id, pending.call_id, pending.name)
        return dataclasses.replace(ack, details={**ack.details, "pending": pending.details["pending"]})

    def _listen(self) -> None:
        """Listen for the decisions of held calls (:meth:`on_event`), once, while one is held."""
        with self._lock:
            subscribe, listening = self._decisions, self._unlisten is not None
        if subscribe is not None and not listening:
            unlisten = subscribe(self.on_event)
            with self._lock:
                spare = unlisten if self._unlisten is not None else None  # another thread subscribed meanwhile
                self._unlisten = self._unlisten or unlisten
            if spare is not None:
                spare()

    def holds(self, session_id: str, call_id: str) -> bool:
        """Whether call ``call_id`` of the session is a task waiting for its approval
        (:meth:`held`): approved, it runs as that task whoever chose the background. One
        look at a dict (atomic): no lock on the call path."""
        return (session_id, call_id) in self._held

    def on_event(self, event: Any) -> None:
        """The system's events: a held call decided without running (``rejected``,
        ``expired``) ends its task ``failed`` with what was decided."""
        if getattr(event, "kind", None) != "decided" or str(event.outcome).startswith("approved"):
            return
        task = self._unhold(event.session_id, event.call_id)
        if task is not None:
            self.settle(task, failure("rejected", task.call_id, task.name,
                                      message=f"the call was {event.outcome} before it ran"))

    def let_go(self, session_id: str, call_id: str, result: ToolResult) -> None:
        """Call ``call_id`` of the session, held for approval as a task (:meth:`held`),
        will not be decided (its turn was interrupted, or not admitted): its task ends
        with ``result``, the call's one result (none held: nothing to do)."""
        task = self._unhold(session_id, call_id)
        if task is not None:
            self.settle(task, result)

    def _unhold(self, session_id: str, call_id: str) -> Task | None:
        """The task held for call ``call_id`` of the session, no longer held (or None);
        no call held any more: the registry stops listening for decisions."""
        with self._lock:
            task = self._held.pop((session_id, call_id), None)
            unlisten = self._unlisten if not self._held else None
            self._unlisten = self._unlisten if self._held else None
        if unlisten is not None:  # no call waits now: no event is built for this registry
            unlisten()
        return task

    def _open(self, session_id: str, session_dir: Path, call_id: str, name: str,
              arguments: dict[str, Any] | None = None, status: TaskStatus = "working",
              held: bool = False) -> Task | ToolResult:
        with self._lock:
            tasks = self._session(session_id, session_dir)
            settings = self.settings
            self._expire(tasks, settings.max_ended_tasks_per_session)  # at its ttl, and past the bound
            open_here = sum(t.status in OPEN for t in tasks.values())
            refusal = None
            if self.stopped:
                refusal = failure("not_started", call_id, name, problem="the system is stopping")
            elif open_here >= settings.max_tasks_per_session:
                refusal = failure("tasks_bound", call_id, name, count=open_here, scope="this session",
                                  bound=settings.max_tasks_per_session, setting="max_tasks_per_session")
            elif self._open_count >= settings.max_tasks:
                refusal = failure("tasks_bound", call_id, name, count=self._open_count, scope="the system",
                                  bound=settings.max_tasks, setting="max_tasks")
            if refusal is not None:
                self._counts["refused"] += 1
                return refusal
            task = Task(f"t_{secrets.token_hex(16)}", session_id, session_dir, call_id, name)
            task.arguments, task.status, task.held = arguments, status, held
            tasks[task.task_id] = task
            self._sessions[session_id] = tasks
            self._open_count += 1
        try:
            self._persist(task, strict=True)  # a cancel may have ended it already: its record says so
        except OSError as exc:
            self.discard(task)
            return failure("not_started", call_id, name, problem=f"its task record cannot be written: {exc}")
        return task

    def started(self, task: Task, running: RunningCall, deadline: float) -> None:
        """``task``'s call was started as ``running`` (cancelled by :meth:`cancel`)."""
        with self._lock:
            stopping = self.stopped
            self._counts["started"] += 1
            if task.status in OPEN:
                task.running, task.deadline = running, deadline
                if not stopping:
                    return
            elif task.status != "cancelled":
                return  # its call answered already
        # it was cancelled (by the host, the system's stop) while it was being started: so must its call be
        if stopping:
            self.settle(task, failure("cancelled", task.call_id, task.name, reason="the system is stopping"))
        running.cancel("stopping" if stopping else "cancelled")

    def discard(self, task: Task) -> None:
        """``task``'s call never started (its turn was cancelled first): forget it (its
        record removed first: a session left with no task may be read from its folder
        again, which must not find it)."""
        self._remove(task)
        self._forget(task)

    def settle(self, task: Task, result: ToolResult) -> None:
        """The answer of ``task``'s call (its ``CallSpec.reply``; the first one wins):
        charged to its session's budget, recorded, and waiters woken."""
        with self._lock:
            if task.status not in OPEN:
                return  # late (a cancelled task's call answering after all): not charged either
        size = result_bytes(result)
        over = self._budgets.charge(task.session_id, 0, size, alone=True)
        if over is not None:
            scope, budget, left = over
            result = failure("over_budget", result.call_id, result.name, result.duration_ms, size=size, scope=scope,
                             budget=budget, left=max(0, left))
        with self._lock:
            if task.status not in OPEN:
                return  # late
            task.status, task.result, task.finished, task.running = _status(result), result, time.time(), None
            task.held = False
            task.ended = time.monotonic()
            task.updated = task.finished
            self._open_count -= 1
            self._counts[task.status] += 1
        self._persist(task)
        with self._lock:
            task.done.set()
            self._changed.notify_all()
        self._tell(task)

    def waiting(self, session_id: str, session_dir: Path, task_id: Any, waiting: bool) -> TaskInfo:
        """Task ``task_id`` waits for input (``waiting``: ``input_required``, a person's
        or an MCP client's answer) or goes on (``working``); its record written when its
        status changes. An ended task is returned as it is. Raises :class:`TaskError`
        for an unknown task."""
        with self._lock:
            task = self._task(session_id, session_dir, task_id)
            status: TaskStatus = "input_required" if waiting else "working"
            changed = task.status in OPEN and task.status != status
            if changed:
                task.status, task.updated = status, time.time()
        if changed:
            self._persist(task)
            self._tell(task)
        return task.info()

    def updated(self, session_id: str, session_dir: Path, task_id: Any) -> float:
        """When task ``task_id``'s status last changed (Unix seconds). Raises
        :class:`TaskError` for an unknown task."""
        with self._lock:
            return self._task(session_id, session_dir, task_id).updated

    # --- the host's view ----------------------------------------------------------------

    def tasks(self, session_id: str, session_dir: Path) -> list[TaskInfo]:
        """The session's tasks, in the order they started (ended ones until their ttl)."""
        with self._lock:
            tasks = self._session(session_id, session_dir)
            self._expire(tasks)
            return sorted((t.info() for t in tasks.values()), key=lambda i: i.started)

    def get(self, session_id: str, session_dir: Path, task_id: Any) -> TaskInfo:
        """Task ``task_id`` of the session. Raises :class:`TaskError` when it has none."""
        with self._lock:
            return self._task(session_id, session_dir, task_id).info()

    def wait(self, session_id: str, session_dir: Path, task_id: Any, timeout_s: float | None) -> TaskInfo:
        """Task ``task_id`` once it has ended, waiting at most ``timeout_s`` seconds
        (``None``: until it ends, which its deadline bounds). Raises :class:`TaskError`
        for an unknown task, ``TimeoutError`` naming it when it is still open, and
        :class:`TaskHostStopped` at once when the system stopped (or stops meanwhile)
        leaving it held for the next host (:meth:`stop`)."""
        with self._lock:
            task = self._task(session_id, session_dir, task_id)
            if not self._changed.wait_for(lambda: task.done.is_set() or (self._kept_held and task.held), timeout_s):
                raise TimeoutError(f"task {task.task_id} ({task.name}) is still {task.status} after {timeout_s} s")
            if not task.done.is_set():
                raise TaskHostStopped(task.info())
        return task.info()

    def cancel(self, session_id: str, session_dir: Path, task_id: Any) -> TaskInfo:
        """Cancel task ``task_id`` as a turn's call is cancelled: it ends ``cancelled``
        at once (its record written), and its call is cancelled through its isolation (a
        worker killed, a thread's ``ctx["cancel"]`` set; what it answers after is late).
        An ended task is returned as it is. Raises :class:`TaskError` for an unknown task."""
        with self._lock:
            task = self._task(session_id, session_dir, task_id)
            running = task.running if task.status in OPEN else None
        self.settle(task, failure("cancelled", task.call_id, task.name, reason="the host cancelled its task"))
        if running is not None:
            running.cancel("cancelled")
        return task.info()

    def undelivered(self, session_id: str, session_dir: Path) -> list[TaskInfo]:
        """The session's ended tasks whose result the model has not had, oldest first:
        one past its ``task_ttl_s`` but not forgotten yet among them (the ttl bounds how
        long a task is kept, never whether the agent loop gives it)."""
        with self._lock:
            tasks = self._session(session_id, session_dir).values()
            return sorted((t.info() for t in tasks if t.status not in OPEN and not t.delivered),
                          key=lambda i: i.started)

    def delivered(self, session_id: str, session_dir: Path, task_id: str) -> None:
        """Task ``task_id``'s result reached the model: recorded so, never given again (a
        task forgotten meanwhile at its ttl: nothing to record)."""
        with self._lock:
            task = self._session(session_id, session_dir).get(task_id)
            if task is None:
                return
            task.delivered = True
        self._persist(task)

    def wait_any(self, session_id: str, session_dir: Path, timeout_s: float) -> bool:
        """Wait until the session has an ended, undelivered task or no open one; False
        when ``timeout_s`` seconds passed first."""
        def ready() -> bool:
            tasks = self._session(session_id, session_dir).values()
            return not any(t.status in OPEN for t in tasks) or any(not t.delivered for t in tasks
                                                                     if t.status not in OPEN)
        with self._lock:
            return self._changed.wait_for(ready, timeout_s)

    def has_open(self, session_id: str, session_dir: Path) -> bool:
        """Whether the session has a task that has not ended."""
        with self._lock:
            return any(t.status in OPEN for t in self._session(session_id, session_dir).values())

    def stop(self, timeout_s: float = 5.0, keep_held: bool = True) -> None:
        """The system stops: no task starts, and each open one ends ``cancelled`` (its
        record written; a host that dies first leaves it for the next host to find
        ``failed``, interrupted) with its call cancelled through its isolation; the
        cancelled ``async`` calls get ``timeout_s`` seconds to end before the tasks'
        event loop stops. But a task whose call waits for a decision (:meth:`held`) is
        left ``input_required``, as its call is left pending in the transcript: the next
        host takes both back (:meth:`resume`), and a waiter for it (:meth:`wait`) is told at
        once (:class:`TaskHostStopped`); ``keep_held=False`` (a system whose data folder is
        removed at its stop: nothing takes them back) ends it ``cancelled`` too."""
        with self._lock:
            self.stopped, self._kept_held = True, keep_held
            open_tasks = [t for tasks in self._sessions.values() for t in tasks.values()
                          if t.status in OPEN and not (keep_held and t.held)]
            self._changed.notify_all()  # a waiter for a held task is told the host stopped (wait)
        for task in open_tasks:
            running = task.running
            self.settle(task, failure("cancelled", task.call_id, task.name, reason="the system is stopping"))
            if running is not None:
                running.cancel("stopping")
        self.event_loop.stop(timeout_s)

    def describe(self) -> dict[str, Any]:
        """The ``tasks`` node of ``tree()``: a supervisor whose ``temporary`` children are
        the open tasks (``id`` the task id, ``session``, ``tool``, ``status``, ``ms_left``
        to the deadline)."""
        now = time.monotonic()
        with self._lock:
            running = [{"id": t.task_id, "kind": "worker", "restart": "temporary", "restarts": 0, "alive": True,
                        "session": t.session_id, "tool": t.name, "status": t.status,
                        "ms_left": max(0, round((t.deadline - now) * 1000)) if t.deadline else None}
                       for tasks in self._sessions.values() for t in tasks.values() if t.status in OPEN]
        return {"id": "tasks", "kind": "supervisor", "restart": "permanent", "restarts": 0, "strategy": "one_for_one",
                "alive": not self.stopped, "children": running}

    def stats(self) -> dict[str, Any]:
        """Counters: ``open`` now, and ``started``, ``completed``, ``failed``,
        ``cancelled``, ``refused``, ``interrupted`` (found running after a host died) and
        ``rerun`` (of them, run again: an idempotent tool's), ``taken_back`` (held for a
        decision when a host before stopped or died: :meth:`resume`) since the start; the bounds."""
        with self._lock:
            return {"open": self._open_count, **self._counts, "max_tasks": self.settings.max_tasks,
                    "max_tasks_per_session": self.settings.max_tasks_per_session,
                    "task_ttl_s": self.settings.task_ttl_s,
                    "max_ended_tasks_per_session": self.settings.max_ended_tasks_per_session}

    # --- inside -------------------------------------------------------------------------

    def _task(self, session_id: str, session_dir: Path, task_id: Any) -> Task:
        tasks = self._session(session_id, session_dir)
        self._expire(tasks)
        task = tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None:
            raise TaskError(f"session {session_id!r} has no task {task_id!r} (unknown, another session's, or "
                            f"ended more than task_ttl_s={self.settings.task_ttl_s:g} s ago)")
        return task

    def _session(self, session_id: str, session_dir: Path, rerun: Any = None) -> dict[str, Task]:
        """The session's tasks (under the lock), read from its folder the first time:
        a task found open there was running in a host that died, and is ``failed``
        (unless ``rerun``: :meth:`resume`), but one whose call waited for a decision
        (``held``) is held for its call again, for :meth:`resume` to give. Kept by session only while it has a task
        (:meth:`_open` keeps what it adds to), so a host serving sessions without end
        keeps no entry for those with none (read again, their folder holds no record)."""
        tasks = self._sessions.get(session_id)
        if tasks is None:
            tasks = {}
            found = [r for r in records.read_all(session_dir) if r["session_id"] == session_id]
            found.sort(key=lambda r: (r["started"], r["task_id"]))  # the earliest of two held for one call is kept
            for record in found:
                task = Task.loaded(record, session_dir)
                kept = self._held.get((session_id, task.call_id)) if task.held else None
                if kept is not None:  # a second record held for one call (forged, left over): never its call's
                    task.held, task.status = False, "cancelled"
                    task.finished, task.ended = time.time(), time.monotonic()
                    task.result = failure("held_task_duplicate", task.call_id, task.name, task=task.task_id,
                                          kept=kept.task_id, call=task.call_id)
                    task.done.set()
                    self._write_quietly(task)
                elif task.held:  # its call waited for a decision: it waits on, held for it again (resume)
                    self._held[(session_id, task.call_id)] = task
                    self._taken.setdefault(session_id, []).append(task)
                    self._open_count += 1
                    self._counts["taken_back"] += 1
                elif task.status in OPEN and rerun is not None and task.attempt == 1 and task.arguments is not None \
                        and rerun(task.name):
                    task.attempt, task.started = 2, time.time()
                    self._open_count += 1
                    self._counts["rerun"] += 1
                elif task.status in OPEN:
                    task.status, task.finished, task.ended = "failed", time.time(), time.monotonic()
                    task.result = failure("task_interrupted", task.call_id, task.name)
                    task.done.set()
                    self._counts["interrupted"] += 1
                    self._write_quietly(task)
                tasks[task.task_id] = task
            if tasks:
                self._sessions[session_id] = tasks
        return tasks

    def _expire(self, tasks: dict[str, Task], keep: int | None = None) -> None:
        """Forget (and remove the records of) tasks that ended over ``task_ttl_s`` ago, as
        ``time.monotonic()`` counts (the wall clock set forward or back changes nothing; a
        task read from its record: its age by the wall clock when it was read), and, with
        ``keep``, the earliest ended past the ``keep`` latest."""
        horizon = time.monotonic() - self.settings.task_ttl_s
        ended = [(t.ended, t) for t in tasks.values() if t.done.is_set() and t.ended is not None]
        gone = [t for stamp, t in ended if stamp < horizon]
        if keep is not None and len(ended) - len(gone) > keep:  # the earliest ended of those left go too
            left = sorted((pair for pair in ended if pair[0] >= horizon), key=lambda pair: pair[0])
            gone += [t for _, t in left[:len(left) - keep]]
        for task in gone:
            del tasks[task.task_id]
            task.written = False
            self._remove_record(task)
            self._drop_if_empty(task.session_id, tasks)

    def _drop_if_empty(self, session_id: str, tasks: dict[str, Task]) -> None:
        """Forget the session's entry once it holds no task (see :meth:`_session`)."""
        if not tasks and self._sessions.get(session_id) is tasks:
            del self._sessions[session_id]

    def _remove(self, task: Task) -> None:
        with self._lock:
            task.written = False
        self._remove_record(task)

    def _forget(self, task: Task) -> None:
        with self._lock:
            self._held.pop((task.session_id, task.call_id), None)
            tasks = self._sessions.get(task.session_id, {})
            if tasks.pop(task.task_id, None) is not None and task.status in OPEN:
                self._open_count -= 1
            self._drop_if_empty(task.session_id, tasks)

    def _persist(self, task: Task, strict: bool = False) -> None:
        """Write ``task``'s record as it is now: writers take turns, each taking the
        task's state when its turn comes, so the last record written is its latest state
        (a record removed meanwhile is not brought back). ``strict``: raise ``OSError``
        rather than log it."""
        with task.writing:
            with self._lock:
                if not task.written:
                    return
                record = task.record()
            if strict:  # its first record (its start): made durable with its name
                with self._leased(task, "the first record") as served:
                    if not served:
                        raise OSError(f"this host no longer serves session {task.session_id!r} (its lease was let go)")
                    records.write(task.session_dir, record, new=True)
            else:
                self._write_quietly(task, record)
            with self._lock:
                removed = not task.written
            if removed:  # expired while it was written
                self._remove_record(task)

    def _write_quietly(self, task: Task, record: dict[str, Any] | None = None) -> None:
        with self._leased(task, "the record") as served:
            try:
                if served:
                    records.write(task.session_dir, record or task.record())
            except OSError as exc:
                logger.error("session {}: task {} ({}) could not be recorded: {}", task.session_id, task.task_id,
                             task.name, exc)

    def _remove_record(self, task: Task) -> None:
        with self._leased(task, "the removal of the record") as served:
            if served:
                records.remove(task.session_dir, task.task_id)

    def _leased(self, task: Task, what: str) -> AbstractContextManager[bool]:
        """Whether the host still serves ``task``'s session (agent/session_lease.py :func:`writing`)."""
        return session_lease.writing(self._owner, task.session_dir, f"{what} of task {task.task_id} ({task.name}, "
                                     f"{task.status})")
