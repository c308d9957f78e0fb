"""Conversion between BFCL and rho_actors: BFCL's declarations as checked JSON
Schemas, its backend methods as tools, its call strings as arguments (internal to
:mod:`rho_actors.integrations.bfcl`).
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rho_actors.integrations.bfcl.data import (
    ERROR_PREFIX,
    MULTI_TURN_CLASSES,
    BfclFunction,
    CallParseError,
    backend_config,
    bfcl_root,
    read_json_lines,
)
from rho_actors.tool import Error

__all__ = [
    "NAME_RE",
    "BfclFunction",
    "BfclTool",
    "ParsedCall",
    "bind_arguments",
    "convert_schema",
    "execute_direct",
    "format_result",
    "load_functions",
    "make_tools",
    "parse_call",
]

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

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


def load_functions(classes: Iterable[str] = MULTI_TURN_CLASSES) -> dict[str, BfclFunction]:
    """Read the function docs of ``classes`` from ``bfcl_eval/data/multi_turn_func_doc``
    (the files BFCL's ``MULTI_TURN_FUNC_DOC_FILE_MAPPING`` names), keyed by function name,
    in file order. Raises ``ValueError`` if two classes declare one name."""
    doc_files = backend_config().MULTI_TURN_FUNC_DOC_FILE_MAPPING
    doc_dir = bfcl_root() / "data" / "multi_turn_func_doc"
    functions: dict[str, BfclFunction] = {}
    for class_name in classes:
        for doc in read_json_lines(doc_dir / doc_files[class_name]):
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
            return "".join(_ENCODE(value, 0)) if _ENCODE is not None else json.dumps(value)
        except Exception:  # not JSON data, or a cycle (json.dumps' ValueError, a RecursionError here)
            return str(value)
    return str(value)


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# what json.dumps(value) runs for a dict, with its defaults, made once (its three frames and an encoder a call
# left out): the C encoder, without json's check for cycles (a cycle raises RecursionError instead)
_ENCODE: Callable[[Any, int], Iterable[str]] | None = (
    None if json.encoder.c_make_encoder is None else  # type: ignore[attr-defined]
    json.encoder.c_make_encoder(None, _not_json, json.encoder.encode_basestring_ascii,  # type: ignore[attr-defined]
                                None, ": ", ", ", False, False, True))


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
    instance), or, when ``ctx["deps"]["server"]`` names a server holding the session's
    :class:`~rho_actors.integrations.bfcl.backends.BfclBackends`, on that server; it
    returns BFCL's result text (a ``str``), or ``Error(text)`` with BFCL's error text
    when the method raised. Tools are ``"exclusive"``: the methods of a
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
        mapping = type(deps) is dict or isinstance(deps, Mapping)  # a dict, the usual case: no ABC look
        server = deps.get("server") if mapping else None
        if isinstance(server, str):  # the session's backends live in a server (replay(isolation=...))
            from rho_actors.isolation.servers import call_server

            text, raised = call_server(ctx, server, "call", self.function.class_name, self.function.name, args)
            return Error(text) if raised else text
        instance = deps.get(self.function.class_name) if mapping else None
        if instance is None:
            return Error(f"{ERROR_PREFIX}no {self.function.class_name} instance in this session")
        try:  # execute_direct, inline (no frame for it on every call)
            value = getattr(instance, self.function.name)(**args)
        except Exception as exc:
            return Error(f"{ERROR_PREFIX}{exc}")
        if type(value) is str:  # format_result, inline (its frame on every call)
            return value
        if type(value) is dict and _ENCODE is not None:
            try:
                return "".join(_ENCODE(value, 0))
            except Exception:  # not JSON data, or a cycle
                return str(value)
        return format_result(value)


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
