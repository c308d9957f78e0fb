"""A turn's calls prepared in the submitting thread (DESIGN §4), as
:class:`~rho_actors.loop.turns.Turns` prepares them (internal: a part of ``Turns``,
which inherits it): for each call, in the model's order, its arguments are decoded
strictly, its tool is looked up among those offered now (:mod:`rho_actors.loop.offered`),
and its arguments are validated against the checked schema (the time validation takes
counts against the call's deadline); a call failing any of these gets its error result
(capped) and its tool never runs. The rest wait to start, but those the session's
approvals hold for a decision (:mod:`rho_actors.loop.turn_holds`).

An arguments text found valid for a registration is remembered with its decoded value
(marshalled: each later call with the same text gets its own copy, as if decoded
afresh), up to ``_VALID_KEPT`` texts of up to ``_VALID_CHARS`` characters a session.
"""

from __future__ import annotations

import marshal
import time
from typing import TYPE_CHECKING, Any

from loguru import logger

from rho_actors.declarations.arguments import MAX_VALIDATION_S, ArgumentsError, decode_arguments, violations
from rho_actors.declarations.toolset import ToolEntry, ToolSet
from rho_actors.encoding import describe_exception, text_length
from rho_actors.lifecycle import PendingCall
from rho_actors.lifecycle.tasks import RUN_IN_BACKGROUND, take_choice
from rho_actors.loop.offered import OfferedTools
from rho_actors.loop.turn import Slot, Turn
from rho_actors.loop.turn_holds import TurnHolds
from rho_actors.results import capped, error_result, failure, text
from rho_actors.sandbox import Waiter
from rho_actors.tool import ToolCall, ToolResult

if TYPE_CHECKING:
    from rho_actors.runtime import Limits

__all__ = ["CallPreparation"]

_VALID_CHARS = 4096  # arguments texts up to this long are remembered once found valid...
_VALID_KEPT = 256  # ...this many per session (then forgotten all at once)


class CallPreparation(OfferedTools, TurnHolds):
    """The preparing part of :class:`~rho_actors.loop.turns.Turns` (see the module doc),
    with the offer it looks calls up in and the holds it hands calls to: the attributes
    below are set by ``Turns``."""

    _limits: Limits
    # arguments texts found valid, by (tool name, text): the entry they were valid for and
    # the decoded value marshalled (decoded, checked once)
    _valid: dict[tuple[str, str], tuple[ToolEntry, bytes]]

    def _prepare_turn(
        self, turn: Turn, refused: list[Slot], withheld: frozenset[str], chooses: bool, approved: bool,
        waiter: Waiter | None,
    ) -> list[tuple[ToolCall, PendingCall]]:
        """Prepare each call of ``turn`` (:meth:`_prepare`): a refused one gets its result
        and joins ``refused``, the rest wait to start; then the calls held for a decision
        leave ``waiting`` (returned, each with its :class:`PendingCall`; in ``refused`` too)."""
        tools = self._tools.current
        for index, slot in enumerate(turn.slots):
            try:
                refusal = self._prepare(slot, tools, withheld, chooses)
            except Exception as exc:  # a bug, or a checker that broke: this call only
                logger.exception("loop {} could not prepare call {}", self.session_id, slot.call.id)
                refusal = failure("not_prepared", slot.call.id, slot.call.name, problem=describe_exception(exc))
            if refusal is not None:
                slot.result = capped(refusal, self._limits.max_output_chars)  # refusals are capped too
                refused.append(slot)
            else:
                turn.open += 1
                turn.waiting.append(index)
                turn.exclusive |= slot.entry is not None and slot.entry.info.concurrency == "exclusive"
        held: list[tuple[ToolCall, PendingCall]] = []
        if (self.approvals is not None and not approved
                and self.approvals.may_hold(turn.slots, turn.waiting, tools.version)):
            held = self._hold(turn, refused, tools.version)
        if waiter is not None and turn.open == 1 and not held:  # its one call: the caller reads its reply
            turn.waiter = waiter
        return held

    def _prepare(self, slot: Slot, tools: ToolSet, withheld: frozenset[str], chooses: bool) -> ToolResult | None:
        """Decode, look up and validate one call; an error result when it is refused."""
        call = slot.call
        name = call.name
        approvals = self.approvals  # never a second call of one id (waits' first look, inline: none waits)
        if approvals is not None and approvals._held and approvals.waits(call.id):
            return failure("call_id_pending", call.id, name, call=call.id)
        entry = tools.entries.get(name)
        if entry is None or name in withheld or (self._allowed is not None and not self._allows(entry)):
            return self._lookup_error(call.id, name, entry, tools, withheld)
        arguments = call.arguments
        key = (name, arguments) if type(arguments) is str and len(arguments) <= _VALID_CHARS else None
        if key is not None:
            known = self._valid.get(key)
            if known is not None and known[0] is entry:  # this text was valid for this very registration
                slot.entry, slot.args = entry, marshal.loads(known[1])
                return None
        try:
            args = decode_arguments(call.arguments, self._limits.max_argument_depth)
        except ArgumentsError as err:
            return error_result(call.id, name, err.kind, text("bad_arguments", tool=name, problem=err))
        if entry.info.policy.background == "optional" and isinstance(args, dict) and RUN_IN_BACKGROUND in args:
            asked = take_choice(entry.info, call.id, args, chooses)  # the model's choice
            if isinstance(asked, ToolResult):
                return asked
            slot.asked, key = asked, None  # a text that chose is not remembered as the tool's arguments
        began = time.monotonic()
        try:  # validation counts against the call's deadline
            size = (len(arguments) if type(arguments) is str  # bounds the work (a str's length: no frame)
                    else text_length(arguments) if isinstance(arguments, (str, bytes, bytearray)) else None)
            problems = violations(entry.validator, args, min(entry.info.timeout_ms / 1000, MAX_VALIDATION_S), size)
        except Exception as exc:  # a $ref cycle's RecursionError, a format checker's OverflowError...
            return failure("unvalidatable", call.id, name, problem=describe_exception(exc))
        if problems:
            return failure("invalid_arguments", call.id, name, problems="; ".join(problems))
        slot.entry, slot.args, slot.validated_s = entry, args, time.monotonic() - began
        if key is not None:
            self._remember(key, entry, args)
        return None

    def _remember(self, key: tuple[str, str], entry: ToolEntry, args: dict[str, Any]) -> None:
        """Keep valid arguments text of ``entry``'s tool with its decoded value (marshalled:
        each later call with the same text gets its own copy, as if decoded afresh)."""
        try:
            blob = marshal.dumps(args)
        except ValueError:  # not plain JSON data: decoded afresh each time
            return
        if len(self._valid) >= _VALID_KEPT:
            self._valid.clear()
        self._valid[key] = (entry, blob)
