"""The messages of a LoopActor, the name it is registered under and its session folder
(internal).

The host's :class:`~rho_actors.loop.handle.Loop` starts turns and reads the offer and
the running calls and sets the withheld names through the LoopActor's
:class:`~rho_actors.loop.turns.Turns` in its own thread (no message); a turn's cancel
token tells ``CancelTurn`` when it is set. ``RunTurn``, ``Offered``, ``Running`` and
``SetWithheld`` give the same as messages, to a caller holding only the actor's ref
(rho itself sends none of them). A
call's result is no message: its ``reply`` settles it in its turn directly (see
:mod:`rho_actors.loop.turns`).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pykka

from rho_actors.agent.session_lease import SessionLease
from rho_actors.cancel import CancelToken
from rho_actors.files import is_same_folder, private_dir
from rho_actors.tool import ToolCall, ToolResult

__all__ = [
    "Allowlist",
    "CancelTurn",
    "FolderAtStart",
    "Offered",
    "RunTurn",
    "Running",
    "SessionWithheld",
    "SetWithheld",
    "allowlist",
    "checked_session_id",
    "leased",
    "loop_name",
    "make_session_folder",
    "tell_loop",
]


@dataclass(slots=True)
class SessionWithheld:
    """A session's withheld names now, shared by its LoopActors one after another (each
    restart starts with the same arguments, this holder among them): what ``SetWithheld``
    set outlives a crash of the loop, so a withheld tool is never offered again by its
    restart."""

    names: frozenset[str]


class FolderAtStart:
    """The names ``start_loop`` found in a session's folder, of the two it looks up (its
    ``tasks`` folder and the approvals' transcript; none when the folder was missing;
    ``None``: not known), for the session's first :class:`~rho_actors.loop.turns.Turns` only:
    :meth:`take` gives them once, so a restart of the loop (same arguments, this holder
    among them) looks into the folder again."""

    __slots__ = ("_names",)

    def __init__(self, names: frozenset[str] | None) -> None:
        self._names: frozenset[str] | None = names

    def take(self) -> frozenset[str] | None:
        """The names, the first time; ``None`` (not known: look) after that."""
        names, self._names = self._names, None
        return names


@dataclass(frozen=True, slots=True)
class Allowlist:
    """The tools a loop may offer (``start_loop(tools=...)``): those named in ``names``,
    and those served by a source named in ``sources``."""

    names: frozenset[str]
    sources: frozenset[str]

    def allows(self, name: str, origin: str) -> bool:
        """Whether the tool ``name`` registered from ``origin`` is on the list."""
        return name in self.names or any(origin.endswith(f"(source {s})") for s in self.sources)


def allowlist(items: Any) -> Allowlist | None:
    """``start_loop``'s ``tools``: ``None`` (every registered tool), or a collection of
    tool names (``str``), tools (anything with a ``name()`` method: by that name) and
    sources (a :class:`~rho_actors.SourceHandle` or a source: anything with a ``name``
    text attribute; every tool it serves). Raises ``TypeError`` for a lone ``str`` or an
    item of another kind."""
    if items is None:
        return None
    if isinstance(items, (str, bytes)):
        raise TypeError(f"tools takes a collection of tool names, tools or sources, got the single string {items!r}")
    names: set[str] = set()
    sources: set[str] = set()
    for item in items:
        if isinstance(item, str):
            names.add(str.__str__(item))
        elif isinstance(getattr(item, "name", None), str):
            sources.add(str(item.name))
        elif callable(getattr(item, "name", None)) and isinstance(item.name(), str):
            names.add(str(item.name()))
        else:
            raise TypeError(f"tools takes tool names, tools and sources; got a {type(item).__name__}")
    return Allowlist(frozenset(names), frozenset(sources))


def loop_name(session_id: str) -> str:
    """The name a session's LoopActor is registered under (``whereis``)."""
    return f"loop:{session_id}"


_SESSION_ID: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@:-]{0,127}")


def checked_session_id(session_id: Any) -> str:
    """``session_id`` as an exact ``str`` (a subclass's methods cannot lie) when it is
    1-128 of ``A-Z a-z 0-9 _ . @ : -``, starting with a letter, digit or ``_``, without
    ``..`` (so it names one folder under ``sessions``); ``ValueError`` otherwise."""
    if isinstance(session_id, str):
        session_id = str.__str__(session_id)
    if type(session_id) is not str or not _SESSION_ID.fullmatch(session_id) or ".." in session_id:
        raise ValueError(
            f"session id {session_id!r} is not allowed: use 1-128 of A-Z a-z 0-9 _ . @ : -, "
            "starting with a letter, digit or _, and no '..'"
        )
    return session_id


def make_session_folder(session_dir: Path, checked: tuple[int, int] | None = None,
                        lease: SessionLease | None = None) -> Path:
    """Create a session's private folder ``session_dir`` (``data_dir/sessions/<id>``)
    unless it exists, and return it: the one place a session folder is made, on first
    use (before the session's first call, or when the host asks for
    :attr:`rho_actors.Loop.data_dir`), never at the loop's start. Made safely by
    :func:`rho_actors.files.private_dir`: ``sessions`` and the session folder are real
    folders reached without following a symlink, mode ``0700``. ``checked``: the
    identity ``start_loop`` found the folder with (:func:`rho_actors.files.folder_identity`);
    a folder that is still that one (one ``lstat``: same device and inode, a real folder
    of mode ``0700``) is not walked again, anything else (removed, replaced, loosened) is.
    ``lease``: the session's (:mod:`~rho_actors.agent.session_lease`), held from here on
    when it is not yet (the folder was missing at the loop's start).
    Raises :class:`rho_actors.files.UnsafePathError` when one is a symlink or no folder,
    :class:`~rho_actors.agent.session_lease.SessionLeaseError` when another host serves
    the session (both ``OSError``), and ``OSError`` when it cannot be made."""
    if checked is None or not is_same_folder(session_dir, checked):
        private_dir(session_dir.parent.parent, session_dir.parent.name, session_dir.name)
    if lease is not None and not lease.held:
        lease.hold()
    return session_dir


def leased(session_id: str, session_dir: Path, folder: tuple[int, int] | None, owner: object) -> SessionLease:
    """The lease of session ``session_id`` (:mod:`~rho_actors.agent.session_lease`) for
    the host ``owner``: held now when its folder ``session_dir`` exists (``folder``: its
    identity, as ``start_loop`` found it), else from the folder's making on
    (:func:`make_session_folder`). Raises as :meth:`SessionLease.hold`."""
    lease = SessionLease(session_id, session_dir, owner)
    if folder is not None:
        lease.hold()
    return lease


@dataclass(frozen=True, slots=True)
class RunTurn:
    """Run ``calls`` as one turn; ``future`` gets their results, in order.
    ``trace_context``: the OpenTelemetry context current in the submitting thread (the
    parent of the calls' spans; None while the system's telemetry is off). Setting
    ``cancel`` cancels the turn; each call runs in a copy of ``context`` (the
    submitter's ``contextvars``); ``on_result(index, result)`` is told each dispatched
    call's result as it settles, from the thread settling it."""

    calls: tuple[ToolCall, ...]
    future: concurrent.futures.Future[list[ToolResult]]
    trace_context: Any = None
    cancel: CancelToken | None = None
    context: contextvars.Context | None = None
    on_result: Callable[[int, ToolResult], None] | None = None


@dataclass(frozen=True, slots=True)
class CancelTurn:
    """The host cancelled turn ``turn``."""

    turn: int


@dataclass(frozen=True, slots=True)
class SetWithheld:
    """Replace the names the loop does not offer."""

    names: frozenset[str]


@dataclass(frozen=True, slots=True)
class Offered:
    """Asks for the checked declarations the loop offers now."""


@dataclass(frozen=True, slots=True)
class Running:
    """Asks for the calls running now."""


def tell_loop(ref: pykka.ActorRef[Any], message: Any) -> bool:
    """Tell ``message`` to the loop (dropped once it has ended); ``False`` when no thread
    could be started for its first message (it waits in the inbox, unstarted)."""
    try:
        ref.tell(message)
    except pykka.ActorDeadError:
        pass
    except RuntimeError:  # "can't start new thread": the host at its thread limit
        return False
    return True
