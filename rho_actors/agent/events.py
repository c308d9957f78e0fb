"""What a prompt of the agent loop (:mod:`rho_actors.agent`) gives back: each
:class:`Step` (a model request, its reply and its calls' results), the
:class:`PromptResult`, and the :data:`PromptEvent` values that :func:`rho_actors.agent.driver.stream`
and ``on_event`` give as they happen.

Example::

    for event in loop.stream("Add 1 and 2", model=model):
        if isinstance(event, TextDelta):
            print(event.text, end="")
        elif isinstance(event, FinalResult):
            print(event.result.usage)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from rho_actors.agent.model import Reply, Usage
from rho_actors.lifecycle import PendingCall
from rho_actors.lifecycle.tasks import TaskInfo
from rho_actors.tool import ToolCall, ToolResult

__all__ = [
    "FinalResult",
    "PromptEvent",
    "PromptResult",
    "Step",
    "StepEnded",
    "TaskFinished",
    "TextDelta",
    "ToolCallFinished",
    "ToolCallStarted",
]


@dataclass(frozen=True, slots=True)
class Step:
    """One model request of a prompt: ``number`` (the session's request count, as in
    its transcript), the model's ``reply``, and the ``results`` of its tool calls (one
    per call, in the calls' order; empty for the final reply)."""

    number: int
    reply: Reply
    results: tuple[ToolResult, ...] = ()

    @property
    def usage(self) -> Usage | None:
        """The tokens this request used (``None`` when the model did not say)."""
        return self.reply.usage


@dataclass(frozen=True, slots=True)
class PromptResult:
    """What a prompt came to.

    ``text``: the final reply's text (after an error: the last reply's text, often
    ``""``). ``steps``: the steps this prompt took, in order. ``error``: ``None``, or
    why the prompt stopped early (``max_steps`` reached, the model raised, the session's
    loop was gone, the transcript failed), as a sentence for the host. ``recovered``:
    ``cancelled`` results given to calls an earlier, interrupted prompt recorded but
    never answered (see :mod:`rho_actors.agent.transcript`). ``pending``: the calls that
    wait for a decision (:class:`~rho_actors.PendingCall`): the prompt returned to let
    the host decide them (``loop.approve``/``reject``/``resolve``), after which
    ``prompt(None)`` goes on.
    """

    text: str
    steps: tuple[Step, ...] = ()
    error: str | None = None
    recovered: tuple[ToolResult, ...] = field(default=())
    pending: tuple[PendingCall, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def usage(self) -> Usage:
        """The tokens all of this prompt's requests used (those that said)."""
        total = Usage()
        for step in self.steps:
            if step.reply.usage is not None:
                total = total + step.reply.usage
        return total


# --- events -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the reply text of request ``step``, as it streams in."""

    step: int
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """A call of request ``step`` was handed to the loop (its reply was recorded)."""

    step: int
    call: ToolCall


@dataclass(frozen=True, slots=True)
class ToolCallFinished:
    """The ``result`` of a call of request ``step`` (recorded)."""

    step: int
    result: ToolResult


@dataclass(frozen=True, slots=True)
class StepEnded:
    """Request ``step.number`` and its turn are done (and recorded)."""

    step: Step


@dataclass(frozen=True, slots=True)
class TaskFinished:
    """A background call ended and its result was given to the model (recorded):
    ``task``, a :class:`rho_actors.TaskInfo` with its ``result``."""

    task: TaskInfo


@dataclass(frozen=True, slots=True)
class FinalResult:
    """The prompt ended: its ``result`` (always the last event)."""

    result: PromptResult


PromptEvent: TypeAlias = TextDelta | ToolCallStarted | ToolCallFinished | TaskFinished | StepEnded | FinalResult
"""What :func:`stream`, :func:`astream` and ``on_event`` give, in order of happening."""
