"""What a session offers the model: the tools of the published tool set that are neither
withheld nor outside the session's allowlist (DESIGN §4), as :class:`~rho_actors.loop.turns.Turns`
reads them (internal: a half of ``Turns``, which inherits it).

The withheld names are one immutable snapshot (:class:`~rho_actors.loop.turn.Withheld`),
swapped whole by :meth:`OfferedTools.set_withheld`: a turn reads it once, so it is prepared
against the old set or the new one, never a mix. The offer is kept until the tool set's
version or the withheld names change. A call of a tool not offered gets an error naming
why (withheld, unavailable, or unknown: with the names offered, at most 40 of them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rho_actors.declarations.toolset import ToolEntry, ToolSet, ToolSetView, copied_infos, offer_chunks
from rho_actors.loop.turn import Withheld, withheld_set
from rho_actors.results import error_result, failure, text
from rho_actors.tool import ErrorKind, ToolInfo, ToolResult

if TYPE_CHECKING:
    from rho_actors.loop.messages import Allowlist, SessionWithheld

__all__ = ["OfferedTools"]

_MAX_NAMES_LISTED = 40


class OfferedTools:
    """The offer half of :class:`~rho_actors.loop.turns.Turns` (see the module doc): the
    attributes below are set by ``Turns``."""

    _kept: SessionWithheld  # the session's names, shared with its loop's restarts
    _snapshot: Withheld  # the snapshot made of them last
    _allowed: Allowlist | None
    _tools: ToolSetView
    _offer: tuple[int, Withheld, tuple[ToolEntry, ...], tuple[bytes, ...] | None] | None  # the last offer, by version

    def set_withheld(self, names: frozenset[str]) -> None:
        """Replace the withheld names (from the next turn prepared), from any thread: one
        assignment of the session's names, which its loop's restarts share and a turn
        being prepared reads once."""
        self._kept.names = names

    @property
    def _withheld(self) -> Withheld:
        """The snapshot of the session's withheld names now (read once per turn; remade
        only when they changed, here or on another loop of the session)."""
        snapshot, names = self._snapshot, self._kept.names
        if snapshot.names is not names:
            snapshot = self._snapshot = withheld_set(names)
        return snapshot

    def offered_entries(self) -> tuple[ToolEntry, ...]:
        """The entries offered now, in registration order (kept until the tool set or
        the withheld names change)."""
        tools, withheld = self._tools.current, self._withheld
        offer = self._offer
        if offer is not None and offer[0] == tools.version and offer[1] is withheld:
            return offer[2]
        entries = tuple(self._offered(tools, withheld.names))
        self._offer = (tools.version, withheld, entries, offer_chunks(entries))
        return entries

    def offered(self) -> list[ToolInfo]:
        """The checked declarations offered now, each its own copy (its schema copied on
        its first read: see :func:`~rho_actors.declarations.toolset.copied_infos`)."""
        entries = self.offered_entries()
        offer = self._offer
        return copied_infos(entries, offer[3] if offer is not None and offer[2] is entries else None)

    def _offered(self, tools: ToolSet, withheld: frozenset[str]) -> list[ToolEntry]:
        return [e for name, e in tools.entries.items() if name not in withheld and self._allows(e)]

    def _allows(self, entry: ToolEntry) -> bool:
        return self._allowed is None or self._allowed.allows(entry.info.name, entry.origin)

    def _lookup_error(
        self, call_id: str, name: str, entry: ToolEntry | None, tools: ToolSet, withheld: frozenset[str]
    ) -> ToolResult:
        if entry is not None:
            return failure("withheld", call_id, name)
        if name in tools.unavailable:
            return error_result(call_id, name, ErrorKind.UNAVAILABLE, tools.unavailable[name])
        offered = [e.info.name for e in self._offered(tools, withheld)]
        shown = ", ".join(offered[:_MAX_NAMES_LISTED]) + (", ..." if len(offered) > _MAX_NAMES_LISTED else "")
        message = text("unknown_tool", tool=name[:100], offered=shown or "(none)")
        return error_result(call_id, name, ErrorKind.UNKNOWN_TOOL, message)
