"""Replay of the Berkeley Function Calling Leaderboard's multi-turn conversations.

The recorded ground-truth calls of BFCL's multi-turn categories (``base``, ``miss_func``,
``miss_param``, ``long_context``) are sent through the runtime (an :class:`ActorSystem`,
one loop per conversation) against BFCL's own backend classes as tools, and every result
and every final state is compared with a direct execution of the same calls on separate,
fresh instances, done the way BFCL's checker does it.

Nothing of BFCL is copied here: data, declarations and backends come from the installed
``bfcl_eval`` package (``pip install --no-deps bfcl-eval==2026.3.23 mpmath``), imported
only when a replay runs.

Library use::

    from rho_actors.bfcl import replay
    report = replay(category="base", limit=10)
    print(report.to_json())
    raise SystemExit(report.exit_code)

How BFCL's entry fields are treated (as ``bfcl_eval`` itself does, see
``model_handler/base_handler.py`` and ``utils.populate_test_cases_with_predefined_functions``):

- ``involved_classes``: only these classes get instances (built from ``initial_config``
  with ``_load_scenario(deepcopy(config), long_context=...)``; stateless classes skip it);
  the tools of every other multi-turn class are withheld for the whole session.
- ``missed_function`` (``miss_func`` only): ``{"<turn index>": [names]}``; each name is
  withheld before that turn and offered from that turn on (BFCL adds its doc then).
- ``excluded_function``: withheld for the whole session. (``bfcl_eval`` 2026.3.23 reads
  this field nowhere in its code, so its own inference still offers these functions; no
  ground-truth call uses one, so the choice changes no result. ``withhold_excluded=False``
  mirrors BFCL exactly.)
- ``long_context`` is true for the ``long_context`` category only (BFCL: ``"long_context"
  in category or "composite" in category``).
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import math
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from rho_actors.tool import Error, ErrorKind, ToolCall, ToolResult

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = [
    "BFCL_VERSION",
    "CATEGORIES",
    "ERROR_PREFIX",
    "INSTALL_HINT",
    "MULTI_TURN_CLASSES",
    "BfclEntry",
    "BfclFunction",
    "BfclTool",
    "BfclUnavailableError",
    "CallParseError",
    "Difference",
    "ParsedCall",
    "Rejection",
    "ReplayReport",
    "StateDifference",
    "backend_class",
    "bind_arguments",
    "build_instances",
    "convert_schema",
    "execute_direct",
    "format_result",
    "load_entries",
    "load_functions",
    "make_tools",
    "parse_call",
    "public_state",
    "replay",
    "state_differences",
    "withheld_for_turn",
]

CATEGORIES: tuple[str, ...] = ("base", "miss_func", "miss_param", "long_context")
"""The BFCL multi-turn categories a replay can run."""

MULTI_TURN_CLASSES: tuple[str, ...] = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)
"""The backend classes of BFCL's multi-turn categories (their function names are unique)."""

BFCL_VERSION = "2026.3.23"
INSTALL_HINT = f"pip install --no-deps bfcl-eval=={BFCL_VERSION} mpmath"
"""The command that installs what a replay needs."""

ERROR_PREFIX = "Error during execution: "
"""BFCL's text for a call that raised: this prefix, then ``str(exception)``."""

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# BFCL's type names (bfcl_eval/constants/type_mappings.py GORILLA_TO_OPENAPI) mapped to
# JSON Schema's; ``None`` means "no type constraint" (BFCL's "any").
_TYPE_MAP: dict[str, str | None] = {
    "dict": "object",
    "object": "object",
    "HashMap": "object",
    "Hashtable": "object",
    "float": "number",
    "number": "number",
    "double": "number",
    "integer": "integer",
    "int": "integer",
    "long": "integer",
    "short": "integer",
    "byte": "integer",
    "Bigint": "integer",
    "string": "string",
    "str": "string",
    "String": "string",
    "char": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "tuple": "array",
    "ArrayList": "array",
    "Array": "array",
    "Queue": "array",
    "Stack": "array",
    "any": None,
    "Any": None,
    "null": "null",
}


class BfclUnavailableError(RuntimeError):
    """``bfcl_eval`` (or ``mpmath``, which its MathAPI needs) is not installed."""


class CallParseError(ValueError):
    """A ground-truth call string is not a plain call with literal arguments, or its
    arguments do not fit the method's signature."""


# --------------------------------------------------------------------------- package


def _bfcl_package() -> ModuleType:
    """Import ``bfcl_eval`` (and check ``mpmath``), or raise :class:`BfclUnavailableError`
    naming the install command."""
    try:
        bfcl_eval = importlib.import_module("bfcl_eval")
        importlib.import_module("mpmath")
    except ImportError as exc:
        raise BfclUnavailableError(
            f"the BFCL replay needs the bfcl_eval package and mpmath ({exc}); "
            f"install them with: {INSTALL_HINT}"
        ) from exc
    return bfcl_eval


def _bfcl_root() -> Path:
    """The installed ``bfcl_eval`` package directory."""
    return Path(str(_bfcl_package().__file__)).parent


def _backend_config() -> ModuleType:
    _bfcl_package()
    return importlib.import_module("bfcl_eval.constants.executable_backend_config")


def _read_json_lines(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _data_file(directory: Path, category: str) -> Path:
    matches = sorted(directory.glob(f"BFCL_v*_multi_turn_{category}.json"))
    if not matches:
        raise FileNotFoundError(f"no BFCL multi_turn_{category} data in {directory}")
    return matches[-1]


def backend_class(class_name: str) -> type:
    """The BFCL backend class named ``class_name`` (one of :data:`MULTI_TURN_CLASSES`),
    imported from the module BFCL's ``CLASS_FILE_PATH_MAPPING`` names."""
    module_name = _backend_config().CLASS_FILE_PATH_MAPPING[class_name]
    cls = getattr(importlib.import_module(module_name), class_name)
    assert isinstance(cls, type)
    return cls


# --------------------------------------------------------------------------- declarations


def convert_schema(bfcl_schema: Mapping[str, Any]) -> dict[str, Any]:
    """Convert a BFCL parameter block to a JSON Schema (Draft 2020-12), as a new dict.

    BFCL's type names become JSON Schema's: ``dict`` -> ``object``, ``float`` ->
    ``number``, ``tuple`` -> ``array``, ``any`` -> no ``type`` keyword at all (and the
    other aliases of BFCL's ``GORILLA_TO_OPENAPI``: ``bool``, ``list``, ``long``...).
    ``properties`` values, ``items`` (a schema, or a list of schemas which becomes
    ``prefixItems``), ``additionalProperties`` and ``anyOf``/``oneOf``/``allOf``
    members are converted recursively; every other keyword is kept as it is.

    Raises ``ValueError`` for a type name that is not known.
    """
    out: dict[str, Any] = {}
    for key, value in bfcl_schema.items():
        if key == "type":
            mapped = _convert_type(value)
            if mapped is not None:
                out["type"] = mapped
        elif key == "properties" and isinstance(value, Mapping):
            out["properties"] = {str(k): convert_schema(v) for k, v in value.items()}
        elif key == "items" and isinstance(value, Mapping):
            out["items"] = convert_schema(value)
        elif key == "items" and isinstance(value, list):
            out["prefixItems"] = [convert_schema(v) for v in value]
        elif key == "additionalProperties" and isinstance(value, Mapping):
            out["additionalProperties"] = convert_schema(value)
        elif key in ("anyOf", "oneOf", "allOf") and isinstance(value, list):
            out[key] = [convert_schema(v) for v in value]
        else:
            out[key] = copy.deepcopy(value)
    return out


def _convert_type(value: Any) -> str | list[str] | None:
    if isinstance(value, list):
        mapped = [_convert_type(v) for v in value]
        if any(m is None for m in mapped):
            return None  # "any" among the alternatives: no constraint
        return [m for m in mapped if isinstance(m, str)]
    if not isinstance(value, str) or value not in _TYPE_MAP:
        raise ValueError(f"unknown BFCL type name {value!r}")
    return _TYPE_MAP[value]


@dataclass(frozen=True, slots=True)
class BfclFunction:
    """One BFCL function doc: ``name``, owning backend ``class_name``, ``description``
    and the raw BFCL ``parameters`` block."""

    name: str
    class_name: str
    description: str
    parameters: dict[str, Any]


def load_functions(classes: Iterable[str] = MULTI_TURN_CLASSES) -> dict[str, BfclFunction]:
    """Read the function docs of ``classes`` from ``bfcl_eval/data/multi_turn_func_doc``
    (the files BFCL's ``MULTI_TURN_FUNC_DOC_FILE_MAPPING`` names), keyed by function name,
    in file order. Raises ``ValueError`` if two classes declare one name."""
    doc_files = _backend_config().MULTI_TURN_FUNC_DOC_FILE_MAPPING
    doc_dir = _bfcl_root() / "data" / "multi_turn_func_doc"
    functions: dict[str, BfclFunction] = {}
    for class_name in classes:
        for doc in _read_json_lines(doc_dir / doc_files[class_name]):
            name = doc["name"]
            if name in functions:
                raise ValueError(
                    f"function {name!r} is declared by both {functions[name].class_name} and {class_name}"
                )
            functions[name] = BfclFunction(name, class_name, doc["description"], doc["parameters"])
    return functions


# --------------------------------------------------------------------------- execution


def format_result(value: Any) -> str:
    """A method's return value as BFCL's checker formats it: a ``str`` as it is, a ``dict``
    as ``json.dumps`` (``str`` if that fails), anything else with ``str``."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except Exception:
            return str(value)
    return str(value)


def execute_direct(instance: object, name: str, args: Mapping[str, Any]) -> tuple[str, bool]:
    """Call ``instance.name(**args)`` the way BFCL's checker does.

    Returns ``(text, raised)``: the result formatted by :func:`format_result`, or, when
    the method raised an ``Exception``, BFCL's error text ``"Error during execution: {e}"``
    and ``True``.
    """
    try:
        value = getattr(instance, name)(**args)
    except Exception as exc:
        return f"{ERROR_PREFIX}{exc}", True
    return format_result(value), False


class BfclTool:
    """A BFCL backend method as a runtime tool (DESIGN §2).

    ``run(args, ctx)`` calls the method on ``ctx["deps"][class_name]`` (the session's
    instance) and returns BFCL's result text (a ``str``), or ``Error(text)`` with BFCL's
    error text when the method raised. Tools are ``"exclusive"``: the methods of a
    session share state, so a turn runs its calls one at a time, in order.
    """

    def __init__(self, function: BfclFunction) -> None:
        self.function = function
        self._schema = convert_schema(function.parameters)

    def __repr__(self) -> str:
        return f"BfclTool({self.function.class_name}.{self.function.name})"

    def name(self) -> str:
        return self.function.name

    def description(self) -> str:
        return self.function.description

    def parameter_schema(self) -> dict[str, Any]:
        return copy.deepcopy(self._schema)

    def concurrency(self) -> Literal["exclusive"]:
        return "exclusive"

    def run(self, args: dict[str, Any], ctx: Mapping[str, Any]) -> str | Error:
        deps = ctx.get("deps") or {}
        instance = deps.get(self.function.class_name) if isinstance(deps, Mapping) else None
        if instance is None:
            return Error(f"{ERROR_PREFIX}no {self.function.class_name} instance in this session")
        text, raised = execute_direct(instance, self.function.name, args)
        return Error(text) if raised else text


def make_tools(functions: Mapping[str, BfclFunction] | None = None) -> list[BfclTool]:
    """One :class:`BfclTool` per function (default: every function of the 8 multi-turn
    classes, from :func:`load_functions`)."""
    functions = load_functions() if functions is None else functions
    return [BfclTool(f) for f in functions.values()]


# --------------------------------------------------------------------------- call strings


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """A call string parsed without evaluation: function ``name``, ``positional``
    argument values and ``keywords`` (literals only)."""

    name: str
    positional: tuple[Any, ...]
    keywords: dict[str, Any]
    source: str


def parse_call(text: str) -> ParsedCall:
    """Parse ``text`` such as ``"cd(folder='document')"`` with :mod:`ast`, never
    evaluating it: the expression must be a call of a plain name whose arguments are
    literals (``ast.literal_eval`` on each argument node). Raises :class:`CallParseError`
    otherwise (not a call, a method or computed callee, ``*args``/``**kwargs``, a
    non-literal argument)."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise CallParseError(f"not a function call (syntax error: {exc.msg}): {text!r}") from exc
    node = tree.body
    if not isinstance(node, ast.Call):
        raise CallParseError(f"not a function call: {text!r}")
    if not isinstance(node.func, ast.Name):
        raise CallParseError(f"the callee is not a plain function name: {text!r}")
    positional: list[Any] = []
    for i, arg in enumerate(node.args):
        if isinstance(arg, ast.Starred):
            raise CallParseError(f"*args is not supported: {text!r}")
        positional.append(_literal(arg, f"positional argument {i}", text))
    keywords: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise CallParseError(f"**kwargs is not supported: {text!r}")
        keywords[kw.arg] = _literal(kw.value, f"argument {kw.arg!r}", text)
    return ParsedCall(node.func.id, tuple(positional), keywords, text)


def _literal(node: ast.expr, what: str, text: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise CallParseError(f"{what} is not a literal ({exc}): {text!r}") from exc


def bind_arguments(method: Callable[..., Any], call: ParsedCall) -> dict[str, Any]:
    """Bind ``call``'s positional and keyword arguments to parameter names by
    ``inspect.signature(method)`` (a bound method, or a function whose ``self`` was
    removed). Returns only the arguments the call gave (defaults are not filled in),
    as a name -> value dict. Raises :class:`CallParseError` when they do not fit the
    signature, or when a positional argument would land in ``*args``."""
    signature = inspect.signature(method)
    try:
        bound = signature.bind_partial(*call.positional, **call.keywords)
    except TypeError as exc:
        raise CallParseError(f"arguments do not fit {call.name}{signature}: {exc}: {call.source!r}") from exc
    out: dict[str, Any] = {}
    for pname, value in bound.arguments.items():
        kind = signature.parameters[pname].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            raise CallParseError(f"positional arguments past the named parameters: {call.source!r}")
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        else:
            out[pname] = value
    return out


# --------------------------------------------------------------------------- sessions


@dataclass(frozen=True, slots=True)
class BfclEntry:
    """One BFCL multi-turn conversation.

    ``ground_truth[i]`` lists the call strings of turn ``i``; ``missed`` maps a turn
    index to the function names BFCL reveals at that turn (``miss_func``);
    ``excluded`` lists ``excluded_function``; ``long_context`` says whether the
    backends load their long-context scenario.
    """

    id: str
    category: str
    involved_classes: tuple[str, ...]
    initial_config: dict[str, Any]
    ground_truth: tuple[tuple[str, ...], ...]
    excluded: tuple[str, ...] = ()
    missed: dict[int, tuple[str, ...]] = field(default_factory=dict)
    long_context: bool = False


def load_entries(
    category: str = "base", limit: int | None = None, ids: Iterable[str] | None = None
) -> list[BfclEntry]:
    """The entries of a multi-turn ``category`` (one of :data:`CATEGORIES`), in file
    order, each joined with its ground truth from ``bfcl_eval/data/possible_answer``:
    only those whose id is in ``ids`` (when given), then the first ``limit`` (all if
    ``None``). Raises ``ValueError`` for an unknown category or an id not found."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}; choose one of {', '.join(CATEGORIES)}")
    data_dir = _bfcl_root() / "data"
    rows = _read_json_lines(_data_file(data_dir, category))
    if ids is not None:
        wanted = set(ids)
        missing = wanted - {row["id"] for row in rows}
        if missing:
            raise ValueError(f"no entry {', '.join(sorted(missing))} in multi_turn_{category}")
        rows = [row for row in rows if row["id"] in wanted]
    if limit is not None:
        rows = rows[: max(0, limit)]
    answer_rows = _read_json_lines(_data_file(data_dir / "possible_answer", category))
    answers = {row["id"]: row["ground_truth"] for row in answer_rows}
    test_category = category if category.startswith("multi_turn") else f"multi_turn_{category}"
    long_context = "long_context" in test_category or "composite" in test_category
    entries = []
    for row in rows:
        truth = answers[row["id"]]
        entries.append(
            BfclEntry(
                id=row["id"],
                category=category,
                involved_classes=tuple(row["involved_classes"]),
                initial_config=row.get("initial_config", {}),
                ground_truth=tuple(tuple(turn) for turn in truth),
                excluded=tuple(row.get("excluded_function", ())),
                missed={int(k): tuple(v) for k, v in row.get("missed_function", {}).items()},
                long_context=long_context,
            )
        )
    return entries


def build_instances(entry: BfclEntry) -> dict[str, object]:
    """Fresh backend instances for ``entry``'s involved classes, keyed by class name,
    built as BFCL's ``execute_multi_turn_func_call`` does: ``cls()``, then (unless the
    class is in BFCL's ``STATELESS_CLASSES``) ``_load_scenario(deepcopy(config),
    long_context=entry.long_context)`` with ``config = initial_config.get(name, {})``."""
    stateless = set(_backend_config().STATELESS_CLASSES)
    instances: dict[str, object] = {}
    for class_name in entry.involved_classes:
        instance = backend_class(class_name)()
        if class_name not in stateless:
            config = entry.initial_config.get(class_name, {})
            instance._load_scenario(copy.deepcopy(config), long_context=entry.long_context)
        instances[class_name] = instance
    return instances


def withheld_for_turn(
    entry: BfclEntry,
    turn: int,
    functions: Mapping[str, BfclFunction],
    *,
    withhold_excluded: bool = True,
) -> set[str]:
    """The tool names a session withholds during ``turn`` (0-based): every function of a
    class not in ``involved_classes``, the ``excluded_function`` names (unless
    ``withhold_excluded`` is false), and each ``missed_function`` name before the turn
    that reveals it."""
    involved = set(entry.involved_classes)
    withheld = {name for name, f in functions.items() if f.class_name not in involved}
    if withhold_excluded:
        withheld.update(entry.excluded)
    for reveal_turn, names in entry.missed.items():
        if turn < reveal_turn:
            withheld.update(names)
    return withheld


def public_state(instance: object) -> dict[str, Any]:
    """An instance's public attributes (``vars``, names not starting with ``_``)."""
    return {k: v for k, v in vars(instance).items() if not k.startswith("_")}


def state_differences(got: object, expected: object) -> list[str]:
    """Names of the public attributes whose values differ (``!=``, deep for containers)
    between two instances of one class, or that only one of them has; sorted."""
    a, b = public_state(got), public_state(expected)
    return sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or a[k] != b[k])


# --------------------------------------------------------------------------- report


@dataclass(frozen=True, slots=True)
class Rejection:
    """A call the runtime refused before running it, as the data made it do.

    ``kind`` is ``"invalid_arguments"`` (the arguments failed the tool's schema) or
    ``"withheld"`` (BFCL's ground truth calls a function BFCL itself holds out at that
    turn); ``reason`` is the runtime's message; ``expected`` what direct execution gave.
    """

    entry_id: str
    turn: int
    call: str
    kind: str
    reason: str
    expected: str


@dataclass(frozen=True, slots=True)
class Difference:
    """A call whose runtime result differs from direct execution (or could not be made)."""

    entry_id: str
    turn: int
    call: str
    expected: str
    got: str
    expected_ok: bool
    got_ok: bool
    error_kind: str | None


@dataclass(frozen=True, slots=True)
class StateDifference:
    """A backend instance whose public state differs at the end of a session.

    ``attributes`` names the differing attributes; ``attributed_to_rejection`` is true
    when the session had a listed rejection (the refused call ran in direct execution
    only, so the states are expected to part)."""

    entry_id: str
    class_name: str
    attributes: tuple[str, ...]
    attributed_to_rejection: bool


def _percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class ReplayReport:
    """The outcome of :func:`replay` for one category.

    Counts: ``sessions`` (entries), ``turns`` (ground-truth turns, empty ones included),
    ``calls`` (ground-truth calls), ``identical`` (calls whose runtime result has the
    same text and the same ok/error status as direct execution). ``rejections`` are the
    listed refusals the data causes; ``differences`` every other mismatch;
    ``sessions_identical_state`` counts sessions whose every instance ends in the same
    public state as direct execution's; ``state_differences`` lists the others.

    Times: ``replay_wall_s`` is the sum over turns of the wall time of
    ``loop.run_turn`` (seconds); ``direct_wall_s`` the sum over calls of the direct
    method call plus BFCL formatting (seconds). Whole sessions:
    ``replay_sessions_wall_s`` adds to the turns each session's set-up and tear-down
    through the runtime (building its backend instances, ``start_loop``,
    ``set_withheld``, ``loop.stop``); ``direct_sessions_wall_s`` adds to the direct calls
    the building of the direct instances, which is all direct execution needs.
    ``total_wall_s`` is the whole replay (loading data, registering tools, both sides,
    the comparisons, system start and stop).

    Per-call overhead, in microseconds, for each call the runtime ran (refused calls
    excluded): ``overhead_us`` = the call's wall time in the runtime, from its
    ``started`` event (the loop dispatching it to a CallActor) to its ``finished`` event
    (the loop settling its result), both stamped with ``time.perf_counter()`` in the
    loop's thread by a :meth:`ActorSystem.subscribe` callback, minus the direct
    execution time of the same call (method call plus BFCL formatting).
    ``turn_overhead_us`` = (wall time of ``run_turn`` minus the summed direct times of
    the turn's calls) / calls in the turn, assigned to each call of the turn, so it
    also counts the host's round trip, argument decoding and validation. Each is
    summarised as ``{"n", "p50", "p99", "mean"}`` (nearest-rank percentiles).
    """

    category: str
    sessions: int = 0
    turns: int = 0
    calls: int = 0
    identical: int = 0
    rejections: list[Rejection] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    sessions_identical_state: int = 0
    state_differences: list[StateDifference] = field(default_factory=list)
    declaration_failures: list[dict[str, str]] = field(default_factory=list)
    tools_registered: int = 0
    replay_wall_s: float = 0.0
    direct_wall_s: float = 0.0
    replay_sessions_wall_s: float = 0.0
    direct_sessions_wall_s: float = 0.0
    total_wall_s: float = 0.0
    overhead_samples_us: list[float] = field(default_factory=list, repr=False)
    tree: dict[str, Any] | None = field(default=None, repr=False)
    turn_overhead_samples_us: list[float] = field(default_factory=list, repr=False)

    @property
    def unexplained_state_differences(self) -> list[StateDifference]:
        """State differences not attributed to a listed rejection."""
        return [d for d in self.state_differences if not d.attributed_to_rejection]

    @property
    def exit_code(self) -> int:
        """0 when every result and state matched except for listed rejections (and every
        declaration passed its checks), else 1."""
        clean = not self.differences and not self.unexplained_state_differences and not self.declaration_failures
        return 0 if clean else 1

    @staticmethod
    def _summary(samples: Sequence[float]) -> dict[str, float | int | None]:
        return {
            "n": len(samples),
            "p50": _round(_percentile(samples, 50)),
            "p99": _round(_percentile(samples, 99)),
            "mean": _round(sum(samples) / len(samples)) if samples else None,
        }

    @property
    def overhead_us(self) -> dict[str, float | int | None]:
        """Per-call overhead summary (dispatch to settled result), in microseconds
        (see the class doc)."""
        return self._summary(self.overhead_samples_us)

    @property
    def turn_overhead_us(self) -> dict[str, float | int | None]:
        """Per-call whole-turn overhead summary in microseconds (see the class doc)."""
        return self._summary(self.turn_overhead_samples_us)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON data (the keys of :meth:`to_json`)."""
        return {
            "category": self.category,
            "sessions": self.sessions,
            "turns": self.turns,
            "calls": self.calls,
            "identical": self.identical,
            "rejected": len(self.rejections),
            "rejections": [asdict(r) for r in self.rejections],
            "different": len(self.differences),
            "differences": [asdict(d) for d in self.differences],
            "sessions_identical_state": self.sessions_identical_state,
            "state_differences": [asdict(d) | {"attributes": list(d.attributes)} for d in self.state_differences],
            "declaration_failures": list(self.declaration_failures),
            "tools_registered": self.tools_registered,
            "replay_wall_s": round(self.replay_wall_s, 6),
            "direct_wall_s": round(self.direct_wall_s, 6),
            "replay_sessions_wall_s": round(self.replay_sessions_wall_s, 6),
            "direct_sessions_wall_s": round(self.direct_sessions_wall_s, 6),
            "total_wall_s": round(self.total_wall_s, 6),
            "overhead_us": self.overhead_us,
            "turn_overhead_us": self.turn_overhead_us,
            "exit_code": self.exit_code,
            **({"tree": self.tree} if self.tree is not None else {}),
        }

    def to_json(self, indent: int | None = None) -> str:
        """The report as one JSON object (text)."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    def render(self) -> RenderableType:
        """A rich renderable of the summary and of every rejection and difference."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        def us(summary: Mapping[str, Any]) -> str:
            if not summary["n"]:
                return "n/a"
            return f"p50 {summary['p50']:.0f} us, p99 {summary['p99']:.0f} us, mean {summary['mean']:.0f} us"

        table = Table(title=f"BFCL multi_turn_{self.category} replay", show_header=False)
        table.add_column(style="bold")
        table.add_column()
        rows = [
            ("sessions", str(self.sessions)),
            ("turns", str(self.turns)),
            ("calls", str(self.calls)),
            ("identical results", f"{self.identical}/{self.calls}"),
            ("rejected (listed below)", str(len(self.rejections))),
            ("other differences", str(len(self.differences))),
            ("sessions with identical state", f"{self.sessions_identical_state}/{self.sessions}"),
            ("replay wall time", f"{self.replay_wall_s:.3f} s (run_turn)"),
            ("direct wall time", f"{self.direct_wall_s:.3f} s"),
            ("replay wall time, whole sessions", f"{self.replay_sessions_wall_s:.3f} s"),
            ("direct wall time, whole sessions", f"{self.direct_sessions_wall_s:.3f} s"),
            ("total wall time", f"{self.total_wall_s:.3f} s"),
            ("overhead per call (dispatch to result)", us(self.overhead_us)),
            ("overhead per call (whole turn)", us(self.turn_overhead_us)),
        ]
        for k, v in rows:
            table.add_row(k, v)
        parts: list[RenderableType] = [table]
        for r in self.rejections:
            parts.append(Text(f"rejected [{r.kind}] {r.entry_id} turn {r.turn}: {r.call}\n  reason: {r.reason}"))
        for d in self.differences:
            parts.append(
                Text(
                    f"DIFFERENT {d.entry_id} turn {d.turn}: {d.call}\n"
                    f"  expected ({'ok' if d.expected_ok else 'error'}): {_clip(d.expected)}\n"
                    f"  got ({'ok' if d.got_ok else d.error_kind}): {_clip(d.got)}",
                    style="red",
                )
            )
        for s in self.state_differences:
            why = "attributed to the rejection in this session" if s.attributed_to_rejection else "UNEXPLAINED"
            parts.append(
                Text(
                    f"state differs {s.entry_id} {s.class_name}: {', '.join(s.attributes)} ({why})",
                    style="" if s.attributed_to_rejection else "red",
                )
            )
        for f in self.declaration_failures:
            parts.append(Text(f"declaration failed {f['name']}: {f['reason']}", style="red"))
        verdict = "OK" if self.exit_code == 0 else "FAILED"
        parts.append(Text(f"{verdict} (exit code {self.exit_code})", style="green" if self.exit_code == 0 else "red"))
        return Group(*parts)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


# --------------------------------------------------------------------------- replay


@dataclass(frozen=True, slots=True)
class _PlannedCall:
    call_id: str
    source: str
    name: str
    direct_args: dict[str, Any]
    arguments_json: str


def _plan_call(
    source: str, call_id: str, functions: Mapping[str, BfclFunction], instances: Mapping[str, object]
) -> _PlannedCall:
    parsed = parse_call(source)
    function = functions.get(parsed.name)
    if function is None:
        raise CallParseError(f"{parsed.name!r} is not a function of the multi-turn classes: {source!r}")
    instance = instances.get(function.class_name)
    method = getattr(instance if instance is not None else backend_class(function.class_name)(), parsed.name)
    args = bind_arguments(method, parsed)
    return _PlannedCall(call_id, source, parsed.name, args, json.dumps(args))


def replay(
    category: str = "base",
    limit: int | None = None,
    progress: bool = False,
    *,
    ids: Iterable[str] | None = None,
    withhold_excluded: bool = True,
    data_dir: Path | None = None,
    tree: bool = False,
) -> ReplayReport:
    """Replay the first ``limit`` (all if ``None``) conversations of BFCL's
    ``multi_turn_{category}`` through an :class:`~rho_actors.ActorSystem` and compare.

    One system registers the tools of the 8 multi-turn classes once; each entry is one
    loop (session id = entry id) whose ``deps`` are its backend instances, with the
    withheld set of :func:`withheld_for_turn` updated between turns. Each ground-truth
    turn is one ``run_turn`` of ``ToolCall`` values with JSON-text arguments; each call
    is also executed directly (:func:`execute_direct`) on a second, separate set of
    instances, and at the end of the session the public states are compared.

    ``progress`` shows a rich progress bar on stderr. ``ids`` restricts the replay to
    those entry ids (see :func:`load_entries`). ``data_dir`` is the system's data
    directory (a temporary one if ``None``). ``tree`` keeps the system's supervision
    tree, taken after the last session, in :attr:`ReplayReport.tree`. Returns a :class:`ReplayReport`; raises
    :class:`BfclUnavailableError` when ``bfcl_eval`` is missing and ``ValueError`` for an
    unknown category.
    """
    started = time.perf_counter()
    entries = load_entries(category, limit, ids)
    functions = load_functions()
    validator_class = importlib.import_module("jsonschema").Draft202012Validator
    validators = {name: validator_class(convert_schema(f.parameters)) for name, f in functions.items()}
    report = ReplayReport(category=category)

    from rho_actors import ActorSystem

    with (
        tempfile.TemporaryDirectory(prefix="rho-bfcl-") as tmp,
        ActorSystem(data_dir=data_dir if data_dir is not None else Path(tmp)) as system,
    ):
        clock = _CallClock()
        system.subscribe(clock)
        for tool in make_tools(functions):
            # An explicit origin names the BFCL method in messages (and skips a source lookup).
            origin = f"bfcl_eval {tool.function.class_name}.{tool.function.name} via rho_actors.bfcl.BfclTool"
            registration = system.register(tool, origin=origin)
            if registration.info is None:
                report.declaration_failures.append({"name": tool.name(), "reason": str(registration.reason)})
            else:
                report.tools_registered += 1
        with _progress_bar(progress, len(entries), category) as advance:
            for entry in entries:
                _Session(system, entry, functions, validators, report, withhold_excluded, clock).run()
                clock.clear()
                advance()
        if tree:
            report.tree = system.tree()
    report.total_wall_s = time.perf_counter() - started
    return report


class _CallClock:
    """Stamps each call's ``started`` and ``finished`` events with ``perf_counter``
    (seconds); called in the loop's thread, as the runtime emits them."""

    def __init__(self) -> None:
        self._started: dict[tuple[str, str], float] = {}
        self._finished: dict[tuple[str, str], float] = {}

    def __call__(self, event: Any) -> None:
        now = time.perf_counter()
        key = (event.session_id, event.call_id)
        if event.kind == "started":
            self._started[key] = now
        elif event.kind in ("finished", "timed_out"):
            self._finished[key] = now

    def wall_s(self, session_id: str, call_id: str) -> float | None:
        """Seconds from the call's dispatch to its result, or ``None`` if not seen."""
        key = (session_id, call_id)
        start, end = self._started.get(key), self._finished.get(key)
        return None if start is None or end is None else end - start

    def clear(self) -> None:
        self._started.clear()
        self._finished.clear()


class _NoProgress:
    def __enter__(self) -> Callable[[], None]:
        return lambda: None

    def __exit__(self, *exc: object) -> None:
        return None


class _RichProgress:
    def __init__(self, total: int, category: str) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]replay bfcl {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task = self._progress.add_task(category, total=total)

    def __enter__(self) -> Callable[[], None]:
        self._progress.start()
        return lambda: self._progress.advance(self._task)

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()


def _progress_bar(enabled: bool, total: int, category: str) -> _NoProgress | _RichProgress:
    return _RichProgress(total, category) if enabled else _NoProgress()


def _kind(result: ToolResult) -> str | None:
    return None if result.error_kind is None else str(result.error_kind)


@dataclass(frozen=True, slots=True)
class _Direct:
    text: str
    raised: bool
    elapsed_s: float


class _Session:
    """One entry replayed: a loop over runtime instances, direct execution on a second,
    separate set, the comparison of every result and of the final states."""

    def __init__(
        self,
        system: Any,
        entry: BfclEntry,
        functions: Mapping[str, BfclFunction],
        validators: Mapping[str, Any],
        report: ReplayReport,
        withhold_excluded: bool,
        clock: _CallClock,
    ) -> None:
        self.system, self.entry, self.functions, self.validators = system, entry, functions, validators
        self.report, self.withhold_excluded, self.clock = report, withhold_excluded, clock
        t0 = time.perf_counter()
        self.runtime_instances = build_instances(entry)
        t1 = time.perf_counter()
        self.direct_instances = build_instances(entry)
        report.replay_sessions_wall_s += t1 - t0
        report.direct_sessions_wall_s += time.perf_counter() - t1
        self.rejected = False
        self.withheld: set[str] = set()

    def run(self) -> None:
        entry, report = self.entry, self.report
        report.sessions += 1
        self.withheld = self._withheld(0)
        t0 = time.perf_counter()
        loop = self.system.start_loop(session_id=entry.id, withheld=sorted(self.withheld), deps=self.runtime_instances)
        report.replay_sessions_wall_s += time.perf_counter() - t0
        try:
            for turn_index, turn in enumerate(entry.ground_truth):
                report.turns += 1
                withheld = self._withheld(turn_index)
                if withheld != self.withheld:
                    t0 = time.perf_counter()
                    loop.set_withheld(sorted(withheld))
                    report.replay_sessions_wall_s += time.perf_counter() - t0
                    self.withheld = withheld
                if turn:
                    self._turn(loop, turn_index, turn)
        finally:
            t0 = time.perf_counter()
            loop.stop()
            report.replay_sessions_wall_s += time.perf_counter() - t0
        self._compare_states()

    def _withheld(self, turn_index: int) -> set[str]:
        return withheld_for_turn(self.entry, turn_index, self.functions, withhold_excluded=self.withhold_excluded)

    def _turn(self, loop: Any, turn_index: int, turn: Sequence[str]) -> None:
        report = self.report
        report.calls += len(turn)
        planned: list[_PlannedCall] = []
        for j, source in enumerate(turn):
            try:
                planned.append(_plan_call(source, f"t{turn_index}c{j}", self.functions, self.direct_instances))
            except CallParseError as exc:
                got = f"unreplayable call: {exc}"
                report.differences.append(Difference(self.entry.id, turn_index, source, "", got, True, False, None))
        if not planned:
            return
        calls = [ToolCall(id=p.call_id, name=p.name, arguments=p.arguments_json) for p in planned]
        t0 = time.perf_counter()
        try:
            results: list[ToolResult] = list(loop.run_turn(calls))
            turn_error: str | None = None
        except Exception as exc:  # a runtime failure: every call of the turn differs
            results = []
            turn_error = f"run_turn raised {type(exc).__name__}: {exc}"
        turn_wall = time.perf_counter() - t0
        report.replay_wall_s += turn_wall
        report.replay_sessions_wall_s += turn_wall

        direct = [self._direct(p) for p in planned]
        by_id = {r.call_id: r for r in results}
        ran: list[_Direct] = []
        for p, d in zip(planned, direct, strict=True):
            result = by_id.get(p.call_id)
            if result is None:
                got = turn_error or f"no result for call id {p.call_id} (results: {[r.call_id for r in results]})"
                report.differences.append(
                    Difference(self.entry.id, turn_index, p.source, d.text, got, not d.raised, False, None)
                )
            elif self._compare(turn_index, p, d, result):
                ran.append(d)
        if ran and turn_error is None:
            per_call = (turn_wall - sum(d.elapsed_s for d in ran)) * 1e6 / len(ran)
            report.turn_overhead_samples_us.extend([per_call] * len(ran))

    def _direct(self, p: _PlannedCall) -> _Direct:
        instance = self.direct_instances[self.functions[p.name].class_name]
        t0 = time.perf_counter()
        text, raised = execute_direct(instance, p.name, p.direct_args)
        elapsed = time.perf_counter() - t0
        self.report.direct_wall_s += elapsed
        self.report.direct_sessions_wall_s += elapsed
        return _Direct(text, raised, elapsed)

    def _compare(self, turn_index: int, p: _PlannedCall, d: _Direct, result: ToolResult) -> bool:
        """Record the outcome of one call; returns whether the runtime ran it."""
        report, entry_id = self.report, self.entry.id
        # Refusals are checked independently: a listed rejection must be one the data
        # causes (arguments failing the converted schema, or a function BFCL holds out at
        # this turn); any other refusal, or running a call whose arguments fail the
        # schema, is a difference.
        schema_ok = self.validators[p.name].is_valid(json.loads(p.arguments_json))
        if (result.error_kind is ErrorKind.INVALID_ARGUMENTS and not schema_ok) or (
            result.error_kind is ErrorKind.WITHHELD and p.name in self.withheld
        ):
            self.rejected = True
            kind = str(result.error_kind)
            report.rejections.append(Rejection(entry_id, turn_index, p.source, kind, result.content, d.text))
            return False
        if not schema_ok and p.name not in self.withheld and result.error_kind is not ErrorKind.INVALID_ARGUMENTS:
            got = f"[the runtime did not refuse arguments that fail the schema] {result.content}"
            report.differences.append(
                Difference(entry_id, turn_index, p.source, d.text, got, not d.raised, result.ok, _kind(result))
            )
            return False
        call_wall = self.clock.wall_s(entry_id, p.call_id)
        if call_wall is not None:
            report.overhead_samples_us.append((call_wall - d.elapsed_s) * 1e6)
        if result.content == d.text and result.ok == (not d.raised):
            report.identical += 1
        else:
            got = result.content
            report.differences.append(
                Difference(entry_id, turn_index, p.source, d.text, got, not d.raised, result.ok, _kind(result))
            )
        return True

    def _compare_states(self) -> None:
        same = True
        for class_name in self.entry.involved_classes:
            differing = state_differences(self.runtime_instances[class_name], self.direct_instances[class_name])
            if differing:
                same = False
                self.report.state_differences.append(
                    StateDifference(self.entry.id, class_name, tuple(differing), self.rejected)
                )
        if same:
            self.report.sessions_identical_state += 1
