"""Out-of-process work for untrusted tools (DESIGN §3 and §5): throwaway declaration
reads and the worker processes of ``process`` isolation.

Two services, both built on ``multiprocessing`` with the ``forkserver`` start method
(``spawn`` works too; bare ``fork`` is refused, the runtime is multi-threaded):

- :func:`read_declaration_isolated` reads an untrusted tool's five declaration callbacks
  in a fresh child process with a time bound and a heap bound, and answers with plain
  data only (JSON text across the pipe). :func:`raw_declaration` turns that answer into
  the dict :func:`rho_actors.declarations.check_declaration` checks.
- :class:`WorkerPool` keeps warm worker processes and runs ``tool.run(args, ctx)`` in
  one of them: at the call's deadline the worker's whole process group is killed
  (``SIGKILL``) and replaced in the background, so a deadline holds even against C code
  that holds the GIL; a crash, an exit or running out of memory is an error result and
  never touches the caller or a sibling call.

Every child runs in its own process group (``os.setsid()`` first thing), so killing the
group also kills whatever the tool started (unless it left the group itself, e.g. with
``start_new_session=True``), and lives under ``RLIMIT_AS`` = ``heap_bytes`` (the whole
address space: an idle child with rho_actors loaded uses about 45 MiB of it). With the
``forkserver`` start method this module asks the fork server to preload
``rho_actors.sandbox`` (and so the rho_actors package), which makes a child ready in a
few milliseconds; that only works when this module is the first to use the fork server.

Tools travel with cloudpickle. A tool whose module a fresh process could not import (a
plugin loaded from a file path that is not on ``sys.path``, ``__main__``...) is shipped
by value (:func:`cloudpickle.register_pickle_by_value`).

Trust: this isolation contains faults (crashes, hangs, runaway memory), not malice. A
worker's result comes back pickled (``details`` may be any picklable object), so a tool
that deliberately forges its worker's reply can run code in the host when the host
unpickles it; declaration reads, which answer with JSON only, do not have that exposure.

Example::

    pool = WorkerPool(warm=2)
    result = pool.run(MyTool, {"x": 1}, {"session_id": "s1", "call_id": "c1"},
                      deadline=time.monotonic() + 5.0, max_output_chars=100_000)
    pool.stop()

    payload = read_declaration_isolated(MyTool, timeout_s=2.0)
    info = check_declaration(raw_declaration(payload))
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import math
import multiprocessing
import multiprocessing.process
import os
import pickle
import resource
import select
import signal
import struct
import sys
import threading
import time
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Final, Literal

import cloudpickle
from loguru import logger

from rho_actors.call import CancelToken, error_result, result_from_exception, result_from_return
from rho_actors.declarations import _Raised, describe_origin, read_declaration
from rho_actors.encoding import describe_exception
from rho_actors.tool import ErrorKind, ToolResult

__all__ = [
    "DEFAULT_HEAP_BYTES",
    "DEFAULT_READ_TIMEOUT_S",
    "IsolatedReadError",
    "ReadFailure",
    "WorkerPool",
    "raw_declaration",
    "read_declaration_isolated",
]

DEFAULT_HEAP_BYTES: Final = 256 * 2**20
"""Default address-space bound (``RLIMIT_AS``) of a child process, in bytes."""

DEFAULT_READ_TIMEOUT_S: Final = 2.0
"""Default time bound of an isolated declaration read, in seconds."""

ReadFailure = Literal["timeout", "memory", "crashed", "exited", "unpicklable", "cancelled"]
"""How an isolated read can fail (:attr:`IsolatedReadError.kind`)."""

_START_METHODS: Final = ("forkserver", "spawn")
_CALLBACKS: Final = ("name", "description", "parameter_schema", "timeout_ms", "concurrency")

_PLAIN_MAX_DEPTH: Final = 100
"""Declaration values nested deeper than this are reported unencodable."""
_MAX_VALUE_CHARS: Final = 4 * 2**20
"""Declaration values longer than this as JSON text are reported unencodable."""
_MAX_ANSWER_BYTES: Final = 32 * 2**20
"""A declaration child's answer longer than this is refused as malformed."""
_EXIT_GRACE_S: Final = 1.0
"""How long a child that closed its pipe gets to finish exiting before it is killed."""
_REAP_TIMEOUT_S: Final = 5.0
_CANCEL_POLL_S: Final = 0.05
"""How often a declaration read looks at its ``cancel`` event, in seconds."""
_READY_TIMEOUT_S: Final = 30.0
_DELIVERY_ATTEMPTS: Final = 3
"""Workers tried for one call when each turns out dead before the call reaches it."""
_TOOL_CACHE_SIZE: Final = 32
"""Unpickled tools a worker keeps, by digest of their pickled bytes."""

# Worker -> parent message tags (the first byte of each frame).
_READY: Final = b"R"
_NEED_TOOL: Final = b"N"
_ANSWER: Final = b"A"
_ANSWER_RETIRE: Final = b"X"

_HEADER: Final = struct.Struct("!i")
_BIG_HEADER: Final = struct.Struct("!Q")


# --- errors --------------------------------------------------------------------------------


class IsolatedReadError(Exception):
    """An isolated declaration read failed; ``kind`` says how (:data:`ReadFailure`):
    ``"timeout"``, ``"memory"``, ``"crashed"``, ``"exited"`` or ``"unpicklable"``;
    ``message`` (also ``str(err)``) names what went wrong and the tool."""

    def __init__(self, kind: ReadFailure, message: str) -> None:
        super().__init__(message)
        self.kind: ReadFailure = kind
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.kind, self.message))


class _Timeout(Exception):
    """The deadline passed before a whole message arrived."""


class _Cancelled(Exception):
    pass


class _Malformed(Exception):
    """A child sent a frame that breaks the protocol."""


class _Unshippable(Exception):
    """The tool could not be pickled."""


class _Stopped(Exception):
    """The pool is stopped."""


# --- processes -----------------------------------------------------------------------------

_preload_lock = threading.Lock()


def _ask_preload() -> None:
    """Add this module to what the fork server preloads (it takes effect only if the
    fork server is not running yet; the modules asked for before are kept)."""
    from multiprocessing import forkserver

    with _preload_lock:
        server = getattr(forkserver, "_forkserver", None)
        current = list(getattr(server, "_preload_modules", None) or ["__main__"])
        if __name__ not in current:
            forkserver.set_forkserver_preload([*current, __name__])


def _context(start_method: str) -> Any:
    """The multiprocessing context for ``start_method`` (``forkserver`` or ``spawn``),
    asking the fork server to preload this module. Raises ``ValueError`` otherwise."""
    if start_method not in _START_METHODS:
        raise ValueError(
            f"start_method must be one of {', '.join(_START_METHODS)}, not {start_method!r} "
            "(the runtime is multi-threaded: a bare fork is unsafe)"
        )
    if start_method == "forkserver":
        _ask_preload()
    return multiprocessing.get_context(start_method)


def _start(proc: Any) -> None:
    """Start ``proc`` and take it out of multiprocessing's own child bookkeeping: this
    module reaps its children itself, and a second thread polling the same fork-server
    child could read its exit status first (and leave ``255`` in its place)."""
    proc.start()
    children = getattr(multiprocessing.process, "_children", None)
    if children is not None:
        children.discard(proc)


def _kill_group(pid: int, *, leader: bool = True) -> None:
    """``SIGKILL`` the process ``pid`` (when ``leader``) and then its process group
    (every process a child started stays in the group it leads)."""
    if leader:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _kill_groups(pids: set[int]) -> None:
    for pid in list(pids):
        _kill_group(pid)


def _reap(proc: Any, timeout_s: float) -> int | None:
    """Wait up to ``timeout_s`` for ``proc`` to end; its exit code (``-N`` for signal
    ``N``) or ``None`` if it is still running."""
    proc.join(timeout_s)
    code = proc.exitcode
    return code if isinstance(code, int) else None


def _close(proc: Any, *conns: Any) -> None:
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.close()
    with contextlib.suppress(ValueError):
        proc.close()


def _signal_name(signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
    description = signal.strsignal(signum)
    return f"{name} ({description})" if description else name


# --- children ------------------------------------------------------------------------------


def _enter_child(heap_bytes: int | None) -> None:
    """First thing in every child: lead a new process group, bound the address space,
    and send what a tool prints to stderr, so it cannot corrupt the host's stdout (a
    command's JSON output, say)."""
    os.setsid()
    with contextlib.suppress(OSError):
        sys.stdout.flush()
        os.dup2(2, 1)
    if heap_bytes is not None and heap_bytes > 0:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = heap_bytes if hard == resource.RLIM_INFINITY else min(heap_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _mib(n: int | None) -> str:
    return "unbounded" if not n or n <= 0 else f"{n / 2**20:g} MiB"


# --- framed, deadline-bound messages (the parent's end) --------------------------------------


class _Channel:
    """The parent's end of a child's pipe: multiprocessing's framing (a 4-byte signed
    big-endian length, or -1 and an 8-byte length), read and written without ever
    blocking past a deadline. ``sentinel`` is the child's process sentinel: when the
    child is gone and nothing more is readable, :meth:`recv` raises ``EOFError``."""

    __slots__ = ("_buf", "_fd", "_poll", "_sentinel", "conn")

    def __init__(self, conn: Any, sentinel: int) -> None:
        self.conn = conn
        self._fd: int = conn.fileno()
        os.set_blocking(self._fd, False)
        self._sentinel = sentinel
        self._buf = bytearray()
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)
        self._poll.register(sentinel, select.POLLIN)

    def _frame(self, max_bytes: int | None) -> bytes | None:
        buf = self._buf
        if len(buf) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack_from(buf)
        start = _HEADER.size
        if size == -1:
            if len(buf) < start + _BIG_HEADER.size:
                return None
            (size,) = _BIG_HEADER.unpack_from(buf, start)
            start += _BIG_HEADER.size
        elif size < 0:
            raise _Malformed(f"a frame header announced {size} bytes")
        if max_bytes is not None and size > max_bytes:
            raise _Malformed(f"a message of {size:,} bytes, more than the limit of {max_bytes:,}")
        end = start + size
        if len(buf) < end:
            return None
        data = bytes(buf[start:end])
        del buf[:end]
        return data

    def recv(self, deadline: float, max_bytes: int | None = None) -> bytes:
        """The next whole message. Raises :class:`_Timeout` at ``deadline`` (a
        ``time.monotonic()`` instant), ``EOFError`` when the child has closed its end or
        ended, :class:`_Malformed` on a broken frame."""
        while True:
            frame = self._frame(max_bytes)
            if frame is not None:
                return frame
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Timeout
            events = self._poll.poll(math.ceil(remaining * 1000) if remaining < 1e6 else None)
            if not events:
                continue
            try:
                data = os.read(self._fd, max(1 << 16, min(1 << 24, len(self._buf))))
            except BlockingIOError:
                data = None
            except OSError as exc:  # ECONNRESET and friends: the other end is gone
                raise EOFError(str(exc)) from None
            if data == b"":
                raise EOFError("the child closed its pipe")
            if data:
                self._buf += data
            elif any(fd == self._sentinel for fd, _ in events):
                raise EOFError("the child process ended")

    def send(self, data: bytes, deadline: float) -> None:
        """Write one whole message before ``deadline``. Raises :class:`_Timeout` or
        ``EOFError`` (the child's end is closed)."""
        n = len(data)
        header = _HEADER.pack(n) if n <= 0x7FFFFFFF else _HEADER.pack(-1) + _BIG_HEADER.pack(n)
        view = memoryview(header + data)
        poller: Any = None
        while view:
            try:
                written = os.write(self._fd, view)
            except BlockingIOError:
                written = 0
            except OSError as exc:  # EPIPE, ECONNRESET
                raise EOFError(str(exc)) from None
            view = view[written:]
            if not view:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Timeout
            if poller is None:
                poller = select.poll()
                poller.register(self._fd, select.POLLOUT)
                poller.register(self._sentinel, select.POLLIN)
            events = poller.poll(math.ceil(remaining * 1000) if remaining < 1e6 else None)
            if any(fd == self._sentinel for fd, _ in events):
                raise EOFError("the child process ended")

    def quiet(self) -> bool:
        """Whether nothing is readable and the child is still running (no wait)."""
        return not self._poll.poll(0)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()


# --- shipping tools ------------------------------------------------------------------------

_by_value_lock = threading.Lock()
_by_value_checked: dict[tuple[str, int], bool] = {}
_registered_for: weakref.WeakKeyDictionary[Any, None] = weakref.WeakKeyDictionary()
_shipped: weakref.WeakKeyDictionary[Any, tuple[bytes, bytes]] = weakref.WeakKeyDictionary()


def _find_spec_fresh(name: str, path: Any) -> Any:
    """The spec the import system would find for ``name`` in a process that has not
    imported it yet: ``sys.meta_path`` asked in order (``importlib.util.find_spec``
    would answer from ``sys.modules``)."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec = find(name, path)
        if spec is not None:
            return spec
    return None


def _importable_elsewhere(module: types.ModuleType) -> bool:
    """Whether a fresh process with this ``sys.path`` would import ``module`` by its name
    and get the same file (so cloudpickle may ship its objects by reference)."""
    name = getattr(module, "__name__", None)
    if not isinstance(name, str) or name in ("__main__", "__mp_main__"):
        return False
    if name in sys.builtin_module_names or name == "rho_actors" or name.startswith("rho_actors."):
        return True  # every child imports rho_actors (this module is its entry point)
    spec = getattr(module, "__spec__", None)
    if spec is None:
        return False
    if spec.origin in ("built-in", "frozen"):
        return True
    path: Any = None
    found: Any = None
    parts = name.split(".")
    try:
        for i in range(len(parts)):
            found = _find_spec_fresh(".".join(parts[: i + 1]), path)
            if found is None:
                return False
            path = found.submodule_search_locations
            if path is None and i < len(parts) - 1:
                return False
    except Exception:  # a broken finder or path entry: do not trust it
        return False
    if found.origin is None:  # a namespace package: found by name is enough
        return spec.origin is None
    ours = getattr(module, "__file__", None) or spec.origin
    try:
        return os.path.samefile(found.origin, ours)
    except (OSError, TypeError):
        return False


def _candidate_modules(tool: Any) -> list[types.ModuleType]:
    """The modules a tool's code comes from (its own, its classes', its callbacks')."""
    names: list[Any] = []
    if isinstance(tool, types.ModuleType):
        names.append(tool.__name__)
    else:
        cls = tool if isinstance(tool, type) else type(tool)
        names.extend(getattr(k, "__module__", None) for k in cls.__mro__)
        names.append(getattr(tool, "__module__", None))
        wrapped = getattr(tool, "__wrapped__", None)
        names.append(getattr(wrapped, "__module__", None))
        for cb in (*_CALLBACKS, "run", "selftest"):
            try:
                fn = getattr(tool, cb, None)
            except Exception:
                continue
            names.append(getattr(fn, "__module__", None))
            names.append(getattr(getattr(fn, "__func__", None), "__module__", None))
    modules: list[types.ModuleType] = []
    for name in dict.fromkeys(n for n in names if isinstance(n, str) and n != "builtins"):
        module = sys.modules.get(name)
        if isinstance(module, types.ModuleType):
            modules.append(module)
    return modules


def _register_by_value(tool: Any) -> None:
    """Ship the tool's modules by value when a fresh process could not import them
    (checked once per tool object, or per type for an instance without weakrefs)."""
    try:
        if tool in _registered_for:
            return
        key: Any = tool
    except TypeError:  # not weakly referenceable, or not hashable
        key = type(tool)
        if key in _registered_for:
            return
    for module in _candidate_modules(tool):
        module_key = (module.__name__, id(module))
        if module_key in _by_value_checked:
            continue
        importable = _importable_elsewhere(module)
        with _by_value_lock:
            if not importable and module.__name__ not in ("__main__", "__mp_main__"):
                with contextlib.suppress(ValueError):
                    cloudpickle.register_pickle_by_value(module)
            _by_value_checked[module_key] = importable
    with contextlib.suppress(TypeError):
        _registered_for[key] = None


def _ship(tool: Any) -> tuple[bytes, bytes]:
    """``(digest, pickled bytes)`` of ``tool``. Raises :class:`_Unshippable` naming why.

    A module, class or function is pickled once per object (its code is not expected to
    change in place: a changed tool is a new object); an instance is pickled on every
    call, so its current state travels."""
    cacheable = isinstance(tool, (type, types.ModuleType, types.FunctionType))
    if cacheable:
        with contextlib.suppress(TypeError):
            shipped = _shipped.get(tool)
            if shipped is not None:
                return shipped
    try:
        _register_by_value(tool)
        data = bytes(cloudpickle.dumps(tool, protocol=pickle.HIGHEST_PROTOCOL))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a __reduce__ may raise anything, SystemExit included
        raise _Unshippable(describe_exception(exc)) from None
    shipped = hashlib.blake2b(data, digest_size=16).digest(), data
    if cacheable:
        with contextlib.suppress(TypeError):
            _shipped[tool] = shipped
    return shipped


def _label(tool: Any) -> str:
    """The tool's origin for messages (never raises)."""
    try:
        return describe_origin(tool)
    except BaseException:
        return f"a {type(tool).__qualname__}"


def _short_name(tool: Any) -> str:
    """A name for results when the caller gave none, without calling the tool's code."""
    name = getattr(tool, "__name__", None)
    return name if isinstance(name, str) else type(tool).__name__


# --- 1. isolated declaration reads -----------------------------------------------------------


def _type_name(value: Any) -> str:
    try:
        return str(type(value).__qualname__)
    except BaseException:
        return "?"


def _plain_problem(value: Any, root: str) -> str | None:
    """Why ``value`` is not strict plain JSON data (exact types dict/list/str/int/float/
    bool/None, ``str`` keys, finite floats, at most :data:`_PLAIN_MAX_DEPTH` levels), or
    ``None``. Iterative, and never calls the value's own code."""
    stack: list[tuple[Any, int, str]] = [(value, 0, root)]
    while stack:
        item, depth, path = stack.pop()
        kind = type(item)
        if item is None or kind is str or kind is bool or kind is int:
            continue
        if kind is float:
            if not math.isfinite(item):
                return f"{path}: {item!r} is not a JSON number"
            continue
        if kind is dict or kind is list:
            if depth >= _PLAIN_MAX_DEPTH:
                return f"{path}: nested deeper than {_PLAIN_MAX_DEPTH} levels"
            if kind is dict:
                for key, sub in item.items():
                    if type(key) is not str:
                        return f"{path}: a key of type {_type_name(key)} is not a string"
                    stack.append((sub, depth + 1, f"{path}.{key}"))
            else:
                stack.extend((sub, depth + 1, f"{path}[{i}]") for i, sub in enumerate(item))
            continue
        return f"{path}: a {_type_name(item)} is not JSON data"
    return None


def _payload_json(cb_name: str, value: Any) -> str:
    """One callback's answer as JSON text (see :func:`read_declaration_isolated`)."""
    if isinstance(value, _Raised):
        return json.dumps({"raised": value.description})
    type_json = json.dumps(_type_name(value))
    problem = _plain_problem(value, cb_name)
    if problem is None:
        try:
            text = json.dumps(value, ensure_ascii=True, allow_nan=False)
        except (ValueError, RecursionError) as exc:  # e.g. an int past the digit limit
            problem = f"{cb_name}: {describe_exception(exc)}"
        else:
            if len(text) <= _MAX_VALUE_CHARS:
                return f'{{"type": {type_json}, "value": {text}}}'
            problem = f"{cb_name}: {len(text):,} characters as JSON, more than {_MAX_VALUE_CHARS:,}"
    return f'{{"type": {type_json}, "unencodable": true, "reason": {json.dumps(problem)}}}'


def _declaration_answer(payload: bytes) -> str:
    """The child's whole answer, as JSON text."""
    try:
        tool = pickle.loads(payload)
    except MemoryError:
        raise
    except BaseException as exc:
        message = f"the tool could not be unpickled in the child process: {describe_exception(exc)}"
        return json.dumps({"error": "unpicklable", "message": message})
    raw = read_declaration(tool)
    for cb_name, value in raw.items():
        if isinstance(value, _Raised) and value.description.split(":", 1)[0] == "MemoryError":
            return json.dumps({"error": "memory", "message": f"{cb_name}() raised {value.description}"})
    parts = [f"{json.dumps(cb_name)}: {_payload_json(cb_name, value)}" for cb_name, value in raw.items()]
    return '{"answers": {' + ", ".join(parts) + "}}"


def _read_main(conn: Any, payload: bytes, heap_bytes: int | None) -> None:
    """Entry point of a declaration-read child."""
    try:
        _enter_child(heap_bytes)
        try:
            text = _declaration_answer(payload)
        except MemoryError:
            text = '{"error": "memory", "message": "MemoryError"}'
        except BaseException as exc:
            text = json.dumps({"error": "crashed", "message": f"the reader failed: {describe_exception(exc)}"})
        conn.send_bytes(text.encode("ascii"))
    finally:
        os._exit(0)


def _check_answer(answer: Any) -> dict[str, dict[str, Any]]:
    """The ``{callback: payload}`` dict of a child's answer; raises ``ValueError`` when the
    answer does not have the documented shape."""
    if type(answer) is not dict or type(answer.get("answers")) is not dict:
        raise ValueError("no answers")
    out: dict[str, dict[str, Any]] = {}
    for cb_name, payload in answer["answers"].items():
        if cb_name not in _CALLBACKS or type(payload) is not dict:
            raise ValueError(f"a bad entry {cb_name!r}")
        if "raised" in payload:
            ok = set(payload) == {"raised"} and type(payload["raised"]) is str
        else:
            ok = type(payload.get("type")) is str and (
                set(payload) == {"type", "value"}
                or (payload.get("unencodable") is True and set(payload) <= {"type", "unencodable", "reason"})
            )
        if not ok:
            raise ValueError(f"a bad entry {cb_name!r}")
        out[cb_name] = payload
    return out


def read_declaration_isolated(
    tool: Any,
    *,
    timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    heap_bytes: int = DEFAULT_HEAP_BYTES,
    start_method: str = "forkserver",
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Read an untrusted tool's declaration callbacks in a fresh, throwaway child process.

    The tool is shipped with cloudpickle (by value when its module could not be imported
    there). The child leads its own process group, bounds its address space to
    ``heap_bytes`` (``RLIMIT_AS``, bytes; ``0`` for no bound), calls ``name``,
    ``description``, ``parameter_schema``, ``timeout_ms`` and ``concurrency`` (those the
    tool has) with :func:`rho_actors.declarations.read_declaration`, and answers with
    JSON text only. ``timeout_s`` (seconds) counts from the child's start.

    Returns ``{callback_name: payload}`` for each callback present, where ``payload`` is
    ``{"raised": "TypeName: message"}`` when the callback raised (any
    ``BaseException``); ``{"type": "<qualname>", "value": <value>}`` when the value is
    strict plain JSON data (exact types dict/list/str/int/float/bool/None, ``str`` keys,
    finite floats); else ``{"type": "<qualname>", "unencodable": True, "reason": "..."}``
    (a ``str`` subclass, a tuple inside a schema...; ``reason`` names the first part that
    is not plain data). Feed it to :func:`raw_declaration` to check it.

    Raises :class:`IsolatedReadError` with ``kind``:
    ``"timeout"`` (the child ran past ``timeout_s``: its process group was killed),
    ``"memory"`` (a ``MemoryError`` past ``heap_bytes``, or the child was killed by a
    ``SIGKILL`` it did not get from here), ``"crashed"`` (the child died of a signal, or
    could not be started, or sent a malformed answer), ``"exited"`` (the child exited,
    with any code, 0 included, without an answer) or ``"unpicklable"`` (the tool could
    not be pickled here or unpickled there) or ``"cancelled"`` (``cancel`` was set: the
    child's process group was killed; it is looked at every 50 ms). Raises ``ValueError`` for a bad
    ``start_method`` (``"forkserver"`` or ``"spawn"``). The child is always reaped and
    its process group killed: nothing it started is left running.
    """
    try:
        _, payload = _ship(tool)
    except _Unshippable as exc:
        message = f"{_label(tool)} could not be shipped to a child process: {exc}"
        raise IsolatedReadError("unpicklable", message) from None
    ctx = _context(start_method)
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_read_main, args=(writer, payload, heap_bytes), name="rho-declaration-read")
    try:
        try:
            _start(proc)
        except Exception as exc:
            raise IsolatedReadError(
                "crashed", f"could not start a child process to read the declaration of {_label(tool)}: "
                f"{describe_exception(exc)}"
            ) from None
        finally:
            writer.close()
        frame = _await_answer(proc, _Channel(reader, proc.sentinel), tool, timeout_s, heap_bytes, cancel)
    finally:
        _close(proc, reader)
    try:
        answer = json.loads(frame)
    except (ValueError, RecursionError) as exc:
        raise IsolatedReadError(
            "crashed", f"the declaration read of {_label(tool)} sent a malformed answer ({describe_exception(exc)})"
        ) from None
    if type(answer) is dict and "error" in answer:
        kind, message = answer.get("error"), str(answer.get("message", ""))
        if kind == "memory":
            raise IsolatedReadError(
                "memory", f"reading the declaration of {_label(tool)} exceeded its heap bound of "
                f"{_mib(heap_bytes)}: {message}"
            )
        if kind == "unpicklable":
            raise IsolatedReadError("unpicklable", f"{_label(tool)}: {message}")
        raise IsolatedReadError("crashed", f"reading the declaration of {_label(tool)} failed: {message}")
    try:
        return _check_answer(answer)
    except ValueError as exc:
        raise IsolatedReadError(
            "crashed", f"the declaration read of {_label(tool)} sent a malformed answer ({exc})"
        ) from None


def _end(proc: Any) -> None:
    """Kill a declaration child's whole process group and reap it."""
    _kill_group(proc.pid)
    _reap(proc, _REAP_TIMEOUT_S)


def _await_answer(
    proc: Any, channel: _Channel, tool: Any, timeout_s: float, heap_bytes: int | None,
    cancel: threading.Event | None = None,
) -> bytes:
    """The child's answer frame. In every case the child is reaped and its process group
    killed (what a callback started dies with it)."""
    deadline = time.monotonic() + timeout_s
    try:
        while True:  # in slices, to notice ``cancel``; the channel keeps partial frames
            try:
                frame = channel.recv(min(deadline, time.monotonic() + _CANCEL_POLL_S), _MAX_ANSWER_BYTES)
                break
            except _Timeout:
                if cancel is not None and cancel.is_set():
                    raise _Cancelled from None
                if time.monotonic() >= deadline:
                    raise
    except _Cancelled:
        _end(proc)
        raise IsolatedReadError(
            "cancelled", f"reading the declaration of {_label(tool)} was cancelled; its process group was killed"
        ) from None
    except _Timeout:
        _end(proc)
        raise IsolatedReadError(
            "timeout", f"reading the declaration of {_label(tool)} took longer than {timeout_s:g} s; "
            "its process group was killed"
        ) from None
    except _Malformed as exc:
        _end(proc)
        raise IsolatedReadError(
            "crashed", f"the declaration read of {_label(tool)} sent a malformed answer ({exc})"
        ) from None
    except EOFError:
        code = _reap(proc, _EXIT_GRACE_S)
        _kill_group(proc.pid, leader=code is None)
        if code is None:
            _reap(proc, _REAP_TIMEOUT_S)
            raise IsolatedReadError(
                "crashed", f"the declaration read of {_label(tool)} closed its pipe without an answer; "
                "its process group was killed"
            ) from None
        raise _read_ended(tool, code, heap_bytes) from None
    except BaseException:
        _end(proc)
        raise
    # Answered: the child is on its way out; kill whatever it leaves behind in its group.
    _kill_group(proc.pid, leader=proc.exitcode is None)
    _reap(proc, _REAP_TIMEOUT_S)
    return frame


def _read_ended(tool: Any, code: int, heap_bytes: int | None) -> IsolatedReadError:
    what = f"reading the declaration of {_label(tool)}"
    if code == -signal.SIGKILL:
        return IsolatedReadError(
            "memory", f"{what} was killed by SIGKILL (not by the sandbox: most likely the kernel's "
            f"out-of-memory killer; heap bound {_mib(heap_bytes)})"
        )
    if code < 0:
        return IsolatedReadError("crashed", f"{what} crashed: the child process died of {_signal_name(-code)}")
    return IsolatedReadError("exited", f"{what} exited with code {code} without an answer")


@functools.lru_cache(maxsize=256)
def _opaque_type(display: str) -> type:
    """A class named ``display``: stands for a value that did not come back as plain data,
    so that :func:`check_declaration` names it (``"expected str, got MyStr"``)."""
    return type(display, (_Opaque,), {"__slots__": ()})


class _Opaque:
    """Base of the stand-ins made by :func:`_opaque_type`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


def raw_declaration(payload: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Turn :func:`read_declaration_isolated`'s answer into the raw dict
    :func:`rho_actors.declarations.check_declaration` takes.

    ``{"raised": text}`` becomes the marker :func:`read_declaration` uses for a raise
    (reported as ``"name() raised ValueError: ..."``); ``{"value": v}`` becomes ``v``; an
    unencodable value becomes a stand-in object whose type is named after the reported
    type, so the check rejects it naming that type (``"name: expected str, got MyStr"``),
    and for a dict or list holding something that is not JSON data, what that is
    (``"parameter_schema: expected dict, got dict holding non-JSON data
    (parameter_schema.enum: a tuple is not JSON data)"``). A stand-in for ``timeout_ms``
    or ``concurrency`` means their defaults, as any bad value does.
    """
    raw: dict[str, Any] = {}
    for cb_name, answer in payload.items():
        if "raised" in answer:
            raw[cb_name] = _Raised(str(answer["raised"]))
        elif "value" in answer:
            raw[cb_name] = answer["value"]
        else:
            type_name = str(answer.get("type", "?"))
            reason = answer.get("reason")
            display = type_name
            if type_name in ("dict", "list"):
                display = f"{type_name} holding non-JSON data" + (f" ({reason})" if reason else "")
            raw[cb_name] = _opaque_type(display)()
    return raw


# --- 2. worker processes -------------------------------------------------------------------


def _worker_main(conn: Any, heap_bytes: int | None) -> None:
    """Entry point of a worker process: serve calls until the pool closes the pipe."""
    try:
        _enter_child(heap_bytes)
        tools: OrderedDict[bytes, Any] = OrderedDict()
        conn.send_bytes(_READY)
        while True:
            try:
                data = conn.recv_bytes()
            except (EOFError, OSError):
                break
            conn.send_bytes(_serve(data, tools, heap_bytes))
    finally:
        os._exit(0)


def _serve(data: bytes, tools: OrderedDict[bytes, Any], heap_bytes: int | None) -> bytes:
    """One call in a worker: the reply frame (a tag byte and a pickled ToolResult)."""
    name, call_id = "?", ""
    try:
        digest, tool_bytes, name, call_id, args, fields, deps_bytes, deadline, max_chars = pickle.loads(data)
        tool = tools.get(digest)
        if tool is None:
            if tool_bytes is None:
                return _NEED_TOOL
            try:
                tool = pickle.loads(tool_bytes)
            except MemoryError:
                raise
            except BaseException as exc:
                text = f"tool {name!r} could not be unpickled in its worker process: {describe_exception(exc)}"
                return _reply(error_result(call_id, name, ErrorKind.RAISED, text), False, name)
            tools[digest] = tool
            while len(tools) > _TOOL_CACHE_SIZE:
                tools.popitem(last=False)
        else:
            tools.move_to_end(digest)
        ctx: dict[str, Any] = dict(fields)
        ctx["deadline"] = deadline
        ctx["cancel"] = CancelToken()
        if deps_bytes is not None:
            try:
                ctx["deps"] = pickle.loads(deps_bytes)
            except Exception:
                logger.debug("call {}: deps could not be unpickled in the worker; left out", call_id)
        result, retire = _call(tool, name, call_id, args, MappingProxyType(ctx), deadline, max_chars, heap_bytes)
        del tool, args, ctx
        return _reply(result, retire, name)
    except MemoryError:
        pass
    except BaseException as exc:  # a broken request, or a BaseException from an odd place
        text = f"tool {name!r} failed in its worker process: {describe_exception(exc)}"
        return _reply(error_result(call_id, name, ErrorKind.RAISED, text), False, name)
    return _reply(_memory_result(call_id, name, heap_bytes), True, name)


def _memory_result(call_id: str, name: str, heap_bytes: int | None) -> ToolResult:
    return error_result(
        call_id, name, ErrorKind.MEMORY,
        f"tool {name!r} ran out of memory: it exceeded its worker's heap bound of {_mib(heap_bytes)} (MemoryError)",
    )


async def _until(coro: Any, deadline: float) -> Any:
    return await asyncio.wait_for(coro, max(0.0, deadline - time.monotonic()))


def _call(
    tool: Any, name: str, call_id: str, args: Any, ctx: Mapping[str, Any], deadline: float, max_chars: int,
    heap_bytes: int | None,
) -> tuple[ToolResult, bool]:
    """Run the tool and make its result (``duration_ms`` is set by the parent); ``True``
    beside it when the worker should be retired (it ran out of memory)."""
    out_of_memory = False
    try:
        value = tool.run(args, ctx)
        if asyncio.iscoroutine(value):
            value = asyncio.run(_until(value, deadline))
        return result_from_return(call_id, name, value, max_chars, 0.0), False
    except MemoryError:
        out_of_memory = True  # built below, once the traceback (and what it holds) is gone
    except TimeoutError as exc:
        if time.monotonic() >= deadline:
            text = f"tool {name!r} did not finish before its deadline; it was cancelled"
            return error_result(call_id, name, ErrorKind.TIMEOUT, text), False
        return result_from_exception(call_id, name, exc, max_chars, 0.0), False
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are `exited` results
        return result_from_exception(call_id, name, exc, max_chars, 0.0), False
    assert out_of_memory
    return _memory_result(call_id, name, heap_bytes), True


def _reply(result: ToolResult, retire: bool, name: str) -> bytes:
    tag = _ANSWER_RETIRE if retire else _ANSWER
    try:
        return tag + pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    except MemoryError:
        raise
    except BaseException:
        pass
    try:  # classes that came by value (a plugin's) are not importable by name here
        return tag + bytes(cloudpickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    except MemoryError:
        raise
    except BaseException as exc:
        what = f"details of type {_type_name(result.details)}" if result.details is not None else "images"
        text = (
            f"tool {name!r} returned {what} that cannot be sent back from its worker process "
            f"({describe_exception(exc)})"
        )
    failed = error_result(result.call_id, result.name, ErrorKind.RAISED, text)
    return tag + pickle.dumps(failed, protocol=pickle.HIGHEST_PROTOCOL)


class _Worker:
    """The parent's record of one worker process."""

    __slots__ = ("_reap_lock", "channel", "exitcode", "killed", "pid", "proc", "reaped", "tools")

    def __init__(self, proc: Any, channel: _Channel) -> None:
        self.proc = proc
        self.pid: int = proc.pid
        self.channel = channel
        self.tools: OrderedDict[bytes, None] = OrderedDict()
        self.killed = False
        self.reaped = False
        self.exitcode: int | None = None
        self._reap_lock = threading.Lock()

    def healthy(self) -> bool:
        """Whether an idle worker is still running and has sent nothing unasked."""
        return not self.reaped and self.channel.quiet()

    def kill(self) -> None:
        self.killed = True
        _kill_group(self.pid)

    def reap(self, timeout_s: float = _REAP_TIMEOUT_S) -> int | None:
        """Wait for the process to end and release it; its exit code (None: still running)."""
        with self._reap_lock:
            if self.reaped:
                return self.exitcode
            code = _reap(self.proc, timeout_s)
            if code is None:
                return None
            self.exitcode, self.reaped = code, True
            return code

    def close(self) -> None:
        """Release the pipe and the process handle; only by the thread that owns the
        worker (a thread polling them must never see their descriptors reused)."""
        self.channel.close()
        if self.reaped:
            _close(self.proc)


class WorkerPool:
    """Warm worker processes for ``process`` isolation (DESIGN §5). Thread-safe: call
    :meth:`run` from any number of threads at once.

    ``warm`` idle workers are started ahead of need, each leading its own process group
    under ``RLIMIT_AS`` = ``heap_bytes`` (bytes; 0 for no bound), with ``start_method``
    ``"forkserver"`` (or ``"spawn"``). A call takes an idle worker or, when none is
    idle, starts one of its own (calls never queue behind each other); afterwards the
    worker goes back to the idle set, or is stopped when ``warm`` are idle already. A
    worker killed at a deadline or found dead is replaced in the background.

    Raises ``ValueError`` for a negative ``warm`` or a bad ``start_method``.
    """

    def __init__(
        self, warm: int = 2, *, heap_bytes: int = DEFAULT_HEAP_BYTES, start_method: str = "forkserver"
    ) -> None:
        if warm < 0:
            raise ValueError(f"warm must be >= 0, not {warm}")
        self._ctx = _context(start_method)
        self._warm = warm
        self._heap_bytes = heap_bytes
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # the keeper waits here: a worker lost, or stop
        self._warmed = threading.Condition(self._lock)  # wait_warm waits here: a worker became idle
        self._all: set[_Worker] = set()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._starting = 0
        self._stopped = False
        self._counts = {"started": 0, "killed": 0, "died": 0, "retired": 0}
        self._pids: set[int] = set()
        self._finalizer = weakref.finalize(self, _kill_groups, self._pids)
        self._keeper = threading.Thread(target=self._keep_warm, name="rho-worker-pool", daemon=True)
        self._keeper.start()

    # --- public ---------------------------------------------------------------------------

    def run(
        self,
        tool: Any,
        args: Mapping[str, Any],
        ctx: Mapping[str, Any],
        deadline: float,
        max_output_chars: int,
        *,
        name: str | None = None,
        started: float | None = None,
        cancel: Any = None,
    ) -> ToolResult:
        """Run ``tool.run(args, ctx)`` in a worker process and return its result. Blocks.
        ``cancel``: a :class:`rho_actors.call.CancelToken`; setting it kills the worker
        running the call (the result is then ``cancelled``).

        ``deadline`` and ``started`` are ``time.monotonic()`` instants (seconds);
        ``started`` (default: now) is where the result's ``duration_ms`` counts from.
        ``max_output_chars`` caps the result's text (it is encoded and capped in the
        worker). ``name`` is the tool's checked name, used in the result (default: the
        tool's ``__name__`` or type name; the tool's own ``name()`` is not called here).

        In the worker, ``ctx`` holds ``session_id``, ``call_id``, ``data_dir``,
        ``withheld`` and ``deadline`` from the given ``ctx``, ``deps`` only when it can be
        pickled (else it is left out), and ``cancel``, a :class:`CancelToken` never set:
        at the deadline the worker is killed instead. An ``async def run`` runs under
        ``asyncio.run`` with a ``wait_for`` to the deadline.

        The tool travels with cloudpickle. A module, class or function tool is pickled
        once per object and kept by each worker (by digest of its bytes); an instance is
        pickled on every call, so its current state travels. What ``run`` does to the
        tool's state in the worker stays there (the worker may serve the next call).

        Never raises for anything the tool does: the result is an error with kind
        ``timeout`` (the deadline passed: the worker's process group was killed),
        ``crashed`` (the worker died of a signal, named), ``exited`` (the worker exited,
        code named, 0 included; or the tool raised ``SystemExit``/``KeyboardInterrupt``:
        the worker survives), ``memory`` (past ``heap_bytes``), ``raised`` (the tool
        raised or returned ``Error``, or could not be pickled here, or its result could
        not be pickled there) or ``cancelled`` (the pool was stopped).
        """
        start = time.monotonic() if started is None else started
        call_id = str(ctx.get("call_id", ""))
        label = name if name is not None else _short_name(tool)

        def failed(kind: ErrorKind, message: str) -> ToolResult:
            return error_result(call_id, label, kind, message, (time.monotonic() - start) * 1000)

        if self._stopped:
            return failed(ErrorKind.CANCELLED, f"tool {label!r} did not run: the worker pool is stopped")
        if time.monotonic() >= deadline:
            return failed(ErrorKind.TIMEOUT, f"tool {label!r} did not run: its deadline had passed")
        try:
            digest, tool_bytes = _ship(tool)
        except _Unshippable as exc:
            return failed(ErrorKind.RAISED, f"tool {label!r} could not be shipped to a worker process: {exc}")
        fields = {
            "session_id": ctx.get("session_id"),
            "call_id": ctx.get("call_id"),
            "data_dir": ctx.get("data_dir"),
            "withheld": tuple(ctx.get("withheld", ())),
        }
        request = (digest, None, label, call_id, dict(args), fields, _pickled_deps(ctx), deadline, max_output_chars)
        try:
            bare = _dump_request(request, None)
        except pickle.PickleError as exc:
            return failed(ErrorKind.RAISED, f"tool {label!r}: its arguments or context could not be sent to its "
                          f"worker process ({describe_exception(exc)})")
        for attempt in range(_DELIVERY_ATTEMPTS):
            try:
                worker = self._take()
            except _Stopped:
                return failed(ErrorKind.CANCELLED, f"tool {label!r} did not run: the worker pool is stopped")
            except Exception as exc:
                return failed(ErrorKind.CRASHED, f"tool {label!r} did not run: no worker process could be started "
                              f"({describe_exception(exc)})")
            try:
                worker.channel.send(bare if digest in worker.tools else _dump_request(request, tool_bytes), deadline)
                break
            except EOFError:  # it died while idle, before the call reached it: try another
                self._lose(worker, "died")
                if attempt == _DELIVERY_ATTEMPTS - 1:
                    return failed(ErrorKind.CRASHED, f"tool {label!r} did not run: its worker processes kept dying "
                                  "before the call reached them")
            except _Timeout:
                self._lose(worker, "killed")
                return failed(ErrorKind.TIMEOUT, f"tool {label!r} did not run: its deadline passed while the call "
                              "was being sent to its worker process")
            except BaseException:
                self._lose(worker, "killed")
                raise
        try:
            result, retire = self._exchange_or_cancel(worker, request, tool_bytes, deadline, cancel)
        except _Timeout:
            budget_ms = round((deadline - start) * 1000)
            self._lose(worker, "killed")
            return failed(ErrorKind.TIMEOUT, f"tool {label!r} did not finish within its timeout of {budget_ms} ms; "
                          "its worker process was killed")
        except EOFError:
            if cancel is not None and cancel.cancelled and worker.killed:
                self._lose(worker, "killed")
                return failed(ErrorKind.CANCELLED, f"tool {label!r} was cancelled; its worker process was killed")
            return self._died(worker, label, failed)
        except _Malformed as exc:
            self._lose(worker, "killed")
            return failed(ErrorKind.CRASHED, f"tool {label!r}: its worker process sent a malformed reply ({exc}); "
                          "it was killed")
        except BaseException:
            self._lose(worker, "killed")
            raise
        self._release(worker, retire)
        if isinstance(result, ToolResult):
            return replace(result, call_id=call_id, name=label, duration_ms=(time.monotonic() - start) * 1000)
        return failed(ErrorKind.RAISED, f"tool {label!r}: its result could not be read back from its worker "
                      f"process ({result})")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Kill every worker's process group and reap the workers, waiting up to
        ``timeout_s`` seconds in all. Calls still running get a ``cancelled`` result;
        later calls too. Idempotent."""
        until = time.monotonic() + timeout_s
        with self._lock:
            self._stopped = True
            workers = list(self._all)
            idle, self._idle = self._idle, []
            self._changed.notify_all()
            self._warmed.notify_all()
        for worker in workers:
            worker.kill()
        for worker in workers:
            worker.reap(max(0.0, until - time.monotonic()))
        for worker in idle:  # busy and starting workers are closed by the threads that own them
            worker.close()
        with self._lock:
            for worker in workers:
                self._forget_locked(worker)
        if self._keeper is not threading.current_thread():
            self._keeper.join(max(0.0, until - time.monotonic()))

    def stats(self) -> dict[str, int]:
        """Counts: ``alive`` (worker processes now), ``idle``, ``busy``, ``starting``
        (being started in the background); since the pool started: ``started``,
        ``killed`` (at a deadline, or for a bad reply), ``died`` (crashed, exited or
        out of memory on their own) and ``retired`` (stopped when surplus, or after
        running out of memory); workers stopped by :meth:`stop` are not counted."""
        with self._lock:
            return {
                "alive": len(self._all),
                "idle": len(self._idle),
                "busy": len(self._busy),
                "starting": self._starting,
                **self._counts,
            }

    def pids(self) -> list[int]:
        """The process ids of the worker processes alive now (each is also the id of the
        process group it leads)."""
        with self._lock:
            return sorted(w.pid for w in self._all)

    def wait_warm(self, timeout_s: float) -> bool:
        """Block until ``warm`` workers are idle (or the pool is stopped), at most
        ``timeout_s`` seconds; returns whether they are."""
        with self._lock:
            return self._warmed.wait_for(lambda: self._stopped or len(self._idle) >= self._warm, timeout_s) and (
                not self._stopped
            )

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- workers --------------------------------------------------------------------------

    def _spawn(self, busy: bool) -> _Worker:
        """Start a worker process (not waiting for it to be ready) and register it."""
        parent_end, child_end = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_worker_main, args=(child_end, self._heap_bytes), name="rho-worker")
        try:
            _start(proc)
        except BaseException:
            _close(proc, parent_end)
            raise
        finally:
            child_end.close()
        worker = _Worker(proc, _Channel(parent_end, proc.sentinel))
        with self._lock:
            if not self._stopped:
                self._all.add(worker)
                self._pids.add(worker.pid)
                self._counts["started"] += 1
                if busy:
                    self._busy.add(worker)
                return worker
        worker.kill()
        worker.reap()
        worker.close()
        raise _Stopped

    def _take(self) -> _Worker:
        dead: list[_Worker] = []
        try:
            with self._lock:
                if self._stopped:
                    raise _Stopped
                while self._idle:
                    worker = self._idle.pop()
                    if worker.healthy():
                        self._busy.add(worker)
                        return worker
                    dead.append(worker)
        finally:
            for worker in dead:
                self._lose(worker, "died")
        return self._spawn(busy=True)

    def _release(self, worker: _Worker, retire: bool) -> None:
        with self._lock:
            self._busy.discard(worker)
            if not (retire or self._stopped or len(self._idle) >= self._warm):
                self._idle.append(worker)
                self._warmed.notify_all()
                return
            if not self._stopped:
                self._counts["retired"] += 1
        worker.kill()
        worker.reap()
        worker.close()
        self._forget(worker)

    def _lose(self, worker: _Worker, how: Literal["killed", "died"]) -> None:
        """A worker killed at a deadline (or for a bad reply), or found dead: kill its
        group, let the keeper start a replacement at once, then reap it."""
        if how == "killed":
            worker.kill()
        else:
            _kill_group(worker.pid, leader=not worker.reaped)
        with self._lock:
            if worker in self._all and not self._stopped:
                self._counts[how] += 1
            self._forget_locked(worker)
            self._changed.notify_all()
        if worker.reap() is None:
            worker.kill()
            worker.reap()
        worker.close()

    def _forget(self, worker: _Worker) -> None:
        with self._lock:
            self._forget_locked(worker)
            self._changed.notify_all()

    def _forget_locked(self, worker: _Worker) -> None:
        self._all.discard(worker)
        self._busy.discard(worker)
        self._pids.discard(worker.pid)
        with contextlib.suppress(ValueError):
            self._idle.remove(worker)

    def _died(self, worker: _Worker, label: str, failed: Callable[[ErrorKind, str], ToolResult]) -> ToolResult:
        """The worker's pipe closed mid-call: find out how it ended."""
        code = worker.reap(_EXIT_GRACE_S)
        stopped = self._stopped
        self._lose(worker, "died")
        if stopped or worker.killed:
            return failed(ErrorKind.CANCELLED, f"tool {label!r} was cancelled: the worker pool stopped")
        if code is None:
            return failed(ErrorKind.CRASHED, f"tool {label!r}: its worker process closed its pipe mid-call; "
                          "it was killed")
        if code == -signal.SIGKILL:
            return failed(ErrorKind.MEMORY, f"tool {label!r} ran out of memory: its worker process was killed by "
                          "SIGKILL, not by the pool (most likely the kernel's out-of-memory killer)")
        if code < 0:
            return failed(ErrorKind.CRASHED, f"tool {label!r} crashed: its worker process died of "
                          f"{_signal_name(-code)}")
        return failed(ErrorKind.EXITED, f"tool {label!r} exited: its worker process ended with exit code {code} "
                      "before answering")

    def _exchange_or_cancel(
        self, worker: _Worker, request: tuple[Any, ...], tool_bytes: bytes, deadline: float, cancel: Any
    ) -> tuple[ToolResult | str, bool]:
        """:meth:`_exchange`, killing the worker when ``cancel`` is set meanwhile (never
        once the exchange has ended: the worker may be reaped, its pid reused)."""
        guard = threading.Lock()

        def kill() -> None:
            if guard.acquire(blocking=False):
                try:
                    worker.kill()
                finally:
                    guard.release()

        if cancel is not None:
            cancel.add_callback(kill)
        try:
            return self._exchange(worker, request, tool_bytes, deadline)
        finally:
            guard.acquire()  # waits out a kill under way; later ones do nothing

    def _exchange(
        self, worker: _Worker, request: tuple[Any, ...], tool_bytes: bytes, deadline: float
    ) -> tuple[ToolResult | str, bool]:
        """Wait for the reply to the call just sent, until ``deadline``: ``(result,
        retire)``, the result being the text of an error when it could not be unpickled.
        Raises ``_Timeout``, ``EOFError`` or ``_Malformed``."""
        digest = request[0]
        while True:
            frame = worker.channel.recv(deadline)
            tag = frame[:1]
            if tag == _READY:
                continue
            if tag == _NEED_TOOL:
                worker.channel.send(_dump_request(request, tool_bytes), deadline)
                continue
            if tag not in (_ANSWER, _ANSWER_RETIRE):
                raise _Malformed(f"an unknown reply tag {tag!r}")
            worker.tools[digest] = None
            worker.tools.move_to_end(digest)
            while len(worker.tools) > _TOOL_CACHE_SIZE:
                worker.tools.popitem(last=False)
            try:
                result: ToolResult | str = pickle.loads(frame[1:])
            except BaseException as exc:
                result = describe_exception(exc)
            return result, tag == _ANSWER_RETIRE

    # --- keeping warm ---------------------------------------------------------------------

    def _deficit(self) -> int:
        return self._warm - len(self._all) - self._starting

    def _keep_warm(self) -> None:
        """The background thread: keep ``warm`` workers alive, replacing lost ones."""
        backoff = 0.0
        while True:
            with self._lock:
                while not self._stopped and (self._deficit() <= 0 or backoff):
                    if backoff:
                        self._changed.wait(backoff)
                        backoff = 0.0
                    else:
                        self._changed.wait()
                if self._stopped:
                    return
                wanted = self._deficit()
                self._starting += wanted
            new: list[_Worker] = []
            failures = 0
            for _ in range(wanted):
                try:
                    new.append(self._spawn(busy=False))
                except _Stopped:
                    failures += 1
                except Exception:
                    failures += 1
                    logger.exception("worker pool: a worker process could not be started")
                finally:
                    with self._lock:
                        self._starting -= 1
            for worker in new:
                if not self._await_ready(worker):
                    failures += 1
            if failures:
                backoff = 0.5

    def _await_ready(self, worker: _Worker) -> bool:
        """Wait for a new worker's hello and make it idle (or stop it when calls started
        enough workers of their own meanwhile); whether it became ready."""
        try:
            ok = worker.channel.recv(time.monotonic() + _READY_TIMEOUT_S) == _READY
        except (_Timeout, EOFError, _Malformed):
            ok = False
        surplus = False
        with self._lock:
            if ok and worker in self._all and not self._stopped:
                if len(self._idle) < self._warm:
                    self._idle.append(worker)
                    self._warmed.notify_all()
                    return True
                self._counts["retired"] += 1
                surplus = True
        if surplus:
            worker.kill()
            worker.reap()
            worker.close()
            self._forget(worker)
            return True
        if ok or self._stopped:  # stopped meanwhile: stop() kills it, its owner (here) closes it
            self._lose(worker, "killed")
            return True
        logger.warning("worker pool: worker {} did not become ready (exit code {})", worker.pid, worker.proc.exitcode)
        self._lose(worker, "died")
        return False


def _pickled_deps(ctx: Mapping[str, Any]) -> bytes | None:
    """``ctx["deps"]`` pickled, or ``None`` when absent or not picklable (left out)."""
    if "deps" not in ctx:
        return None
    try:
        return bytes(cloudpickle.dumps(ctx["deps"], protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        return None


def _dump_request(request: tuple[Any, ...], tool_bytes: bytes | None) -> bytes:
    full = (request[0], tool_bytes, *request[2:])
    try:
        return pickle.dumps(full, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        try:
            return bytes(cloudpickle.dumps(full, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception as exc:
            raise pickle.PicklingError(describe_exception(exc)) from None


_ask_preload()  # at import, so that it is asked before anything starts the fork server
