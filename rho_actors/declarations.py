"""Checked declarations (DESIGN §3) and the DeclarationActor that owns their cache.

A declaration is what a tool says about itself. It is read by calling the tool's
callbacks (:func:`read_declaration`) and then checked (:func:`check_declaration`):

- ``name``: exactly a ``str`` matching :data:`NAME_PATTERN` (``^[A-Za-z0-9_-]{1,64}$``,
  the rule OpenAI and Anthropic both apply to tool names);
- ``description``: exactly a ``str``, not blank;
- ``parameter_schema``: exactly a ``dict`` of plain JSON data (string keys), nested at
  most ``max_schema_depth`` levels, valid under the JSON Schema Draft 2020-12
  metaschema, whose top level is an object schema (``"type": "object"``);
- ``timeout_ms`` (a positive ``int``, milliseconds, cut to one day) and ``concurrency`` (``"parallel"``
  or ``"exclusive"``): a bad or raising answer means the default; it does not exclude
  the tool.

A tool failing any check is left out of what loops offer, with its reason logged once.
"""

from __future__ import annotations

import copy
import functools
import inspect
import json
import math
import re
import sys
import threading
import time
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tenacity
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from loguru import logger
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from rho_actors.actor import Actor, Names
from rho_actors.arguments import compile_pattern, make_validator, no_retrieval
from rho_actors.encoding import describe_exception, scrub_text
from rho_actors.events import DeclarationEvent, EventBus
from rho_actors.timers import Timers
from rho_actors.tool import DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS, ToolInfo, callback

__all__ = [
    "DECLARATIONS",
    "DEFAULT_MAX_SCHEMA_DEPTH",
    "NAME_PATTERN",
    "DeclarationActor",
    "Checked",
    "ReadUntrusted",
    "DeclarationError",
    "DeclarationState",
    "Rejected",
    "UntrustedReads",
    "checked_untrusted",
    "check_declaration",
    "describe_origin",
    "read_declaration",
]

NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
DEFAULT_MAX_SCHEMA_DEPTH = 32
"""How deeply a parameter schema may nest dicts and lists."""

_CALLBACKS = ("name", "description", "parameter_schema", "timeout_ms", "concurrency")


class DeclarationError(ValueError):
    """A declaration failed its checks; ``str(err)`` lists every failure and ``name``
    is the tool's name when that part was valid."""

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


@dataclass(frozen=True, slots=True)
class Rejected:
    """A tool left out of what loops offer, and why; ``name`` is its name when that
    much of its declaration was readable and valid."""

    reason: str
    name: str | None = None


@dataclass(frozen=True, slots=True)
class _Raised:
    """A callback that raised while its declaration was read."""

    description: str


@functools.lru_cache(maxsize=1024)
def _class_line(cls: Any) -> int | None:
    """Where ``cls`` is defined (parsing its module's source once per class)."""
    try:
        return inspect.getsourcelines(cls)[1]
    except (TypeError, OSError):
        return None


def describe_origin(tool: Any, trusted: bool = True) -> str:
    """Where a tool comes from, for messages: ``module.qualname (file:line)`` when known.
    Never raises (a tool whose attributes misbehave is named by its type). For an
    untrusted tool (``trusted=False``) no code of the tool runs: no attribute lookup
    that could reach its ``__getattr__``, properties or metaclass."""
    try:
        return _origin(tool) if trusted else _static_origin(tool)
    except BaseException:
        return f"a {type(tool).__qualname__} object"


def _static_origin(tool: Any) -> str:
    if isinstance(tool, types.ModuleType):
        namespace = object.__getattribute__(tool, "__dict__")
        label, where = str(namespace.get("__name__", "?")), namespace.get("__file__")
    else:
        cls = tool if isinstance(tool, type) else type(tool)
        label = f"{type.__getattribute__(cls, '__module__')}.{type.__getattribute__(cls, '__qualname__')}"
        label += "" if cls is tool else " instance"
        module = sys.modules.get(type.__getattribute__(cls, "__module__"))
        where = object.__getattribute__(module, "__dict__").get("__file__") if module is not None else None
    return f"{label} ({where})" if isinstance(where, str) else label


def _origin(tool: Any) -> str:
    target = tool if inspect.ismodule(tool) or inspect.isclass(tool) or inspect.isfunction(tool) else type(tool)
    wrapped = getattr(tool, "__wrapped__", None)
    if wrapped is not None and inspect.isfunction(wrapped):
        target = wrapped
    name = str(getattr(target, "__qualname__", None) or getattr(target, "__name__", "?"))
    module = getattr(target, "__module__", None)
    label = name if inspect.ismodule(target) or not module else f"{module}.{name}"
    if target is type(tool) and not inspect.isclass(tool):
        label += " instance"
    try:
        where = inspect.getsourcefile(target)
    except (TypeError, OSError):
        where = None
    code = getattr(target, "__code__", None)
    line: int | None = None
    if code is not None:
        line = code.co_firstlineno
    elif inspect.isclass(target):
        line = _class_line(typing.cast(Any, target))
    if where and line:
        where += f":{line}"
    return f"{label} ({where})" if where else label


def read_declaration(tool: Any) -> dict[str, Any]:
    """Call the tool's declaration callbacks in this thread.

    Returns a dict with the keys ``name``, ``description``, ``parameter_schema``,
    ``timeout_ms``, ``concurrency``: each the callback's answer, absent when the tool
    has no such callback, or a marker when it raised (any ``BaseException`` is caught:
    a tool's ``SystemExit`` must not stop the reading actor).
    """
    raw: dict[str, Any] = {}
    for cb_name in _CALLBACKS:
        cb = callback(tool, cb_name)
        if cb is None:
            continue
        try:
            raw[cb_name] = cb()
        except BaseException as exc:
            raw[cb_name] = _Raised(describe_exception(exc))
    return raw


def _json_data_problem(value: Any, depth: int, max_depth: int, path: str) -> str | None:
    """Why ``value`` is not plain JSON data within ``max_depth`` levels, or ``None``."""
    if depth > max_depth:
        return f"{path}: nested deeper than {max_depth} levels"
    if value is None or type(value) in (str, bool, int):
        return None
    if type(value) is float:
        return None if math.isfinite(value) else f"{path}: {value} is not JSON"
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                return f"{path}: key {key!r} is not a string"
            problem = _json_data_problem(item, depth + 1, max_depth, f"{path}.{key}")
            if problem:
                return problem
        return None
    if type(value) is list:
        for i, item in enumerate(value):
            problem = _json_data_problem(item, depth + 1, max_depth, f"{path}[{i}]")
            if problem:
                return problem
        return None
    return f"{path}: a {type(value).__name__} is not JSON data"


def check_declaration(raw: dict[str, Any], *, max_schema_depth: int = DEFAULT_MAX_SCHEMA_DEPTH) -> ToolInfo:
    """Check a declaration read by :func:`read_declaration`.

    Returns the :class:`ToolInfo` (with a private deep copy of the schema).
    Raises :class:`DeclarationError` listing every failing check, e.g.
    ``"name: 'my tool' does not match ^[A-Za-z0-9_-]{1,64}$; description: empty"``.
    """
    problems: list[str] = []

    def answer(key: str) -> Any:
        if key not in raw:
            problems.append(f"{key}: missing")
            return None
        value = raw[key]
        if isinstance(value, _Raised):
            problems.append(f"{key}() raised {value.description}")
            return None
        return value

    name = answer("name")
    if "name" in raw and not isinstance(raw["name"], _Raised):
        if type(name) is not str:
            problems.append(f"name: expected str, got {type(name).__name__}")
        elif not NAME_PATTERN.fullmatch(name):
            problems.append(f"name: {name[:80]!r} does not match ^{NAME_PATTERN.pattern}$")

    description = answer("description")
    if "description" in raw and not isinstance(raw["description"], _Raised):
        if type(description) is not str:
            problems.append(f"description: expected str, got {type(description).__name__}")
        elif not description.strip():
            problems.append("description: empty")
        else:
            description = scrub_text(str.__str__(description))  # what reaches a model is valid UTF-8

    schema = answer("parameter_schema")
    if "parameter_schema" in raw and not isinstance(raw["parameter_schema"], _Raised):
        problems.extend(_schema_problems(schema, max_schema_depth))

    if problems:
        valid = name if type(name) is str and NAME_PATTERN.fullmatch(name) else None
        raise DeclarationError("; ".join(problems), valid)

    timeout = raw.get("timeout_ms", DEFAULT_TIMEOUT_MS)
    if type(timeout) is int and timeout > 0:
        timeout = min(timeout, MAX_TIMEOUT_MS)
    else:
        _log_default_once(name, "timeout_ms", timeout, f"the default {DEFAULT_TIMEOUT_MS} ms")
        timeout = DEFAULT_TIMEOUT_MS
    concurrency = raw.get("concurrency", "parallel")
    if not (type(concurrency) is str and concurrency in ("parallel", "exclusive")):
        _log_default_once(name, "concurrency", concurrency, '"parallel"')
        concurrency = "parallel"
    return ToolInfo(
        name=name,
        description=description,
        parameter_schema=copy.deepcopy(schema),
        timeout_ms=timeout,
        concurrency="exclusive" if concurrency == "exclusive" else "parallel",
    )


_logged_defaults: set[tuple[str, str, str]] = set()


def _log_default_once(name: str, key: str, value: Any, default: str) -> None:
    """Log, once per (tool, callback, value), that a bad answer means the default."""
    shown = value.description if isinstance(value, _Raised) else describe_value(value)
    if (name, key, shown) in _logged_defaults:
        return
    if len(_logged_defaults) > 10_000:
        _logged_defaults.clear()
    _logged_defaults.add((name, key, shown))
    logger.warning("tool {}: {}() gave {}, not {}; using {}", name, key, shown,
                   "a positive int (milliseconds)" if key == "timeout_ms" else '"parallel" or "exclusive"', default)


def describe_value(value: Any) -> str:
    """A short, never-raising description of an answer, for messages: ``2500.0 (float)``."""
    try:
        text = repr(value)
    except BaseException:
        text = "<repr raised>"
    return f"{scrub_text(text)[:80]} ({type(value).__name__})"


def _schema_problems(schema: Any, max_depth: int) -> list[str]:
    """Why ``schema`` cannot be offered, or ``[]``. Never raises: an unexpected error of
    a check is itself the reason."""
    try:
        return _schema_checks(schema, max_depth)
    except RecursionError:
        return [f"parameter_schema: nested deeper than {max_depth} levels"]
    except Exception as exc:  # registration never raises for a bad declaration
        return [f"parameter_schema: cannot be checked: {describe_exception(exc)}"]


def _schema_checks(schema: Any, max_depth: int) -> list[str]:
    if type(schema) is not dict:
        return [f"parameter_schema: expected dict, got {type(schema).__name__}"]
    problem = _json_data_problem(schema, 0, max_depth, "parameter_schema")
    if problem:
        return [problem]
    problem = _wire_problem(schema)
    if problem:
        return [problem]
    try:  # no format checker: patterns are checked by RE2 below, never compiled by re
        Draft202012Validator.check_schema(schema, format_checker=None)  # type: ignore[arg-type]
    except SchemaError as err:
        where = err.json_path.replace("$", "parameter_schema", 1)
        return [f"{where}: not a valid JSON Schema (Draft 2020-12): {err.message}"]
    if schema.get("type") != "object":
        got = schema.get("type")
        return [f'parameter_schema: the top level must be an object schema ("type": "object"), got type {got!r}']
    problems = _keyword_problems(schema)
    if problems:
        return problems
    return _validator_problems(schema)


def _wire_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` cannot be sent by both SDKs (UTF-8 JSON text read back the same),
    or ``None``: a lone surrogate, an integer of more than 4,300 digits..."""
    try:
        text = json.dumps(schema, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
        json.loads(text)
    except (ValueError, TypeError) as err:
        return f"parameter_schema: cannot be sent as UTF-8 JSON: {describe_exception(err)}"
    return None


_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
"""Keywords whose values are instances, not schemas: not searched for ``$ref`` or patterns."""


def _keyword_problems(schema: dict[str, Any]) -> list[str]:
    """Every ``$ref``/``$dynamicRef`` must be local (``#...``) and resolve, ``$id`` may
    appear only at the top level, every ``pattern``/``patternProperties`` key must
    compile with RE2, and ``unevaluatedProperties`` is not combined with
    ``patternProperties`` (its matching would not be linear-time)."""
    problems: list[str] = []
    refs: list[tuple[str, str]] = []
    has = {"patternProperties": False, "unevaluatedProperties": False}
    stack: list[tuple[Any, str]] = [(schema, "parameter_schema")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, list):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            where = f"{path}.{key}"
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                if not value.startswith("#"):
                    problems.append(f"{where}: {value[:120]!r} is not a local reference (#...); "
                                    "nothing is fetched from the network or read from a file")
                else:
                    refs.append((where, value))
            elif key == "$id" and node is not schema and isinstance(value, str):
                problems.append(f"{where}: $id is allowed only at the top level")
            elif key == "pattern" and isinstance(value, str):
                problems.extend(_pattern_problem(where, value))
            elif key == "patternProperties" and isinstance(value, dict):
                has["patternProperties"] = True
                for pattern in value:
                    problems.extend(_pattern_problem(where, pattern))
            elif key == "unevaluatedProperties":
                has["unevaluatedProperties"] = True
            if key not in _DATA_KEYWORDS:
                stack.append((value, where))
    if all(has.values()):
        problems.append("parameter_schema: unevaluatedProperties with patternProperties is not supported "
                        "(patterns are matched by RE2 in linear time)")
    if not problems and refs:
        resolver = no_retrieval().resolver_with_root(DRAFT202012.create_resource(schema))
        for where, ref in refs:
            try:
                resolver.lookup(ref)
            except Unresolvable:
                problems.append(f"{where}: {ref[:120]!r} does not resolve within the schema")
    return problems


def _pattern_problem(where: str, pattern: str) -> list[str]:
    try:
        compile_pattern(pattern)
    except ValueError as err:
        return [f"{where}: {err}"]
    return []


def _validator_problems(schema: dict[str, Any]) -> list[str]:
    """A validator compiles from ``schema`` and validates ``{}`` without an error (a
    ``$ref`` cycle that never descends into the instance raises ``RecursionError``)."""
    try:
        for _ in make_validator(copy.deepcopy(schema)).iter_errors({}):
            pass
    except RecursionError:
        return ["parameter_schema: its $refs form a cycle that never reaches a value"]
    except Exception as exc:
        return [f"parameter_schema: cannot be used to validate: {describe_exception(exc)}"]
    return []


DECLARATIONS = "declarations"
"""The name the DeclarationActor is registered under in its system."""


@dataclass(frozen=True, slots=True)
class UntrustedReads:
    """How untrusted declarations are read (DESIGN §3): in a throwaway process within
    ``timeout_s`` seconds and ``heap_bytes`` bytes; a read that runs over is tried again
    after each of ``retry_s`` (seconds; default 1, 5 and 30 minutes, as tenacity's
    ``wait_chain`` of ``wait_fixed`` waits), then the tool stays out."""

    timeout_s: float = 2.0
    heap_bytes: int = 256 * 2**20
    retry_s: tuple[float, ...] = (60.0, 300.0, 1800.0)
    start_method: str = "forkserver"

    def wait(self) -> tenacity.wait.wait_base:
        """The retry schedule as a tenacity wait strategy."""
        return tenacity.wait_chain(*(tenacity.wait_fixed(s) for s in self.retry_s))

    def retry_delay_s(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1-based), in seconds."""
        state = tenacity.RetryCallState(retry_object=tenacity.Retrying(), fn=None, args=(), kwargs={})
        state.attempt_number = retry
        return float(self.wait()(state))


@dataclass(frozen=True, slots=True)
class Checked:
    """Told by the DeclarationActor to the registry: an untrusted tool's declaration was
    read and checked (``outcome``), or the read failed (a :class:`Rejected`)."""

    tool: Any
    outcome: ToolInfo | Rejected


@dataclass(frozen=True, slots=True)
class ReadUntrusted:
    """Asked of the DeclarationActor by the registry: read this untrusted tool."""

    tool: Any


@dataclass(frozen=True, slots=True)
class _ReadDone:
    tool: Any
    outcome: ToolInfo | Rejected
    timed_out: bool
    retry: int


@dataclass(frozen=True, slots=True)
class _Retry:
    tool: Any
    retry: int


_checked_untrusted: dict[int, tuple[Any, ToolInfo | Rejected]] = {}
"""Every system's checked untrusted declarations, for :func:`checked_untrusted`."""


def checked_untrusted(tool: Any) -> ToolInfo | Rejected | None:
    """The checked declaration (or the rejection) of an untrusted tool a system has read,
    or ``None`` when none has (yet)."""
    held = _checked_untrusted.get(id(tool))
    return held[1] if held is not None and held[0] is tool else None


@dataclass
class DeclarationState:
    """The DeclarationActor's durable state, kept by the system (as an OTP process keeps
    an ETS table with an heir): ``cache`` (tool id -> (tool, outcome)), ``reading``
    (tool id -> tool, the untrusted tools whose reads or retries are wanted) and
    ``closed``, set when the system stops: in-flight reads are then cancelled."""

    cache: dict[int, tuple[Any, ToolInfo | Rejected]] = field(default_factory=dict)
    reading: dict[int, Any] = field(default_factory=dict)
    closed: threading.Event = field(default_factory=threading.Event)


class DeclarationActor(Actor):
    """Owns the checked-declaration cache and the retry timers (DESIGN §3, §6: permanent).

    A trusted tool's declaration is read in this actor's thread (:meth:`check`); an
    untrusted tool's in a throwaway process (:meth:`read_untrusted`, in a helper thread
    that waits for it), the outcome then told, as :class:`Checked`, to the actor named
    ``notify`` (the registry). Each outcome is kept for the tool's life: until
    :meth:`forget` (unregistration) or a re-read (a re-registration: its code may have
    changed). A rejection's reason is logged once, when it is found. A read that ran
    over its time bound is retried on the :class:`UntrustedReads` schedule. Its state
    is a :class:`DeclarationState` kept by the system, and every message to it or from
    it goes by name, so a restarted DeclarationActor (or registry) loses no checked
    declaration, no read in flight and no retry. Events: ``read``, ``rejected``,
    ``retry``, ``excluded``.
    """

    def __init__(
        self,
        state: DeclarationState,
        names: Names,
        notify: str,
        max_schema_depth: int = DEFAULT_MAX_SCHEMA_DEPTH,
        untrusted: UntrustedReads | None = None,
        timers: Timers | None = None,
        events: EventBus | None = None,
    ) -> None:
        super().__init__()
        self._state = state
        self._cache = state.cache
        self._names = names
        self._notify = notify
        self._max_schema_depth = max_schema_depth
        self._untrusted = untrusted or UntrustedReads()
        self._timers = timers
        self._events = events

    def check(self, tool: Any, fresh: bool = False) -> ToolInfo | Rejected:
        """The trusted tool's checked declaration, or why it is left out. Never raises."""
        cached = self._cache.get(id(tool))
        if cached is not None and cached[0] is tool and not fresh:
            return cached[1]
        try:
            outcome: ToolInfo | Rejected = check_declaration(
                read_declaration(tool), max_schema_depth=self._max_schema_depth
            )
        except DeclarationError as err:
            outcome = Rejected(str(err), err.name)
            logger.warning("tool {} left out: {}", describe_origin(tool), outcome.reason)
        self._cache[id(tool)] = (tool, outcome)
        return outcome

    def read_untrusted(self, tool: Any, retry: int = 0) -> None:
        """Read an untrusted tool's declaration in a throwaway process, without blocking
        this actor; the outcome reaches the ``notify`` actor as :class:`Checked`."""
        self._state.reading[id(tool)] = tool
        threading.Thread(
            target=_read_isolated,
            args=(tool, self._untrusted, self._max_schema_depth, retry, self._deliver, self._state.closed),
            name="rho-declaration-read",
            daemon=True,
        ).start()

    def _deliver(self, message: Any) -> None:
        """Hand ``message`` to whichever DeclarationActor runs now (by name), from the
        calling thread, which may wait for a restart."""
        self._names.deliver(DECLARATIONS, message, stop=self._state.closed)

    def _deliver_later(self, name: str, message: Any) -> None:
        """Hand ``message`` to the actor named ``name`` from a helper thread: this
        actor's thread never waits on another actor."""
        threading.Thread(
            target=self._names.deliver, args=(name, message), kwargs={"stop": self._state.closed},
            name="rho-deliver", daemon=True,
        ).start()

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, ReadUntrusted):
            self.read_untrusted(message.tool)
        elif isinstance(message, _ReadDone):
            self._read_done(message)
        elif isinstance(message, _Retry):
            if self._state.reading.get(id(message.tool)) is message.tool:
                self.read_untrusted(message.tool, message.retry)
        else:
            return super().on_receive(message)
        return None

    def _read_done(self, done: _ReadDone) -> None:
        if self._state.reading.get(id(done.tool)) is not done.tool:
            return  # forgotten (unregistered) while it was read
        origin = describe_origin(done.tool, trusted=False)
        outcome = done.outcome
        self._cache[id(done.tool)] = (done.tool, outcome)
        _checked_untrusted[id(done.tool)] = (done.tool, outcome)
        if isinstance(outcome, ToolInfo):
            self._emit("read", origin, outcome.name, None)
        elif done.timed_out and done.retry < len(self._untrusted.retry_s) and self._timers is not None:
            delay = self._untrusted.retry_delay_s(done.retry + 1)
            logger.warning("tool {} left out for now: {}; read again in {} s", origin, outcome.reason, delay)
            self._emit("retry", origin, outcome.name, f"{outcome.reason}; read again in {delay} s")
            retry = _Retry(done.tool, done.retry + 1)
            self._timers.call_at(time.monotonic() + delay, lambda: self._deliver_later(DECLARATIONS, retry))
        else:
            kind = "excluded" if done.timed_out else "rejected"
            logger.warning("tool {} left out: {}", origin, outcome.reason)
            self._emit(kind, origin, outcome.name, outcome.reason)
        self._deliver_later(self._notify, Checked(done.tool, outcome))

    def _emit(self, kind: Any, origin: str, name: str | None, reason: str | None) -> None:
        if self._events is not None:
            self._events.emit(DeclarationEvent(kind, origin, name, reason))

    def forget(self, tool: Any) -> None:
        """Drop the tool's cached declaration and any read or retry still to come."""
        for table in (self._cache, _checked_untrusted):
            held = table.get(id(tool))
            if held is not None and held[0] is tool:
                del table[id(tool)]
        if self._state.reading.get(id(tool)) is tool:
            del self._state.reading[id(tool)]


def _read_isolated(
    tool: Any, settings: UntrustedReads, depth: int, retry: int, deliver: Callable[[Any], None],
    cancel: threading.Event,
) -> None:
    """A helper thread's work: one isolated read and check, delivered as ``_ReadDone``."""
    from rho_actors import sandbox

    timed_out = False
    try:
        payload = sandbox.read_declaration_isolated(
            tool, timeout_s=settings.timeout_s, heap_bytes=settings.heap_bytes, start_method=settings.start_method,
            cancel=cancel,
        )
        outcome: ToolInfo | Rejected = check_declaration(sandbox.raw_declaration(payload), max_schema_depth=depth)
    except DeclarationError as err:
        outcome = Rejected(str(err), err.name)
    except sandbox.IsolatedReadError as err:
        timed_out = err.kind == "timeout"
        outcome = Rejected(f"reading its declaration failed ({err.kind}): {err}")
    except BaseException as err:  # this thread must always answer
        outcome = Rejected(f"reading its declaration failed: {describe_exception(err)}")
    deliver(_ReadDone(tool, outcome, timed_out, retry))
