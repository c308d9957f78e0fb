"""Every message between the host and a sandbox child, encoded and decoded (internal).

Each frame of a :class:`~rho_actors.sandbox.channel.Channel` carries a type tag; this
module names the tags, the size limit of what a child may send, and the encoding of
each message type:

=================  =========  ========================================================
tag                direction  body
=================  =========  ========================================================
``READY``          child ->   empty: a worker is ready (a read's child: started)
``CALL``           -> child   a :class:`CallRequest` (pickled: it comes from the host)
``LOAD``           -> child   ``(digest, tool bytes)`` pickled: a tool to hold ahead of its calls
``LOADED``         child ->   empty: the ``LOAD`` frame's tool was unpickled (or could not be: its call says why)
``NEED_TOOL``      child ->   empty: the worker does not hold the request's tool; resend with it
``RESULT``         child ->   a ``ToolResult``, in the worker's :class:`ResultCodec`
``RESULT_RETIRE``  child ->   the same, and the worker should be retired (it ran out of memory)
``DECLARATION``    child ->   a declaration read's answer: JSON text
``SELFTEST``       child ->   a selftest's answer: JSON text
``DISCOVERY``      child ->   which tools a plugin file holds: JSON text
``SERVE``          -> child   a server call: ``(method, args, kwargs)`` pickled (host data)
``SERVED``         child ->   a server's answer (or its start's failure), in its codec:
                              :func:`encode_served` / :func:`decode_served`
=================  =========  ========================================================

What comes back from a worker is decoded by its :class:`ResultCodec`, looked up by name
in :data:`CODECS`, a property of the worker: ``"plain"`` (msgpack of plain data,
validated field by field: the default, and the only codec of a worker that runs
untrusted code) or ``"pickle"`` (``details`` may be any picklable object; decoding runs
code, so trusted workers only). Every frame a child sends is bounded
(:data:`MAX_REPLY_BYTES`, :data:`MAX_DECLARATION_BYTES`, :data:`MAX_SELFTEST_BYTES`);
control frames have empty bodies; any other tag, size or shape is a protocol violation.
Nothing a child sends is ever unpickled by the host, except by a trusted pickle worker.
"""

from __future__ import annotations

import contextvars
import json
import math
import pickle
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Protocol

import cloudpickle
import msgpack

from rho_actors.bounded_json import loads_bounded
from rho_actors.cancel import CancelToken
from rho_actors.encoding import describe_exception, replace_controls, scrub_strings, scrub_text
from rho_actors.sandbox.context_values import plain_values
from rho_actors.tool import MAX_URI_CHARS, Audio, Block, ErrorKind, Image, Resource, ToolResult

__all__ = [
    "CALL",
    "LOAD",
    "LOADED",
    "CONTEXT_VALUES",
    "PORTABLE_CTX",
    "CODECS",
    "DECLARATION",
    "DISCOVERY",
    "MAX_CONTENT_CHARS",
    "MAX_DECLARATION_BYTES",
    "MAX_DETAILS_BYTES",
    "MAX_IMAGES",
    "MAX_IMAGE_BYTES",
    "MAX_PLAIN_DEPTH",
    "MAX_REPLY_BYTES",
    "MAX_SELFTEST_BYTES",
    "NEED_TOOL",
    "READY",
    "RESULT",
    "RESULT_RETIRE",
    "SELFTEST",
    "SERVE",
    "SERVED",
    "UNTRUSTED_DATA_DIR",
    "CallRequest",
    "PickleCodec",
    "PlainCodec",
    "ResultCodec",
    "WireError",
    "WorkerCall",
    "call_request",
    "child_text",
    "decode_call",
    "decode_json",
    "decode_served",
    "encode_call",
    "encode_json",
    "encode_served",
    "plain_problem",
    "short_name",
]

READY: Final = b"R"
CALL: Final = b"C"
LOAD: Final = b"L"
LOADED: Final = b"O"
NEED_TOOL: Final = b"N"
RESULT: Final = b"A"
RESULT_RETIRE: Final = b"X"
DECLARATION: Final = b"D"
SELFTEST: Final = b"S"
DISCOVERY: Final = b"F"
SERVE: Final = b"V"
SERVED: Final = b"W"

MAX_DECLARATION_BYTES: Final = 32 * 2**20
"""A declaration child's answer longer than this is refused as malformed."""
MAX_SELFTEST_BYTES: Final = 64 * 1024
"""A selftest child's answer longer than this is refused as malformed."""
MAX_REPLY_BYTES: Final = 64 * 2**20
"""A worker's frame longer than this is a protocol violation (the worker is killed)."""
MAX_CONTENT_CHARS: Final = 16 * 2**20
"""The longest ``content`` a worker may send back, in characters (the call's own
``max_output_chars`` cap is applied in the worker)."""
MAX_DETAILS_BYTES: Final = 2**20
"""The longest ``details`` of a plain-data result, as msgpack bytes."""
MAX_IMAGES: Final = 16
"""The most images of one plain-data result."""
MAX_IMAGE_BYTES: Final = 20 * 2**20
"""The largest image of a plain-data result, in bytes: the largest any provider takes
(OpenAI 20 MB per image; Anthropic 5 MB). A larger one is refused when decoded."""
MAX_BLOCKS: Final = 64
"""The most content blocks (text, images, sounds, resources) of one plain-data result."""
MAX_MEDIA_BYTES: Final = MAX_IMAGE_BYTES
"""The largest sound or resource blob of a plain-data result, in bytes (an image's bound)."""
MAX_PLAIN_DEPTH: Final = 100
"""Plain data nested deeper than this is refused."""


class WireError(Exception):
    """A message could not be encoded or decoded; ``str(err)`` says why."""


@dataclass(frozen=True, slots=True)
class CallRequest:
    """One call for a worker: the tool's ``digest`` and pickled bytes (``tool_bytes``
    is ``None`` when the worker is expected to hold the tool already), the checked
    ``name``, ``call_id``, ``args``, the plain ``fields`` of ``ctx``, ``deps`` pickled
    (or ``None``), the ``deadline`` (``time.monotonic()`` instant), ``timeout_ms`` and
    ``max_chars`` (the cap of the result's text)."""

    digest: bytes
    tool_bytes: bytes | None
    name: str
    call_id: str
    args: dict[str, Any]
    fields: dict[str, Any]
    deps_bytes: bytes | None
    deadline: float
    timeout_ms: int
    max_chars: int


_CALL_FIELDS: Final = tuple(f.name for f in fields(CallRequest))  # a CALL body's order (encode_call's)
_NO_DEPS: Final = pickle.dumps({}, protocol=pickle.HIGHEST_PROTOCOL)  # no deps' bytes, made once (not per call)

CONTEXT_VALUES: Final = "context_values"
"""The request field holding the caller's plain-data ``contextvars`` (name -> value)."""

PORTABLE_CTX: Final = ("session_id", "call_id", "data_dir", "withheld", "traceparent")
"""The ``ctx`` keys that travel to another process (DESIGN §2's table): plain values."""


def short_name(tool: Any) -> str:
    """A name for results when the caller gave none, without calling the tool's code."""
    name = getattr(tool, "__name__", None)
    return name if isinstance(name, str) else type(tool).__name__


@dataclass(frozen=True, slots=True)
class WorkerCall:
    """One call for another process (a worker process, a Ray task), as the host holds it:
    cut from the isolation's ``CallSpec`` (:func:`rho_actors.isolation.base.worker_call`)
    or made by :meth:`of`. ``call_id`` and ``name`` (the tool's checked name) go into the
    result; ``tool`` is shipped (once per ``version``, compared by identity: see
    :class:`~rho_actors.sandbox.shipping.ShippedTools`); ``ctx`` is the host's ctx, of
    which :func:`call_request` cuts what travels; ``started`` (where ``duration_ms``
    counts from) and ``deadline`` are ``time.monotonic()`` instants (seconds),
    ``timeout_ms`` the call's budget (ms), ``max_output_chars`` the cap of its text.
    ``cancel`` set kills the process running it. ``context``: the submitter's
    ``contextvars`` (their plain values travel by name). ``deps``: ``None`` for a trusted
    tool (its ctx's ``deps`` travel, when picklable); an untrusted tool's registered plain
    ``deps``, which replace the session's (see :func:`call_request`). ``start_by``: the
    instant by which a worker must have the call (waiting for a slot, a free worker or a
    new one's start); the tool then gets ``timeout_ms`` from when its worker has it, at
    most until ``deadline`` (``None``: ``deadline`` bounds both)."""

    call_id: str
    name: str
    tool: Any
    args: Mapping[str, Any]
    ctx: Mapping[str, Any]
    started: float
    deadline: float
    timeout_ms: int
    max_output_chars: int
    cancel: CancelToken | None = None
    context: contextvars.Context | None = None
    version: object = None
    deps: Mapping[str, Any] | None = None
    start_by: float | None = None

    @property
    def untrusted(self) -> bool:
        """Whether this is an untrusted tool's call (it has its registered ``deps``)."""
        return self.deps is not None

    @classmethod
    def of(
        cls, tool: Any, args: Mapping[str, Any], ctx: Mapping[str, Any], deadline: float, max_output_chars: int, *,
        name: str | None = None, started: float | None = None, cancel: CancelToken | None = None,
        version: object = None, context: contextvars.Context | None = None,
    ) -> WorkerCall:
        """A trusted tool's call made from its parts, for a caller without a ``CallSpec``:
        ``call_id`` from ``ctx``, ``name`` by default the tool's ``__name__`` or type
        name, ``started`` by default now, ``timeout_ms`` from ``started`` to ``deadline``."""
        start = time.monotonic() if started is None else started
        return cls(str(ctx.get("call_id", "")), name if name is not None else short_name(tool), tool, args, ctx, start,
                   deadline, round((deadline - start) * 1000), max_output_chars, cancel, context, version)


UNTRUSTED_DATA_DIR: Final = Path(".")
"""``ctx["data_dir"]`` of an untrusted call in its worker: the worker's private folder
(its working directory; the session's folder stays closed to it)."""


def call_request(digest: bytes, call: WorkerCall) -> CallRequest:
    """The :class:`CallRequest` of ``call`` for another process (a worker, a Ray task), the
    tool not attached (``digest`` names it): the portable part of its ``ctx``
    (:data:`PORTABLE_CTX`, ``withheld`` as a tuple, absent keys left out but
    ``session_id``, ``call_id``, ``data_dir`` and ``withheld``), ``deps`` pickled (left
    out when it cannot be) and the plain values of ``call.context`` by name. An untrusted
    call (``call.deps`` given) gets those ``deps`` instead of the session's,
    :data:`UNTRUSTED_DATA_DIR` as ``data_dir``, and no ``contextvars``. The other side
    rebuilds the ctx in :func:`rho_actors.sandbox.worker.serve_request`. Never raises."""
    ctx = call.ctx
    fields: dict[str, Any] = {
        "session_id": ctx.get("session_id"),
        "call_id": ctx.get("call_id"),
        "data_dir": UNTRUSTED_DATA_DIR if call.untrusted else ctx.get("data_dir"),
        "withheld": tuple(ctx.get("withheld", ())),
    }
    if "traceparent" in ctx:  # the call's span, which the tool's own spans join
        fields["traceparent"] = ctx["traceparent"]
    context_values = {} if call.untrusted else plain_values(call.context)
    if context_values:
        fields[CONTEXT_VALUES] = context_values
    if not call.untrusted:
        deps = _pickled_deps(ctx)
    else:  # plain JSON data; none (the usual) have their bytes made once
        deps = _pickled_deps({"deps": dict(call.deps)}) if call.deps else _NO_DEPS
    return CallRequest(digest, None, call.name, call.call_id, dict(call.args), fields, deps, call.deadline,
                       call.timeout_ms, call.max_output_chars)


def _pickled_deps(ctx: Mapping[str, Any]) -> bytes | None:
    """``ctx["deps"]`` pickled, or ``None`` when absent or not picklable (left out)."""
    if "deps" not in ctx:
        return None
    try:
        return bytes(cloudpickle.dumps(ctx["deps"], protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        return None


def encode_call(request: CallRequest, *, deadline: float | None = None, tool_bytes: bytes | None = None) -> bytes:
    """``request`` as a ``CALL`` body (a pickled tuple), ``deadline`` and ``tool_bytes`` in place of its own
    when given (no copy made). Raises :class:`WireError` when its arguments or context cannot be pickled."""
    r = request
    data = (r.digest, r.tool_bytes if tool_bytes is None else tool_bytes, r.name, r.call_id, r.args, r.fields,
            r.deps_bytes, r.deadline if deadline is None else deadline, r.timeout_ms, r.max_chars)
    try:
        return pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        try:
            return bytes(cloudpickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception as exc:
            raise WireError(describe_exception(exc)) from None


def decode_call(body: bytes) -> CallRequest:
    """A ``CALL`` body back as a :class:`CallRequest` (in the worker). Raises
    :class:`WireError` when it is not one."""
    data = pickle.loads(body)
    if type(data) is not tuple or len(data) != len(_CALL_FIELDS):
        raise WireError(f"a CALL frame held a {type(data).__qualname__}, not the fields of a call")
    return CallRequest(*data)


class ResultCodec(Protocol):
    """How a worker's ``ToolResult`` crosses back to the host."""

    def encode(self, result: ToolResult) -> bytes:
        """The result's bytes; raises :class:`WireError` naming what cannot be sent."""

    def decode(self, body: bytes) -> ToolResult:
        """The result from its bytes; raises :class:`WireError` when they are not one."""


class PickleCodec:
    """Results as pickles (cloudpickle for classes that came by value). Decoding a
    pickle runs code: **trusted workers only** (a trusted tool's ``process`` isolation,
    ``codec="pickle"``); never for a worker that ran untrusted code."""

    def encode(self, result: ToolResult) -> bytes:
        try:
            return pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        except MemoryError:
            raise
        except BaseException:
            pass
        try:  # classes that came by value (a plugin's) are not importable by name here
            return bytes(cloudpickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        except MemoryError:
            raise
        except BaseException as exc:
            raise WireError(describe_exception(exc)) from None

    def decode(self, body: bytes) -> ToolResult:
        try:
            result = pickle.loads(body)
        except BaseException as exc:
            raise WireError(describe_exception(exc)) from None
        if not isinstance(result, ToolResult):
            raise WireError(f"a {type(result).__qualname__}, not a ToolResult")
        return result


def _type_name(value: Any) -> str:
    try:
        return str(type(value).__qualname__)
    except BaseException:
        return "?"


def _clip_path(path: str) -> str:
    return path if len(path) <= 200 else path[:199] + "…"


def plain_problem(value: Any, root: str, *, tuples: bool = False) -> str | None:
    """Why ``value`` is not strict plain JSON data, or ``None`` when it is.

    Plain JSON data: exact types ``dict`` (``str`` keys), ``list`` (and ``tuple`` when
    ``tuples``), ``str``, ``int``, finite ``float``, ``bool`` and ``None``, nested at most
    :data:`MAX_PLAIN_DEPTH` levels. The answer names the first part that is not, as a
    path from ``root`` (``"details.rows[2]: a Point is not JSON data"``). Iterative, and
    never calls the value's own code (no ``__eq__``, ``__hash__`` or ``__iter__`` of a
    subclass: subclasses are refused)."""
    stack: list[tuple[Any, int, str]] = [(value, 0, root)]
    while stack:
        item, depth, path = stack.pop()
        kind = type(item)
        if item is None or kind is str or kind is bool or kind is int:
            continue
        if kind is float:
            if not math.isfinite(item):
                return f"{_clip_path(path)}: {item!r} is not a JSON number"
            continue
        if kind is dict or kind is list or (tuples and kind is tuple):
            if depth >= MAX_PLAIN_DEPTH:
                return f"{_clip_path(path)}: nested deeper than {MAX_PLAIN_DEPTH} levels"
            if kind is dict:
                for key, sub in item.items():
                    if type(key) is not str:
                        return f"{_clip_path(path)}: a key of type {_type_name(key)} is not a string"
                    stack.append((sub, depth + 1, f"{path}.{key}"))
            else:
                stack.extend((sub, depth + 1, f"{path}[{i}]") for i, sub in enumerate(item))
            continue
        return f"{_clip_path(path)}: a {_type_name(item)} is not JSON data"
    return None


class _Budget:
    """Counts the containers one unpacking builds; past ``limit`` it raises."""

    __slots__ = ("left",)

    def __init__(self, limit: int) -> None:
        self.left = limit

    def __call__(self, container: Any) -> Any:
        self.left -= 1
        if self.left < 0:
            raise WireError("too many nested lists and maps")
        return container


def _no_ext(code: int, data: bytes) -> Any:
    raise WireError(f"a msgpack extension type {code} (only plain data is accepted)")


def _unpack(data: bytes, *, max_len: int, max_containers: int) -> Any:
    """msgpack ``data`` as plain data, bounded: at most ``max_len`` items in each list
    or map and ``max_containers`` lists and maps in all; no extension types. Raises
    :class:`WireError`."""
    try:
        if len(data) <= max_containers:  # a list or map takes a byte at least: no count needed (a reply's case)
            return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True, ext_hook=_no_ext,
                                   max_array_len=max_len, max_map_len=max_len, max_ext_len=0)
        budget = _Budget(max_containers)
        return msgpack.unpackb(
            data, raw=False, use_list=True, strict_map_key=True, ext_hook=_no_ext, list_hook=budget,
            object_hook=budget, max_array_len=max_len, max_map_len=max_len, max_ext_len=0,
        )
    except WireError:
        raise
    except MemoryError:
        raise
    except Exception as exc:  # msgpack's ExtraData, FormatError, StackError, ValueError...
        raise WireError(f"not msgpack plain data ({describe_exception(exc)})") from None


def _pack(value: Any) -> bytes:
    try:
        return bytes(msgpack.packb(value, use_bin_type=True, strict_types=False))
    except MemoryError:
        raise
    except Exception as exc:  # an int past 64 bits...
        raise WireError(describe_exception(exc)) from None


_RESULT_KEYS: Final = frozenset({"ok", "content", "error_kind", "details", "images", "blocks"})
_RESULT_SHAPES: Final = (_RESULT_KEYS, _RESULT_KEYS - {"blocks"})  # blocks may be left out (made once, not per reply)
_RESULT_MAX_LEN: Final = max(len(_RESULT_KEYS), MAX_IMAGES, MAX_BLOCKS)
_ERROR_KINDS: Final = frozenset(kind.value for kind in ErrorKind)
_MIME_TYPE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}")


class PlainCodec:
    """Results as plain data (msgpack): what every worker that runs untrusted code uses.

    The body is a msgpack map ``{"ok": bool, "content": str, "error_kind": str | None,
    "details": bin | None, "images": [[bin, str], ...], "blocks": [block, ...]}``;
    ``details`` is itself the msgpack of plain JSON data (see :func:`plain_problem`), at
    most :data:`MAX_DETAILS_BYTES`. ``blocks`` (a result's ordered content, empty or left
    out for a text-only one; ``images`` is empty when it is not) are ``["text", str]``, ``["image", bin,
    mime]``, ``["audio", bin, mime]`` or ``["resource", uri, mime | None, text | None,
    bin | None]``. Decoding never runs code and checks every field before the result
    exists: types, lengths (:data:`MAX_CONTENT_CHARS`, :data:`MAX_IMAGES`,
    :data:`MAX_IMAGE_BYTES`, :data:`MAX_BLOCKS`, :data:`MAX_MEDIA_BYTES`), the error kind
    against :class:`ErrorKind`, the MIME type's shape, and each value as
    :class:`~rho_actors.tool.Audio` or :class:`~rho_actors.tool.Resource` checks it.
    ``call_id``, ``name`` and ``duration_ms`` are the host's own, never read."""

    def encode(self, result: ToolResult) -> bytes:
        details: bytes | None = None
        if result.details is not None:
            problem = plain_problem(result.details, "details", tuples=True)
            if problem is not None:
                raise WireError(f"{problem}; details of an untrusted tool must be plain JSON data")
            details = _pack(result.details)
            if len(details) > MAX_DETAILS_BYTES:
                raise WireError(f"details of {len(details):,} bytes, more than the limit of {MAX_DETAILS_BYTES:,}")
        images: list[list[Any]] = []
        for i, image in enumerate(() if result.blocks else result.images):
            images.append(_media(f"images[{i}]", image)[1:])
        if len(result.blocks) > MAX_BLOCKS:
            raise WireError(f"{len(result.blocks)} content blocks, more than the limit of {MAX_BLOCKS}")
        blocks = [_encode_block(i, block) for i, block in enumerate(result.blocks)]
        kind = None if result.error_kind is None else str(result.error_kind.value)
        return _pack({
            "ok": bool(result.ok), "content": str(result.content), "error_kind": kind,
            "details": details, "images": images, "blocks": blocks,
        })

    def decode(self, body: bytes) -> ToolResult:
        message = _unpack(body, max_len=_RESULT_MAX_LEN, max_containers=MAX_IMAGES + MAX_BLOCKS + 3)
        if type(message) is not dict or message.keys() not in _RESULT_SHAPES:
            raise WireError(f"a result must be a map of exactly {', '.join(sorted(_RESULT_KEYS))} "
                            "(blocks may be left out)")
        ok, content, kind = message["ok"], message["content"], message["error_kind"]
        if type(ok) is not bool:
            raise WireError("result.ok is not a bool")
        if type(content) is not str or len(content) > MAX_CONTENT_CHARS:
            raise WireError(f"result.content is not a str of at most {MAX_CONTENT_CHARS:,} characters")
        if ok and kind is not None:
            raise WireError("an ok result with an error_kind")
        if not ok and kind not in _ERROR_KINDS:
            raise WireError(f"result.error_kind {str(kind)[:40]!r} is not a known error kind")
        raw_details = message["details"]
        details: Any = None
        if raw_details is not None:
            if type(raw_details) is not bytes or len(raw_details) > MAX_DETAILS_BYTES:
                raise WireError(f"result.details is not msgpack bytes of at most {MAX_DETAILS_BYTES:,}")
            details = _unpack(raw_details, max_len=MAX_DETAILS_BYTES, max_containers=MAX_DETAILS_BYTES // 8)
            problem = plain_problem(details, "result.details")
            if problem is not None:
                raise WireError(problem)
        raw_images = message["images"]
        if type(raw_images) is not list or len(raw_images) > MAX_IMAGES:
            raise WireError(f"result.images is not a list of at most {MAX_IMAGES}")
        images: list[Image] = []
        for i, pair in enumerate(raw_images):
            if type(pair) is not list or len(pair) != 2:
                raise WireError(f"result.images[{i}] is not a [data, mime_type] pair")
            data, mime = pair
            if type(data) is not bytes or len(data) > MAX_IMAGE_BYTES:
                raise WireError(f"result.images[{i}] data is not bytes of at most {MAX_IMAGE_BYTES:,}")
            if type(mime) is not str or _MIME_TYPE.fullmatch(mime) is None:
                raise WireError(f"result.images[{i}] has no valid MIME type")
            try:
                images.append(Image(data, mime))
            except (TypeError, ValueError) as exc:  # well formed, but not a picture type rho sends
                raise WireError(f"result.images[{i}]: {exc}") from None
        raw_blocks = message.get("blocks", [])
        if type(raw_blocks) is not list or len(raw_blocks) > MAX_BLOCKS:
            raise WireError(f"result.blocks is not a list of at most {MAX_BLOCKS}")
        if raw_blocks and images:
            raise WireError("a result with both blocks and images (its images are among its blocks)")
        blocks = tuple(_decode_block(i, raw) for i, raw in enumerate(raw_blocks)) if raw_blocks else ()
        if len(blocks) > MAX_IMAGES and sum(isinstance(b, Image) for b in blocks) > MAX_IMAGES:
            raise WireError(f"result.blocks holds more than {MAX_IMAGES} images")
        error_kind = None if ok else ErrorKind(kind)
        return ToolResult("", "", ok, content, error_kind, details, tuple(images), 0.0, blocks)


def _media(where: str, value: Any) -> list[Any]:
    """``[kind, data, mime]`` of an Image or Audio ``value``, its data's size checked."""
    data, mime = getattr(value, "data", None), getattr(value, "mime_type", None)
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    if type(data) is not bytes or type(mime) is not str:
        raise WireError(f"{where}: data must be bytes and mime_type a str")
    limit = MAX_IMAGE_BYTES if isinstance(value, Image) else MAX_MEDIA_BYTES
    if len(data) > limit:
        raise WireError(f"{where}: {len(data):,} bytes of data, more than the limit of {limit:,}")
    return ["image" if isinstance(value, Image) else "audio", data, mime]


def _encode_block(i: int, block: Block) -> list[Any]:
    where = f"blocks[{i}]"
    if isinstance(block, str):
        if len(block) > MAX_CONTENT_CHARS:
            raise WireError(f"{where}: a text of more than {MAX_CONTENT_CHARS:,} characters")
        return ["text", str(block)]
    if isinstance(block, (Image, Audio)):
        return _media(where, block)
    if isinstance(block, Resource):
        if block.text is not None and len(block.text) > MAX_CONTENT_CHARS:
            raise WireError(f"{where}: a resource text of more than {MAX_CONTENT_CHARS:,} characters")
        if block.blob is not None and len(block.blob) > MAX_MEDIA_BYTES:
            raise WireError(f"{where}: a resource blob of {len(block.blob):,} bytes, more than the limit of "
                            f"{MAX_MEDIA_BYTES:,}")
        return ["resource", str(block.uri), block.mime_type, block.text, block.blob]
    raise WireError(f"{where}: a {type(block).__name__}, not text, Image, Audio or Resource")


def _decode_block(i: int, raw: Any) -> Block:
    where = f"result.blocks[{i}]"
    if type(raw) is not list or not raw or type(raw[0]) is not str:
        raise WireError(f"{where} is not a [kind, ...] list")
    kind, fields = raw[0], raw[1:]
    try:
        if kind == "text" and len(fields) == 1 and type(fields[0]) is str and len(fields[0]) <= MAX_CONTENT_CHARS:
            return str(fields[0])
        if kind in ("image", "audio") and len(fields) == 2:
            data, mime = fields
            limit = MAX_IMAGE_BYTES if kind == "image" else MAX_MEDIA_BYTES
            if type(data) is not bytes or len(data) > limit:
                raise WireError(f"{where} data is not bytes of at most {limit:,}")
            if type(mime) is not str or _MIME_TYPE.fullmatch(mime) is None:
                raise WireError(f"{where} has no valid MIME type")
            return Image(data, mime) if kind == "image" else Audio(data, mime)
        if kind == "resource" and len(fields) == 4:
            uri, mime, text, blob = fields
            if type(uri) is not str or len(uri) > MAX_URI_CHARS:
                raise WireError(f"{where} uri is not a str of at most {MAX_URI_CHARS:,} characters")
            if mime is not None and (type(mime) is not str or _MIME_TYPE.fullmatch(mime) is None):
                raise WireError(f"{where} has no valid MIME type")
            if text is not None and (type(text) is not str or len(text) > MAX_CONTENT_CHARS):
                raise WireError(f"{where} text is not a str of at most {MAX_CONTENT_CHARS:,} characters")
            if blob is not None and (type(blob) is not bytes or len(blob) > MAX_MEDIA_BYTES):
                raise WireError(f"{where} blob is not bytes of at most {MAX_MEDIA_BYTES:,}")
            return Resource(uri, mime, text, blob)
    except (TypeError, ValueError) as exc:  # well formed, but refused by the value's own checks
        raise WireError(f"{where}: {exc}") from None
    raise WireError(f"{where} is not a text, image, audio or resource block of the right shape")


CODECS: Final[Mapping[str, ResultCodec]] = MappingProxyType({"plain": PlainCodec(), "pickle": PickleCodec()})
"""Result codecs by name: ``"plain"`` (any worker; the only one for untrusted code) and
``"pickle"`` (trusted workers only)."""


def encode_json(value: Any) -> bytes:
    """``value`` (plain JSON data) as ASCII JSON text."""
    return json.dumps(value, ensure_ascii=True, allow_nan=False).encode("ascii")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def child_text(text: str) -> str:
    """A string a child sent, scrubbed once for every later use: lone surrogates and
    unsafe characters (:func:`~rho_actors.encoding.replace_controls`) become U+FFFD, so
    it is valid UTF-8 and holds no terminal control sequence."""
    return replace_controls(scrub_text(text))


def decode_json(body: bytes, max_containers: int = 2**20, max_depth: int = MAX_PLAIN_DEPTH) -> Any:
    """JSON text a child sent back as plain data (``NaN`` and ``Infinity`` refused),
    every string scrubbed by :func:`child_text`, its arrays and objects counted before
    any is built (at most ``max_containers``, ``max_depth`` deep). Raises
    :class:`WireError` when it is not strict JSON or is over a bound."""
    try:
        value = loads_bounded(body, max_containers=max_containers, max_depth=max_depth, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise WireError(describe_exception(exc)) from None
    try:
        return scrub_strings(value, child_text)
    except ValueError as exc:  # two keys that scrub to one
        raise WireError(str(exc)) from None


_SERVED_KEYS: Final = frozenset({"ok", "value", "type", "message"})
MAX_SERVED_MESSAGE_CHARS: Final = 4_000
"""The longest error message a server sends back (longer ones are cut), in characters."""
MAX_SERVED_BYTES: Final = 16 * 2**20
"""The longest answer frame of an untrusted (plain) server; a longer one is a protocol
violation (the server is killed)."""
MAX_SERVED_ITEMS: Final = 2**20
"""The most items of one list or map, and the most lists and maps in all, of a plain
server's answer (what decoding it may build in the host is bounded)."""


def encode_served(codec: str, ok: bool, value: Any) -> bytes:
    """A server's answer (the child's side): ``value`` returned (``ok``) or the exception
    it raised, in the server's codec (``"plain"``: msgpack of plain JSON data, tuples as
    lists; ``"pickle"``: cloudpickle, trusted servers only). Raises :class:`WireError`
    when a returned value cannot be encoded (the message names its first bad part)."""
    if ok:
        if codec == "plain":
            problem = plain_problem(value, "the returned value", tuples=True)
            if problem is not None:
                raise WireError(f"{problem}; an untrusted server returns plain JSON data only")
            return _pack({"ok": True, "value": value, "type": None, "message": None})
        try:
            return bytes(cloudpickle.dumps((True, value, None, None)))
        except Exception as exc:
            raise WireError(f"the returned {_type_name(value)} cannot be pickled ({describe_exception(exc)})") from None
    name, message = _type_name(value), str(describe_exception(value))[:MAX_SERVED_MESSAGE_CHARS]
    if codec == "plain":
        return _pack({"ok": False, "value": None, "type": name, "message": message})
    return bytes(pickle.dumps((False, None, name, message)))


def decode_served(codec: str, body: bytes) -> tuple[bool, Any, str, str]:
    """A server's answer (the host's side) as ``(ok, value, error type name, error
    message)``; ``"plain"`` never runs code: bounded msgpack, every field checked, every
    string scrubbed by :func:`child_text`. Raises :class:`WireError` for anything else."""
    if codec == "pickle":
        try:
            ok, value, name, message = pickle.loads(body)
        except Exception as exc:
            raise WireError(f"not a server answer ({describe_exception(exc)})") from None
        return bool(ok), value, str(name or ""), str(message or "")
    if len(body) > MAX_SERVED_BYTES:
        raise WireError(f"a server answer of {len(body):,} bytes, more than the limit of {MAX_SERVED_BYTES:,}")
    answer = _unpack(body, max_len=MAX_SERVED_ITEMS, max_containers=MAX_SERVED_ITEMS)
    if type(answer) is not dict or set(answer) != _SERVED_KEYS:
        raise WireError(f"a server answer must be a map of exactly {', '.join(sorted(_SERVED_KEYS))}")
    ok = answer["ok"]
    if type(ok) is not bool:
        raise WireError("answer.ok is not a bool")
    if ok:
        problem = plain_problem(answer["value"], "answer.value")
        if problem is not None:
            raise WireError(problem)
        try:
            return True, scrub_strings(answer["value"], child_text), "", ""
        except ValueError as exc:  # two keys that scrub to one
            raise WireError(f"answer.value: {exc}") from None
    name, message = answer["type"], answer["message"]
    if type(name) is not str or type(message) is not str or len(name) > 200 or len(message) > MAX_SERVED_MESSAGE_CHARS:
        raise WireError("answer.type and answer.message must be short strings")
    return False, None, child_text(name), child_text(message)
