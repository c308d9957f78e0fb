"""The tool contract: what a tool exposes, what a call is, and what a call returns.

A tool is any module, class or object with the required callbacks::

    name() -> str
    description() -> str
    parameter_schema() -> dict        # JSON Schema of the arguments object
    run(args: dict[str, Any], ctx: Mapping[str, Any]) -> result

and optionally ``timeout_ms() -> int`` (default :data:`DEFAULT_TIMEOUT_MS`),
``concurrency() -> "parallel" | "exclusive"`` (default ``"parallel"``),
``annotations() -> dict`` (MCP's title and hints: :mod:`rho_actors.declarations.annotations`)
and ``selftest() -> Ok | Error``. The contract is DESIGN §2 (docs/design/tool-contract.md), translated from the
``Rho.Tool`` behaviour of an Elixir agent runtime.

Example::

    class Add:
        @staticmethod
        def name(): return "add"
        @staticmethod
        def description(): return "Add two integers."
        @staticmethod
        def parameter_schema():
            return {"type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"]}
        @staticmethod
        def run(args, ctx): return args["a"] + args["b"]

    assert is_tool(Add) and concurrency(Add) == "parallel"
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import os
import re
import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from rho_actors.declarations.context import CONTEXT_NAME, ToolContext, looks_like_context
from rho_actors.declarations.policy import NO_POLICY, CallPolicy
from rho_actors.encoding import replace_controls, scrub_text
from rho_actors.errors import RhoError

__all__ = [
    "CONTEXT_NAME",
    "DEFAULT_TIMEOUT_MS",
    "IMAGE_TYPES",
    "MAX_URI_CHARS",
    "MAX_TIMEOUT_MS",
    "MEDIA",
    "PendingSchema",
    "REQUIRED_CALLBACKS",
    "SCHEMA_SLOT",
    "Resource",
    "Concurrency",
    "Details",
    "Error",
    "ErrorKind",
    "Audio",
    "Block",
    "Image",
    "Ok",
    "ToolCall",
    "ToolContext",
    "ToolFailure",
    "ToolInfo",
    "ToolResult",
    "checked_untrusted",
    "concurrency",
    "default_timeout_ms",
    "is_tool",
    "is_untrusted",
    "lazy_copies",
    "looks_like_context",
    "missing_callbacks",
    "schema_lock",
    "timeout_ms",
    "track_checked",
    "untrusted",
]

DEFAULT_TIMEOUT_MS = 30_000
"""The per-call timeout, in milliseconds, of a tool without ``timeout_ms()``."""

MAX_TIMEOUT_MS = 24 * 3600 * 1000
"""The longest per-call timeout (one day, in milliseconds); a longer one is cut to it."""

REQUIRED_CALLBACKS = ("name", "description", "parameter_schema", "run")

Concurrency = Literal["parallel", "exclusive"]


@dataclass(frozen=True, slots=True)
class Ok:
    """A successful tool result: ``output`` is given to the model (a ``str`` as it is,
    anything else JSON-encoded)."""

    output: Any = None


@dataclass(frozen=True, slots=True)
class Error:
    """A failed tool result the tool chose to return: ``reason`` is given to the model
    (a ``str`` as it is, anything else JSON-encoded). The result's kind is ``raised``."""

    reason: Any


@dataclass(frozen=True, slots=True)
class Details:
    """Output for the model plus ``details`` for the host's screens only.

    ``Details(output, details)`` may stand alone (it counts as ``Ok``) or inside
    ``Ok``. ``details`` is handed to the host untouched in :attr:`ToolResult.details`
    and never goes to the model.
    """

    output: Any
    details: Any


IMAGE_TYPES: tuple[str, ...] = ("image/png", "image/jpeg", "image/gif", "image/webp")
"""The image types both providers accept (OpenAI's and Anthropic's documented lists)."""


@dataclass(frozen=True, slots=True)
class Image:
    """A picture for the model: raw bytes and their MIME type (``"image/png"``...).

    Return it alone, or in a list beside text parts; it ends up in
    :attr:`ToolResult.images`, the text parts in :attr:`ToolResult.content`.
    Checked when made: ``data`` must be ``bytes`` (a ``bytearray`` or ``memoryview`` is
    copied to ``bytes``) and ``mime_type`` one of :data:`IMAGE_TYPES`, compared and kept
    in lower case (``"image/PNG"`` becomes ``"image/png"``); else ``TypeError`` or
    ``ValueError`` naming the problem, so a tool returning a bad image gets an error
    result saying why.
    """

    data: bytes
    mime_type: str = "image/png"

    def __post_init__(self) -> None:
        data = self.data
        if isinstance(data, (bytearray, memoryview)):
            object.__setattr__(self, "data", bytes(data))
        elif type(data) is not bytes:
            raise TypeError(f"Image data must be bytes, got {type(data).__name__}")
        mime = self.mime_type
        if not isinstance(mime, str):
            raise TypeError(f"Image mime_type must be a str, got {type(mime).__name__}")
        normalised = str.__str__(mime).strip().lower()
        if normalised not in IMAGE_TYPES:
            shown = normalised[:40].encode("ascii", "backslashreplace").decode("ascii")
            raise ValueError(f"Image mime_type {shown!r} is not supported; use one of {', '.join(IMAGE_TYPES)}")
        object.__setattr__(self, "mime_type", normalised)


_MIME_TYPE: Final = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,126}/[a-z0-9][a-z0-9!#$&^_.+-]{0,126}")
_URI: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[^\x00-\x20\x7f]+")
MAX_URI_CHARS: Final = 8192
"""The longest :attr:`Resource.uri`, in characters."""


def _bytes(owner: str, field_name: str, data: Any) -> bytes:
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if type(data) is not bytes:
        raise TypeError(f"{owner} {field_name} must be bytes, got {type(data).__name__}")
    return data


def _shown(value: str) -> str:
    return value[:40].encode("ascii", "backslashreplace").decode("ascii")


def _mime(owner: str, mime: Any, kind: str | None) -> str:
    """``mime`` as a lower-case ``type/subtype`` (RFC 6838 names, no parameters), of
    top-level type ``kind`` when given; else ``TypeError``/``ValueError`` naming it."""
    if not isinstance(mime, str):
        raise TypeError(f"{owner} mime_type must be a str, got {type(mime).__name__}")
    normalised = str.__str__(mime).strip().lower()
    if _MIME_TYPE.fullmatch(normalised) is None:
        raise ValueError(f"{owner} mime_type {_shown(normalised)!r} is not a MIME type (type/subtype)")
    if kind is not None and normalised.partition("/")[0] != kind:
        raise ValueError(f"{owner} mime_type {_shown(normalised)!r} is not an {kind} type; use {kind}/<subtype>, "
                         f"e.g. audio/wav or audio/mpeg")
    return normalised


@dataclass(frozen=True, slots=True)
class Audio:
    """A sound: raw bytes and their MIME type (``"audio/wav"``, ``"audio/mpeg"``...),
    MCP's ``AudioContent``.

    Return it alone, or in a list or tuple beside text, :class:`Image` and
    :class:`Resource` parts; it ends up in :attr:`ToolResult.blocks` in its place (and
    :attr:`ToolResult.audio`), the model's text naming it (providers take no audio from
    a tool). Checked when made: ``data`` must be ``bytes`` (a ``bytearray`` or
    ``memoryview`` is copied) and ``mime_type`` an ``audio/<subtype>`` type, kept in
    lower case; else ``TypeError`` or ``ValueError`` naming the problem. Its bytes count
    against the result budgets as an image's do."""

    data: bytes
    mime_type: str = "audio/wav"

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", _bytes("Audio", "data", self.data))
        object.__setattr__(self, "mime_type", _mime("Audio", self.mime_type, "audio"))


@dataclass(frozen=True, slots=True)
class Resource:
    """An embedded resource: MCP's ``EmbeddedResource``, the contents of ``uri``
    (``"file:///report.csv"``, ``"test://x"``: an absolute URI with a scheme, at most
    :data:`MAX_URI_CHARS` characters, valid UTF-8 with no spaces, control, bidi or
    zero-width characters), as ``text``
    (a ``str``) or ``blob`` (``bytes``): exactly one of them. ``mime_type`` is optional
    (a ``type/subtype``, kept in lower case).

    Return it like an :class:`Image` (alone or in a list or tuple beside other parts);
    it ends up in :attr:`ToolResult.blocks` in its place (and
    :attr:`ToolResult.resources`). The model's text gets a line naming it and, for a
    text resource, its text. Raises ``TypeError`` or ``ValueError`` naming the problem.
    Its text (UTF-8) or blob bytes count against the result budgets."""

    uri: str
    mime_type: str | None = None
    text: str | None = None
    blob: bytes | None = None

    def __post_init__(self) -> None:
        uri = self.uri
        if not isinstance(uri, str):
            raise TypeError(f"Resource uri must be a str, got {type(uri).__name__}")
        uri = str.__str__(uri)
        # a lone surrogate cannot be sent (the JSON of an MCP reply fails: the server's
        # writer dies), and a C1, bidi or zero-width character would reach terminals
        if (len(uri) > MAX_URI_CHARS or _URI.fullmatch(uri) is None or scrub_text(uri) != uri
                or replace_controls(uri) != uri):
            raise ValueError(f"Resource uri {_shown(uri)!r} is not an absolute URI (scheme:rest, valid UTF-8, no "
                             f"spaces, control, bidi or zero-width characters, at most {MAX_URI_CHARS} characters)")
        object.__setattr__(self, "uri", uri)
        if self.mime_type is not None:
            object.__setattr__(self, "mime_type", _mime("Resource", self.mime_type, None))
        if (self.text is None) == (self.blob is None):
            raise ValueError(f"Resource {_shown(uri)!r} needs exactly one of text and blob")
        if self.text is not None:
            if not isinstance(self.text, str):
                raise TypeError(f"Resource text must be a str, got {type(self.text).__name__}")
            object.__setattr__(self, "text", scrub_text(str.__str__(self.text)))
        else:
            object.__setattr__(self, "blob", _bytes("Resource", "blob", self.blob))

    @property
    def size(self) -> int:
        """The bytes of its contents: the text's UTF-8 length or the blob's."""
        if self.text is not None:
            return len(self.text.encode("utf-8", "surrogatepass"))
        return len(self.blob or b"")


Block = str | Image | Audio | Resource
"""One part of a result's content in order (:attr:`ToolResult.blocks`): text, a
picture, a sound or an embedded resource."""
MEDIA: Final = (Image, Audio, Resource)
"""The non-text parts a tool may return (alone or in a list or tuple)."""


@dataclass(frozen=True, slots=True, weakref_slot=True)
class ToolInfo:
    """A tool's checked declaration (DESIGN §3): the only thing offered to a model.

    ``timeout_ms`` is in milliseconds; ``parameter_schema`` is a private deep copy of the tool's JSON Schema (Draft
    2020-12, top level ``"type": "object"``); ``policy`` is every rule of its calls in one place (its bounds, retries,
    background and ``requires_approval``: :class:`~rho_actors.declarations.policy.CallPolicy`). A copy handed out by
    :func:`lazy_copies` (``Loop.offered()``) makes that copy on the first read of ``parameter_schema`` (equality,
    ``repr``, pickling, ``dataclasses.replace`` and ``asdict`` read it too), so an offer whose schemas are not read
    costs no copy.
    """

    name: str
    description: str
    parameter_schema: dict[str, Any]
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    concurrency: Concurrency = "parallel"
    policy: CallPolicy = NO_POLICY  # the rules of its calls (rho_actors.declarations.policy)
    annotations: tuple[tuple[str, Any], ...] = ()  # MCP's title and hints, checked: (key, value) pairs

    @property
    def requires_approval(self) -> bool:
        """Whether its calls may wait for a decision (DESIGN §4 "Approvals"): ``policy.requires_approval``."""
        return self.policy.requires_approval

    def copy(self) -> ToolInfo:
        """A copy with its own deep copy of the schema, for handing out."""
        return dataclasses.replace(self, parameter_schema=copy.deepcopy(self.parameter_schema))


class PendingSchema:
    """A schema copy not made yet, in the ``parameter_schema`` slot of a
    :class:`ToolInfo` from :func:`lazy_copies`: the first read of that attribute calls
    ``take(info)`` once (under a lock) and keeps the dict it returns."""

    __slots__ = ()

    def take(self, info: ToolInfo) -> dict[str, Any]:
        raise NotImplementedError


class _OwnSchema:
    """``ToolInfo.parameter_schema``: the slot ``dataclass(slots=True)`` made, except
    that a :class:`PendingSchema` in it is replaced by its copy on the first read, under
    ``lock`` (re-entrant: a finalizer run by a collection inside ``loads`` may read one;
    new in a fork child, where the thread holding it may not exist): concurrent first
    reads get the same copy."""

    __slots__ = ("_delete", "_get", "_set", "lock")

    def __init__(self, slot: Any) -> None:
        self._get, self._set, self._delete = slot.__get__, slot.__set__, slot.__delete__
        self.lock = threading.RLock()

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        value = self._get(obj)
        if not isinstance(value, PendingSchema):
            return value
        with self.lock:
            value = self._get(obj)
            if isinstance(value, PendingSchema):
                value = value.take(obj)
                self._set(obj, value)
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        self._set(obj, value)

    def __delete__(self, obj: Any) -> None:
        self._delete(obj)

    def renew_lock(self) -> None:
        self.lock = threading.RLock()


SCHEMA_SLOT: Final = ToolInfo.__dict__["parameter_schema"]
"""The slot of ``ToolInfo.parameter_schema`` itself (its ``__get__``/``__set__`` never
take a :class:`PendingSchema`), for pending copies that fill several copies at once."""
_OWN_SCHEMA: Final = _OwnSchema(SCHEMA_SLOT)
type.__setattr__(ToolInfo, "parameter_schema", _OWN_SCHEMA)
os.register_at_fork(after_in_child=_OWN_SCHEMA.renew_lock)


def schema_lock() -> threading.RLock:
    """The lock under which a pending schema is replaced by its copy (re-entrant): held
    by whatever else re-points a pending copy's slot, so no read decodes it meanwhile."""
    return _OWN_SCHEMA.lock


def lazy_copies(infos: Iterable[ToolInfo], schemas: Iterable[PendingSchema | None]) -> list[ToolInfo]:
    """A copy of each of ``infos`` to hand out, equal to it; its schema is taken from
    the matching ``schemas`` entry (a :class:`PendingSchema` of that info's schema) on
    its first read, or deep-copied now (:meth:`ToolInfo.copy`) where that is ``None``.
    Made without ``__init__`` (about half its time): ``ToolInfo`` checks nothing when
    made. Raises ``ValueError`` when the two differ in length."""
    new, put_schema = object.__new__, SCHEMA_SLOT.__set__
    put_name, put_description, put_timeout, put_concurrency, put_policy, put_annotations = (
        ToolInfo.__dict__[name].__set__
        for name in ("name", "description", "timeout_ms", "concurrency", "policy", "annotations"))
    copies: list[ToolInfo] = []
    append = copies.append
    for info, schema in zip(infos, schemas, strict=True):
        if schema is None:
            append(info.copy())
            continue
        made = new(ToolInfo)
        put_name(made, info.name)
        put_description(made, info.description)
        put_schema(made, schema)
        put_timeout(made, info.timeout_ms)
        put_concurrency(made, info.concurrency)
        put_policy(made, info.policy)
        put_annotations(made, info.annotations)
        append(made)
    return copies


class ErrorKind(enum.StrEnum):
    """Why a call failed (DESIGN §4). ``retryable`` says whether the same call,
    repeated unchanged, may succeed."""

    INVALID_JSON = "invalid_json"
    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
    WITHHELD = "withheld"
    UNAVAILABLE = "unavailable"
    TIMEOUT = "timeout"
    TOOL_ERROR = "tool_error"
    """The tool returned ``Error(reason)``: it ran and reported a failure itself."""
    RAISED = "raised"
    EXITED = "exited"
    CRASHED = "crashed"
    MEMORY = "memory"
    OUTPUT_LIMIT = "output_limit"
    CANCELLED = "cancelled"
    BUDGET_EXHAUSTED = "budget_exhausted"  # the governor's refusals (DESIGN §4), with the next two
    REPEATED_CALL = "repeated_call"
    RATE_LIMITED = "rate_limited"
    PENDING_APPROVAL = "pending_approval"  # waits for a person's decision: it has not run (DESIGN §4)
    DEFERRED = "deferred"  # its tool returned Deferred: it waits for loop.resolve
    REJECTED = "rejected"
    APPROVAL_EXPIRED = "approval_expired"

    @property
    def retryable(self) -> bool:
        """Whether the same call, repeated unchanged, may succeed."""
        return self in _RETRYABLE


_RETRYABLE = frozenset({ErrorKind.TIMEOUT, ErrorKind.CRASHED, ErrorKind.CANCELLED, ErrorKind.RATE_LIMITED})


class ToolFailure(RhoError):
    """Raised by a tool's ``run`` for an error result of kind ``kind`` (not ``raised``): a tool standing for one
    elsewhere (an MCP server's) reports ``unavailable``, ``crashed``, ``timeout`` or ``cancelled``. ``str(err)`` is
    the model's text (capped). ``ValueError`` for a ``kind`` not an :class:`ErrorKind` value. ``retryable=True``: run
    again it may succeed (an idempotent tool's call is retried; ``details["retryable"]``; ``result_from_exception``).
    ``details``: more of the result's host-only ``details`` (an upstream MCP task's ``{"task_status": "failed"}``)."""

    def __init__(self, kind: ErrorKind | str, message: str, retryable: bool = False,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.kind, self.retryable = ErrorKind(kind), retryable is True
        self.details: Mapping[str, Any] = dict(details or {})

    def __reduce__(self) -> tuple[Any, ...]:  # pickled by its arguments (from a worker process)
        return (type(self), (self.kind, str(self), self.retryable, dict(self.details)))


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call from the model.

    ``arguments`` is the model's raw JSON text (decoded strictly: a JSON object, nothing
    repaired) or an already decoded mapping with string keys (as Anthropic's
    ``tool_use.input`` is).
    """

    id: str
    name: str
    arguments: str | Mapping[str, Any] = "{}"


@dataclass(frozen=True, slots=True)
class ToolResult:
    """Exactly one per call id.

    ``content`` is the text for the model; ``error_kind`` is ``None`` when ``ok``;
    ``details`` is for the host only; ``images`` are :class:`Image` values;
    ``duration_ms`` is the wall time from the call's start (its dispatch to a
    CallActor) to its result, in milliseconds (0.0 for a call refused before dispatch).

    ``blocks`` is the content in the tool's order when it returned more than text
    (:data:`Block` values: ``str``, :class:`Image`, :class:`Audio`, :class:`Resource`),
    what an MCP client is served; empty for a text-only result. When given, ``images``
    is its images, and ``content`` is the model's view of it: the text parts and a
    line naming each sound and resource (with a text resource's text), images aside.
    Raises ``TypeError`` for a block of another type.
    """

    call_id: str
    name: str
    ok: bool
    content: str
    error_kind: ErrorKind | None = None
    details: Any = None
    images: tuple[Image, ...] = field(default=())
    duration_ms: float = 0.0
    blocks: tuple[Block, ...] = field(default=())

    def __post_init__(self) -> None:
        if isinstance(self.content, str):  # the one place result text is made valid UTF-8
            object.__setattr__(self, "content", scrub_text(self.content))
        if self.blocks:
            blocks = tuple(scrub_text(b) if isinstance(b, str) else b for b in self.blocks)
            for i, block in enumerate(blocks):
                if not isinstance(block, (str, *MEDIA)):
                    raise TypeError(f"ToolResult blocks[{i}] is a {type(block).__name__}, not text, Image, Audio "
                                    "or Resource")
            object.__setattr__(self, "blocks", blocks)
            object.__setattr__(self, "images", tuple(b for b in blocks if isinstance(b, Image)))

    @property
    def audio(self) -> tuple[Audio, ...]:
        """The :class:`Audio` values of :attr:`blocks`, in order."""
        return tuple(b for b in self.blocks if isinstance(b, Audio))

    @property
    def resources(self) -> tuple[Resource, ...]:
        """The :class:`Resource` values of :attr:`blocks`, in order."""
        return tuple(b for b in self.blocks if isinstance(b, Resource))

    @property
    def retryable(self) -> bool:
        """Whether the same call, repeated unchanged, may succeed (see :class:`ErrorKind`)."""
        return self.error_kind is not None and self.error_kind.retryable


def callback(obj: Any, name: str) -> Any:
    """``obj``'s callable attribute ``name``, or None (also when reading it raises or
    exits: a tool's ``__getattr__`` must not stop the reading actor)."""
    try:
        value = getattr(obj, name, None)
    except BaseException:
        return None
    return value if callable(value) else None


def missing_callbacks(obj: Any) -> list[str]:
    """The required callbacks ``obj`` lacks (not callable attributes count as missing)."""
    return [cb for cb in REQUIRED_CALLBACKS if callback(obj, cb) is None]


_UNTRUSTED_MARK = "__rho_untrusted__"


def untrusted(tool: Any) -> Any:
    """Mark ``tool`` untrusted ("dynamic", DESIGN §1): every system reads its declaration
    in a throwaway process and runs its calls in a worker process. Returns ``tool``, so it
    also works as a class or function decorator. Raises ``TypeError`` when the mark
    cannot be set on it."""
    try:
        setattr(tool, _UNTRUSTED_MARK, True)
    except (AttributeError, TypeError) as err:
        raise TypeError(f"cannot mark {type(tool).__name__} untrusted: {err}") from err
    return tool


def is_untrusted(tool: Any) -> bool:
    """Whether ``tool`` was marked with :func:`untrusted` (an attribute lookup that
    raises means not marked)."""
    try:
        return getattr(tool, _UNTRUSTED_MARK, False) is True
    except BaseException:
        return False


def is_tool(obj: Any) -> bool:
    """Whether ``obj`` (a module, class or object) exports the required callbacks
    ``name``, ``description``, ``parameter_schema`` and ``run``."""
    return not missing_callbacks(obj)


_checked_lock = threading.Lock()
_checked: weakref.WeakSet[Any] = weakref.WeakSet()


def track_checked(cache: Any) -> None:
    """Consult ``cache`` while it lives: one system's checked declarations of untrusted
    tools (:class:`rho_actors.declarations.checked.CheckedCache`: ``get(tool)`` gives a
    ``ToolInfo``, a ``Rejected`` or ``None``), which :func:`timeout_ms`,
    :func:`concurrency` and ``declaration`` answer from (they never run an untrusted
    tool's code)."""
    with _checked_lock:
        _checked.add(cache)


def checked_untrusted(tool: Any) -> object | None:
    """The checked declaration (a ``ToolInfo``) or the rejection (a ``Rejected``) of an
    untrusted tool that a live system has read, or ``None`` when none has (yet)."""
    with _checked_lock:
        caches = list(_checked)
    for cache in caches:
        outcome: object | None = cache.get(tool)
        if outcome is not None:
            return outcome
    return None


def default_timeout_ms() -> int:
    """The per-call timeout of a tool without ``timeout_ms()``: 30 000 ms."""
    return DEFAULT_TIMEOUT_MS


def timeout_ms(tool: Any) -> int:
    """The tool's per-call timeout in milliseconds: its ``timeout_ms()`` when that
    returns a positive ``int`` (cut to :data:`MAX_TIMEOUT_MS`), else
    :func:`default_timeout_ms` (a raise included).

    An untrusted tool (:func:`untrusted`) is never read here: its timeout comes from the
    declaration a system checked (the default until one has).
    """
    if is_untrusted(tool):
        checked = checked_untrusted(tool)
        return checked.timeout_ms if isinstance(checked, ToolInfo) else DEFAULT_TIMEOUT_MS
    cb = callback(tool, "timeout_ms")
    if cb is None:
        return DEFAULT_TIMEOUT_MS
    try:
        value = cb()
    except BaseException:  # a raise, or an exit, means the default
        return DEFAULT_TIMEOUT_MS
    return min(value, MAX_TIMEOUT_MS) if type(value) is int and value > 0 else DEFAULT_TIMEOUT_MS


def concurrency(tool: Any) -> Concurrency:
    """The tool's concurrency: ``"exclusive"`` only when its ``concurrency()`` returns
    exactly that string; anything else, a raise included, is ``"parallel"``.

    An untrusted tool (:func:`untrusted`) is never read here: its concurrency comes from
    the declaration a system checked (``"parallel"`` until one has).
    """
    if is_untrusted(tool):
        checked = checked_untrusted(tool)
        return checked.concurrency if isinstance(checked, ToolInfo) else "parallel"
    cb = callback(tool, "concurrency")
    if cb is None:
        return "parallel"
    try:
        value = cb()
    except BaseException:  # a raise, or an exit, means "parallel"
        return "parallel"
    return "exclusive" if type(value) is str and value == "exclusive" else "parallel"
