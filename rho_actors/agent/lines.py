"""A transcript's lines, each a checked record (the format is
:mod:`rho_actors.agent.transcript`'s): reading them from a file, or from where a writer
left it (:class:`Mark`), each one's version, ``seq`` and ``sum`` checked."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from loguru import logger

from rho_actors.encoding import scrub_strings
from rho_actors.errors import RhoError
from rho_actors.files import UnsafePathError, open_regular

__all__ = ["SCHEMA_VERSION", "VERSIONS", "Mark", "TranscriptError", "append_whole", "checksum", "read_all",
           "read_past", "read_records", "record_line", "scan"]

SCHEMA_VERSION: Final = 2
VERSIONS: Final = (1, 2)
"""The record versions this module reads."""

_CANONICAL: Final = json.JSONEncoder(sort_keys=True, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
_LINE: Final = json.JSONEncoder(ensure_ascii=False, allow_nan=False)  # a line as written


class TranscriptError(RhoError):
    """A transcript that cannot be used: a record that fails its checks (its JSON, its
    ``seq``, its ``sum``, its version or a field's type) anywhere but a torn last line,
    or a file that is a symlink or not a regular file. ``str(err)`` names the file and,
    for a record, the line."""


def checksum(record: Mapping[str, Any]) -> str:
    """The ``sum`` of a record: the first 16 hex digits of the SHA-256 of the record
    without ``sum`` (JSON, keys sorted, ASCII, compact separators)."""
    text = _CANONICAL.encode({k: v for k, v in record.items() if k != "sum"} if "sum" in record else record)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:16]


def record_line(record: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """``record`` as written, its ``sum`` added, and its line (JSON in UTF-8, newline
    ended): ``record`` itself, or, when a string in it (a key too) is not valid UTF-8, a
    copy with every string's lone surrogates replaced. Raises ``ValueError`` for a value
    JSON cannot hold, or two keys of a dict that become one so (neither is dropped)."""
    try:
        return _line(record)
    except UnicodeEncodeError:  # rare: only then is the record walked
        try:
            scrubbed = scrub_strings(record)
        except ValueError as exc:  # two keys that scrub to one: neither is lost without a word
            raise ValueError(f"a {record.get('type')} record cannot be written as JSON: {exc}") from None
        return _line(scrubbed)


def _line(full: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    try:
        full["sum"] = checksum(full)
        return full, (_LINE.encode(full) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        raise
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"a {full.get('type')} record cannot be written as JSON: {exc}") from None


def append_whole(fd: int, data: bytes, path: Path, mark: Mark | None, *, checked: bool = False) -> None:
    """Append ``data`` (a record's line) to file ``fd`` (opened ``O_APPEND``, its lock
    held) whole or not at all: a write the disk cuts short (``ENOSPC``, ``EFBIG``,
    ``EDQUOT``: it wrote what fitted) has what it wrote cut away before its ``OSError``
    is raised, so no later record follows a torn line (which would make every later read
    of the transcript fail). ``mark``: where the writer's last whole record ended (None:
    not known); unless the caller ``checked`` it already (one ``lstat``), a file no longer
    at ``path`` (removed or replaced: a tool clearing its session's folder; records written
    on would be lost with it) or not ending there (a torn line that could not be cut
    away, another writer) is a :class:`TranscriptError`, nothing written."""
    if mark is not None and not checked:
        try:
            st: os.stat_result | None = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != (mark.dev, mark.ino):
            raise TranscriptError(f"transcript {path} was removed or replaced while this session had it open: "
                                  "nothing more is recorded in it")
        if st.st_size != mark.good:
            raise TranscriptError(f"transcript {path} is {st.st_size} bytes long where its records written so far "
                                  f"end at {mark.good} (a record cut short, or another writer): nothing more is "
                                  "recorded in it")
    start = os.lseek(fd, 0, os.SEEK_END) if mark is None else mark.good
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        if len(view) < len(data):
            os.ftruncate(fd, start)
        raise


def _open_for_reading(path: Path) -> int | None:
    try:
        return open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except UnsafePathError as exc:
        raise TranscriptError(f"transcript {path} cannot be used: {exc}") from None


def read_all(fd: int, offset: int = 0) -> bytes:
    """The bytes of file ``fd`` from ``offset`` to its end."""
    chunks: list[bytes] = []
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def read_past(path: Path, mark: Mark | None) -> tuple[list[dict[str, Any]], bool, Mark] | None:
    """Without the file's lock: the records of the transcript at ``path`` appended past
    ``mark`` (where a reader left it), whether they are all of them (read from its start:
    ``mark`` is ``None`` or at 0, or the file was replaced or made shorter since), and the
    mark past them. Whole lines only: a line being written (or cut short) is left for the next read
    (one under the lock cuts a torn one away). ``None`` when there is no file. Raises as
    :func:`read_records`."""
    fd = _open_for_reading(path)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
        if mark is None or (st.st_dev, st.st_ino) != (mark.dev, mark.ino) or st.st_size < mark.good:
            mark = Mark(st.st_dev, st.st_ino, 0, 0, 1, None)
        data = read_all(fd, mark.good) if st.st_size > mark.good else b""
    finally:
        os.close(fd)
    records, _, _, after = scan(data[:data.rfind(b"\n") + 1], str(path), mark)
    return records, mark.good == 0, after


def read_records(path: str | Path) -> tuple[list[dict[str, Any]], int, bool]:
    """The records of the transcript at ``path``: ``(records, good_bytes, torn)``, where
    ``good_bytes`` is the length of the file up to the end of its last whole record and
    ``torn`` says a cut-short last line was skipped (with a loguru warning). A missing
    file has no records. Each record's version, ``seq`` and ``sum`` are checked; a line
    repeating the line before it byte for byte is skipped with a warning. Raises
    :class:`TranscriptError` naming the line for anything else that is wrong (and for a
    path that is a symlink or not a regular file), and ``OSError`` when the file
    cannot be read."""
    fd = _open_for_reading(Path(path))
    if fd is None:
        return [], 0, False
    try:
        return _records(read_all(fd), str(path))
    finally:
        os.close(fd)


def _records(data: bytes, path: str) -> tuple[list[dict[str, Any]], int, bool]:
    records, good, torn, _ = scan(data, path, Mark(0, 0, 0, 0, 1, None))
    return records, good, torn


@dataclass(slots=True)
class Mark:
    """Where a writer left a transcript it closed: the file (``dev``, ``ino``), its whole
    records' ``good`` bytes and count ``seq``, the last record's ``version`` and ``line``."""

    dev: int
    ino: int
    good: int
    seq: int
    version: int
    line: bytes | None


def scan(data: bytes, path: str, mark: Mark) -> tuple[list[dict[str, Any]], int, bool, Mark]:
    """The records of ``data``, the file's bytes past ``mark``: (records, the bytes of
    the whole ones, whether a cut-short last line was skipped, the mark past them).
    Raises :class:`TranscriptError` naming the line as :func:`read_records` does."""
    records: list[dict[str, Any]] = []
    offset = 0
    number = mark.seq
    previous, version = mark.line, mark.version
    while offset < len(data):
        end = data.find(b"\n", offset)
        last = end == -1 or end == len(data) - 1
        line = data[offset:] if end == -1 else data[offset:end]
        number += 1
        record = _parse(line) if end != -1 else None
        if record is None:
            if last and (end == -1 or b"\0" in line):
                logger.warning(
                    "transcript {}: line {} was cut short (the process stopped while writing it); it is skipped",
                    path, number,
                )
                return records, offset, True, Mark(mark.dev, mark.ino, mark.good + offset, mark.seq + len(records),
                                                    version, previous)
            raise TranscriptError(f"transcript {path}: line {number} is not a valid record (not a JSON object)")
        if line == previous:
            logger.warning("transcript {}: line {} repeats line {} exactly; it is skipped", path, number, number - 1)
            offset = end + 1
            continue
        problem = _integrity_problem(record, mark.seq + len(records) + 1, version)
        if problem:
            raise TranscriptError(f"transcript {path}: line {number} is not a valid record: {problem}")
        version = record["v"]
        records.append(record)
        previous = line
        offset = end + 1
    return records, offset, False, Mark(mark.dev, mark.ino, mark.good + offset, mark.seq + len(records), version,
                                         previous)


def _integrity_problem(record: dict[str, Any], seq: int, version: int) -> str | None:
    """Why ``record`` cannot be the ``seq``-th record after records of ``version``."""
    v = record.get("v")
    if type(v) is not int or v not in VERSIONS:
        return f"unknown version {v!r}; this reader knows versions {', '.join(map(str, VERSIONS))}"
    if v < version:
        return f"a version {v} record after version {version} records"
    if v == 1:
        return None
    if record.get("seq") != seq or type(record.get("seq")) is not int:
        return f"seq is {record.get('seq')!r} where {seq} was due (a record is missing, repeated or moved)"
    if record.get("sum") != checksum(record):
        return "its checksum does not match its content (the line was changed)"
    return None


def _no_constant(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None
