"""The agent loop: a model's replies and a session's tool calls, step by step.

:func:`prompt` runs one prompt of a session (:class:`~rho_actors.Loop`) to its end::

    load the session's transcript (the conversation so far; see rho_actors.agent.transcript)
    record the user's text
    repeat:
        send the conversation and the tools the loop offers *now* to the model
        record its reply
        no tool calls -> done: the reply's text is the answer
        run the calls as one turn (loop.run_turn), record each result, add them to
        the conversation in the calls' order
    until max_steps requests were answered with tool calls -> stop with an error

The offered declarations (``loop.declarations("neutral")``) are read again for every
request, so a tool registered, removed or withheld between steps changes the next
request. Nothing in here raises for what a model, a tool or the runtime does: a model
that raises (a provider error its adapter's retries did not cure), ``max_steps``, a
LoopActor that is gone for good or a transcript that cannot be read or written end the
prompt with :attr:`PromptResult.error` set, and the session can take the next prompt.

A LoopActor killed mid-turn answers the turn's open calls with ``crashed`` results,
which are recorded and sent to the model like any others; the loop waits (a bounded
time) for its supervisor to restart it and goes on. A process that died mid-turn leaves
calls recorded without results: the next prompt gives them ``cancelled`` results and
never runs them again.

The options of a prompt (``instructions``, ``temperature``, ``max_tokens``, ``cancel``,
``on_event``, ``max_calls_per_prompt``) are :func:`prompt`'s; :func:`stream` and
:func:`astream` yield its events. Every reply is checked against
the wire rules (:mod:`rho_actors.agent.provider_rules`) before it is recorded: unique call ids (the ids
the model sent are kept as ``sent_id`` in the transcript), an exact duplicate call once.

Example::

    model = ScriptedModel([
        Reply(tool_calls=[ToolCall("c1", "add", '{"a": 1, "b": 2}')]),
        Reply(text="1 + 2 = 3"),
    ])
    result = prompt(loop, "What is 1 + 2?", model=model)
    assert result.error is None and result.text == "1 + 2 = 3"
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, NoReturn, Protocol

import pykka
from loguru import logger

from rho_actors.agent.background import TaskSource, await_tasks, deliver_tasks
from rho_actors.agent.events import (
    FinalResult,
    PromptEvent,
    PromptResult,
    Step,
    StepEnded,
    TaskFinished,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from rho_actors.agent.model import Message, Model, Reply
from rho_actors.agent.moves import recording_moves
from rho_actors.agent.provider_rules import NEUTRAL_RULES, WireRules, checked_reply, sanitise_calls
from rho_actors.agent.recorder import Recorder, with_text
from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, TranscriptError
from rho_actors.cancel import CancelToken
from rho_actors.encoding import describe_exception, scrub_text
from rho_actors.lifecycle import RECORDED_BY_CALLER, CallTrack, PendingCall, open_pending, pending_call
from rho_actors.otp.actor import ActorExit
from rho_actors.results import failure
from rho_actors.telemetry import Telemetry
from rho_actors.tool import ToolCall, ToolResult


class Session(Protocol):
    """What a prompt needs of a session: :class:`rho_actors.Loop` is one. The agent layer
    sits on top of the runtime and depends on this much only. A session that also has
    an ``instructions`` attribute (as a ``Loop`` has) gives the default system prompt;
    one with a ``telemetry`` attribute (a :class:`rho_actors.Telemetry`) gets the
    prompt's ``invoke_agent`` and ``chat`` spans recorded with it."""

    @property
    def session_id(self) -> str: ...

    @property
    def data_dir(self) -> Path: ...

    @property
    def alive(self) -> bool: ...

    def declarations(self, dialect: Any = "neutral") -> list[dict[str, Any]]: ...

    def submit_turn(
        self, calls: Sequence[ToolCall], *, cancel: CancelToken | None = None,
        on_result: Callable[[int, ToolResult], None] | None = None,
    ) -> concurrent.futures.Future[list[ToolResult]]: ...

    def turn_bound_s(self, calls: Sequence[ToolCall]) -> float: ...


__all__ = [
    "DEFAULT_MAX_STEPS",
    "FinalResult",
    "PromptEvent",
    "PromptResult",
    "Session",
    "Step",
    "StepEnded",
    "TaskFinished",
    "TextDelta",
    "ToolCallFinished",
    "ToolCallStarted",
    "aprompt",
    "astream",
    "prompt",
    "stream",
]

DEFAULT_MAX_STEPS: Final = 10
CANCEL_WAIT_S: Final = 30.0
"""How long, in seconds, a cancelled :func:`aprompt` or :func:`astream` waits for the
prompt to record its cancellation before it re-raises."""
LOOP_WAIT_S: Final = 10.0
"""How long, in seconds, a prompt waits for a session's LoopActor that is not running
(its supervisor restarting it) before it stops with an error."""


class _Stop(Exception):
    """Ends the prompt with an error (already recorded in the transcript)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Cancelled(Exception):
    """The host cancelled the prompt while its model request was in flight."""


def prompt(
    loop: Session,
    text: str | None,
    *,
    model: Model,
    max_steps: int = DEFAULT_MAX_STEPS,
    cancel: CancelToken | None = None,
    instructions: str | None = None,
    temperature: float | None = None,
    max_tokens: int | None = None,
    on_event: Callable[[PromptEvent], None] | None = None,
    max_calls_per_prompt: int | None = None,
    wait_for_tasks: bool = False,
) -> PromptResult:
    """Run one prompt of ``loop``'s session to its end and return its :class:`PromptResult`.

    ``text``: the user's message; ``None`` continues the recorded conversation without a new message (after an
    interrupted prompt, a model error or ``max_steps``: the model is asked again). ``model``: any
    :class:`~rho_actors.agent.model.Model`. ``max_steps``: at most this many model requests (>= 1) in this prompt; a
    reply with tool calls at the last one stops the prompt with an error (its calls have run and are recorded).
    ``max_calls_per_prompt``: at most this many tool calls run in this prompt (>= 1; ``None``: no bound); a call
    past it gets a ``budget_exhausted`` result and does not run, and the model is asked again with it. Each request
    first gives the model the results of ended background calls (:mod:`rho_actors.agent.background`);
    ``wait_for_tasks=True``: a final reply while tasks are open waits for one to end and asks again. ``cancel``:
    setting it (from any thread) cancels the running turn (its calls get ``cancelled`` results, recorded) and stops
    the prompt before its next request; during a model request it stops the prompt at once, without waiting for the
    model (the request runs in a thread of its own; its reply is dropped, a stream ended). ``instructions``: the
    system prompt (default ``loop.instructions``; not recorded). ``temperature``, ``max_tokens``: passed to
    ``model.complete`` when given. ``on_event``: called (in this thread) with each :data:`PromptEvent`; with it the
    model is asked to stream (``on_text``).

    The conversation comes from, and goes to, ``loop.data_dir / "transcript.jsonl"``
    (:mod:`rho_actors.agent.transcript`); one prompt per session runs at a time (another one gets an error result at
    once). Blocks the calling thread: from asyncio use :func:`aprompt`. Errors of the model, the tools, the runtime
    or the transcript are reported in :attr:`PromptResult.error`, never raised; raises ``TypeError`` for a ``text``
    or ``instructions`` that is not a ``str`` or ``None``, a ``model`` without ``complete`` or a ``cancel`` that is
    not a :class:`~rho_actors.CancelToken`, and ``ValueError`` for a blank ``text`` (empty or only whitespace:
    providers refuse it; nothing is recorded), ``max_steps < 1`` or ``max_calls_per_prompt < 1``.
    """
    options = _checked(text, model, max_steps, cancel, instructions, temperature, max_tokens)
    if max_calls_per_prompt is not None:
        _checked(text, model, max_calls_per_prompt, cancel, instructions, None, None, "max_calls_per_prompt")
    if instructions is None:
        instructions = getattr(loop, "instructions", None)
        instructions = instructions if isinstance(instructions, str) and instructions.strip() else None
    transcript = Transcript(loop.data_dir / TRANSCRIPT_NAME)
    try:
        transcript.open()
    except (TranscriptError, OSError) as exc:
        result = PromptResult("", error=f"the session's transcript cannot be used: {describe_exception(exc)}")
        if on_event is not None:
            on_event(FinalResult(result))
        return result
    telemetry = getattr(loop, "telemetry", None) or Telemetry(enabled=False)
    with transcript, telemetry.invoke_agent(loop.session_id, model) as outcome:  # telemetry: the prompt's span
        driver = _Driver(loop, transcript, model, max_steps, cancel, instructions, options, on_event, telemetry)
        driver.max_calls, driver.wait_for_tasks = max_calls_per_prompt, wait_for_tasks
        result = driver.run(text)
        outcome(result.error)
    if on_event is not None:
        on_event(FinalResult(result))
    return result


def _checked(
    text: Any, model: Any, max_steps: Any, cancel: Any, instructions: Any, temperature: Any, max_tokens: Any,
    steps_name: str = "max_steps",
) -> dict[str, Any]:
    """The model options given, after checking every argument of :func:`prompt`."""
    if text is not None and not isinstance(text, str):
        raise TypeError(f"text must be a str or None, got {type(text).__name__}")
    if isinstance(text, str) and not text.strip():
        raise ValueError("the prompt text is empty or only whitespace (providers refuse such a message); "
                         "nothing was recorded; pass None to continue the conversation without new text")
    if instructions is not None and not isinstance(instructions, str):
        raise TypeError(f"instructions must be a str or None, got {type(instructions).__name__}")
    if not callable(getattr(model, "complete", None)):
        raise TypeError(f"model must have a complete(messages, tools) method, got {type(model).__name__}")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"{steps_name} must be an int of 1 or more, got {max_steps!r}")
    if cancel is not None and not isinstance(cancel, CancelToken):
        raise TypeError(f"cancel must be a rho_actors.CancelToken or None, got {type(cancel).__name__}")
    options: dict[str, Any] = {}
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
        options["temperature"] = float(temperature)
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int of 1 or more, got {max_tokens!r}")
        options["max_tokens"] = max_tokens
    return options


async def aprompt(loop: Session, text: str | None, *, model: Model, **options: Any) -> PromptResult:
    """:func:`prompt` (same ``options``) for asyncio hosts: runs it in a worker thread
    (in a copy of the caller's ``contextvars``, which the tools see), so the event loop
    is never blocked. Cancelling the awaiting task cancels the prompt and its running
    turn (as ``cancel`` does), waits (at most :data:`CANCEL_WAIT_S`) for the prompt to
    record the ``cancelled`` results, and re-raises ``CancelledError``."""
    token = options.pop("cancel", None)
    if token is None:
        token = CancelToken()
    _checked(text, model, options.get("max_steps", 1), token, options.get("instructions"),
             options.get("temperature"), options.get("max_tokens"))
    task = asyncio.ensure_future(asyncio.to_thread(prompt, loop, text, model=model, cancel=token, **options))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        token.cancel("cancelled")
        await asyncio.wait({task}, timeout=CANCEL_WAIT_S)
        raise


def stream(loop: Session, text: str | None, *, model: Model, **options: Any) -> Iterator[PromptEvent]:
    """Run :func:`prompt` (same ``options``, ``on_event`` excepted) in a thread and
    yield its events as they happen: :class:`TextDelta` (the model streams),
    :class:`ToolCallStarted`, :class:`ToolCallFinished`, :class:`StepEnded`, and last
    :class:`FinalResult` with the :class:`PromptResult`. Closing the iterator early cancels
    the prompt. Raises what :func:`prompt` raises for bad arguments, at once."""
    token = options.pop("cancel", None)
    if token is None:
        token = CancelToken()
    _checked(text, model, options.get("max_steps", 1), token, options.get("instructions"),
             options.get("temperature"), options.get("max_tokens"))
    events: queue.SimpleQueue[PromptEvent | BaseException] = queue.SimpleQueue()
    thread = _prompt_thread(loop, text, model, token, options, events.put)
    return _drain(events, token, thread)


def _prompt_thread(
    loop: Session, text: str | None, model: Model, token: CancelToken, options: dict[str, Any],
    put: Callable[[PromptEvent | BaseException], None],
) -> threading.Thread:
    def run() -> None:
        try:
            prompt(loop, text, model=model, cancel=token, on_event=put, **options)
        except BaseException as exc:  # an argument error: raised to the consumer
            put(exc)

    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(run,), name=f"prompt:{loop.session_id}", daemon=True)
    thread.start()
    return thread


def _drain(
    events: queue.SimpleQueue[PromptEvent | BaseException], token: CancelToken, thread: threading.Thread
) -> Iterator[PromptEvent]:
    done = False
    try:
        while True:
            event = events.get()
            if isinstance(event, BaseException):
                done = True
                raise event
            if isinstance(event, FinalResult):
                done = True
            yield event
            if done:
                return
    finally:
        if not done:
            token.cancel("cancelled")
            thread.join(CANCEL_WAIT_S)


async def astream(loop: Session, text: str | None, *, model: Model, **options: Any) -> AsyncIterator[PromptEvent]:
    """:func:`stream` for asyncio hosts: an async iterator of the same events, never
    blocking the event loop. Cancelling the consuming task (or closing the iterator
    early) cancels the prompt and waits (at most :data:`CANCEL_WAIT_S`) for it to
    record that."""
    token = options.pop("cancel", None)
    if token is None:
        token = CancelToken()
    _checked(text, model, options.get("max_steps", 1), token, options.get("instructions"),
             options.get("temperature"), options.get("max_tokens"))
    events: asyncio.Queue[PromptEvent | BaseException] = asyncio.Queue()
    running = asyncio.get_running_loop()

    def put(event: PromptEvent | BaseException) -> None:
        try:
            running.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:  # the event loop has closed
            pass

    thread = _prompt_thread(loop, text, model, token, options, put)
    done = False
    try:
        while True:
            event = await events.get()
            if isinstance(event, BaseException):
                done = True
                raise event
            if isinstance(event, FinalResult):
                done = True
            yield event
            if done:
                return
    finally:
        if not done:
            token.cancel("cancelled")
            await asyncio.to_thread(thread.join, CANCEL_WAIT_S)


class _Driver:
    def __init__(
        self, loop: Session, transcript: Transcript, model: Model, max_steps: int, cancel: CancelToken | None,
        instructions: str | None, options: dict[str, Any], on_event: Callable[[PromptEvent], None] | None,
        telemetry: Telemetry,
    ) -> None:
        self.loop = loop
        self.telemetry = telemetry
        self.transcript = transcript
        self.model = model
        self.max_steps = max_steps
        self.cancel = cancel
        self.instructions = instructions
        self.options = options
        self.on_event = on_event
        rules = getattr(model, "wire_rules", None)
        self.rules = rules if isinstance(rules, WireRules) else NEUTRAL_RULES
        history = transcript.history
        self.messages: list[Message] = list(history.messages)
        self.taken = {c.id for m in self.messages for c in m.tool_calls}
        self.next_step = history.next_step
        self.steps: list[Step] = []
        self.recovered: list[ToolResult] = []
        self.max_calls: int | None = None  # max_calls_per_prompt, and the calls run so far
        self.wait_for_tasks = False
        self.tasks: TaskSource | None = getattr(loop, "task_registry", None)  # a Loop's background calls
        self.calls_run = 0
        self.pending: list[PendingCall] = []

    def _emit(self, event: PromptEvent) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                logger.exception("session {}: on_event raised; the prompt goes on", self.loop.session_id)

    def run(self, text: str | None) -> PromptResult:
        try:
            running = _running_now(self.loop, self.transcript.history.pending)
            if running:  # an approved call runs in this host now: not interrupted, and not answered yet
                return self._result(f"approved call(s) {', '.join(running)} are running now; prompt again once "
                                    "they have finished")
            self._recover()
            if self.transcript.history.open_calls:  # calls wait for a decision: nothing goes to the model yet
                history = self.transcript.history
                self.pending = open_pending(history.open_calls, [c for m in history.messages for c in m.tool_calls])
                return self._result(_waiting(self.pending, history.open_calls))
            if text is not None:
                text = scrub_text(text)  # a lone surrogate would break every later request
                self.transcript.user(self.next_step, text)
                self.messages.append(Message.user(text))
            elif not self.transcript.history.awaiting_reply and not self._deliver_tasks():
                return self._result("there is nothing to continue: the conversation is empty or ends with a reply")
            while True:
                self._deliver_tasks()
                if self.cancel is not None and self.cancel.cancelled:
                    self._stop("cancelled", "the host cancelled the prompt")
                if len(self.steps) >= self.max_steps:
                    self._stop("max_steps", f"the model still asked for tools after max_steps={self.max_steps} "
                                            "steps; the prompt was stopped")
                if self._step():
                    return self._result(None)
        except _Stop as stop:
            return self._result(stop.message)
        except (OSError, ValueError, RecursionError, TranscriptError) as exc:  # the transcript could not be written
            logger.exception("session {}: the transcript could not be written", self.loop.session_id)
            return self._result(f"the session's transcript could not be written: {describe_exception(exc)}")

    def _deliver_tasks(self) -> bool:
        return self.tasks is not None and deliver_tasks(self.tasks, self.loop.session_id, self.loop.data_dir,
                                                        self.transcript, self.next_step, self.messages,
                                                        lambda info: self._emit(TaskFinished(info)))

    def _result(self, error: str | None) -> PromptResult:
        text = self.steps[-1].reply.text if self.steps else ""
        return PromptResult(text, tuple(self.steps), error, tuple(self.recovered), tuple(self.pending))

    def _stop(self, kind: str, message: str) -> NoReturn:
        """Record why the prompt stops (at the request it did not make, or that failed),
        and stop it."""
        self.transcript.error(self.next_step, kind, message)
        raise _Stop(message)

    def _recover(self) -> None:
        """Record ``cancelled`` results for calls an interrupted prompt left unanswered."""
        for step, index, result in self.transcript.history.pending:
            logger.warning("session {}: call {} ({}) of step {} was interrupted before its result was recorded; "
                           "it is answered as cancelled, not run again", self.loop.session_id, result.call_id,
                           result.name, step)
            self.transcript.result(step, index, result)
            self.recovered.append(result)
        self.transcript.history.pending = []

    def _request(self, number: int, tools: list[dict[str, Any]]) -> Reply:
        messages = list(self.messages)
        if self.instructions:
            messages.insert(0, Message.system(self.instructions))
        options = dict(self.options)
        if self.cancel is not None:
            return checked_reply(self._cancellable(number, messages, tools, options, self.cancel))
        if self.on_event is not None:
            options["on_text"] = lambda piece: self._emit(TextDelta(number, piece))
        return checked_reply(self._complete(messages, tools, options))

    def _complete(self, messages: list[Message], tools: list[dict[str, Any]], options: dict[str, Any]) -> Any:
        return self.model.complete(messages, tools, **options) if options else self.model.complete(messages, tools)

    def _cancellable(
        self, number: int, messages: list[Message], tools: list[dict[str, Any]], options: dict[str, Any],
        cancel: CancelToken,
    ) -> Any:
        """The model's answer, asked for in a thread of its own (in a copy of this thread's ``contextvars``), so that
        ``cancel`` stops the prompt without waiting for the model: raises :class:`_Cancelled` at once, the request's
        reply, when it comes, is dropped, and a streaming request is ended at its next text piece. Text pieces are
        emitted in this thread, in order."""
        inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        given_up = threading.Event()
        if self.on_event is not None:

            def on_text(piece: str) -> None:
                if given_up.is_set():
                    raise _Cancelled  # ends the stream of a request given up
                inbox.put(("text", piece))

            options["on_text"] = on_text

        def ask() -> None:
            try:
                inbox.put(("reply", self._complete(messages, tools, options)))
            except BaseException as exc:  # handed to the prompt's thread, which decides
                inbox.put(("error", exc))

        def on_cancel() -> None:
            inbox.put(("cancelled", None))

        cancel.add_inline_callback(on_cancel)
        try:
            return self._answer(number, inbox, given_up, ask)
        finally:  # the host's token may serve many prompts: it keeps no callback per request
            cancel.remove_callback(on_cancel)

    def _answer(
        self, number: int, inbox: queue.SimpleQueue[tuple[str, Any]], given_up: threading.Event,
        ask: Callable[[], None],
    ) -> Any:
        """Start ``ask`` on a thread of its own and serve ``inbox`` until its reply, its
        error or a cancel (:meth:`_cancellable`)."""
        context = contextvars.copy_context()
        threading.Thread(target=context.run, args=(ask,), name=f"model:{self.loop.session_id}:{number}",
                         daemon=True).start()
        while True:
            kind, value = inbox.get()
            if kind == "text":
                self._emit(TextDelta(number, value))
            elif kind == "reply":
                return value
            elif kind == "error":
                raise value
            else:
                given_up.set()
                raise _Cancelled

    def _step(self) -> bool:
        """One model request and its turn; True when the reply was the final one."""
        number = self.next_step
        tools = self._declarations()
        started = time.perf_counter()
        try:
            with self.telemetry.chat(self.model) as record:  # telemetry: the request's span
                reply = self._request(number, tools)
                record(reply)
        except _Cancelled:
            self._stop("cancelled", "the host cancelled the prompt")
        except Exception as exc:
            logger.warning("session {}: the model failed at step {}: {}", self.loop.session_id, number,
                           describe_exception(exc))
            self._stop("model", f"the model failed at step {number}: {describe_exception(exc)}")
        model_ms = (time.perf_counter() - started) * 1000
        calls, sources = sanitise_calls(reply.tool_calls, self.rules, self.taken, f"s{number}")
        sent_ids = {k: reply.tool_calls[i].id for k, i in enumerate(sources) if reply.tool_calls[i].id != calls[k].id}
        if len(calls) < len(reply.tool_calls):
            logger.warning("session {}: step {} repeated {} tool call(s) exactly; each runs once",
                           self.loop.session_id, number, len(reply.tool_calls) - len(calls))
        reply = replace(reply, tool_calls=calls)
        self.transcript.reply(number, reply, model_ms, sent_ids=sent_ids)  # before any call runs
        self.next_step += 1
        self.messages.append(Message.assistant(reply.text, reply.tool_calls, reply.thinking))
        if not reply.tool_calls:
            step = Step(number, reply)
            self.steps.append(step)
            self._emit(StepEnded(step))
            if reply.stop_reason in ("incomplete", "refused"):
                why = (f"was cut short: it hit its token limit ({self._reply_size(reply)})"
                       if reply.stop_reason == "incomplete" else "was refused")
                self._stop("model", f"the model's reply at step {number} {why}; its text is kept")
            return not (self.wait_for_tasks and self.tasks is not None and
                        await_tasks(self.tasks, self.loop.session_id, self.loop.data_dir, self.cancel))
        for call in reply.tool_calls:
            self._emit(ToolCallStarted(number, call))
        recorder = Recorder(self.transcript, number)
        cut = reply.stop_reason == "incomplete"  # the last call is the one the token limit cut off
        runnable = reply.tool_calls[:-1] if cut else reply.tool_calls
        with recording_moves(self.loop, self.transcript, number, runnable):  # the governor's: queued, retried
            results = self._run_calls(runnable, recorder.record)
        size = self._reply_size(reply)
        if cut:
            last = reply.tool_calls[-1]
            results.append(failure("cut_off", last.id, last.name, size=size))
        step = Step(number, reply, tuple(results))
        self.steps.append(step)
        self._take(number, results, recorder)
        self._emit(StepEnded(step))
        if cut:
            last = reply.tool_calls[-1]
            self._stop("model", f"the model's reply at step {number} hit its token limit ({size}): its last call "
                                f"{last.id} ({scrub_text(last.name)[:64]}) was cut off and did not run")
        return bool(self.pending)  # calls wait: the prompt returns, the host decides, prompt(None) goes on

    def _take(self, number: int, results: list[ToolResult], recorder: Recorder) -> None:
        """Record step ``number``'s results and add them to the conversation in call
        order; a call that waits for a decision is recorded ``pending`` instead (no
        result yet: the prompt returns once the step ends)."""
        for index, result in enumerate(results):
            pending = pending_call(result)
            if pending is not None:
                self.transcript.call(number, index, "pending", call_id=result.call_id, name=result.name,
                                     kind=pending.kind, arguments_sha256=pending.arguments_sha256,
                                     expires_at=pending.expires_at, reason=pending.reason)
                self.pending.append(pending)
            else:
                recorder.record(index, result, quiet=False)
                self.messages.append(Message.tool_result(result))
            self._emit(ToolCallFinished(number, result))

    def _reply_size(self, reply: Reply) -> str:
        """How large a reply was, for a text saying it hit its token limit: the output
        tokens the provider counted, and the limit the request had when known."""
        used = reply.usage.output_tokens if reply.usage is not None else 0
        limit = self.options.get("max_tokens", getattr(self.model, "max_tokens", None))
        limit = limit if isinstance(limit, int) and not isinstance(limit, bool) else None
        if used and limit:
            return f"{used} output tokens, max_tokens={limit}"
        if used:
            return f"{used} output tokens"
        return f"max_tokens={limit}" if limit else "its size was not reported"

    # --- the session's LoopActor ----------------------------------------------------------

    def _wait_for_loop(self) -> bool:
        """Wait (at most :data:`LOOP_WAIT_S`) for the session's LoopActor to run again."""
        until = time.monotonic() + LOOP_WAIT_S
        delay = 0.002
        while not self.loop.alive:
            if time.monotonic() >= until:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return True

    def _gone(self) -> NoReturn:
        self._stop("loop", f"the loop of session {self.loop.session_id!r} is not running (stopped, or its "
                           f"supervisor gave up restarting it) and did not come back within {LOOP_WAIT_S:g} s")

    def _declarations(self) -> list[dict[str, Any]]:
        """The tools the loop offers now, waiting out a restart of its LoopActor."""
        for _ in range(3):
            try:
                return self.loop.declarations("neutral")
            except (pykka.ActorDeadError, ActorExit, pykka.Timeout):
                if not self._wait_for_loop():
                    self._gone()
            except Exception as exc:
                logger.exception("session {}: the loop could not list its tools", self.loop.session_id)
                self._stop("loop", f"the loop of session {self.loop.session_id!r} could not list its tools: "
                                   f"{describe_exception(exc)}")
        self._stop("loop", f"the loop of session {self.loop.session_id!r} kept stopping while asked for its tools")

    def _run_calls(self, calls: Sequence[ToolCall], on_result: Callable[[int, ToolResult], None]) -> list[ToolResult]:
        """The calls' results: those within ``max_calls_per_prompt`` run as one turn, the rest ``budget_exhausted``."""
        allowed = len(calls) if self.max_calls is None else max(0, min(len(calls), self.max_calls - self.calls_run))
        self.calls_run += allowed
        results = [with_text(r) for r in self._run_turn(calls[:allowed], on_result)] if allowed else []
        return results + [failure("budget_exhausted", c.id, c.name, scope="this prompt", budget=self.max_calls,
                                  what="tool calls", setting="max_calls_per_prompt") for c in calls[allowed:]]

    def _run_turn(self, calls: Sequence[ToolCall], on_result: Callable[[int, ToolResult], None]) -> list[ToolResult]:
        """The turn's results, one per call in order (``on_result`` is told each as it settles); a turn the loop never
        took (it was not running) gets ``cancelled`` results."""
        future: concurrent.futures.Future[list[ToolResult]] | None = None
        for _ in range(3):
            recorded = RECORDED_BY_CALLER.set(True)  # its held calls are recorded by _take, in this transcript
            try:
                future = self.loop.submit_turn(calls, cancel=self.cancel, on_result=on_result)
                break
            except pykka.ActorDeadError:  # not told: nothing ran; wait for the restart
                if not self._wait_for_loop():
                    break
            finally:
                RECORDED_BY_CALLER.reset(recorded)
        if future is None:
            return [failure("loop_not_running", c.id, c.name) for c in calls]
        bound = self.loop.turn_bound_s(calls)
        try:
            return future.result(timeout=bound)
        except concurrent.futures.TimeoutError:
            logger.error("session {}: the loop did not answer a turn within {:.1f} s", self.loop.session_id, bound)
            return [failure("loop_unanswered", c.id, c.name, bound_s=bound) for c in calls]


_WAITING: Final = ("{n} call(s) wait for a decision: decide them first (loop.approve, loop.reject or "
                   "loop.resolve), then prompt(None) goes on; no new message is taken meanwhile: {calls}")
_ACTED_ON: Final = ("call(s) {calls} were decided and are being acted on (an approved one run, a rejected one "
                    "answered; loop.when_decided(call_id) gives each one's result); prompt(None) again once they "
                    "have their results")


def _waiting(pending: list[PendingCall], tracks: Mapping[str, CallTrack]) -> str:
    """Why a prompt cannot go on while ``pending`` (a transcript's open calls, ``tracks``)
    have no result: those that wait for a decision, and those decided (by another process,
    or before this host started) that this host acts on now (never "decide them first":
    deciding one again is refused)."""
    undecided = [p for p in pending if tracks[p.call_id].state != "decided"]
    decided = ", ".join(f"{p.call_id} ({p.name}: {p.reason})" for p in pending if tracks[p.call_id].state == "decided")
    if not undecided:
        return _ACTED_ON.format(calls=decided)
    waiting = _WAITING.format(n=len(undecided), calls=", ".join(f"{p.call_id} ({p.name})" for p in undecided))
    return waiting if not decided else f"{waiting}; and {_ACTED_ON.format(calls=decided)}"


def _running_now(loop: Session, unanswered: list[tuple[int, int, ToolResult]]) -> list[str]:
    """The ids of calls a transcript has no result for that run in ``loop`` now (an
    approved call run by ``loop.approve`` or a decision from another process)."""
    running = getattr(loop, "running", None)
    if not unanswered or running is None:
        return []
    try:
        now = {call["call_id"] for call in running()}
    except Exception:
        return []
    return [r.call_id for _, _, r in unanswered if r.call_id in now]
