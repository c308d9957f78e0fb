"""Every message between the host and a sandbox child, encoded and decoded (internal).

Each frame of a :class:`~rho_actors.sandbox.channel.Channel` carries a type tag; this
module names the tags, the size limit of what a child may send, and the encoding of
each message type:

=================  =========  ========================================================
tag                direction  body
=================  =========  ========================================================
``READY``          child ->   empty: a worker process is ready
``CALL``           -> child   a :class:`CallRequest` (pickled: it comes from the host)
``NEED_TOOL``      child ->   empty: the worker does not hold the request's tool; resend with it
``RESULT``         child ->   a ``ToolResult``, in the worker's :class:`ResultCodec`
``RESULT_RETIRE``  child ->   the same, and the worker should be retired (it ran out of memory)
``DECLARATION``    child ->   a declaration read's answer: JSON text
``SELFTEST``       child ->   a selftest's answer: JSON text
=================  =========  ========================================================

What comes back from a worker is decoded by its :class:`ResultCodec`, looked up by name
in :data:`CODECS` (today only ``"pickle"``: ``details`` may be any picklable object).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Final, Protocol

import cloudpickle

from rho_actors.encoding import describe_exception
from rho_actors.tool import ToolResult

__all__ = [
    "CALL",
    "CODECS",
    "DECLARATION",
    "MAX_DECLARATION_BYTES",
    "MAX_SELFTEST_BYTES",
    "NEED_TOOL",
    "READY",
    "RESULT",
    "RESULT_RETIRE",
    "SELFTEST",
    "CallRequest",
    "PickleCodec",
    "ResultCodec",
    "WireError",
    "decode_call",
    "decode_json",
    "encode_call",
    "encode_json",
]

READY: Final = b"R"
CALL: Final = b"C"
NEED_TOOL: Final = b"N"
RESULT: Final = b"A"
RESULT_RETIRE: Final = b"X"
DECLARATION: Final = b"D"
SELFTEST: Final = b"S"

MAX_DECLARATION_BYTES: Final = 32 * 2**20
"""A declaration child's answer longer than this is refused as malformed."""
MAX_SELFTEST_BYTES: Final = 64 * 1024
"""A selftest child's answer longer than this is refused as malformed."""


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


_CALL_FIELDS: Final = tuple(f.name for f in fields(CallRequest))


def encode_call(request: CallRequest) -> bytes:
    """``request`` as a ``CALL`` body (its fields as a pickled tuple). Raises
    :class:`WireError` when its arguments or context cannot be pickled."""
    data = tuple(getattr(request, name) for name in _CALL_FIELDS)
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
    pickle runs code: it trusts the worker."""

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


CODECS: Final[Mapping[str, ResultCodec]] = MappingProxyType({"pickle": PickleCodec()})
"""Result codecs by name."""


def encode_json(value: Any) -> bytes:
    """``value`` (plain JSON data) as ASCII JSON text."""
    return json.dumps(value, ensure_ascii=True, allow_nan=False).encode("ascii")


def decode_json(body: bytes) -> Any:
    """JSON text back as data. Raises :class:`WireError` when it is not JSON."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise WireError(describe_exception(exc)) from None
