"""Task records on disk: one JSON file per background call in its session's folder
(DESIGN §4 "Background calls").

A task's record is ``<session folder>/tasks/<task_id>.json``, written whole each time
its status changes: to a temporary file beside it (``0600``, never through a symlink,
named for its writer: two threads writing one record never share one), its data synced,
then renamed over the record, so a reader finds the last whole record or none. A host
killed with ``kill -9`` loses nothing written (the kernel keeps it): the syncs are for a
crash of the machine: the data is ``fdatasync``-ed before the rename. A new record
(``new=True``: the task's start) has its folder ``fsync``-ed too, so a task that started
is always found; a later one (its end, its delivery) has not: a crash may leave the record before it,
whole (a task found ``working`` reads as interrupted, never run again; a delivery the
transcript recorded is not given twice). Record fields::

    "v": 1, "task_id": str, "call_id": str, "name": str, "session_id": str,
    "status": "working" | "input_required" | "completed" | "failed" | "cancelled",
    "started": float, "finished": float | null      (Unix time, seconds)
    "result": {"ok": bool, "content": str, "error_kind": str | null, "duration_ms": float} | null
    "delivered": bool                               (its result reached the model)
    "arguments": object, "attempt": int             (optional: the call's validated arguments, and
                                                     which run of it this is: 1, or 2 once re-run)
    "held": true                                    (optional: its call waits for a decision and never
                                                     started; the next host takes it back ``input_required``)

:func:`read_all` skips (with a warning) a file that is not a whole, valid record, and
removes a temporary file whose writer's process has ended (a host killed mid-write): it
never raises for what is in the folder.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import threading
from pathlib import Path
from typing import Any, Final

from loguru import logger

from rho_actors.files import UnsafePathError, open_regular, private_dir

__all__ = ["FOLDER", "STATUSES", "read_all", "remove", "write"]

FOLDER: Final = "tasks"
"""The folder of a session's task records, inside the session's folder."""
STATUSES: Final = ("working", "input_required", "completed", "failed", "cancelled")
"""A task's statuses, MCP's names (the tasks extension): the first two are open."""
_NAME: Final = re.compile(r"t_[0-9a-f]{32}\.json")
_TEMPORARY: Final = re.compile(r"\.t_[0-9a-f]{32}\.json\.([0-9]{1,10})\.[0-9]+\.tmp")
_MAX_RECORD_BYTES: Final = 4 << 20  # a record holds one result's text (capped by max_output_chars)


def write(session_dir: Path, record: dict[str, Any], *, new: bool = False) -> None:
    """Write ``record`` (the module doc's fields) as ``tasks/<task_id>.json`` in
    ``session_dir``, atomically; ``new``: the task's first record, its name made durable
    too (the module doc). Raises ``OSError`` (and
    :class:`~rho_actors.files.UnsafePathError`) when it cannot."""
    folder = private_dir(session_dir, FOLDER)
    name = f"{record['task_id']}.json"
    data = json.dumps({"v": 1, **record}, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")
    temporary = folder / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = open_regular(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        try:
            view = memoryview(data)
            while view:  # a full disk writes what fits: the rest raises, the record before stays whole
                view = view[os.write(fd, view):]
            os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, folder / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    if not new:
        return
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove(session_dir: Path, task_id: str) -> None:
    """Remove task ``task_id``'s record (gone already: nothing to do)."""
    try:
        os.unlink(session_dir / FOLDER / f"{task_id}.json")
    except FileNotFoundError:
        pass


def read_all(session_dir: Path) -> list[dict[str, Any]]:
    """Every whole, valid task record of the session in ``session_dir`` (none when it
    has no ``tasks`` folder), in no particular order."""
    folder = session_dir / FOLDER
    try:
        found = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    names = sorted(n for n in found if _NAME.fullmatch(n))
    for name in found:  # a temporary file of a writer whose process is gone (killed mid-write): never renamed
        left = _TEMPORARY.fullmatch(name)
        if left is not None and not _alive(int(left[1])):
            with contextlib.suppress(OSError):
                os.unlink(folder / name)
    records = []
    for name in names:
        record = _read(folder / name)
        if record is not None:
            records.append(record)
    return records


def _read(path: Path) -> dict[str, Any] | None:
    try:
        fd = open_regular(path, os.O_RDONLY)
    except (OSError, UnsafePathError) as exc:
        logger.warning("task record {} cannot be read: {}", path, exc)
        return None
    try:
        data = os.read(fd, _MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    problem = "it is larger than 4 MiB" if len(data) > _MAX_RECORD_BYTES else None
    record: Any = None
    if problem is None:
        try:
            record = json.loads(data)
        except ValueError as exc:
            problem = f"it is not JSON ({exc})"
        except RecursionError:  # a record nested past the parser's depth (no record rho writes is)
            problem = "it is JSON nested too deeply to read"
    if problem is None:
        problem = _problem(record, path.name[:-5])
    if problem is not None:
        logger.warning("task record {} is skipped: {}", path, problem)
        return None
    return record  # type: ignore[no-any-return]


def _problem(record: Any, task_id: str) -> str | None:
    """Why ``record`` is not a valid task record named ``task_id``, or ``None``."""
    if not isinstance(record, dict) or record.get("v") != 1:
        return "it is not a version 1 task record"
    if record.get("task_id") != task_id:
        return f"its task_id is not {task_id}"
    for key in ("call_id", "name", "session_id"):
        if not isinstance(record.get(key), str):
            return f"its {key} is not a string"
    if record.get("status") not in STATUSES:
        return f"its status is not one of {', '.join(STATUSES)}"
    if not _time(record.get("started")) or not (record.get("finished") is None or _time(record.get("finished"))) \
            or not isinstance(record.get("delivered"), bool):
        return "its started, finished or delivered field is wrong"
    if not isinstance(record.get("arguments", {}), dict) or record.get("attempt", 1) not in (1, 2) \
            or not isinstance(record.get("held", False), bool):
        return "its arguments, attempt or held field is wrong"
    result = record.get("result")
    if result is not None and not (isinstance(result, dict) and isinstance(result.get("ok"), bool)
                                   and isinstance(result.get("content"), str)
                                   and isinstance(result.get("error_kind"), (str, type(None)))
                                   and (result.get("duration_ms") is None or _time(result.get("duration_ms")))):
        return "its result is not {ok, content, error_kind, duration_ms}"
    return None


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (one of another user: yes)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _time(value: Any) -> bool:
    """Whether ``value`` is a finite number (not a bool): a time or a duration."""
    return type(value) in (int, float) and math.isfinite(value)
