"""Served sessions a killed ``mcp serve`` left holding calls, taken back by the next
server on the same data folder (DESIGN §6b "Held calls across a restart").

A served session ends by rejecting its calls still waiting for approval
(:meth:`~rho_actors.mcp.sessions.Session.end_held`): no client of it can be answered
after. A server killed (``kill -9``, a crash) ends none, so its sessions' held calls, and
the MCP tasks of held background calls, are left pending in their transcripts and task
records. Each served session that may hold a call keeps
:data:`~rho_actors.mcp.sessions.HELD_MARKER` in its folder (its client's principal) from
before such a call until its end; a server starting finds the sessions still marked and
takes each back (:class:`TakenBack`): its loop started, which takes back its held tasks
and the transcript's held calls as any host does (``loop/reruns.py``: a decision recorded
while no server ran is acted on, a task whose call the transcript holds no more ends
``held_task_lost``), and each of its tasks served again to the same principal
(:meth:`~rho_actors.mcp.tasks.ServedTasks.taken_back`: ``tasks/get``, ``tasks/update``
deciding a held call). ``rho-actors approve/reject`` is acted on within a second, as for
any session. A session left holding nothing is ended at once; the others end with the
server (their calls still waiting rejected, as any session's)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import anyio
from loguru import logger

from rho_actors.encoding import describe_exception
from rho_actors.files import open_regular
from rho_actors.loop.approval_rules import approval_rule
from rho_actors.mcp.sessions import HELD_MARKER, Session
from rho_actors.mcp.tasks import ServedTasks

__all__ = ["TakenBack", "marked_sessions", "may_hold"]

_MAX_PRINCIPAL_CHARS = 512  # a marker longer than this names no principal this server gives


async def may_hold(session: Session, entry: Any, principal: str, as_task: bool) -> None:
    """Before the turn of a call of the tool whose tool-set entry is ``entry``: mark the
    session (:meth:`Session.mark`, in a worker thread, once) when the call may be held
    for a decision (its tool may require approval, or the loop has an approval policy)
    or runs as a task (``as_task``: its task outlives the server's crash as its record)."""
    if session.marked or entry is None:
        return
    if not as_task and approval_rule(entry) is False and session.loop.approval_policy is None:
        return
    await anyio.to_thread.run_sync(session.mark, principal)


def marked_sessions(data_dir: Path) -> list[tuple[str, str]]:
    """The served sessions under ``data_dir`` whose folder holds :data:`HELD_MARKER`:
    (session id, principal), in the order of their ids. A marker that cannot be read
    is logged and left."""
    found = []
    try:
        with os.scandir(data_dir / "sessions") as folders:
            names = sorted(f.name for f in folders if f.name.startswith("mcp-") and f.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return []
    for name in names:
        try:
            with os.fdopen(open_regular(data_dir / "sessions" / name / HELD_MARKER, os.O_RDONLY), "rb") as marker:
                principal = marker.read(_MAX_PRINCIPAL_CHARS * 4).decode("utf-8", "surrogateescape")
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            logger.warning("MCP session {}: its {} cannot be read; not taken back: {}", name, HELD_MARKER,
                           describe_exception(exc))
            continue
        found.append((name, principal[:_MAX_PRINCIPAL_CHARS]))
    return found


class TakenBack:
    """The sessions one server took back from a server before it (see the module doc):
    ``system`` serves them with ``withheld`` tools withheld, ``tasks`` serves their tasks."""

    def __init__(self, system: Any, withheld: tuple[str, ...], tasks: ServedTasks) -> None:
        self._system, self._withheld, self._tasks = system, withheld, tasks
        self.sessions: set[Session] = set()

    async def start(self) -> None:
        """Take back every marked session (each in a worker thread); one that cannot be
        taken back is logged and left marked (the next server tries again)."""
        for session_id, principal in await anyio.to_thread.run_sync(marked_sessions, self._system.data_dir):
            try:
                session, holding = await anyio.to_thread.run_sync(functools.partial(self._take, session_id,
                                                                                     principal))
            except Exception as exc:
                logger.error("MCP session {}: left by a server that stopped without ending it, not taken back: {}",
                             session_id, describe_exception(exc))
                continue
            if holding:
                self.sessions.add(session)
            else:  # nothing waits (decided while no server ran, or lost): ended, its marker removed
                await session.close(set(), "")

    def _take(self, session_id: str, principal: str) -> tuple[Session, bool]:
        loop = self._system.start_loop(session_id, withheld=self._withheld)  # its held calls and tasks taken back
        loop.model_chooses = False
        session = Session(loop, principal=principal, marked=True)
        infos = self._system.task_registry.tasks(session_id, loop.data_dir)
        held = {p.call_id: p for p in loop.pending() if p.kind == "approval"}
        self._tasks.taken_back(session, infos, held)
        logger.warning("MCP session {}: taken back from a server that stopped without ending it: {} call(s) wait "
                       "for a decision, {} task(s) served again to {}", session_id, len(held), len(infos), principal)
        return session, bool(loop.pending()) or self._system.task_registry.has_open(session_id, loop.data_dir)

    async def close(self) -> None:
        """End the sessions taken back (their calls still waiting rejected, as any served session's)."""
        for session in list(self.sessions):
            await session.close(self.sessions, "")
