"""Stateful tool servers whose state lives in an isolation of their own (DESIGN §5, §6).

A server is a child of a supervisor like any other (``system.start_child(ChildSpec(id,
start, name=...))``) whose ``start`` says where its state lives:

- :class:`ThreadActor` — ``cls(*args, **kwargs)`` held by a rho actor in the host; its
  methods run in that actor's thread (a call past its deadline cannot be stopped).
- :class:`ProcessActor` — ``cls(*args, **kwargs)`` built and held in a process of its
  own, owned by a :class:`ProcessServer` actor: trusted, its process tree contained as a
  trusted ``process`` worker's is; untrusted (``trusted=False``), forked clean and
  confined as an untrusted worker is (its own uid, Landlock, namespaces, seccomp, a
  cgroup; answers as plain data only). A call past its deadline gets the process killed:
  the server's state is lost, the caller gets :class:`ServerDown`, the actor exits and
  its supervisor starts a fresh one within its restart intensity.
- ``rho_actors.integrations.ray.servers.RayActor`` — a Ray actor, supervised the same way.

All three answer a :class:`ServerCall` (``ref.ask(ServerCall("get", ("k",)))``); from a
tool in ``thread`` isolation, :func:`call_server` finds a server by name and turns its
failures into the error results of ``results.TEXTS`` (``server_killed``...).

Example::

    system.start_child(ChildSpec("kv", ProcessActor(KvStore), name="kv"))

    @tool(timeout_ms=5_000)
    def kv_get(key: str, ctx: ToolContext) -> str:
        return call_server(ctx, "kv", "get", key, timeout_ms=1_000)
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import pykka
from loguru import logger

from rho_actors.encoding import describe_exception
from rho_actors.errors import RhoError
from rho_actors.otp.actor import Actor, kill, start_link
from rho_actors.otp.owned import owner_now
from rho_actors.results import TEXTS, text
from rho_actors.sandbox import (
    MAX_REPLY_BYTES,
    MAX_SERVED_BYTES,
    READY,
    SERVE,
    SERVED,
    TREE_ONLY,
    Child,
    ConfinePolicy,
    DeadlineReached,
    Enclosure,
    Malformed,
    WireError,
    context,
    decode_served,
    default_policy,
    end_child,
    hold_servers,
    mib,
    register_by_value,
    release_servers,
    server_child,
    signal_name,
    spawn,
)
from rho_actors.tool import ToolFailure

__all__ = [
    "DEFAULT_SERVER_HEAP_BYTES", "ProcessActor", "ProcessServer", "ServerCall", "ServerDown", "ServerError",
    "ServerRestarted", "ServerUnreachable", "ThreadActor", "ThreadServer", "call_server",
]

DEFAULT_SERVER_HEAP_BYTES = 256 * 2**20
"""The default bound of a process server's whole tree (bytes)."""
_ASK_MARGIN_S = 10.0  # what killing and reaping a server's tree may add to a call's wait
_WATCHER_END_S = 5.0  # how long a stopping server waits for its woken watcher thread to end


@dataclass(frozen=True, slots=True)
class ServerCall:
    """A message for a server: ``method(*args, **kwargs)`` on its object within
    ``timeout_ms`` milliseconds (default: the server's ``call_timeout_ms``). Methods
    whose name starts with ``_`` are refused."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    timeout_ms: int | None = None


class ServerError(RhoError):
    """The server's method raised: ``type_name`` and ``str(err)`` (``"TypeName:
    message"``) say what, as the server sent it (an untrusted server's text is scrubbed).
    The server lives on, its state as the method left it."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(message)
        self.type_name = type_name

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.type_name, str(self)))


class _ServerSituation(RhoError):
    """A server error told as the ``results.TEXTS`` situation ``key`` with its ``fields``
    (``str(err)`` is that text); it pickles as its key and fields."""

    def __init__(self, key: str, fields: Mapping[str, Any]) -> None:
        super().__init__(text(key, **fields))
        self.key = key
        self.fields = dict(fields)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.fields))


class ServerDown(_ServerSituation):
    """A server's process was killed at a call's deadline, died, or ran out of memory:
    its state is lost, and its actor exits so that its supervisor restarts it fresh.
    ``key`` is the situation of ``results.TEXTS`` (``server_killed``, ``server_crashed``,
    ``server_memory``; ``server_ray_memory`` for a Ray server's ``RayServerDown``) and
    ``fields`` its fields; ``str(err)`` is that text."""


class ServerUnreachable(_ServerSituation):
    """A server could not be reached for one call, which may or may not have run; the
    server lives on with its state (a Ray server whose Ray actor is alive but was
    unavailable for a moment: Ray's ``ActorUnavailableError``). ``key`` is the situation
    of ``results.TEXTS`` (``server_unreachable``) and ``fields`` its fields."""


class ServerRestarted(_ServerSituation):
    """The server was restarted since its last call without any caller being told
    (its process died between calls, or its actor was ended and restarted): everything
    it held is lost. Raised to the first call after such a restart, which did not run;
    the server lives on with fresh state, and the next call runs. ``key`` is
    ``server_restarted`` and ``fields`` its fields (``cause``: what ended the old one)."""


class _Lineage:
    """What one :class:`ProcessActor`'s successive servers share: the loss no caller was
    told of yet (a cause, for :class:`ServerRestarted`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._untold: str | None = None

    def lost(self, cause: str) -> None:
        with self._lock:
            if self._untold is None:
                self._untold = cause

    def take(self) -> str | None:
        with self._lock:
            cause, self._untold = self._untold, None
            return cause


def _timeout_ms(value: int | None, default: int) -> int:
    timeout_ms = default if value is None else value
    if type(timeout_ms) is not int or timeout_ms <= 0:
        raise ValueError(f"a server call's timeout_ms must be milliseconds > 0, got {timeout_ms!r}")
    return timeout_ms


def _check_ms(**values: int) -> None:
    for key, value in values.items():
        if type(value) is not int or value <= 0:
            raise ValueError(f"{key} must be milliseconds > 0, got {value!r}")


def _method(message: ServerCall) -> str:
    if type(message.method) is not str or not message.method or message.method.startswith("_"):
        raise AttributeError(f"a server has no public method {message.method!r}")
    return message.method


# --------------------------------------------------------------------------- in a process


class ProcessServer(Actor):
    """A rho actor owning one server process that holds ``cls(*args, **kwargs)``. Start it
    with :class:`ProcessActor`.

    Calls: ``ref.ask(ServerCall(method, args, kwargs, timeout_ms))``, served one at a
    time, answers the method's return value; a method that raises raises
    :class:`ServerError` (the server lives on). At the call's deadline, when the process
    dies, sends a malformed answer or reaches its memory bound, the whole process tree is
    killed and reaped before the caller gets :class:`ServerDown`; this actor then exits
    with it as reason (calls queued behind get it too), and its supervisor restarts it with
    a fresh process. A process that dies between calls is noticed by a watcher thread and
    ends the actor the same way. The process is killed when the actor stops.

    Raises ``RuntimeError`` on start (the supervisor's start error) when the process
    cannot be started, its ``cls(...)`` raises, or it is not ready within
    ``start_timeout_ms``.
    """

    def __init__(self, cls: type, args: tuple[Any, ...], kwargs: Mapping[str, Any], *, trusted: bool,
                 confine: ConfinePolicy | None, heap_bytes: int, call_timeout_ms: int, start_timeout_ms: int,
                 lineage: _Lineage | None = None) -> None:
        super().__init__()
        self._lineage = lineage if lineage is not None else _Lineage()
        self._untold = self._lineage.take()  # a predecessor's loss: told to this server's first caller
        self._told = False  # a ServerDown of this server reached a caller
        self.cls, self._args, self._kwargs = cls, args, dict(kwargs)
        self.trusted = trusted
        self.policy = TREE_ONLY if trusted else (confine if confine is not None else default_policy())
        self.codec = "pickle" if trusted else "plain"
        self.heap_bytes = heap_bytes
        self.call_timeout_ms, self.start_timeout_ms = call_timeout_ms, start_timeout_ms
        self.child: Child | None = None
        self.enclosure: Enclosure | None = None
        self.pid = 0
        self.calls = 0
        self._process_ended = False
        self._removing = False  # its enclosure is being removed: the stop's kill is too late
        self._lock = threading.Lock()
        self._down_error: ServerDown | None = None
        self._watcher: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1
        self._held = False
        self._owner, self._owned = owner_now(), -1  # its system's ledger, and its process's token there

    @property
    def label(self) -> str:
        """``"server KvStore (pid N)"``, for messages."""
        return f"server {self.cls.__name__} (pid {self.pid})"

    def on_start(self) -> None:
        register_by_value(self.cls)
        try:
            state = bytes(cloudpickle.dumps((self.cls, self._args, self._kwargs)))
        except Exception as exc:
            raise RuntimeError(f"server {self.cls.__name__} cannot be shipped to its process: "
                               f"{describe_exception(exc)}") from None
        hold_servers()
        self._held = True
        self.enclosure = Enclosure(self.policy, self.heap_bytes or None)
        try:
            self.child = spawn(context("forkserver"), server_child, (self.codec, state), self.enclosure.setup,
                               name="rho-server", label=f"server {self.cls.__name__}")
        except Exception as exc:
            self._end_process()
            raise RuntimeError(f"server {self.cls.__name__}: no process could be started "
                               f"({describe_exception(exc)})") from None
        self.pid = self.child.pid
        self.enclosure.started(self.pid)
        if self._owner is not None and self.enclosure.process is not None:  # a system's stop that cannot wait
            self._owned = self._owner.add(self.enclosure.process, self._kill_now, self.label)  # kills it (otp.owned)
        try:
            self._await_ready()
        except BaseException:
            self._end_process()
            raise
        self._wake_r, self._wake_w = os.pipe()
        self._watcher = threading.Thread(target=self._watch, name=f"rho-server-watch-{self.pid}", daemon=True)
        self._watcher.start()

    def _await_ready(self) -> None:
        assert self.child is not None
        deadline = time.monotonic() + self.start_timeout_ms / 1000
        try:
            tag, body = self.child.channel.recv(deadline, MAX_REPLY_BYTES)
        except DeadlineReached:
            raise RuntimeError(f"{self.label} was not ready within {self.start_timeout_ms} ms") from None
        except (EOFError, Malformed) as exc:
            raise RuntimeError(f"{self.label} ended before it was ready ({exc})") from None
        if tag == READY:
            return
        try:
            _, _, _, message = decode_served(self.codec, body) if tag == SERVED else (0, 0, "", "")
        except WireError as exc:
            message = f"a malformed answer ({exc})"
        raise RuntimeError(f"{self.label} could not start: {message or f'an unexpected frame {tag!r}'}")

    def _watch(self) -> None:
        """Wait for the process to end (its sentinel, never reaping it) or for the wake
        pipe; a process that ended while no call ran ends this actor."""
        assert self.child is not None
        sentinel = self.child.proc.sentinel
        with contextlib.suppress(OSError, ValueError):
            ready, _, _ = select.select([sentinel, self._wake_r], [], [])
            if sentinel in ready and not self._process_ended:
                code = self.child.proc.exitcode
                cause = ("its process ended between calls" if code is None else
                         f"its process died of {signal_name(-code)} between calls" if code < 0 else
                         f"its process exited with code {code} between calls")
                self._down("server_crashed", method="(between calls)", cause=cause)

    def server_info(self) -> dict[str, Any]:
        """This server as plain data, for the supervision tree: ``isolation``
        (``"process"``), ``class``, ``pid``, ``trusted``, ``calls`` served, its
        ``memory_bound``."""
        return {"isolation": "process", "class": self.cls.__qualname__, "pid": self.pid, "trusted": self.trusted,
                "calls": self.calls, "memory_bound": self.enclosure.memory_bound if self.enclosure else "none"}

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, ServerCall):
            return self._call(message)
        logger.warning("{} ignored an unknown message {!r}", self.label, message)
        return None

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` within ``call_timeout_ms`` (for ``ref.proxy().call(...)``)."""
        return self._call(ServerCall(method, args, kwargs))

    def _call(self, message: ServerCall) -> Any:
        if self._down_error is not None:
            self._told = True
            raise self._down_error
        method = _method(message)
        if self._untold is not None:
            cause, self._untold = self._untold, None
            raise ServerRestarted("server_restarted", {"server": self.cls.__name__, "method": method, "cause": cause})
        timeout_ms = _timeout_ms(message.timeout_ms, self.call_timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000
        body = pickle.dumps((method, tuple(message.args), dict(message.kwargs)))  # a bad argument raises here
        assert self.child is not None
        channel = self.child.channel
        self.calls += 1
        try:
            channel.send(SERVE, body, deadline)
            tag, reply = channel.recv(deadline, MAX_REPLY_BYTES if self.trusted else MAX_SERVED_BYTES)
            if tag != SERVED:
                raise Malformed(f"an unexpected frame {tag!r}")
            ok, value, type_name, error = decode_served(self.codec, reply)
        except DeadlineReached:
            self._told = True
            raise self._down("server_killed", method=method, timeout_ms=timeout_ms) from None
        except EOFError:
            self._told = True
            raise self._lost(method) from None
        except (Malformed, WireError) as exc:
            self._told = True
            raise self._down("server_crashed", method=method, cause=f"it sent a malformed answer: {exc}") from None
        if ok:
            return value
        raise ServerError(type_name, error)

    def _lost(self, method: str) -> ServerDown:
        assert self.enclosure is not None
        if self.enclosure.memory_bound_hit():
            return self._down("server_memory", method=method, heap=mib(self.heap_bytes))
        code = self.child.proc.exitcode if self.child is not None else None
        cause = ("its process ended" if code is None else f"its process died of {signal_name(-code)}" if code < 0
                 else f"its process exited with code {code}")
        return self._down("server_crashed", method=method, cause=cause)

    def _down(self, key: str, **fields: Any) -> ServerDown:
        """Kill and reap the process tree (its state is gone), then make this actor exit
        with the returned error as reason; calls already queued get it at once."""
        error = ServerDown(key, {"server": self.cls.__name__, **fields})
        with self._lock:
            first = self._down_error is None
            if first:
                self._down_error = error
        if first:
            logger.warning("{}: {}", self.label, error)
            self._end_process()
            kill(self.actor_ref, error)
        return self._down_error or error

    def _end_process(self) -> None:
        """Kill the process tree and reap it, remove its enclosure; idempotent. A loss no
        caller was told of (an end between calls, by the watcher or the actor's own end)
        is left for the next server of the same :class:`ProcessActor` to tell."""
        with self._lock:
            if self._process_ended:
                return
            self._process_ended = True
        if self._untold is not None:  # never told: the next server tells it
            self._lineage.lost(self._untold)
        elif not self._told and self.child is not None:
            down = self._down_error
            self._lineage.lost(down.fields.get("cause", str(down)) if down is not None else "its actor was ended")
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
        watcher = self._watcher  # woken: it ends before the descriptors it selects on are closed (and reused)
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(_WATCHER_END_S)
        if self.child is not None:
            with contextlib.suppress(Exception):
                end_child(self.child, self.enclosure)
            self.child.channel.close()
            with contextlib.suppress(ValueError, OSError):
                self.child.proc.close()
        if self._owner is not None:  # reaped (or given up on): a stop that found it entered waited for this
            self._owner.discard(self._owned)
        with self._lock:
            enclosure, self._removing = self.enclosure, True  # no kill from the stop once it is being removed
        if enclosure is not None:
            enclosure.remove()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self._held:
            self._held = False
            release_servers()

    def _kill_now(self) -> None:
        """SIGKILL the process tree, from the system's stop (any thread; this actor ends
        and reaps it as it stops, behind that stop)."""
        with self._lock:  # (killed here even once its actor began to end it: it stays entered until reaped)
            if self._removing or self.enclosure is None:
                return
            self.enclosure.kill()

    def on_stop(self) -> None:
        self._end_process()

    def on_failure(self, *exc_info: Any) -> None:
        self._end_process()


@dataclass(frozen=True, slots=True, init=False)
class ProcessActor:
    """How to start a :class:`ProcessServer` (the ``start`` of a
    :class:`rho_actors.ChildSpec`): ``ProcessActor(cls, args=[...], kwargs={...},
    trusted=True)`` builds ``cls(*args, **kwargs)`` in a fresh process on every start;
    the arguments are plain data as :class:`rho_actors.StartChild` takes them (the inline
    ``ProcessActor(cls, *args, **kwargs)`` works too; mixing both is a ``TypeError``). ``cls``, ``args``
    and ``kwargs`` are pickled (cloudpickle; a class of a module a fresh process cannot
    import goes by value). ``trusted=False`` confines the process by ``confine`` (default:
    :func:`rho_actors.sandbox.confine.enclosure.default_policy`, what a default system's
    untrusted workers get) and takes only plain JSON data back from it. ``heap_bytes``
    bounds the process tree (bytes; 0: none), ``call_timeout_ms`` is each call's default
    deadline, ``start_timeout_ms`` the bound on its start. These keyword names are taken:
    a class needing one gets it through a ``functools.partial``. Raises ``TypeError`` for
    a ``cls`` that is not a class, ``ValueError`` for a bad bound."""

    cls: type
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    trusted: bool
    confine: ConfinePolicy | None
    heap_bytes: int
    call_timeout_ms: int
    start_timeout_ms: int
    lineage: _Lineage

    def __init__(self, cls: type, *inline: Any, args: Sequence[Any] | None = None,
                 kwargs: Mapping[str, Any] | None = None, trusted: bool = True, confine: ConfinePolicy | None = None,
                 heap_bytes: int = DEFAULT_SERVER_HEAP_BYTES, call_timeout_ms: int = 30_000,
                 start_timeout_ms: int = 30_000, **inline_kwargs: Any) -> None:
        if not isinstance(cls, type):
            raise TypeError(f"ProcessActor needs a class, got {type(cls).__name__}")
        args, kwargs = _arguments("ProcessActor", inline, inline_kwargs, args, kwargs)
        _check_ms(call_timeout_ms=call_timeout_ms, start_timeout_ms=start_timeout_ms)
        if type(heap_bytes) is not int or heap_bytes < 0:
            raise ValueError(f"heap_bytes must be an int of 0 or more (bytes; 0: none), got {heap_bytes!r}")
        values = {"cls": cls, "args": args, "kwargs": kwargs, "trusted": bool(trusted), "confine": confine,
                  "heap_bytes": heap_bytes, "call_timeout_ms": call_timeout_ms, "start_timeout_ms": start_timeout_ms,
                  "lineage": _Lineage()}
        for key, value in values.items():
            object.__setattr__(self, key, value)

    def __call__(self) -> pykka.ActorRef[Any]:
        return start_link(ProcessServer, self.cls, self.args, self.kwargs, trusted=self.trusted, confine=self.confine,
                          heap_bytes=self.heap_bytes, call_timeout_ms=self.call_timeout_ms,
                          start_timeout_ms=self.start_timeout_ms, lineage=self.lineage,
                          timeout_s=self.start_timeout_ms / 1000 + 5)


# --------------------------------------------------------------------------- in a thread


class ThreadServer(Actor):
    """A rho actor holding ``cls(*args, **kwargs)`` in the host; each
    :class:`ServerCall` runs the method in this actor's thread, one at a time, and
    answers its value (a raise is re-raised to the caller as :class:`ServerError`, the
    server living on). A thread cannot be killed: a call past its deadline keeps
    running, and later calls wait for it. Start it with :class:`ThreadActor`."""

    def __init__(self, cls: type, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        super().__init__()
        self.cls, self._args, self._kwargs = cls, args, dict(kwargs)
        self.obj: Any = None
        self.calls = 0

    def on_start(self) -> None:
        self.obj = self.cls(*self._args, **self._kwargs)

    def server_info(self) -> dict[str, Any]:
        """This server as plain data: ``isolation`` (``"thread"``), ``class``, ``calls``."""
        return {"isolation": "thread", "class": self.cls.__qualname__, "calls": self.calls}

    def on_receive(self, message: Any) -> Any:
        if not isinstance(message, ServerCall):
            logger.warning("server {} ignored an unknown message {!r}", self.cls.__name__, message)
            return None
        method = _method(message)
        self.calls += 1
        try:
            return getattr(self.obj, method)(*message.args, **dict(message.kwargs))
        except Exception as exc:
            raise ServerError(type(exc).__qualname__, describe_exception(exc)) from exc


@dataclass(frozen=True, slots=True, init=False)
class ThreadActor:
    """How to start a :class:`ThreadServer`: ``ThreadActor(cls, args=[...],
    kwargs={...})`` (or inline: ``ThreadActor(cls, *args, **kwargs)``) builds
    ``cls(*args, **kwargs)`` in the host on every start."""

    cls: type
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]

    def __init__(self, cls: type, *inline: Any, args: Sequence[Any] | None = None,
                 kwargs: Mapping[str, Any] | None = None, **inline_kwargs: Any) -> None:
        if not isinstance(cls, type):
            raise TypeError(f"ThreadActor needs a class, got {type(cls).__name__}")
        args, kwargs = _arguments("ThreadActor", inline, inline_kwargs, args, kwargs)
        for key, value in (("cls", cls), ("args", args), ("kwargs", kwargs)):
            object.__setattr__(self, key, value)

    def __call__(self) -> pykka.ActorRef[Any]:
        return start_link(ThreadServer, self.cls, self.args, self.kwargs)


def _arguments(what: str, inline: tuple[Any, ...], inline_kwargs: dict[str, Any], args: Sequence[Any] | None,
               kwargs: Mapping[str, Any] | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A server class's arguments, given as plain data (``args``, ``kwargs``) or inline."""
    if args is None and kwargs is None:
        return inline, inline_kwargs
    if inline or inline_kwargs:
        raise TypeError(f"{what} takes the class's arguments either as args=/kwargs= (as StartChild takes them) or "
                        f"inline, not both: got args=/kwargs= and {len(inline)} inline argument(s) "
                        f"{sorted(inline_kwargs)}")
    if args is not None and not isinstance(args, (list, tuple)):
        raise TypeError(f"{what}'s args must be a list or tuple, got {type(args).__name__}")
    if kwargs is not None and not (isinstance(kwargs, Mapping) and all(isinstance(k, str) for k in kwargs)):
        raise TypeError(f"{what}'s kwargs must be a mapping of str keys, got {type(kwargs).__name__}")
    return tuple(args or ()), dict(kwargs or {})


# --------------------------------------------------------------------------- from a tool


def call_server(ctx: Mapping[str, Any], name: str, method: str, *args: Any, timeout_ms: int | None = None,
                **kwargs: Any) -> Any:
    """From a tool in ``thread`` isolation: ``method(*args, **kwargs)`` on the server
    registered as ``name`` (found with ``ctx["whereis"]``, so it follows restarts),
    within ``timeout_ms`` (default: the server's own; milliseconds). Returns the
    method's value; raises :class:`ServerError` when it raised, and
    :class:`~rho_actors.tool.ToolFailure` with the text of ``results.TEXTS`` for the
    model otherwise: ``server_not_running`` (no live server by that name),
    ``server_killed``/``server_crashed``/``server_memory``, and
    ``server_ray_memory`` for a Ray server Ray's memory monitor killed (a
    :class:`ServerDown`, a Ray server's included: its state is lost; it is being
    restarted), ``server_restarted`` (:class:`ServerRestarted`: the server was restarted
    while idle, everything it held is lost, the call did not run), ``server_unreachable``
    (:class:`ServerUnreachable`: the call may not have run; the server keeps its
    state), ``server_unanswered`` (no answer before the tool's own deadline, or
    ``timeout_ms`` plus 10 s: a thread server cannot be killed). Raises ``KeyError``
    when ``ctx`` has no ``whereis`` (a tool outside ``thread`` isolation)."""
    whereis = ctx["whereis"]
    ref = whereis(name)
    fields = {"server": name, "method": method}
    if ref is None:
        raise ToolFailure(TEXTS["server_not_running"][0], text("server_not_running", **fields))
    wait_s = None if timeout_ms is None else timeout_ms / 1000 + _ASK_MARGIN_S
    deadline = ctx.get("deadline")
    if isinstance(deadline, float):
        wait_s = min(wait_s if wait_s is not None else float("inf"), max(0.0, deadline - time.monotonic()))
    try:
        return ref.ask(ServerCall(method, args, kwargs, timeout_ms), timeout=wait_s)
    except (ServerDown, ServerRestarted, ServerUnreachable) as exc:
        raise ToolFailure(TEXTS[exc.key][0], text(exc.key, **{**exc.fields, "server": name})) from None
    except pykka.ActorDeadError:
        raise ToolFailure(TEXTS["server_not_running"][0], text("server_not_running", **fields)) from None
    except pykka.Timeout:
        raise ToolFailure(TEXTS["server_unanswered"][0], text("server_unanswered", **fields)) from None
