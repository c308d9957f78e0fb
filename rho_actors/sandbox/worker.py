"""The main loop of a worker process of ``process`` isolation (internal; the child's
side of :class:`rho_actors.sandbox.pool.WorkerPool`).

A worker first runs one no-op call through its whole call path (:func:`warm_up`: the
pages and caches a call touches are its own before it is idle, not on its first call's
time), says ``READY``, then serves ``CALL`` frames one at a time until the host closes
its pipe: it unpickles the tool (or asks for it with ``NEED_TOOL`` when it does not hold
it), runs ``tool.run(args, ctx)`` and answers one ``RESULT`` (``RESULT_RETIRE`` after a
``MemoryError``) encoded by its result codec. A ``LOAD`` frame (a registered tool the
host sends ahead) is unpickled and held as a call's tool would be, unanswered.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import os
import pickle
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from loguru import logger

from rho_actors.cancel import CancelToken
from rho_actors.encoding import describe_exception
from rho_actors.results import CANCELLED, failure, result_from_exception, result_from_return
from rho_actors.sandbox import wire
from rho_actors.sandbox.channel import Channel
from rho_actors.sandbox.confine.confinement import disk_bound
from rho_actors.sandbox.context_values import context_vars
from rho_actors.sandbox.processes import mib
from rho_actors.telemetry import attached
from rho_actors.tool import ToolResult

__all__ = ["ADDRESS_SPACE_BOUND", "TOOL_CACHE_SIZE", "WorkerConfig", "serve_request", "warm_up", "warm_up_request",
           "worker_child"]

TOOL_CACHE_SIZE: Final = 32
"""Unpickled tools a worker keeps, by digest of their pickled bytes."""


ADDRESS_SPACE_BOUND: Final = "address-space bound (RLIMIT_AS: this host gives no memory cgroup)"
"""How a worker's memory bound is named when it is ``RLIMIT_AS`` (no cgroup, no sampler)."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """A worker's settings (plain data): its result ``codec`` (a name in
    :data:`rho_actors.sandbox.wire.CODECS`) and, for messages, its ``heap_bytes`` bound,
    what that ``bound`` is (:data:`ADDRESS_SPACE_BOUND`, or a resident-memory bound:
    :attr:`rho_actors.sandbox.confine.enclosure.Enclosure.memory_bound_words`) and the
    ``setting`` that raises it."""

    codec: str
    heap_bytes: int | None
    bound: str = ADDRESS_SPACE_BOUND
    setting: str = "ActorSystem(process_heap_bytes=...)"


def worker_child(channel: Channel, config: WorkerConfig) -> None:
    """Entry point of a worker process: serve calls until the host closes the pipe."""
    codec = wire.CODECS[config.codec]
    tools: OrderedDict[bytes, Any] = OrderedDict()
    os.set_inheritable(channel.fd, False)  # a program a tool runs (os.system, exec) never holds the reply pipe
    warm_up(config, codec)
    channel.send(wire.READY, b"")
    while True:
        try:
            tag, body = channel.recv()
        except (EOFError, OSError):
            break
        if tag == wire.LOAD:
            _load(body, tools)
            channel.send(wire.LOADED, b"")  # the host waits for it: a worker still loading is not idle
            continue
        if tag != wire.CALL:
            break
        reply_tag, reply = _serve(body, tools, config, codec)
        channel.send(reply_tag, reply)


class _NoOp:
    """The tool of :func:`warm_up`."""

    @staticmethod
    def run(args: Mapping[str, Any], ctx: Mapping[str, Any]) -> str:
        return ""


_WARM_UP_DIR: Final = "/warm-up/sessions/warm-up"
"""The warm-up call's ``data_dir``: a path as a real call's (a session's folder, or an
untrusted call's ``Path(".")``), never looked at on disk."""


def warm_up_request() -> wire.CallRequest:
    """The request of :func:`warm_up`'s no-op call, shaped as a real call's
    (:func:`rho_actors.sandbox.wire.call_request`): text ids, its ``data_dir`` a
    ``pathlib`` path, ``deps`` pickled (a session's ``None``), so that decoding it and
    building its ctx run the code a real first call runs. (Unpickling a path runs
    ``pathlib``'s code: with a ``None`` there, a worker's first real call sometimes
    copied ~12 pages from its fork server; benchmarks/PROFILE.md section 35.)"""
    return wire.CallRequest(b"warm-up", pickle.dumps(_NoOp), "warm-up", "warm-up", {},
                            {"session_id": "warm-up", "call_id": "warm-up", "data_dir": Path(_WARM_UP_DIR),
                             "withheld": ()},
                            pickle.dumps(None, protocol=pickle.HIGHEST_PROTOCOL), time.monotonic() + 5.0, 5_000, 1_000)


def warm_up(config: WorkerConfig, codec: wire.ResultCodec) -> None:
    """Run one no-op call (:func:`warm_up_request`) through the worker's call path
    (decoding, unpickling, the ctx, the run, the result and its encoding), so that what a
    call touches first (the copy-on-write pages shared with the fork server, caches, lazy
    set-ups) is paid here, before the worker is idle. Never raises."""
    with contextlib.suppress(Exception):
        serve_request(wire.decode_call(wire.encode_call(warm_up_request())), OrderedDict(), config, codec)


def _load(body: bytes, tools: OrderedDict[bytes, Any]) -> None:
    """Hold the tool of a ``LOAD`` frame (pickled ``(digest, tool_bytes)``: host data) as
    a call's tool is held; one that cannot be loaded is left out (its first call asks
    for it with ``NEED_TOOL`` and reports the error)."""
    try:
        digest, tool_bytes = pickle.loads(body)
        tools[digest] = pickle.loads(tool_bytes)
    except Exception:
        return
    tools.move_to_end(digest)
    while len(tools) > TOOL_CACHE_SIZE:
        tools.popitem(last=False)


def _serve(
    data: bytes, tools: OrderedDict[bytes, Any], config: WorkerConfig, codec: wire.ResultCodec
) -> tuple[bytes, bytes]:
    """One call in a worker: the reply frame."""
    try:
        request = wire.decode_call(data)
    except MemoryError:
        return _reply(_memory_result("", "?", config), True, "?", codec)
    except BaseException as exc:  # a broken request
        return _reply(failure("failed_in_worker", "", "?", problem=describe_exception(exc)), False, "?", codec)
    return serve_request(request, tools, config, codec)


def serve_request(
    request: wire.CallRequest, tools: OrderedDict[bytes, Any], config: WorkerConfig, codec: wire.ResultCodec
) -> tuple[bytes, bytes]:
    """Run one call (the tool from ``tools`` by digest, or unpickled from the request's
    ``tool_bytes`` and kept there, at most :data:`TOOL_CACHE_SIZE`) and return its reply
    frame: ``(NEED_TOOL, b"")`` when the tool is neither held nor sent, else
    ``(RESULT or RESULT_RETIRE, the result encoded by codec)``. The ctx the tool gets is
    the request's fields with ``deadline``, ``cancel`` (never set) and ``deps``. Used by
    worker processes and by Ray tasks (:mod:`rho_actors.isolation.ray_tasks`)."""
    name, call_id = request.name, request.call_id
    try:
        tool = tools.get(request.digest)
        if tool is None:
            if request.tool_bytes is None:
                return wire.NEED_TOOL, b""
            try:
                tool = pickle.loads(request.tool_bytes)
            except MemoryError:
                raise
            except BaseException as exc:
                failed = failure("unpicklable_in_worker", call_id, name, problem=describe_exception(exc))
                return _reply(failed, False, name, codec)
            tools[request.digest] = tool
            while len(tools) > TOOL_CACHE_SIZE:
                tools.popitem(last=False)
        else:
            tools.move_to_end(request.digest)
        ctx: dict[str, Any] = dict(request.fields)
        carried = ctx.pop(wire.CONTEXT_VALUES, None) or {}
        ctx["deadline"] = request.deadline
        ctx["cancel"] = CancelToken()
        if request.deps_bytes is not None:
            try:
                ctx["deps"] = pickle.loads(request.deps_bytes)
            except Exception:
                logger.debug("call {}: deps could not be unpickled in the worker; left out", call_id)
        with attached(ctx):  # the call's span from ctx["traceparent"] is current here
            result, retire = contextvars.copy_context().run(
                _call_in_context, tool, request, MappingProxyType(ctx), config, carried
            )
        del tool, ctx, request
        return _reply(result, retire, name, codec)
    except MemoryError:
        pass
    except BaseException as exc:  # a broken request, or a BaseException from an odd place
        failed = failure("failed_in_worker", call_id, name, problem=describe_exception(exc))
        return _reply(failed, False, name, codec)
    return _reply(_memory_result(call_id, name, config), True, name, codec)


def _call_in_context(
    tool: Any, request: wire.CallRequest, ctx: Mapping[str, Any], config: WorkerConfig, carried: Mapping[str, Any]
) -> tuple[ToolResult, bool]:
    """:func:`_call` in a fresh copy of the worker's context, with the caller's plain
    ``contextvars`` set on the variables of those names (see
    :mod:`rho_actors.sandbox.context_values`)."""
    for name, value in carried.items():
        for var in context_vars(name):
            var.set(value)
    return _call(tool, request, ctx, config)


def _memory_result(call_id: str, name: str, config: WorkerConfig) -> ToolResult:
    return failure("memory", call_id, name, heap=mib(config.heap_bytes), bound=config.bound, setting=config.setting)


async def _until(coro: Any, deadline: float) -> Any:
    return await asyncio.wait_for(coro, max(0.0, deadline - time.monotonic()))


def _call(
    tool: Any, request: wire.CallRequest, ctx: Mapping[str, Any], config: WorkerConfig
) -> tuple[ToolResult, bool]:
    """Run the tool and make its result (``duration_ms`` is set by the host); ``True``
    beside it when the worker should be retired (it ran out of memory)."""
    name, call_id, deadline, max_chars = request.name, request.call_id, request.deadline, request.max_chars
    out_of_memory = False
    try:
        value = tool.run(request.args, ctx)
        if asyncio.iscoroutine(value):
            value = asyncio.run(_until(value, deadline))
        return result_from_return(call_id, name, value, max_chars, 0.0), False
    except MemoryError:
        out_of_memory = True  # built below, once the traceback (and what it holds) is gone
    except TimeoutError as exc:
        if time.monotonic() >= deadline:
            return failure("timeout", call_id, name, timeout_ms=request.timeout_ms, consequence=CANCELLED), False
        return result_from_exception(call_id, name, exc, max_chars, 0.0), False
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are `exited` results
        disk = disk_bound()
        if disk is not None and isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return failure("disk_full", call_id, name, problem=describe_exception(exc), disk=mib(disk)), False
        return result_from_exception(call_id, name, exc, max_chars, 0.0), False
    assert out_of_memory
    return _memory_result(call_id, name, config), True


def _reply(result: ToolResult, retire: bool, name: str, codec: wire.ResultCodec) -> tuple[bytes, bytes]:
    tag = wire.RESULT_RETIRE if retire else wire.RESULT
    try:
        return tag, codec.encode(result)
    except MemoryError:
        raise
    except wire.WireError as exc:
        what = (f"details of type {type(result.details).__qualname__}" if result.details is not None
                else "content blocks" if result.blocks else "images")
        failed = failure("unreturnable", result.call_id, result.name, what=what, problem=str(exc))
    return tag, codec.encode(failed)
