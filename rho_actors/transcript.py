"""Durable session transcripts: one JSON Lines file per session, appended as it goes.

The agent loop (:mod:`rho_actors.agent`) writes each session's conversation to
``loop.data_dir / "transcript.jsonl"``, one record per line, each appended, flushed and
``os.fsync``-ed before the loop moves on; a record is whole once its newline is on disk.
A later prompt in the same session (a new process, a new :class:`~rho_actors.ActorSystem`
on the same ``data_dir``, a LoopActor restarted by its supervisor) reads the conversation
back from it instead of starting over.

Record schema (version 1)
-------------------------

Every record is one JSON object on one line with these keys::

    "v":    1                 the schema version
    "type": "user" | "reply" | "result" | "error"
    "step": int               the model request (1, 2, ... over the whole session) the
                              record belongs to
    "ts":   float             Unix time of the write, in seconds

and, by type:

``user`` (a prompt's text; ``step`` is the request that will answer it)
    ``"text": str``
``reply`` (the model's reply to request ``step``; written *before* its calls run)
    ``"text": str``, ``"tool_calls": [{"id": str, "name": str, "arguments": str | object}]``
    (the model's raw argument text, or the decoded object a provider gave; ``"sent_id"``,
    optional, the id the model sent when the recorded one replaces it: see
    :mod:`rho_actors.provider_rules`), and
    ``"model_ms": float`` (how long the request took, milliseconds).
``result`` (one call's result; written after the turn)
    ``"index": int`` (the call's position in its reply's ``tool_calls``), ``"call_id"``,
    ``"name"``, ``"ok": bool``, ``"content": str`` (the text for the model),
    ``"error_kind": str | null``, ``"duration_ms": float`` and
    ``"images": [{"mime_type": str, "data": str}]`` (``data`` is base64). ``details`` are
    the host's and are not recorded.
``error`` (why a prompt stopped early; not part of the conversation a model sees)
    ``"kind"``: ``"model"`` (request ``step`` raised or gave an invalid reply: the step
    is used up), or, with ``step`` the request the prompt stopped before making (the next
    prompt makes it), ``"max_steps"``, ``"loop"`` (the session's LoopActor was gone) or
    ``"cancelled"`` (the host cancelled); and ``"message": str``.

Reading back (:func:`load`): ``user``, ``reply`` and ``result`` records give the
conversation as :class:`~rho_actors.model.Message` values, each result placed right after
its reply in call order. A call whose ``reply`` was recorded but whose ``result`` was not
(the process died mid-turn) is never run again (its tool may have had effects): it gets a
``cancelled`` error result (:data:`INTERRUPTED`), listed in :attr:`History.pending` for the
writer to record. A last line cut short (no newline, or not JSON: the process died while
writing it) is skipped with a loguru warning, and :meth:`Transcript.open` truncates the file
back to the last whole line before appending. Any other unreadable line raises
:class:`TranscriptError`; records of an unknown ``type`` are skipped with a warning.

Example::

    with Transcript(loop.data_dir / TRANSCRIPT_NAME) as transcript:
        history = transcript.history
        transcript.user(history.next_step, "What is 1 + 2?")
"""

from __future__ import annotations

import base64
import binascii
import errno
import fcntl
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from loguru import logger

from rho_actors.call import error_result
from rho_actors.model import Message, Reply
from rho_actors.tool import ErrorKind, Image, ToolCall, ToolResult

__all__ = [
    "INTERRUPTED",
    "SCHEMA_VERSION",
    "TRANSCRIPT_NAME",
    "History",
    "Transcript",
    "TranscriptBusyError",
    "TranscriptError",
    "load",
    "read_records",
]

SCHEMA_VERSION: Final = 1
TRANSCRIPT_NAME: Final = "transcript.jsonl"
INTERRUPTED: Final = "the session was interrupted before this call's result was recorded"
"""The text of the ``cancelled`` result a recorded call without a recorded result gets."""

ERROR_KINDS: Final = ("model", "max_steps", "loop", "cancelled")


class TranscriptError(Exception):
    """A transcript that cannot be read: a line other than the last is not a valid
    record. ``str(err)`` names the file and the line."""


class TranscriptBusyError(TranscriptError):
    """Another prompt (in this process or another) holds the session's transcript."""


@dataclass(slots=True)
class History:
    """A session's transcript as read back.

    ``messages``: the conversation (interrupted calls already answered with their
    ``cancelled`` results); ``pending``: those results as ``(step, index, result)``, not
    yet recorded; ``next_step``: the number of the session's next model request;
    ``records``: how many records were read; ``torn``: whether a cut-short last line
    was skipped.
    """

    messages: list[Message] = field(default_factory=list)
    pending: list[tuple[int, int, ToolResult]] = field(default_factory=list)
    next_step: int = 1
    records: int = 0
    torn: bool = False

    @property
    def awaiting_reply(self) -> bool:
        """Whether the conversation ends with a message the model has not answered (a
        ``user`` or ``tool`` message): a prompt can continue it without new text."""
        return bool(self.messages) and self.messages[-1].role != "assistant"


# --------------------------------------------------------------------------- reading


def read_records(path: str | Path) -> tuple[list[dict[str, Any]], int, bool]:
    """The records of the transcript at ``path``: ``(records, good_bytes, torn)``, where
    ``good_bytes`` is the length of the file up to the end of its last whole record and
    ``torn`` says a cut-short last line was skipped (with a loguru warning). A missing
    file has no records. Raises :class:`TranscriptError` for an unreadable line that is
    not the last, and ``OSError`` when the file cannot be read."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return [], 0, False
    records: list[dict[str, Any]] = []
    offset = 0
    number = 0
    while offset < len(data):
        end = data.find(b"\n", offset)
        last = end == -1 or end == len(data) - 1
        line = data[offset:] if end == -1 else data[offset:end]
        number += 1
        record = _parse(line) if end != -1 else None
        if record is None:
            if last:
                logger.warning(
                    "transcript {}: line {} was cut short (the process stopped while writing it); it is skipped",
                    path, number,
                )
                return records, offset, True
            raise TranscriptError(f"transcript {path}: line {number} is not a valid record")
        records.append(record)
        offset = end + 1
    return records, offset, False


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def load(path: str | Path) -> History:
    """The :class:`History` of the transcript at ``path`` (empty when there is none),
    without changing the file. Raises :class:`TranscriptError` for a transcript that
    cannot be read (a bad record other than a cut-short last line)."""
    records, _, torn = read_records(path)
    history = _history(records, str(path))
    history.torn = torn
    return history


@dataclass(slots=True)
class _Group:
    """A reply and its results, by call index."""

    step: int
    message: Message
    results: dict[int, Message] = field(default_factory=dict)


def _history(records: list[dict[str, Any]], where: str) -> History:
    items: list[Message | _Group] = []
    groups: dict[int, _Group] = {}
    last_step = 0
    for number, record in enumerate(records, 1):
        try:
            kind, step = record["type"], record["step"]
            if not isinstance(step, int) or isinstance(step, bool) or step < 1:
                raise TypeError(f"step must be a positive int, got {step!r}")
            if kind == "user":
                items.append(Message.user(_str(record["text"])))
            elif kind == "reply":
                if step in groups:
                    raise ValueError(f"a second reply for step {step}")
                calls = tuple(_call(c) for c in record["tool_calls"])
                group = _Group(step, Message.assistant(_str(record["text"]), calls))
                groups[step] = group
                items.append(group)
                last_step = max(last_step, step)
            elif kind == "result":
                group_of = groups.get(step)
                index = record["index"]
                if group_of is None or not isinstance(index, int) or not 0 <= index < len(group_of.message.tool_calls):
                    raise ValueError(f"a result for call {index!r} of step {step}, which has no such call")
                if index in group_of.results:
                    logger.warning("transcript {}: line {} repeats the result of call {} of step {}; the first counts",
                                   where, number, index, step)
                    continue
                group_of.results[index] = Message.tool_result(_result(record))
            elif kind == "error":
                if record.get("kind") == "model":
                    last_step = max(last_step, step)
            else:
                logger.warning("transcript {}: line {} has an unknown record type {!r}; it is skipped",
                               where, number, kind)
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise TranscriptError(f"transcript {where}: line {number} is not a valid record: {exc}") from None
    history = History(records=len(records), next_step=last_step + 1)
    for item in items:
        if isinstance(item, Message):
            history.messages.append(item)
            continue
        history.messages.append(item.message)
        for index, call in enumerate(item.message.tool_calls):
            message = item.results.get(index)
            if message is None:
                result = error_result(call.id, call.name, ErrorKind.CANCELLED, INTERRUPTED)
                history.pending.append((item.step, index, result))
                message = Message.tool_result(result)
            history.messages.append(message)
    return history


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _call(data: Any) -> ToolCall:
    arguments = data["arguments"]
    if not isinstance(arguments, (str, dict)):
        raise TypeError(f"tool call arguments must be a string or an object, got {type(arguments).__name__}")
    return ToolCall(_str(data["id"]), _str(data["name"]), arguments)


def _result(record: Mapping[str, Any]) -> ToolResult:
    kind = record["error_kind"]
    images = tuple(
        Image(base64.b64decode(_str(i["data"]), validate=True), _str(i["mime_type"])) for i in record["images"]
    )
    return ToolResult(
        _str(record["call_id"]), _str(record["name"]), bool(record["ok"]), _str(record["content"]),
        None if kind is None else ErrorKind(kind), None, images, float(record.get("duration_ms", 0.0)),
    )


# --------------------------------------------------------------------------- writing


class Transcript:
    """The writer of one session's transcript at ``path``.

    :meth:`open` (or ``with``) takes an exclusive ``flock`` on the file (one prompt per
    session at a time, across processes too), reads it into :attr:`history`, and
    truncates a cut-short last line away. Each write method appends one record and
    returns once it is flushed and ``fsync``-ed; they raise ``OSError`` when the disk
    does, and ``ValueError`` for a value JSON cannot hold (a tool call's arguments
    object).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.history = History()
        self._fd: int | None = None

    def open(self) -> History:
        """Lock the transcript, read it and get it ready to append; returns
        :attr:`history`. Raises :class:`TranscriptBusyError` when another prompt holds
        it, :class:`TranscriptError` when it cannot be read (the lock is then released),
        and ``OSError``."""
        if self._fd is not None:
            return self.history
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise TranscriptBusyError(
                        f"transcript {self.path} is in use by another prompt of this session"
                    ) from None
                raise
            if created:
                _fsync_dir(self.path.parent)
            records, good, torn = read_records(self.path)
            history = _history(records, str(self.path))
            history.torn = torn
            if torn:
                os.ftruncate(fd, good)
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.history = history
        return history

    def close(self) -> None:
        """Release the lock and close the file (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # releases the flock

    def __enter__(self) -> Transcript:
        self.open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- records ------------------------------------------------------------------------

    def user(self, step: int, text: str) -> None:
        """Record a prompt's ``text``, to be answered by request ``step``."""
        self._append({"type": "user", "step": step, "text": text})

    def reply(
        self, step: int, reply: Reply, model_ms: float = 0.0, *, sent_ids: Mapping[int, str] | None = None
    ) -> None:
        """Record the model's reply to request ``step`` (before its calls run);
        ``model_ms``: how long the request took, in milliseconds; ``sent_ids``: the id
        the model sent for call *index*, where the recorded id replaces it."""
        calls = [
            {"id": c.id, "name": c.name,
             "arguments": c.arguments if isinstance(c.arguments, str) else dict(c.arguments)}
            for c in reply.tool_calls
        ]
        for index, sent in (sent_ids or {}).items():
            calls[index]["sent_id"] = sent
        self._append({"type": "reply", "step": step, "text": reply.text, "tool_calls": calls,
                      "model_ms": round(model_ms, 3)})

    def result(self, step: int, index: int, result: ToolResult) -> None:
        """Record the result of call ``index`` (its position in the reply) of ``step``."""
        self._append({
            "type": "result", "step": step, "index": index, "call_id": result.call_id, "name": result.name,
            "ok": result.ok, "content": result.content,
            "error_kind": None if result.error_kind is None else str(result.error_kind),
            "duration_ms": round(result.duration_ms, 3),
            "images": [{"mime_type": i.mime_type, "data": base64.b64encode(i.data).decode("ascii")}
                       for i in result.images],
        })

    def error(self, step: int, kind: str, message: str) -> None:
        """Record why the prompt stopped at ``step`` (``kind``: one of ``model``,
        ``max_steps``, ``loop``, ``cancelled``)."""
        if kind not in ERROR_KINDS:
            raise ValueError(f"error kind must be one of {', '.join(ERROR_KINDS)}, got {kind!r}")
        self._append({"type": "error", "step": step, "kind": kind, "message": message})

    def _append(self, record: dict[str, Any]) -> None:
        if self._fd is None:
            raise ValueError(f"transcript {self.path} is not open")
        full = {"v": SCHEMA_VERSION, "type": record.pop("type"), "step": record.pop("step"),
                "ts": round(time.time(), 6), **record}
        try:
            text = json.dumps(full, ensure_ascii=False, allow_nan=False)
            data = (text + "\n").encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: escape it, JSON reads it back
            data = (json.dumps(full, ensure_ascii=True, allow_nan=False) + "\n").encode("ascii")
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"a {full['type']} record cannot be written as JSON: {exc}") from None
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)


def _fsync_dir(path: Path) -> None:
    """Make a new file's directory entry durable (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
