"""Tool results: the model-visible text of every error, in one table, and the
functions that build :class:`~rho_actors.tool.ToolResult` values (DESIGN §4).

Every error result a model sees is written here: :data:`TEXTS` maps a situation (a
key such as ``"timeout"``) to its :class:`~rho_actors.tool.ErrorKind` and the
template of its text, and :func:`failure` fills one in. The per-violation texts of
argument checks live with those checks (:mod:`rho_actors.declarations.arguments`) and reach a
result through :func:`error_result`. Like a tool's output, a refusal's text is held to
the output cap by :func:`capped`.

Example::

    failure("timeout", "c1", "search", timeout_ms=500, consequence=KILLED)
    # ToolResult(call_id="c1", name="search", ok=False, error_kind=ErrorKind.TIMEOUT,
    #            content="tool 'search' did not finish within its timeout of 500 ms; "
    #                    "its worker process was killed", ...)
"""

from __future__ import annotations

import dataclasses
import os
import re
import traceback
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from rho_actors.encoding import cap_text, describe_exception, encode_output, replace_controls, scrub_text
from rho_actors.lifecycle import Deferred
from rho_actors.tool import MEDIA, Audio, Block, Details, Error, ErrorKind, Ok, Resource, ToolFailure, ToolResult

__all__ = [
    "CANCELLED",
    "DISCARDED",
    "KILLED",
    "RAY_CANCELLED",
    "SENT_CANCEL",
    "STOPPED",
    "TEXTS",
    "TRACEBACK",
    "called_as",
    "capped",
    "error_result",
    "failure",
    "model_text",
    "result_from_exception",
    "result_from_return",
    "text",
    "tool_traceback",
    "traceback_of",
]

KILLED: Final = "its worker process was killed"
"""The ``consequence`` of a ``timeout`` in a worker process."""
CANCELLED: Final = "it was cancelled"
"""The ``consequence`` of a ``timeout`` in a thread (or a coroutine)."""
SENT_CANCEL: Final = "its MCP server was sent notifications/cancelled"
"""The ``consequence`` of a ``timeout`` of an MCP server's tool (:mod:`rho_actors.mcp`)."""
STOPPED: Final = "its worker process was killed, or the call was kept from reaching one"
"""The ``consequence`` of a ``timeout`` that a process call's pool had not answered in time."""
DISCARDED: Final = "what it returned after its deadline was discarded"
"""The ``consequence`` of a ``timeout`` whose tool returned only after its deadline."""
RAY_CANCELLED: Final = "its Ray task was force-cancelled (a running task's worker is killed)"
"""The ``consequence`` of a ``timeout`` (or the end of a ``cancelled`` reason) of a Ray task."""

_K = ErrorKind
TEXTS: Final[Mapping[str, tuple[ErrorKind, str]]] = MappingProxyType({
    # timeouts: one wording, with what became of the call
    "timeout": (_K.TIMEOUT, "tool {tool!r} did not finish within its timeout of {timeout_ms} ms; {consequence}"),
    # a call refused before its tool runs
    "unknown_tool": (_K.UNKNOWN_TOOL, "unknown tool {tool!r}; the tools offered are: {offered}"),
    "withheld": (_K.WITHHELD, "tool {tool!r} is not available in this session now"),
    "unavailable_removed": (_K.UNAVAILABLE, "tool {tool!r} was unregistered"),
    "unavailable_renamed": (_K.UNAVAILABLE, "tool {tool!r} was renamed to {new!r}"),
    "unavailable_changed": (
        _K.UNAVAILABLE, "tool {tool!r} was unregistered or registered again before this call started; it did not run"
    ),
    "unavailable_rejected": (
        _K.UNAVAILABLE, "tool {tool!r} is not offered: its declaration failed its checks ({reason})"
    ),
    "over_budget": (
        _K.OUTPUT_LIMIT, "tool {tool!r} returned {size} bytes, over this {scope}'s result budget of {budget} bytes "
        "({left} left); its result was left out"
    ),
    # the governor (rho_actors.governor): a bound of the tool, the session, the prompt or the system
    "concurrency_bound": (
        _K.UNAVAILABLE, "{running} calls of tool {tool!r} are running; the bound is {bound} (max_concurrency), "
        "and none ended before this call's deadline; it did not run"
    ),
    "session_concurrency_bound": (
        _K.UNAVAILABLE, "{running} calls of tool {tool!r} are running in this session; the bound is {bound} "
        "(max_concurrency_per_session), and none ended before this call's deadline; it did not run"
    ),
    "exclusive_bound": (
        _K.UNAVAILABLE, "a call of an exclusive tool is running in this session ({running} running; the bound is "
        "{bound}: exclusive tools run one at a time, in the background too), and it did not end before this "
        "call's deadline; tool {tool!r} did not run"
    ),
    "thread_calls_bound": (
        _K.UNAVAILABLE, "{running} calls are running in threads; the bound is {bound} (max_thread_calls), and none "
        "ended before this call's deadline; tool {tool!r} did not run"
    ),
    "budget_exhausted": (
        _K.BUDGET_EXHAUSTED, "tool {tool!r} did not run: {scope} has used its budget of {budget} {what} ({setting})"
    ),
    "repeated_call": (
        _K.REPEATED_CALL, "tool {tool!r} did not run: it already ran {count} times in this session with these same "
        "arguments (max_repeats={count}); you already have its result, use it instead of calling it again"
    ),
    "rate_limited": (
        _K.RATE_LIMITED, "tool {tool!r} did not run: its rate limit of {rate} would let it start only in {wait_ms} "
        "ms, after this call's deadline"
    ),
    # background calls (rho_actors.tasks)
    "tasks_bound": (
        _K.UNAVAILABLE, "tool {tool!r} did not run: {count} background calls are open in {scope}; the bound is "
        "{bound} ({setting})"
    ),
    "task_interrupted": (
        _K.CANCELLED, "interrupted: the host stopped before the background call of tool {tool!r} finished; it was "
        "not run again"
    ),
    "background_choice_invalid": (
        _K.INVALID_ARGUMENTS, "invalid arguments for tool {tool!r}: run_in_background must be true or false, not "
        "{value}; the tool did not run"
    ),
    "background_choice_forbidden": (
        _K.INVALID_ARGUMENTS, "invalid arguments for tool {tool!r}: run_in_background is not allowed here (this host "
        "does not let the model choose to run a call in the background); call it again without it"
    ),
    "bad_arguments": (_K.INVALID_ARGUMENTS, "tool {tool!r}: {problem}"),
    "invalid_arguments": (_K.INVALID_ARGUMENTS, "invalid arguments for tool {tool!r}: {problems}"),
    "cut_off": (
        _K.INVALID_JSON, "tool {tool!r} did not run: the reply hit its token limit ({size}) before this call "
        "was complete; send the call again in a shorter reply"
    ),
    "unvalidatable": (_K.INVALID_ARGUMENTS, "the arguments for tool {tool!r} could not be validated: {problem}"),
    # the runtime around a call
    "not_prepared": (_K.CRASHED, "the loop could not prepare this call: {problem}"),
    "loop_failed": (_K.CRASHED, "the loop failed to run this call: {problem}"),
    "loop_crashed": (_K.CRASHED, "the session's loop crashed before this call finished"),
    "session_stopped": (_K.CANCELLED, "the session stopped before this call finished"),
    "turn_not_started": (_K.CANCELLED, "the session stopped before this turn started"),
    "turn_interrupted": (_K.CANCELLED, "the host's thread was interrupted as it started this turn ({problem}): "
                                       "this call was cancelled"),
    "not_started": (_K.CANCELLED, "the call did not start: {problem}"),
    "cancelled": (_K.CANCELLED, "tool {tool!r} was cancelled ({reason})"),
    "host_cancelled": (_K.CANCELLED, "tool {tool!r} was cancelled by the host while running"),
    "host_cancelled_before_start": (_K.CANCELLED, "tool {tool!r} did not start: the host cancelled the turn"),
    "loop_not_running": (_K.CANCELLED, "the session's loop was not running; the call did not start"),
    "loop_unanswered": (_K.CRASHED, "the session's loop did not answer this call within {bound_s:.0f} s"),
    # a conversation replayed to a provider (rho_actors.agent.provider_rules)
    "no_result": (_K.CANCELLED, "no result was recorded for this call; it is answered as cancelled"),
    "held_task_lost": (
        _K.CANCELLED, "not run: the call of tool {tool!r} waited for a decision as task {task}, but its session's "
        "transcript holds it no more (never recorded, or removed) when its host started"
    ),
    "held_task_duplicate": (
        _K.CANCELLED, "not run: task {task} of tool {tool!r} was a second record held for call {call} when its host "
        "started; the call is task {kept}'s"
    ),
    "interrupted": (_K.CANCELLED, "the session was interrupted before this call's result was recorded"),
    # a call that waits for a decision (DESIGN §4 "Approvals")
    "pending_approval": (_K.PENDING_APPROVAL, "call {call} of tool {tool!r} requires approval and has not run; "
                                              "it waits for a decision{reason}"),
    "deferred": (_K.DEFERRED, "call {call} of tool {tool!r} waits for its result from outside: {reason}"),
    "rejected": (_K.REJECTED, "{message}"),
    "call_id_pending": (_K.INVALID_ARGUMENTS, "tool {tool!r} did not run: call id {call!r} names a call of this "
                                              "session that waits for a decision; a new call needs an id of its own"),
    "pending_bound": (_K.UNAVAILABLE, "tool {tool!r} did not run: {count} calls of this session wait for a decision, "
                                      "holding {held_bytes} bytes of arguments; the bound is {bound} calls and "
                                      "{bound_bytes} bytes"),
    "decision_unbound": (_K.REJECTED, "call {call} of tool {tool!r} did not run: the decision recorded for it "
                                      "{problem}; an approval runs only the arguments it is bound to"),
    "approval_expired": (_K.APPROVAL_EXPIRED, "call {call} of tool {tool!r} was not decided within its approval "
                                              "timeout of {timeout_s:g} s; it did not run"),
    "empty_error": (_K.RAISED, "the call failed without a message ({kind})"),  # keeps the result's kind
    "raised_opaque": (_K.RAISED, "tool {tool!r} raised"),
    # a call in a worker process
    "pool_stopped": (_K.CANCELLED, "tool {tool!r} did not run: the worker pool is stopped"),
    "pool_stopped_mid_call": (_K.CANCELLED, "tool {tool!r} was cancelled: the worker pool stopped"),
    "cancelled_killed": (_K.CANCELLED, "tool {tool!r} was cancelled ({reason}); its worker process was killed"),
    "pool_closed": (_K.CANCELLED, "tool {tool!r} did not run: {problem}"),
    "start_interrupted": (_K.CANCELLED, "tool {tool!r} did not run: its start was interrupted ({problem})"),
    "unshippable": (_K.RAISED, "tool {tool!r} could not be shipped to a worker process: {problem}"),
    "unsendable": (
        _K.RAISED, "tool {tool!r}: its arguments or context could not be sent to its worker process ({problem})"
    ),
    "no_reply_reader": (  # the host at its thread limit: the call not written, its worker kept
        _K.UNAVAILABLE, "tool {tool!r} did not run: no thread could be started to wait for its worker's reply "
        "({problem})"
    ),
    "no_worker": (  # a start that failed on its own (sandbox/pool.py _start_failed): never the tool's doing
        _K.UNAVAILABLE, "tool {tool!r} did not run: no worker process could be started for it ({problem})"
    ),
    "malformed_reply": (
        _K.CRASHED, "tool {tool!r}: its worker process sent a malformed reply ({problem}); it was killed"
    ),
    "reader_failed": (
        _K.CRASHED, "tool {tool!r}: the host's reader of its worker's reply failed ({problem}); the worker was killed"
    ),
    "pipe_closed": (_K.CRASHED, "tool {tool!r}: its worker process closed its pipe mid-call; it was killed"),
    "oom_killed": (
        _K.MEMORY, "tool {tool!r} ran out of memory: its worker process was killed by SIGKILL, not by the pool "
        "(most likely the kernel's out-of-memory killer)"
    ),
    "memory": (
        _K.MEMORY, "tool {tool!r} ran out of memory: it exceeded its worker's {bound} of {heap} (MemoryError); "
        "raise it with {setting}"
    ),
    "worker_crashed": (_K.CRASHED, "tool {tool!r} crashed: its worker process died of {signal}"),
    "worker_server_gone": (
        _K.UNAVAILABLE, "tool {tool!r} did not finish: the fork server its worker process came from (pid {server}) "
        "ended and took the worker with it, not the tool's doing (the call may have begun); the next call gets a "
        "worker from a new fork server"
    ),
    "killed_outside": (
        _K.CRASHED, "tool {tool!r} crashed: its worker process was killed by {signal}, sent from outside the pool"
    ),
    "memory_tree": (
        _K.MEMORY, "tool {tool!r} ran out of memory: its process tree reached its {bound} of {heap} and was killed; "
        "raise it with {setting}"
    ),
    "memory_thread": (_K.MEMORY, "tool {tool!r} ran out of memory (MemoryError in its thread)"),
    "no_worker_in_time": (
        _K.UNAVAILABLE, "tool {tool!r} did not run: no worker process was free or started for it within its "
        "start bound of {start_ms} ms ({why}); its own timeout of {timeout_ms} ms never began"
    ),
    "queued_past_deadline": (
        _K.TIMEOUT, "tool {tool!r} did not finish within its timeout of {timeout_ms} ms; it did not start: "
        "all {cap} worker processes of the system were busy"
    ),
    "queued_past_share": (
        _K.TIMEOUT, "tool {tool!r} did not finish within its timeout of {timeout_ms} ms; it did not start: it "
        "waited its turn for a worker process the whole time (the system runs at most {cap} calls in worker "
        "processes at once, {share} of one session; this session had {held} running)"
    ),
    "threads_exhausted": (
        _K.UNAVAILABLE, "tool {tool!r} is unavailable for now: {running} of its calls that timed out are still "
        "running in abandoned threads (the cap is {cap} {scope}); it is offered again once they end"
    ),
    "worker_exited": (
        _K.EXITED, "tool {tool!r} exited: its worker process ended with exit code {code} before answering"
    ),
    "unpicklable_in_worker": (
        _K.RAISED, "tool {tool!r} could not be unpickled in its worker process: {problem}"
    ),
    "failed_in_worker": (_K.RAISED, "tool {tool!r} failed in its worker process: {problem}"),
    "disk_full": (
        _K.RAISED, "tool {tool!r} raised {problem}: its private folder is bounded to {disk} in all "
        "(Confinement(disk_bytes=...))"
    ),
    "unreturnable": (
        _K.RAISED, "tool {tool!r} returned {what} that cannot be sent back from its worker process ({problem})"
    ),
    # a call as a Ray task (rho_actors.isolation.ray_tasks)
    "ray_not_running": (_K.CANCELLED, "tool {tool!r} did not run: the ray isolation is not running"),
    "ray_not_installed": (
        _K.UNAVAILABLE, "tool {tool!r} did not run: Ray is not installed (pip install 'rho_actors[ray]'): {problem}"
    ),
    "ray_untrusted": (_K.UNAVAILABLE, "tool {tool!r} is untrusted and cannot run on Ray"),
    "ray_unreachable": (_K.UNAVAILABLE, "tool {tool!r} did not run: Ray is not reachable ({problem})"),
    "ray_infeasible": (_K.UNAVAILABLE, "tool {tool!r} cannot run on Ray: {problem}"),
    "ray_unshippable": (_K.RAISED, "tool {tool!r} could not be shipped to Ray: {problem}"),
    "ray_unsendable": (
        _K.RAISED, "tool {tool!r}: its arguments or context could not be sent to its Ray task ({problem})"
    ),
    "ray_refused": (_K.UNAVAILABLE, "tool {tool!r} did not run: Ray refused the task ({problem})"),
    "ray_malformed": (_K.CRASHED, "tool {tool!r}: its Ray task sent a malformed reply ({problem})"),
    "ray_memory": (
        _K.MEMORY, "tool {tool!r} ran out of memory: Ray's memory monitor killed its worker ({cause})"
    ),
    "ray_runtime_env": (_K.UNAVAILABLE, "tool {tool!r} did not run: its Ray runtime_env could not be set up ({cause})"),
    "ray_cancelled_outside": (_K.CANCELLED, "tool {tool!r}: its Ray task was cancelled from outside ({cause})"),
    "ray_lost": (_K.CRASHED, "tool {tool!r} crashed: its Ray worker or node was lost ({cause})"),
    "ray_node_lost": (
        _K.CRASHED, "tool {tool!r} crashed: the Ray node it ran on, {node}, was lost ({cause}); later calls go to "
        "the remaining nodes"
    ),
    "ray_raised": (_K.RAISED, "tool {tool!r} failed in its Ray task ({cause})"),
    "ray_failed": (_K.CRASHED, "tool {tool!r}: Ray failed ({cause})"),
    # a stateful server reached from a tool (rho_actors.isolation.servers.call_server)
    "server_not_running": (
        _K.UNAVAILABLE, "server {server!r} is not running now (it is restarting, or its supervisor gave it up); "
        "{method}() did not run"
    ),
    "server_killed": (
        _K.TIMEOUT, "server {server!r} did not answer {method}() within {timeout_ms} ms: its process was killed, "
        "so everything it held is lost; it is restarted with fresh state"
    ),
    "server_crashed": (
        _K.CRASHED, "server {server!r} died during {method}() ({cause}), so everything it held is lost; it is "
        "restarted with fresh state"
    ),
    "server_memory": (
        _K.MEMORY, "server {server!r} ran out of memory during {method}() (its process tree reached its bound of "
        "{heap} and was killed), so everything it held is lost; it is restarted with fresh state"
    ),
    "server_ray_memory": (
        _K.MEMORY, "server {server!r} ran out of memory during {method}(): Ray's memory monitor killed its Ray "
        "actor ({cause}), so everything it held is lost; it is restarted with fresh state"
    ),
    "server_restarted": (
        _K.UNAVAILABLE, "server {server!r} was restarted since its last call ({cause}), so everything it held is "
        "lost; {method}() did not run: call it again to run it on the fresh state"
    ),
    "server_unreachable": (
        _K.UNAVAILABLE, "server {server!r} could not be reached during {method}() ({cause}): the call may or may "
        "not have run; the server keeps its state"
    ),
    "server_unanswered": (_K.TIMEOUT, "server {server!r} did not answer {method}() before this call's deadline"),
    # a tool of an MCP server (rho_actors.mcp.source), raised as a ToolFailure; {tool} is
    # called_as(): the name the client called, with the upstream's own when they differ
    "mcp_not_connected": (
        _K.UNAVAILABLE, "tool {tool} cannot be called: MCP server {server} is not connected now "
        "(restarting or stopped)"
    ),
    "mcp_given_up": (
        _K.UNAVAILABLE, "tool {tool} cannot be called: MCP server {server} was given up: it failed past its restart "
        "intensity ({max_restarts} restarts in {max_seconds:g} s) and is not restarted again; its last error: "
        "{error}; to start it afresh, {remedy}"
    ),
    "mcp_stopped": (_K.UNAVAILABLE, "tool {tool}: MCP server {server} was stopped during the call"),
    "mcp_crashed": (
        _K.CRASHED, "tool {tool}: MCP server {server} exited or dropped the connection during the call; "
        "it is restarted within its restart intensity"
    ),
    "mcp_session_cap": (
        _K.UNAVAILABLE, "tool {tool} cannot be called now: MCP server {server} runs a process for each session "
        "and its {count} processes are all busy"
    ),
    "mcp_session_gone": (
        _K.UNAVAILABLE, "tool {tool}: MCP server {server} no longer knew this client's session (it restarted?): "
        "a new session is being opened; the call was not sent again, as the tool is not declared idempotent"
    ),
    "mcp_input_unanswered": (
        _K.RAISED, "tool {tool}: MCP server {server} needed input the call could not give: {reason}"
    ),
    "mcp_task_ended": (
        _K.RAISED, "tool {tool}: MCP server {server} ran the call as a task that ended {status} without a result"
    ),
    "mcp_refused": (_K.RAISED, "tool {tool}: MCP server {server} refused the call: error {code}: {message}"),
    "mcp_task_failed": (
        _K.RAISED, "tool {tool}: MCP server {server} ran the call as a task that failed: error {code}: {message}"
    ),
    "mcp_task_malformed": (
        _K.RAISED, "tool {tool}: MCP server {server} answered {what} that is not a valid task: {problem}; {fate}"
    ),
    "mcp_malformed": (_K.RAISED, "tool {tool}: MCP server {server} answered {what} that is not valid: {problem}"),
    "mcp_output_schema": (
        _K.RAISED, "tool {tool!r} returned output that does not match its outputSchema: {problem}",
    ),
})
"""Situation -> ``(kind, template)``: every model-visible error text of the runtime.
Templates are ``str.format`` strings; ``{tool!r}`` is the tool's name (in the ``mcp_*``
texts ``{tool}`` is :func:`called_as`'s label)."""


def called_as(called: str, upstream: str | None = None, server: str | None = None) -> str:
    """How an MCP server's tool is named in its error texts: ``'called'``, the name the
    client called; ``'up__wipe' (upstream 'wipe' of server 'up')`` when the server's own
    name for it (``upstream``, of ``server``) differs (a gateway's namespaced name)."""
    if upstream is None or upstream == called:
        return repr(called)
    return f"{called!r} (upstream {upstream!r} of server {server!r})"


def text(key: str, **fields: Any) -> str:
    """The text of situation ``key`` of :data:`TEXTS` with ``fields`` filled in.
    Raises ``KeyError`` for an unknown key or a missing field."""
    return TEXTS[key][1].format(**fields)


def failure(key: str, call_id: str, name: str, duration_ms: float = 0.0, **fields: Any) -> ToolResult:
    """The error result of situation ``key`` of :data:`TEXTS` for call ``call_id`` of
    tool ``name`` (``{tool}`` in the template; ``duration_ms`` in milliseconds)."""
    kind, template = TEXTS[key]
    return error_result(call_id, name, kind, template.format(tool=name, **fields), duration_ms)


def error_result(call_id: str, name: str, kind: ErrorKind, message: str, duration_ms: float = 0.0) -> ToolResult:
    """An error :class:`ToolResult` with ``message`` as the model's text."""
    return ToolResult(call_id, name, False, message, kind, None, (), duration_ms)


def capped(result: ToolResult, max_chars: int) -> ToolResult:
    """``result`` with its text cut to ``max_chars`` characters behind the size notice
    of :func:`~rho_actors.encoding.cap_text` (the output cap every result text obeys),
    for results the runtime builds itself: a refusal echoing long names or values."""
    content, truncated = cap_text(result.content, max_chars)
    return dataclasses.replace(result, content=content) if truncated else result


def result_from_exception(
    call_id: str, name: str, exc: BaseException, max_chars: int, duration_ms: float
) -> ToolResult:
    """A ``raised`` result for an ``Exception``, ``exited`` for any other ``BaseException``;
    the text (``tool 'x' raised ValueError: ...``) is capped at ``max_chars`` characters.
    Its host-only ``details`` are ``{"traceback": text}`` (:func:`tool_traceback`; the
    model never sees details). A :class:`~rho_actors.tool.ToolFailure` gives its own
    kind, with its message as the text, its ``details``, and no traceback."""
    if isinstance(exc, ToolFailure):
        failed = error_result(call_id, name, exc.kind, encode_output(str(exc), max_chars).text, duration_ms)
        details = {**exc.details, "retryable": True} if exc.retryable else dict(exc.details)
        return dataclasses.replace(failed, details=details) if details else failed
    if isinstance(exc, Exception):
        kind, verb = ErrorKind.RAISED, "raised"
    else:
        kind, verb = ErrorKind.EXITED, "exited with"
    message = encode_output(f"tool {name!r} {verb} {describe_exception(exc)}", max_chars).text
    result = error_result(call_id, name, kind, message, duration_ms)
    return dataclasses.replace(result, details={TRACEBACK: tool_traceback(exc)})


TRACEBACK: Final = "traceback"
"""The key of a ``raised``/``exited`` result's ``details`` that holds the traceback."""
MAX_TRACEBACK_CHARS: Final = 20_000
_OWN_DIR: Final = os.path.dirname(os.path.abspath(__file__)) + os.sep


def tool_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as text, from the tool's own first frame (the runtime's frames
    that called it are left out), control characters removed, at most
    :data:`MAX_TRACEBACK_CHARS` characters (the end kept). Never raises."""
    try:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.startswith(_OWN_DIR):
            tb = tb.tb_next
        report = traceback.TracebackException(type(exc), exc, tb)
        for summary, (frame, _) in zip(report.stack, traceback.walk_tb(tb), strict=False):
            if summary.filename == "<dynamic-code>":  # a function shipped by value: its module's file
                where = frame.f_globals.get("__file__")
                if isinstance(where, str):
                    summary.filename = _real_path(where)
                    summary._line = None  # type: ignore[attr-defined]  # read again from that file
            elif summary.filename.startswith("/proc/self/fd/"):
                summary.filename = _real_path(summary.filename)
                summary._line = None  # type: ignore[attr-defined]
        text = "".join(report.format())
    except BaseException:
        text = f"{type(exc).__name__} (its traceback could not be formatted)"
    text = replace_controls(scrub_text(text), "")
    if len(text) > MAX_TRACEBACK_CHARS:
        text = "...\n" + text[-MAX_TRACEBACK_CHARS:]
    return text


def _real_path(path: str) -> str:
    """``path`` with a ``/proc/self/fd/N`` folder (a worker's imports pinned before its
    uid drop) replaced by the folder it stands for."""
    match = re.match(r"/proc/self/fd/(\d+)(/.*)?$", path)
    if match is None:
        return path
    try:
        return os.readlink(f"/proc/self/fd/{match.group(1)}") + (match.group(2) or "")
    except OSError:
        return path


def traceback_of(result: ToolResult) -> str | None:
    """The traceback a ``raised``/``exited`` result carries in its details, or ``None``."""
    details = result.details
    if result.error_kind not in (ErrorKind.RAISED, ErrorKind.EXITED) or not isinstance(details, Mapping):
        return None
    text = details.get(TRACEBACK)
    return replace_controls(text, "")[-MAX_TRACEBACK_CHARS:] if isinstance(text, str) else None


def result_from_return(call_id: str, name: str, value: Any, max_chars: int, duration_ms: float) -> ToolResult:
    """The result for what ``run`` returned: ``Ok``/plain value/``Details`` are ok;
    ``Error(reason)`` is a ``tool_error`` (the tool's own report of a failure, told apart
    from an exception it ``raised``) with ``reason`` as text. An :class:`Image`,
    :class:`Audio` or :class:`Resource`, alone or in a list or tuple beside text (and
    other values, JSON-encoded), makes the result's ``blocks``, in order (its text parts
    held to ``max_chars`` in all: past it they give way to one capped text at the first
    one's place); its ``content`` is then :func:`model_text` of them, capped at
    ``max_chars``."""
    if type(value) is str:  # the usual case: scrubbed once, and made without the dataclass's __init__
        content = value if value.isascii() else scrub_text(value)  # ASCII holds no surrogate: nothing to scrub
        if len(content) <= max_chars:  # set through its slots (see _NEW below): on every call
            result = _NEW(ToolResult)
            _SET_CALL_ID(result, call_id)
            _SET_NAME(result, name)
            _SET_OK(result, True)
            _SET_CONTENT(result, content)
            _SET_ERROR_KIND(result, None)
            _SET_DETAILS(result, None)
            _SET_IMAGES(result, ())
            _SET_DURATION(result, duration_ms)
            _SET_BLOCKS(result, ())
            return result
        return ToolResult(call_id, name, True, encode_output(content, max_chars).text, None, None, (), duration_ms)
    if isinstance(value, Deferred):  # it waits for loop.resolve (DESIGN §4 "Approvals")
        deferred = failure("deferred", call_id, name, duration_ms, call=call_id, reason=value.reason)
        return dataclasses.replace(deferred, details={"deferred": value.reason})
    ok = True
    if isinstance(value, Ok):
        value = value.output
    elif isinstance(value, Error):
        ok, value = False, value.reason
    details = None
    if isinstance(value, Details):
        value, details = value.output, value.details
    blocks: tuple[Block, ...] = ()
    if isinstance(value, MEDIA):
        blocks = (value,)
    elif isinstance(value, (list, tuple)) and any(isinstance(v, MEDIA) for v in value):
        blocks = tuple(v if isinstance(v, (str, *MEDIA)) else encode_output(v, max_chars).text for v in value)
    if blocks:
        content = encode_output(model_text(blocks), max_chars).text
        texts = "\n".join(b for b in blocks if isinstance(b, str))
        capped_texts = encode_output(texts, max_chars).text
        if capped_texts != texts:  # the text parts give way to one capped text, at the first one's place
            first = next(i for i, b in enumerate(blocks) if isinstance(b, str))
            media = [b for b in blocks if not isinstance(b, str)]
            blocks = (*media[:first], capped_texts, *media[first:])
    else:
        content = encode_output(value, max_chars).text
    kind = None if ok else ErrorKind.TOOL_ERROR
    return ToolResult(call_id, name, ok, content, kind, details, (), duration_ms, blocks)


# A plain text result (scrubbed, within the cap) is made with its fields set through their slots:
# a frozen dataclass's ``__init__`` sets each through ``object.__setattr__`` and scrubs again, about
# twice the time, on every call.
_NEW = object.__new__
(_SET_CALL_ID, _SET_NAME, _SET_OK, _SET_CONTENT, _SET_ERROR_KIND, _SET_DETAILS, _SET_IMAGES, _SET_DURATION,
 _SET_BLOCKS) = (ToolResult.__dict__[f.name].__set__ for f in dataclasses.fields(ToolResult))


def model_text(blocks: tuple[Block, ...]) -> str:
    """The text a model gets for ``blocks``, one line per part: text as it is, a line
    naming each :class:`Audio` and :class:`Resource` (providers take neither from a
    tool; a text resource's text follows its line), images left out (they go to the
    model as pictures)."""
    lines: list[str] = []
    for block in blocks:
        if isinstance(block, str):
            lines.append(block)
        elif isinstance(block, Audio):
            lines.append(f"[audio: {block.mime_type}, {len(block.data):,} bytes, not shown to the model]")
        elif isinstance(block, Resource):
            mime = f"{block.mime_type}, " if block.mime_type else ""
            if block.text is not None:
                lines.append(f"[resource {block.uri} ({mime}text):]\n{block.text}")
            else:
                lines.append(f"[resource {block.uri} ({mime}{block.size:,} bytes), not shown to the model]")
    return "\n".join(lines)
