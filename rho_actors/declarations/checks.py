"""Checked declarations (DESIGN §3); the DeclarationActor that owns their cache is in
:mod:`rho_actors.registry.declaration_actor`.

A declaration is what a tool says about itself. It is read by calling the tool's
callbacks (:func:`read_declaration`) and then checked (:func:`check_declaration`):

- ``name``: exactly a ``str`` matching :data:`NAME_PATTERN` (``^[A-Za-z0-9_-]{1,64}$``,
  the rule OpenAI and Anthropic both apply to tool names);
- ``description``: exactly a ``str``, not blank, of at most ``max_description_chars``
  characters (default 16,384); control characters other than newline and tab, bidi
  controls and zero-width characters are removed from it, and from every ``title`` and
  ``description`` string of the schema (:func:`rho_actors.encoding.strip_controls`);
- ``parameter_schema``: exactly a ``dict`` of plain JSON data (string keys), nested at
  most ``max_schema_depth`` levels, of at most ``max_schema_nodes`` values (default
  2,048) and ``max_schema_bytes`` bytes of JSON text (default 65,536), both counted
  before anything else is checked, valid under the JSON Schema Draft 2020-12
  metaschema, whose top level is an object schema (``"type": "object"``);
- ``timeout_ms`` (a positive ``int``, milliseconds, cut to one day) and ``concurrency`` (``"parallel"``
  or ``"exclusive"``): a bad or raising answer means the default; it does not exclude
  the tool; so for the call policy's callbacks (:mod:`rho_actors.declarations.policy`):
  a bad answer sets no bound.

A tool failing any check is left out of what loops offer, with its reason logged once.
"""

from __future__ import annotations

import collections
import copy
import functools
import hashlib
import inspect
import json
import marshal
import math
import os
import re
import sys
import threading
import types
import typing
from dataclasses import dataclass
from typing import Any, Final

from loguru import logger
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from rho_actors.declarations.annotations import Annotations, checked_annotations, idempotent_hinted
from rho_actors.declarations.arguments import compile_pattern, make_validator, no_retrieval
from rho_actors.declarations.metaschema import metaschema_validator
from rho_actors.declarations.policy import POLICY_CALLBACKS, policy_from_answers
from rho_actors.encoding import describe_exception, scrub_text, shown_text, strip_controls
from rho_actors.errors import RhoError
from rho_actors.tool import (
    DEFAULT_TIMEOUT_MS,
    MAX_TIMEOUT_MS,
    REQUIRED_CALLBACKS,
    ToolInfo,
    callback,
    checked_untrusted,
    missing_callbacks,
)

__all__ = [
    "DECLARATION_CALLBACKS",
    "DEFAULT_MAX_DESCRIPTION_CHARS",
    "DEFAULT_MAX_SCHEMA_BYTES",
    "DEFAULT_MAX_SCHEMA_DEPTH",
    "DEFAULT_MAX_SCHEMA_NODES",
    "NAME_PATTERN",
    "DeclarationError",
    "Raised",
    "Rejected",
    "checked_untrusted",
    "check_declaration",
    "describe_origin",
    "not_a_tool",
    "output_schema_problems",
    "read_declaration",
]

_MAX_ORIGIN_CHARS = 1_000  # an untrusted tool's origin as messages show it

NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
DEFAULT_MAX_SCHEMA_DEPTH = 32
"""How deeply a parameter schema may nest dicts and lists."""
DEFAULT_MAX_DESCRIPTION_CHARS = 16_384
"""How long a tool's description may be, in characters (it is sent in every request)."""
DEFAULT_MAX_SCHEMA_BYTES = 65_536
"""How long a parameter schema's JSON text may be, in bytes (UTF-8)."""
DEFAULT_MAX_SCHEMA_NODES = 2_048
"""How many JSON values (objects, arrays, strings, numbers...) a parameter schema may hold."""

DECLARATION_CALLBACKS: Final = ("name", "description", "parameter_schema", "timeout_ms", "concurrency",
                                "annotations", "requires_approval", *POLICY_CALLBACKS)
"""Every callback a declaration is read from (DESIGN §2): what :func:`read_declaration`
asks, here and in an untrusted tool's reading process alike."""


class DeclarationError(RhoError, ValueError):
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
class Raised:
    """The marker :func:`read_declaration` leaves for a callback that raised
    (``Raised("TypeName: message")``), also made from an isolated read's answer."""

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
    that could reach its ``__getattr__``, properties or metaclass, and the text (a
    plugin file's name, say: anyone's who may write its folder) is one line, escaped and
    cut (:func:`~rho_actors.encoding.shown_text`)."""
    try:
        return _origin(tool) if trusted else shown_text(_static_origin(tool), _MAX_ORIGIN_CHARS)
    except BaseException:
        return f"a {type(tool).__qualname__} object"


def _static_origin(tool: Any) -> str:
    own = _own_wrapper_origin(tool)
    if own is not None:
        return own
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


def _own_wrapper_origin(tool: Any) -> str | None:
    """The user's function or file behind one of rho's own wrappers (an ``@tool``
    function, a plugin file's stand-in), read from the instance's own storage without
    running any of its code; ``None`` for anything else."""
    cls = type(tool)
    module = type.__getattribute__(cls, "__module__")
    if not isinstance(module, str) or not module.startswith("rho_actors."):
        return None
    try:
        namespace = object.__getattribute__(tool, "__dict__")
    except AttributeError:
        namespace = {}
    func = namespace.get("func")
    if isinstance(func, types.FunctionType):
        code = func.__code__
        return f"{func.__module__}.{func.__qualname__} ({code.co_filename}:{code.co_firstlineno})"
    try:
        path = object.__getattribute__(tool, "path")
    except AttributeError:
        return None
    return f"{os.path.basename(path)} ({path})" if isinstance(path, str) else None


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
    ``timeout_ms``, ``concurrency``, ``requires_approval``: each the callback's answer,
    absent when the tool has no such callback, or a marker when it raised (any
    ``BaseException`` is caught: a tool's ``SystemExit`` must not stop the reading
    actor). ``requires_approval`` and ``idempotent`` may also be ``bool`` attributes; a
    policy over the call (a method taking arguments) is not called and reads as ``True``.
    """
    raw: dict[str, Any] = {}
    for cb_name in DECLARATION_CALLBACKS:
        if cb_name == "requires_approval" and _approval_answer(tool, raw):
            continue
        if cb_name == "idempotent" and _bool_attribute(tool, cb_name, raw):
            continue
        cb = callback(tool, cb_name)
        if cb is None:
            continue
        try:
            raw[cb_name] = cb()
        except BaseException as exc:
            raw[cb_name] = Raised(describe_exception(exc))
    return raw


def _bool_attribute(tool: Any, name: str, raw: dict[str, Any]) -> bool:
    """Put ``tool``'s attribute ``name`` in ``raw`` when it is a ``bool``; whether it was."""
    try:
        value = getattr(tool, name, None)
    except BaseException:
        return False
    if isinstance(value, bool):
        raw[name] = value
        return True
    return False


def _approval_answer(tool: Any, raw: dict[str, Any]) -> bool:
    """Put a ``requires_approval`` that is a bool attribute, or a policy over the call
    (``True``: its calls may need a decision), in ``raw``; whether it was read here (an
    attribute that cannot be read is absent: the default)."""
    try:
        value = getattr(tool, "requires_approval", None)
    except BaseException:
        return True
    if isinstance(value, bool):
        raw["requires_approval"] = value
        return True
    try:
        policy = callable(value) and any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                                         for p in inspect.signature(value).parameters.values())
    except (TypeError, ValueError):  # no signature to read: called as a method of no arguments
        return False
    if policy:
        raw["requires_approval"] = True
    return policy


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


def check_declaration(
    raw: dict[str, Any], *, max_schema_depth: int = DEFAULT_MAX_SCHEMA_DEPTH,
    max_description_chars: int = DEFAULT_MAX_DESCRIPTION_CHARS, max_schema_bytes: int = DEFAULT_MAX_SCHEMA_BYTES,
    max_schema_nodes: int = DEFAULT_MAX_SCHEMA_NODES,
) -> ToolInfo:
    """Check a declaration read by :func:`read_declaration` (see the module doc for the
    bounds: characters, bytes and JSON values).

    Returns the :class:`ToolInfo` (with a private deep copy of the schema, its
    ``title``/``description`` strings stripped of control characters).
    Raises :class:`DeclarationError` listing every failing check, e.g.
    ``"name: 'my tool' does not match ^[A-Za-z0-9_-]{1,64}$; description: empty"``.
    """
    problems: list[str] = []

    def answer(key: str) -> Any:
        if key not in raw:
            problems.append(f"{key}: missing")
            return None
        value = raw[key]
        if isinstance(value, Raised):
            problems.append(f"{key}() raised {value.description}")
            return None
        return value

    name = answer("name")
    if "name" in raw and not isinstance(raw["name"], Raised):
        if type(name) is not str:
            problems.append(f"name: expected str, got {type(name).__name__}")
        elif not NAME_PATTERN.fullmatch(name):
            problems.append(f"name: {name[:80]!r} does not match ^{NAME_PATTERN.pattern}$")

    description = answer("description")
    if "description" in raw and not isinstance(raw["description"], Raised):
        if type(description) is not str:
            problems.append(f"description: expected str, got {type(description).__name__}")
        elif len(description) > max_description_chars:
            problems.append(f"description: {len(description)} characters, over the bound of "
                            f"{max_description_chars}")
        else:
            description, _ = strip_controls(scrub_text(str.__str__(description)))  # valid UTF-8, no escapes
            if not description.strip():
                problems.append("description: empty")

    schema = answer("parameter_schema")
    if "parameter_schema" in raw and not isinstance(raw["parameter_schema"], Raised):
        problems.extend(_schema_problems(schema, max_schema_depth, max_schema_nodes, max_schema_bytes))


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
    try:
        annotations = checked_annotations(raw.get("annotations"))
    except (TypeError, ValueError) as exc:  # hints: a bad one is left out, as a bad timeout is
        _log_default_once(name, "annotations", raw.get("annotations"), f"none ({exc})")
        annotations = ()
    policy = policy_from_answers(_idempotence(raw, annotations),
                                 lambda key, value, problem: _log_default_once(name, key, value, problem),
                                 requires_approval=raw.get("requires_approval") not in (False, None))
    return ToolInfo(
        name=name,
        description=description,
        parameter_schema=_stripped_annotations(marshal.loads(marshal.dumps(schema))),  # plain JSON: a deep copy
        timeout_ms=timeout,
        concurrency="exclusive" if concurrency == "exclusive" else "parallel",
        policy=policy,
        annotations=idempotent_hinted(annotations, policy.idempotent),
    )


def _idempotence(raw: dict[str, Any], annotations: Annotations) -> dict[str, Any]:
    """The answers with the tool's one idempotence fact (docs/design/tool-contract.md
    "Idempotence"): its ``idempotent()``, else its own ``idempotentHint``."""
    if "idempotent" not in raw and dict(annotations).get("idempotentHint") is True:
        return {**raw, "idempotent": True}
    return raw



_logged_defaults: set[tuple[str, str, str]] = set()


def _log_default_once(name: str, key: str, value: Any, default: str) -> None:
    """Log, once per (tool, callback, value), that a bad answer means the default."""
    shown = value.description if isinstance(value, Raised) else describe_value(value)
    if (name, key, shown) in _logged_defaults:
        return
    if len(_logged_defaults) > 10_000:
        _logged_defaults.clear()
    _logged_defaults.add((name, key, shown))
    wanted = {"timeout_ms": "a positive int (milliseconds)", "concurrency": '"parallel" or "exclusive"'}.get(key)
    if wanted is None:  # a call policy's callback: no bound
        logger.warning("tool {}: {}() gave {}: {}; no such bound is set", name, key, shown, default)
        return
    logger.warning("tool {}: {}() gave {}, not {}; using {}", name, key, shown, wanted, default)


def describe_value(value: Any) -> str:
    """A short, never-raising description of an answer, for messages: ``2500.0 (float)``."""
    try:
        text = repr(value)
    except BaseException:
        text = "<repr raised>"
    return f"{scrub_text(text)[:80]} ({type(value).__name__})"


def _stripped_annotations(schema: Any) -> Any:
    """``schema`` (a private copy) with control characters removed from every string
    ``title`` and ``description`` in it (shown to models and on terminals)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in ("title", "description") and type(value) is str:
                    node[key] = strip_controls(value)[0]
                elif key not in _DATA_KEYWORDS:
                    stack.append(value)
    return schema


def _too_many_nodes(schema: Any, max_nodes: int) -> bool:
    """Whether ``schema`` holds more than ``max_nodes`` JSON values (counting stops there)."""
    count, stack = 0, [schema]
    while stack:
        node = stack.pop()
        count += 1
        if count > max_nodes:
            return True
        if type(node) is dict:
            count += len(node)  # its keys
            stack.extend(node.values())
        elif type(node) is list:
            stack.extend(node)
    return False


def output_schema_problems(schema: Any, max_depth: int = DEFAULT_MAX_SCHEMA_DEPTH) -> list[str]:
    """Why ``schema`` cannot be served as a tool's ``outputSchema`` (MCP), or ``[]``: the
    checks and bounds of a parameter schema (its size, depth and JSON values, a valid
    Draft 2020-12 object schema, local ``$ref`` s that resolve, RE2 patterns), each
    problem named from ``outputSchema``. Never raises."""
    return [p.replace("parameter_schema", "outputSchema", 1) for p in _schema_problems(schema, max_depth)]


def _schema_problems(
    schema: Any, max_depth: int, max_nodes: int = DEFAULT_MAX_SCHEMA_NODES, max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES,
) -> list[str]:
    """Why ``schema`` cannot be offered, or ``[]``. Never raises: an unexpected error of
    a check is itself the reason. Its size is bounded first (``max_nodes`` JSON values,
    ``max_bytes`` bytes of JSON text), so the costly checks only see bounded input."""
    try:
        return _schema_checks(schema, max_depth, max_bytes, max_nodes)
    except RecursionError:
        return [f"parameter_schema: nested deeper than {max_depth} levels"]
    except Exception as exc:  # registration never raises for a bad declaration
        return [f"parameter_schema: cannot be checked: {describe_exception(exc)}"]


def _schema_checks(
    schema: Any, max_depth: int, max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES, max_nodes: int = DEFAULT_MAX_SCHEMA_NODES,
) -> list[str]:
    if type(schema) is not dict:
        return [f"parameter_schema: expected dict, got {type(schema).__name__}"]
    problem = _json_data_problem(schema, 0, max_depth, "parameter_schema")
    if problem:
        return [problem]
    if _too_many_nodes(schema, max_nodes):
        return [f"parameter_schema: more than {max_nodes} JSON values (keys included), over its bound"]
    problem, text = _wire_problem(schema, max_bytes)
    if problem:
        return [problem]
    # The checks below depend on the JSON value alone, which the text (of exact JSON types
    # only, checked above) identifies: one schema offered by many tools is checked once.
    key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    known = _SCHEMA_VERDICTS.get(key)
    if known is None:
        known = _SCHEMA_VERDICTS.put(key, tuple(_costly_checks(schema)))
    return list(known)


class _Verdicts:
    """The last ``size`` schema verdicts by the SHA-256 of the schema's JSON text (an LRU,
    safe from any thread)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._held: collections.OrderedDict[bytes, tuple[str, ...]] = collections.OrderedDict()

    def get(self, key: bytes) -> tuple[str, ...] | None:
        with self._lock:
            found = self._held.get(key)
            if found is not None:
                self._held.move_to_end(key)
            return found

    def put(self, key: bytes, verdict: tuple[str, ...]) -> tuple[str, ...]:
        with self._lock:
            self._held[key] = verdict
            if len(self._held) > self._size:
                self._held.popitem(last=False)
        return verdict


_SCHEMA_VERDICTS = _Verdicts(4_096)


def _costly_checks(schema: dict[str, Any]) -> list[str]:
    """The meta-schema, the keywords and a validator's compilation (bounded input)."""
    # check_schema's first error at half its time (no format checker: patterns are checked by RE2 below)
    err = next(metaschema_validator().iter_errors(schema), None)
    if err is not None:
        where = err.json_path.replace("$", "parameter_schema", 1)
        return [f"{where}: not a valid JSON Schema (Draft 2020-12): {err.message}"]
    if schema.get("type") != "object":
        got = schema.get("type")
        return [f'parameter_schema: the top level must be an object schema ("type": "object"), got type {got!r}']
    problems = _keyword_problems(schema)
    if problems:
        return problems
    return _validator_problems(schema)


def _wire_problem(schema: dict[str, Any], max_bytes: int = DEFAULT_MAX_SCHEMA_BYTES) -> tuple[str | None, str]:
    """Why ``schema`` cannot be sent by both SDKs (UTF-8 JSON text read back the same,
    of at most ``max_bytes`` bytes), or ``None``: a lone surrogate, an integer of more
    than 4,300 digits, too long a text...; and the JSON text (``""`` when it has none)."""
    try:
        text = json.dumps(schema, ensure_ascii=False, allow_nan=False)
        size = len(text.encode("utf-8"))
        json.loads(text)
    except (ValueError, TypeError) as err:
        return f"parameter_schema: cannot be sent as UTF-8 JSON: {describe_exception(err)}", ""
    if size > max_bytes:
        return f"parameter_schema: {size} bytes of JSON text, over the bound of {max_bytes}", text
    return None, text


_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
"""Keywords whose values are instances, not schemas: not searched for ``$ref`` or patterns."""


def _keyword_problems(schema: dict[str, Any]) -> list[str]:
    """Every ``$ref``/``$dynamicRef`` must be local (``#...``) and resolve, ``$id`` may
    appear only at the top level, every ``pattern``/``patternProperties`` key must
    compile with RE2 (``unevaluatedProperties`` matches ``patternProperties`` with RE2
    too: :mod:`rho_actors.declarations.arguments`)."""
    problems: list[str] = []
    refs: list[tuple[str, str]] = []
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
                for pattern in value:
                    problems.extend(_pattern_problem(where, pattern))
            if key not in _DATA_KEYWORDS:
                stack.append((value, where))
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



def not_a_tool(obj: Any) -> str:
    """Why ``obj`` is not a tool, for a message: what it lacks, what was found instead and
    what to do (``"it lacks name, ...; it is a plain function: decorate it with @tool"``)."""
    import inspect
    import types

    said = f"it lacks {', '.join(missing_callbacks(obj))}"
    kind = type(obj)
    if inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.ismethod(obj):
        return f"{said}; it is a plain function: decorate it with @tool (from rho_actors import tool)"
    if kind.__name__ == "Tool" and kind.__module__.split(".")[0] == "pydantic_ai":
        return (f"{said}; it is a pydantic-ai Tool: register its function (decorated with @tool) instead, or "
                "give rho's tools to a pydantic-ai agent with rho_actors.integrations.pydantic_ai.RhoToolset")
    values = [cb for cb in REQUIRED_CALLBACKS
              if hasattr(obj, cb) and not callable(getattr(obj, cb, None))]
    if values:
        found = ", ".join(f"{cb} is a {type(getattr(obj, cb)).__name__}" for cb in values)
        where = ("module" if isinstance(obj, types.ModuleType)
                 else f"class {obj.__name__}" if inspect.isclass(obj) else type(obj).__name__)
        return (f"{said}; in this {where} {found}, not a function: each callback is a function "
                f"(def name() -> str: return ...), or define the tool as an @tool function")
    if isinstance(obj, types.ModuleType):
        return f"{said}; it is a module without them: define them at its top level, or one @tool function in it"
    return f"{said}; it is a {kind.__name__}: a tool is an @tool function or a class or module with those callbacks"
