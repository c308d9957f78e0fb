"""Durable session transcripts: one JSON Lines file per session, appended as it goes.

The agent loop (:mod:`rho_actors.agent`) writes each session's conversation to
``loop.data_dir / "transcript.jsonl"``, one record per line, each appended, flushed and
synced (``os.fdatasync``) before the loop moves on; a record is whole once its newline is
on disk. A record may be written unsynced (``sync=False``) where losing it to a crash of
the machine is safe (the next synced record covers it): a process killed with
``kill -9`` loses nothing it wrote.
A later prompt in the same session (a new process, a new :class:`~rho_actors.ActorSystem`
on the same ``data_dir``, a LoopActor restarted by its supervisor) reads the conversation
back from it instead of starting over.

Record schema (version 2)
-------------------------

Every record is one JSON object on one line with these keys::

    "v":    2                 the schema version (1: the same records without seq/sum)
    "seq":  int               the record's number in the file: 1, 2, 3, ... with no gap
    "type": "user" | "reply" | "result" | "error" | "call"
    "step": int               the model request (1, 2, ... over the whole session) the
                              record belongs to
    "ts":   float             Unix time of the write, in seconds
    "sum":  str               integrity check: the first 16 hex digits of the SHA-256 of
                              the record without "sum" (JSON, keys sorted, ASCII, compact)

A record may carry further keys: they are covered by ``sum`` and ignored by readers that
do not know them, so new fields need no new version.

and, by type:

``user`` (a prompt's text; ``step`` is the request that will answer it)
    ``"text": str``; ``"tasks": [str]`` when it gives the model the results of those
    background calls (:mod:`rho_actors.tasks`), each given once
``reply`` (the model's reply to request ``step``; written *before* its calls run)
    ``"text": str``, ``"tool_calls": [{"id": str, "name": str, "arguments": str | object}]``
    (the model's raw argument text, or the decoded object a provider gave; ``"sent_id"``,
    optional, the id the model sent when the recorded one replaces it: see
    :mod:`rho_actors.agent.provider_rules`), and
    ``"model_ms": float`` (how long the request took, milliseconds), and, when the
    provider sent any, ``"thinking": [object]``: its reasoning blocks exactly as they
    came (:attr:`rho_actors.agent.model.Reply.thinking`; a transcript written before they were
    recorded has none, see :mod:`rho_actors.agent.providers.anthropic` for what is then sent).
``result`` (one call's result; written as the call settles, so a turn's results are in the
    order they settled, each once, all of them by the turn's end)
    ``"index": int`` (the call's position in its reply's ``tool_calls``), ``"call_id"``,
    ``"name"``, ``"ok": bool``, ``"content": str`` (the text for the model),
    ``"error_kind": str | null``, ``"duration_ms": float`` and
    ``"images": [{"mime_type": str, "sha256": str, "bytes": int}]``: each image by its
    digest; its bytes are in the image store beside the transcript
    (:mod:`rho_actors.agent.image_store`, ``images/<sha256>``, bounded: an image that does not
    fit has ``"omitted": str`` saying so, and is left out when read back, as is one whose
    file is missing or does not match). Older records hold ``{"mime_type", "data"}``
    (base64 inline) and still load. ``details`` are the host's and are not recorded; nor
    are a result's other blocks (sounds, embedded resources): ``content`` is what the
    model saw of them (a line naming each, a text resource's text).
``call`` (a call's state changed between its reply and its result: held for approval,
    decided, started once approved...; not part of the conversation a model sees)
    ``"index"``, ``"call_id"``, ``"name"``, ``"state"``, ``"at"`` and the state's fields,
    as :mod:`rho_actors.lifecycle` defines and checks them.
``error`` (why a prompt stopped early; not part of the conversation a model sees)
    ``"kind"``: ``"model"`` (request ``step`` raised or gave an invalid reply: the step
    is used up), or, with ``step`` the request the prompt stopped before making (the next
    prompt makes it), ``"max_steps"``, ``"loop"`` (the session's LoopActor was gone) or
    ``"cancelled"`` (the host cancelled); and ``"message": str``.

Reading back (:func:`load`): ``user``, ``reply`` and ``result`` records give the
conversation as :class:`~rho_actors.agent.model.Message` values, each result placed right after
its reply in call order. A call whose ``reply`` was recorded but whose ``result`` was not
(the process died mid-turn) is never run again (its tool may have had effects): it gets a
``cancelled`` error result (:data:`INTERRUPTED`), listed in :attr:`History.pending` for the
writer to record; unless its ``call`` records say it is still waiting for a decision, or
was decided and has not started (``pending``, or ``decided`` without a later state and not
``resolved``): such a call is in :attr:`History.open_calls`, with no result yet. A last
line cut short (no newline, or holding NUL bytes, which this writer never writes and a
file system leaves after a crash: the process or machine died while writing it) is
skipped with a loguru warning, and :meth:`Transcript.open` truncates the file back to
the last whole line before appending; a line that repeats the line before it
byte for byte is skipped with a warning. Anything else is tampering or damage and raises
:class:`TranscriptError` naming the line: a line that is not JSON, a checksum that does
not match, a ``seq`` out of order (a gap, a duplicate, a reorder), an unknown version (or
a version 1 record after a version 2 one), a field of the wrong type (``"ok": "false"``).
Records of an unknown ``type`` are skipped with a warning. Version 1 transcripts (written
before ``seq``/``sum``) still load; records appended to them are version 2.

A record the disk cuts short (``ENOSPC``, ``EFBIG``) is cut away before the write's
``OSError`` is raised (:func:`~rho_actors.agent.lines.append_whole`): the next record
follows the last whole one; a transcript removed or replaced while open (a tool clearing its folder) gets no
more records (:class:`TranscriptError`). Files are opened safely (:mod:`rho_actors.files`): never through a
symlink, and only a regular file (a FIFO, device or folder in its place is a :class:`TranscriptError` at once).

Example::

    with Transcript(loop.data_dir / TRANSCRIPT_NAME) as transcript:
        history = transcript.history
        transcript.user(history.next_step, "What is 1 + 2?")
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from loguru import logger

from rho_actors.agent import lines, transcript_lock
from rho_actors.agent.image_store import DEFAULT_MAX_IMAGE_STORE_BYTES, ImageStore
from rho_actors.agent.lines import SCHEMA_VERSION, Mark, TranscriptError, checksum, read_all, read_records, scan
from rho_actors.agent.model import Message, Reply
from rho_actors.agent.transcript_lock import TranscriptBusyError
from rho_actors.files import fsync_dir, open_regular
from rho_actors.lifecycle import CallTrack, LifecycleError, call_record, check_move, fold
from rho_actors.results import failure, text
from rho_actors.tool import ErrorKind, Image, ToolCall, ToolResult

__all__ = [
    "INTERRUPTED",
    "SCHEMA_VERSION",
    "TRANSCRIPT_NAME",
    "History",
    "Transcript",
    "TranscriptBusyError",
    "TranscriptError",
    "checksum",
    "load",
    "read_records",
    "thinking_blocks",
]

TRANSCRIPT_NAME: Final = "transcript.jsonl"
INTERRUPTED: Final = text("interrupted")
"""The text of the ``cancelled`` result a recorded call without a recorded result gets."""

ERROR_KINDS: Final = ("model", "max_steps", "loop", "cancelled")
_WAITING: Final = ("pending", "decided")  # a call without result in these states is open, not interrupted


@dataclass(slots=True)
class History:
    """A session's transcript as read back.

    ``messages``: the conversation (interrupted calls already answered with their
    ``cancelled`` results); ``pending``: those results as ``(step, index, result)``, not
    yet recorded; ``next_step``: the number of the session's next model request;
    ``records``: how many records were read; ``torn``: whether a cut-short last line
    was skipped; ``calls``: the :class:`~rho_actors.lifecycle.CallTrack` of each call
    that has ``call`` records, by call id; ``open_calls``: those of them without a
    result that wait for a decision or to run once decided (no result in ``messages``);
    ``delivered_tasks``: the ids of the background calls whose results a ``user``
    record gave the model (its ``"tasks"`` field: :mod:`rho_actors.tasks`);
    ``unanswered``: where each call of a recorded reply that has no ``result`` record yet
    is, by call id: ``(step, index)`` (kept up to date by :meth:`Transcript.reopen` and
    by the writer's own records).
    """

    messages: list[Message] = field(default_factory=list)
    pending: list[tuple[int, int, ToolResult]] = field(default_factory=list)
    calls: dict[str, CallTrack] = field(default_factory=dict)
    open_calls: dict[str, CallTrack] = field(default_factory=dict)
    delivered_tasks: set[str] = field(default_factory=set)
    unanswered: dict[str, tuple[int, int]] = field(default_factory=dict)
    next_step: int = 1
    records: int = 0
    torn: bool = False

    @property
    def awaiting_reply(self) -> bool:
        """Whether the conversation ends with a message the model has not answered (a
        ``user`` or ``tool`` message): a prompt can continue it without new text."""
        return bool(self.messages) and self.messages[-1].role != "assistant"


# --------------------------------------------------------------------------- reading


def load(path: str | Path) -> History:
    """The :class:`History` of the transcript at ``path`` (empty when there is none),
    without changing the file. Raises :class:`TranscriptError` for a transcript that
    cannot be read (a bad record other than a cut-short last line)."""
    records, _, torn = read_records(path)
    history = _history(records, str(path), ImageStore(Path(path).parent))
    history.torn = torn
    return history


@dataclass(slots=True)
class _Group:
    """A reply and its results, by call index."""

    step: int
    message: Message
    results: dict[int, Message] = field(default_factory=dict)


def _history(records: list[dict[str, Any]], where: str, images: ImageStore) -> History:
    items: list[Message | _Group] = []
    groups: dict[int, _Group] = {}
    delivered: set[str] = set()  # the background calls whose results a user record gave
    last_step = 0
    for number, record in enumerate(records, 1):
        try:
            kind, step = record["type"], record["step"]
            if not isinstance(step, int) or isinstance(step, bool) or step < 1:
                raise TypeError(f"step must be a positive int, got {step!r}")
            _number(record, "ts", required=False)
            if kind == "user":
                items.append(Message.user(_str(record["text"])))
                delivered.update(_str(t) for t in _list(record.get("tasks", [])))
            elif kind == "reply":
                if step in groups:
                    raise ValueError(f"a second reply for step {step}")
                _number(record, "model_ms", required=False)
                calls = tuple(_call(c) for c in _list(record["tool_calls"]))
                thinking = _thinking(record.get("thinking", []))
                group = _Group(step, Message.assistant(_str(record["text"]), calls, thinking))
                groups[step] = group
                items.append(group)
                last_step = max(last_step, step)
            elif kind == "result":
                group_of = groups.get(step)
                index = record["index"]
                if group_of is None or type(index) is not int or not 0 <= index < len(group_of.message.tool_calls):
                    raise ValueError(f"a result for call {index!r} of step {step}, which has no such call")
                if index in group_of.results:
                    logger.warning("transcript {}: line {} repeats the result of call {} of step {}; the first counts",
                                   where, number, index, step)
                    continue
                group_of.results[index] = Message.tool_result(_result(record, images))
            elif kind == "call":
                _placed(record, groups.get(step))
            elif kind == "error":
                if record.get("kind") not in ERROR_KINDS:
                    raise ValueError(f"error kind must be one of {', '.join(ERROR_KINDS)}, got {record.get('kind')!r}")
                _str(record["message"])
                if record.get("kind") == "model":
                    last_step = max(last_step, step)
            else:
                logger.warning("transcript {}: line {} has an unknown record type {!r}; it is skipped",
                               where, number, kind)
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise TranscriptError(f"transcript {where}: line {number} is not a valid record: {exc}") from None
    history = History(records=len(records), next_step=last_step + 1, calls=_tracks(records, where),
                      delivered_tasks=delivered)
    _assemble(history, items)
    return history


def _assemble(history: History, items: list[Message | _Group]) -> None:
    """Put the conversation of ``items`` in ``history``: each reply followed by its
    results in call order, an interrupted call's ``cancelled`` result in its place."""
    tracks = history.calls
    for item in items:
        if isinstance(item, Message):
            history.messages.append(item)
            continue
        history.messages.append(item.message)
        for index, call in enumerate(item.message.tool_calls):
            message = item.results.get(index)
            track = tracks.get(call.id)
            if message is None:
                history.unanswered[call.id] = (item.step, index)
            if message is None and track is not None and track.state in _WAITING and track.decision != "resolved":
                history.open_calls[call.id] = track
                continue
            if message is None:
                result = failure("interrupted", call.id, call.name)
                history.pending.append((item.step, index, result))
                message = Message.tool_result(result)
            history.messages.append(message)


def _placed(record: Mapping[str, Any], group: _Group | None) -> None:
    """Raise ``ValueError`` unless ``call`` record ``record`` is of a call of a reply before it."""
    index = record.get("index")
    if group is None or type(index) is not int or not 0 <= index < len(group.message.tool_calls):
        raise ValueError(f"a call record for call {index!r} of step {record['step']}, which has no such call")


def _moved_on(history: History, records: list[dict[str, Any]], where: str) -> None:
    """``history`` moved on by ``records`` appended since it was read: its calls' tracks,
    the calls without a result and the next step (its conversation stays as it was)."""
    history.calls = _tracks(records, where, history.calls)
    history.records += len(records)
    for record in records:
        kind, step = record.get("type"), record.get("step")
        if not isinstance(step, int):
            continue
        if kind == "reply" and isinstance(record.get("tool_calls"), list):
            for index, call in enumerate(record["tool_calls"]):
                if isinstance(call, dict) and isinstance(call.get("id"), str):
                    history.unanswered[call["id"]] = (step, index)
        elif kind == "result" and isinstance(record.get("call_id"), str):
            history.unanswered.pop(record["call_id"], None)
        if kind == "reply" or (kind == "error" and record.get("kind") == "model"):
            history.next_step = max(history.next_step, step + 1)


def _tracks(records: list[dict[str, Any]], where: str, tracks: dict[str, CallTrack] | None = None
            ) -> dict[str, CallTrack]:
    try:
        return fold(records, tracks)
    except LifecycleError as exc:
        raise TranscriptError(f"transcript {where}: a call record is not valid: {exc}") from None


_JSON_NAMES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number",
               type(None): "null"}


def _json_name(value: Any) -> str:
    return _JSON_NAMES.get(type(value), type(value).__name__)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {_json_name(value)}")
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected an array, got {_json_name(value)}")
    return value


def _number(record: Mapping[str, Any], key: str, required: bool = True) -> float:
    if key not in record and not required:
        return 0.0
    value = record[key]
    if type(value) not in (int, float) or not math.isfinite(value):
        raise TypeError(f"{key} must be a number, got {_json_name(value)}")
    return float(value)


def _call(data: Any) -> ToolCall:
    if not isinstance(data, dict):
        raise TypeError(f"a tool call must be an object, got {_json_name(data)}")
    arguments = data["arguments"]
    if not isinstance(arguments, (str, dict)):
        raise TypeError(f"tool call arguments must be a string or an object, got {type(arguments).__name__}")
    return ToolCall(_str(data["id"]), _str(data["name"]), arguments)


THINKING_FIELDS: Final = {"thinking": ("thinking", "signature"), "redacted_thinking": ("data",)}
"""The reasoning block types recorded, and the text fields each must have."""


def _thinking(value: Any) -> tuple[dict[str, Any], ...]:
    blocks = _list(value)
    for block in blocks:
        if not isinstance(block, dict):
            raise TypeError(f"a thinking block must be an object, got {_json_name(block)}")
        fields = THINKING_FIELDS.get(block.get("type"))  # type: ignore[arg-type]
        if fields is None:
            raise ValueError(f"a thinking block's type must be one of {', '.join(THINKING_FIELDS)}, "
                             f"got {block.get('type')!r}")
        for name in fields:
            _str(block.get(name))
    return tuple(blocks)


def thinking_blocks(value: Any) -> tuple[dict[str, Any], ...]:
    """The reasoning blocks of a reply that can be recorded and replayed: each a plain
    dict of a type in :data:`THINKING_FIELDS` with its text fields; anything else is
    left out. Never raises."""
    kept: list[dict[str, Any]] = []
    try:
        for block in tuple(value or ()):
            if isinstance(block, Mapping):
                fields = THINKING_FIELDS.get(block.get("type"))  # type: ignore[arg-type]
                if fields is not None and all(isinstance(block.get(name), str) for name in fields):
                    kept.append({"type": block["type"], **{name: block[name] for name in fields}})
    except Exception:
        return tuple(kept)
    return tuple(kept)


def _result(record: Mapping[str, Any], store: ImageStore) -> ToolResult:
    kind, ok = record["error_kind"], record["ok"]
    if type(ok) is not bool:
        raise TypeError(f"ok must be true or false, got {_json_name(ok)}")
    if kind is not None and not isinstance(kind, str):
        raise TypeError(f"error_kind must be a string or null, got {_json_name(kind)}")
    if ok != (kind is None):
        raise ValueError(f"ok is {json.dumps(ok)} but error_kind is {json.dumps(kind)}")
    images = tuple(i for i in (_image(data, store) for data in _list(record["images"])) if i is not None)
    return ToolResult(
        _str(record["call_id"]), _str(record["name"]), ok, _str(record["content"]),
        None if kind is None else ErrorKind(kind), None, images, _number(record, "duration_ms", required=False),
    )


def _image(data: Any, store: ImageStore) -> Image | None:
    """A recorded image: inline (base64, older records) or by digest from ``store``;
    ``None`` when it was omitted or its stored bytes are gone (left out, with a warning)."""
    if not isinstance(data, dict):
        raise TypeError(f"an image must be an object, got {_json_name(data)}")
    mime = _str(data["mime_type"])
    if "data" in data:
        return Image(base64.b64decode(_str(data["data"]), validate=True), mime)
    digest = _str(data["sha256"])
    if "omitted" in data:
        return None
    stored = store.get(digest)
    return None if stored is None else Image(stored, mime)


# --------------------------------------------------------------------------- writing


class Transcript:
    """The writer of one session's transcript at ``path``.

    :meth:`open` (or ``with``) locks it (one prompt per session at a time, across
    processes too: :mod:`~rho_actors.agent.transcript_lock`), reads it into
    :attr:`history`, and truncates a cut-short last line away. Each write method appends
    one record and returns once it is flushed and synced (``fdatasync``); they raise
    ``OSError`` when the disk does, and ``ValueError`` for a value JSON cannot hold (a
    tool call's arguments object). Images go to :attr:`images`, an :class:`~rho_actors.agent.image_store.ImageStore`
    beside the file bounded to ``max_image_bytes`` (default 256 MiB).
    """

    def __init__(self, path: str | Path, *, max_image_bytes: int = DEFAULT_MAX_IMAGE_STORE_BYTES) -> None:
        self.path = Path(path)
        self.images = ImageStore(self.path.parent, max_image_bytes)
        self.history = History()
        self._fd: int | None = None
        self._prompt: transcript_lock.PromptLock | None = None
        self._seq = 0
        self._mark: Mark | None = None  # where the last read or write left the file, for reopen()
        self._writing = threading.Lock()  # records come from the threads that settle or move calls too
        self._per_record = False  # open(per_record=True): the file's lock is taken for each record
        self._kept: transcript_lock.KeptFile | None = None  # then the file, kept open between records

    def open(self, *, brief: bool = False, per_record: bool = False) -> History:
        """Lock the transcript, read it and get it ready to append; returns
        :attr:`history`. ``brief``: a writer of a record or two (a decision, a result).
        ``per_record``: a writer that holds the session (the prompt lock) until
        :meth:`close` but the file's own lock only while it appends a record (the file
        kept open, its lock taken again, then what others appended meanwhile read; a
        file replaced at its path meanwhile is written no more), so brief writers (a
        decision from another process) get in between: a session served over MCP.
        Raises :class:`TranscriptBusyError` (another prompt holds it, or ``brief``:
        anyone), :class:`TranscriptError` when it cannot be read (the locks are then
        released), and ``OSError``."""
        if self._fd is not None or self._per_record:
            return self.history
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            if not brief:
                self._prompt = transcript_lock.prompt_lock_of(self.path)
            created = not os.path.lexists(self.path)
            wait_s = 0.0 if brief else transcript_lock.RECORD_WAIT_S
            fd = self._fd = transcript_lock.file_lock_of(self.path, wait_s, os.O_APPEND)
            if created:
                fsync_dir(self.path.parent)
            st = os.fstat(fd)
            records, good, torn, mark = scan(read_all(fd), str(self.path), Mark(st.st_dev, st.st_ino, 0, 0, 1, None))
            history = _history(records, str(self.path), self.images)
            history.torn = torn
            if torn:
                os.ftruncate(self._fd, good)
                os.fsync(self._fd)
        except BaseException:
            self.close()
            raise
        self._seq, self._mark = len(records), mark
        self.history = history
        if per_record:  # the file's lock let go until the next record, the file kept open for it
            transcript_lock.unlock(self._fd)
            self._kept, self._fd, self._per_record = transcript_lock.KeptFile(self._fd), None, True
        return history

    def read_unlocked(self) -> None:
        """Read, without the transcript's lock, what it gained since this writer (closed)
        last read or wrote it: the whole file the first time, or when it was replaced or
        made shorter, then only its tail (:func:`~rho_actors.agent.lines.read_past`: whole
        lines). :meth:`reopen`, under the lock, then reads only the rest. Raises as :meth:`open`."""
        read = None if self._fd is not None else lines.read_past(self.path, self._mark)
        if read is None:
            return
        records, whole, mark = read
        if whole:
            self.history = _history(records, str(self.path), self.images)
        else:
            _moved_on(self.history, records, str(self.path))
        self._seq, self._mark = mark.seq, mark

    def reopen(self) -> History:
        """Lock again, as a brief writer (:meth:`open` ``brief=True``), the transcript
        this writer read before (then :meth:`close`-d), reading only the records appended
        since, by any process: they move :attr:`history`'s ``calls``, ``unanswered``
        and ``next_step`` on (its conversation and ``open_calls`` stay as they were
        read). A whole read when it was not read before, or the file was replaced
        or made shorter. Raises as :meth:`open`."""
        mark = self._mark
        if self._fd is not None:
            return self.history
        if mark is None or not os.path.lexists(self.path):
            return self.open(brief=True)
        fd = transcript_lock.file_lock_of(self.path, 0.0, os.O_APPEND)
        try:
            caught_up = self._caught_up(fd, mark)
        except BaseException:
            os.close(fd)
            raise
        if not caught_up:
            os.close(fd)
            self._mark, self.history = None, History()
            return self.open(brief=True)
        self._fd = fd
        return self.history

    def _caught_up(self, fd: int, mark: Mark, at_path: bool = False) -> bool:
        """Read the records appended to ``fd`` past ``mark`` into :attr:`history`; False
        (nothing read) when the file was replaced or made shorter (``at_path``: or
        another file is at :attr:`path` now, or none: its ``lstat`` is ``fd``'s as ``mark``'s)."""
        try:
            st = os.lstat(self.path) if at_path else os.fstat(fd)
        except FileNotFoundError:
            return False
        if (st.st_dev, st.st_ino) != (mark.dev, mark.ino) or st.st_size < mark.good:
            return False
        if st.st_size == mark.good:  # nothing appended since
            return True
        records, good, torn, after = scan(read_all(fd, mark.good), str(self.path), mark)
        if torn:
            os.ftruncate(fd, mark.good + good)
            os.fsync(fd)
        _moved_on(self.history, records, str(self.path))
        self._seq, self._mark = after.seq, after
        return True

    def sync(self) -> None:
        """Make the records written so far durable (``fdatasync``): those written
        ``sync=False`` for a group commit (:mod:`~rho_actors.agent.group_commit`); opened
        ``per_record`` (or closed), through a descriptor of its own. Raises ``OSError``."""
        with self._writing:
            if (fd := self._fd) is not None:  # close() waits for it
                os.fdatasync(fd)
                return
        kept = self._kept  # per_record: no record held up meanwhile
        if kept is not None and (fd := kept.borrow()) is not None:
            try:
                os.fdatasync(fd)  # the file's data and size, whichever descriptor asks
            finally:
                kept.give_back()
        elif self._mark is not None:
            own = open_regular(self.path, os.O_RDONLY)
            try:
                os.fdatasync(own)
            finally:
                os.close(own)

    def close(self) -> None:
        """Release the locks and close the files (idempotent)."""
        kept, self._kept, self._per_record = self._kept, None, False
        if kept is not None:  # a record being written goes on with it: its last user closes it
            kept.close()
        if self._fd is not None:  # never a per_record one's: a record or a sync using it ends first
            with self._writing:
                fd, self._fd = self._fd, None
                if fd is not None:  # the file's lock first: a prompt waiting for it never holds it alone
                    os.close(fd)  # releases the flock
        prompt, self._prompt = self._prompt, None
        if prompt is not None:
            prompt.release()

    def __enter__(self) -> Transcript:
        self.open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- records ------------------------------------------------------------------------

    def user(self, step: int, text: str, *, tasks: Sequence[str] = ()) -> None:
        """Record a prompt's ``text``, to be answered by request ``step``; ``tasks``:
        the background calls whose results it gives the model (each once, ever)."""
        self._append({"type": "user", "step": step, "text": text, **({"tasks": list(tasks)} if tasks else {})})
        self.history.delivered_tasks.update(tasks)

    def reply(
        self, step: int, reply: Reply, model_ms: float = 0.0, *, sent_ids: Mapping[int, str] | None = None,
        sync: bool = True,
    ) -> None:
        """Record the model's reply to request ``step`` (before its calls run);
        ``model_ms``: how long the request took, in milliseconds; ``sent_ids``: the id
        the model sent for call *index*, where the recorded id replaces it; ``sync``
        as in :meth:`call`."""
        calls = [
            {"id": c.id, "name": c.name,
             "arguments": c.arguments if isinstance(c.arguments, str) else dict(c.arguments)}
            for c in reply.tool_calls
        ]
        for index, sent in (sent_ids or {}).items():
            calls[index]["sent_id"] = sent
        record: dict[str, Any] = {"type": "reply", "step": step, "text": reply.text, "tool_calls": calls,
                                  "model_ms": round(model_ms, 3)}
        if reply.thinking:
            record["thinking"] = [dict(block) for block in reply.thinking]
        self._append(record, sync)
        self.history.unanswered.update((c.id, (step, i)) for i, c in enumerate(reply.tool_calls))
        self.history.next_step = max(self.history.next_step, step + 1)

    def result(self, step: int, index: int, result: ToolResult, *, sync: bool = True) -> None:
        """Record the result of call ``index`` (its position in the reply) of ``step``;
        ``sync=False``: written, not synced (see :meth:`call`)."""
        self._append({
            "type": "result", "step": step, "index": index, "call_id": result.call_id, "name": result.name,
            "ok": result.ok, "content": result.content,
            "error_kind": None if result.error_kind is None else str(result.error_kind),
            "duration_ms": round(result.duration_ms, 3),
            "images": [self._stored(i) for i in result.images],
        }, sync)
        self.history.unanswered.pop(result.call_id, None)

    def _stored(self, image: Image) -> dict[str, Any]:
        """An image's record: its digest, put in the image store when it fits."""
        digest, stored = self.images.put(image.data)
        record: dict[str, Any] = {"mime_type": image.mime_type, "sha256": digest, "bytes": len(image.data)}
        if not stored:
            record["omitted"] = f"the transcript's image store is full ({self.images.max_bytes} bytes)"
            logger.warning("transcript {}: an image of {} bytes is not kept: {}", self.path, len(image.data),
                           record["omitted"])
        return record

    def call(self, step: int, index: int, state: str, *, call_id: str, name: str, sync: bool = True,
             **fields: Any) -> None:
        """Record that call ``index`` of ``step`` (``call_id``, of tool ``name``) moved to
        ``state`` with the state's ``fields`` (:func:`rho_actors.lifecycle.call_record`,
        which raises :class:`~rho_actors.lifecycle.LifecycleError`, a ``ValueError``, for a
        state or a field it does not take). ``sync=False``: written but not synced
        yet (the next record written with ``sync`` makes both durable)."""
        self._append({"type": "call", "step": step, **call_record(state, call_id=call_id, name=name, index=index,
                                                                  **fields)}, sync)

    def error(self, step: int, kind: str, message: str) -> None:
        """Record why the prompt stopped at ``step`` (``kind``: one of ``model``,
        ``max_steps``, ``loop``, ``cancelled``)."""
        if kind not in ERROR_KINDS:
            raise ValueError(f"error kind must be one of {', '.join(ERROR_KINDS)}, got {kind!r}")
        self._append({"type": "error", "step": step, "kind": kind, "message": message})

    def _append(self, record: dict[str, Any], sync: bool = True) -> None:
        with self._writing:
            if self._fd is not None or not self._per_record:
                if self._fd is None:
                    raise ValueError(f"transcript {self.path} is not open")
                self._append_now(self._fd, record, sync)
                return
            kept = self._kept
            fd = kept.borrow() if kept is not None else None
            if kept is None or fd is None:
                raise ValueError(f"transcript {self.path} is not open")
            try:
                transcript_lock.relock(fd, self.path, transcript_lock.RECORD_WAIT_S)
                try:
                    if self._mark is None or not self._caught_up(fd, self._mark, at_path=True):
                        raise TranscriptError(f"transcript {self.path} was replaced or cut short by another "
                                              "process; this session records nothing more in it")
                    self._append_now(fd, record, sync, True)  # fd stays the borrow's: close() never closes it
                finally:
                    transcript_lock.unlock(fd)
            finally:
                kept.give_back()

    def _append_now(self, fd: int, record: dict[str, Any], sync: bool, checked: bool = False) -> None:
        full, data = lines.record_line({"v": SCHEMA_VERSION, "seq": self._seq + 1, "type": record.pop("type"),
                                        "step": record.pop("step"), "ts": round(time.time(), 6), **record})
        moves = full["type"] in ("call", "result")
        if moves:  # the writer's own moves too: a move not allowed is never written
            check_move(full, self.history.calls)
        mark = self._mark
        lines.append_whole(fd, data, self.path, mark, checked=checked)  # whole or not at all, to the file at its path
        if moves:  # moved once written: a record the disk refused moves no call (a decision is not made)
            fold([full], self.history.calls)
        self._seq += 1  # written: counted before its sync, which may fail with the record in the file
        if mark is not None:
            self._mark = Mark(mark.dev, mark.ino, mark.good + len(data), self._seq, SCHEMA_VERSION, data[:-1])
        if sync:
            os.fdatasync(fd)  # the data and the size that reaches it: all a reader needs
