"""The cap on worker processes of a whole system, shared fairly among sessions
(internal; DESIGN §5 "Fair shares").

Every :class:`~rho_actors.sandbox.pool.WorkerPool` of a system takes a slot of one
:class:`WorkerSlots` before it starts a worker process and frees it once the process is
reaped, so the system never has more than ``limit`` worker processes alive (running or
idle). Before a call takes a worker at all it is *granted* a place
(:meth:`WorkerSlots.enter`): at most ``running`` calls are granted at once (``running``
<= ``limit``: the rest of the cap holds idle workers kept for their scope), at most
``per_session`` of one session, and waiting calls are granted in fair order (the session
with the fewest granted calls first, then the oldest call), so one session's wide turn of
long calls never starves another's.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Final, Protocol

__all__ = ["QUANTUM", "REUSE_GRACE_S", "SHORT_CALL_S", "Grant", "WorkerSlots"]

QUANTUM: Final = 16
"""Calls in a row a session may run on the grant (and the warm worker) it just used
while other sessions wait, before its grant goes to them (see :meth:`WorkerSlots.leave`)."""
SHORT_CALL_S: Final = 0.5
"""Only a call shorter than this (seconds) keeps its grant for its session's next call."""
REUSE_GRACE_S: Final = 0.5
"""How long a just-used grant is kept for its session's next call while others wait
(seconds): the time a session's next call takes to arrive."""


class Grant:
    """A call's place under the cap: its ``session``, when the call reached its worker
    (``at``, a ``time.monotonic()`` instant; before: when it was granted) and whether it
    is not held (``left``: given back, or, made with ``left=True`` and passed to
    :meth:`WorkerSlots.enter`, not yet granted: set ``False`` under the cap's lock as it is
    granted, so that a caller interrupted anywhere knows whether it holds one)."""

    __slots__ = ("at", "left", "session")

    def __init__(self, session: Hashable, at: float, left: bool = False) -> None:
        self.session = session
        self.at = at
        self.left = left


class _Retiring(Protocol):
    def retire_one_idle(self, spare: frozenset[Hashable]) -> bool:
        """Stop one idle worker (not one of a session in ``spare``); whether there was one."""


@dataclass(slots=True)
class _Share:
    """A session's use of the cap: ``granted`` calls now (running or holding a kept
    grant), ``run``, grants it re-took in a row while others waited, and ``kept_until``,
    until when a grant it just released is kept for it (0: none)."""

    granted: int = 0
    run: int = 0
    kept_until: float = 0.0
    waited_out: int = 0


@dataclass(eq=False, slots=True)
class _Ticket:
    """A call waiting for a grant: ``granted`` once handed one, ``cond`` (on the cap's
    lock) to wake it."""

    seq: int
    session: Hashable
    cond: threading.Condition
    granted: bool = False
    grant: Grant | None = None

    def hand(self) -> None:
        """Granted (under the cap's lock): it and its caller's :class:`Grant` hold the place."""
        self.granted = True
        if self.grant is not None:
            self.grant.left = False
        self.cond.notify()


class WorkerSlots:
    """The cap on worker processes of a whole system (alive ones: idle, busy or
    starting; a slot is freed once its process is reaped), the cap on calls running in
    them, and the fair share of it each session gets. ``limit`` >= 1; ``running``, the
    most calls that hold a worker at once (1..``limit``; default ``limit``): the
    ``limit - running`` other slots keep idle workers warm for their scope, so that
    more sessions than ``running`` each keep their untrusted worker; ``per_session``,
    the most calls of one session that hold a worker at once (1..``running``; default
    ``running``). ``peak`` is the most processes ever alive at once.

    A call first :meth:`enter`\\ s (a grant: at most ``running`` at once, ``per_session``
    per session; waiting calls are granted in fair order) and :meth:`leave`\\ s when it
    ends; a granted call that needs a new worker process beyond the cap retires an idle
    worker of any pool sharing the cap (:meth:`retire_idle`), else waits (:meth:`wait`),
    until its deadline. A session whose short call just ended keeps its grant for
    :data:`REUSE_GRACE_S` while others wait, so that its next call finds its warm worker
    (untrusted workers are never shared between sessions), at most :data:`QUANTUM`
    times in a row."""

    def __init__(self, limit: int, per_session: int | None = None, running: int | None = None) -> None:
        if limit < 1:
            raise ValueError(f"the worker cap must be >= 1, not {limit}")
        running = limit if running is None else running
        if not 1 <= running <= limit:
            raise ValueError(f"the cap on running workers must be within 1..{limit} (the worker cap), not {running}")
        per_session = running if per_session is None else per_session
        if not 1 <= per_session <= running:
            raise ValueError(f"the per-session share of workers must be within 1..{running} (the cap on running "
                             f"workers), not {per_session}")
        self.limit = limit
        self.running = running
        self.per_session = per_session
        self.alive = 0
        self.peak = 0
        self.waiting = 0
        self.queued = 0
        self.waited_out = 0
        self._granted = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # calls waiting for a process slot wait here
        self._pools: weakref.WeakSet[_Retiring] = weakref.WeakSet()
        self._shares: dict[Hashable, _Share] = {}
        self._queue: list[_Ticket] = []
        self._seq = itertools.count()

    def join(self, pool: _Retiring) -> None:
        """Let this cap retire ``pool``'s idle workers when it is full."""
        self._pools.add(pool)

    # --- grants: the fair share of each session -------------------------------------------

    def enter(self, session: Hashable, deadline: float, cancelled: Callable[[], bool] | None = None,
              grant: Grant | None = None) -> bool:
        """Wait for a grant for one call of ``session`` (fair order, see the class),
        until ``deadline`` (a ``time.monotonic()`` instant) or ``cancelled()`` (polled
        on every :meth:`poke`); whether it was granted (if so, :meth:`leave` must
        follow). A waiting call is woken only when the grant is handed to it (or to
        look at its deadline), never by every change. ``grant`` (made with
        ``left=True``): marked held (``left=False``) under this cap's lock at the
        instant the place is its, so a caller interrupted anywhere (in the wait, as the
        place is handed to it, right after) gives it back by it, once."""
        with self._cond:
            share = self._shares.setdefault(session, _Share())
            if share.kept_until:  # its kept grant: take it again
                share.kept_until = 0.0
                _held(grant)
                return True
            self._expire_kept(time.monotonic())
            if not self._queue and self._grantable(share):
                self._grant(share)
                _held(grant)
                return True
            ticket = _Ticket(next(self._seq), session, threading.Condition(self._lock), grant=grant)
            self._queue.append(ticket)
            self.queued += 1
            self._dispatch()
            try:
                while not ticket.granted:
                    if cancelled is not None and cancelled():
                        return False
                    now = time.monotonic()
                    if now >= deadline:
                        share.waited_out += 1
                        self.waited_out += 1
                        return False
                    ticket.cond.wait(min(deadline - now, self._next_expiry(now), 0.25))
                    self._expire_kept(time.monotonic())
                return True
            except BaseException:  # interrupted (a signal handler's KeyboardInterrupt), maybe once granted
                if ticket.granted and grant is None:  # no caller's grant knows of it: given back here
                    self._ungrant(session, self._shares.setdefault(session, share))
                    self._dispatch()
                raise
            finally:
                if not ticket.granted:
                    self._queue.remove(ticket)
                    if not share.granted and not any(t.session == session for t in self._queue):
                        self._shares.pop(session, None)
                    self._dispatch()  # it may have been first in line

    def try_enter(self, session: Hashable, grant: Grant | None = None) -> bool:
        """:meth:`enter` without a wait: a grant for one call of ``session`` only if one
        is free now (its kept grant, or a free place while no call waits); whether it was
        granted (if so, :meth:`leave` must follow; if not, nothing changed). ``grant``:
        as :meth:`enter`'s."""
        with self._cond:
            share = self._shares.get(session)
            if share is not None and share.kept_until:  # its kept grant: take it again
                share.kept_until = 0.0
                _held(grant)
                return True
            self._expire_kept(time.monotonic())
            share = share if share is not None else _Share()
            if self._queue or not self._grantable(share):
                return False
            self._shares[session] = share
            self._grant(share)
            _held(grant)
            return True

    def leave(self, session: Hashable, held_s: float = 0.0, keep: bool = True) -> None:
        """One call of ``session`` that :meth:`enter` granted has ended, ``held_s``
        seconds after it was granted. While other sessions wait, the grant of a short
        call (under :data:`SHORT_CALL_S`) goes to the session's next call (handed over
        at once when it waits, else kept for it :data:`REUSE_GRACE_S`), at most
        :data:`QUANTUM` times in a row (so others wait at most that many short calls
        more); else (or without ``keep``: the call's worker would serve any session
        anyway) it is freed at once and handed on in fair order."""
        with self._cond:
            share = self._shares.get(session)
            if share is None or not share.granted:
                return
            others = any(t.session != session for t in self._queue)
            if keep and others and share.run < QUANTUM and not share.kept_until and held_s < SHORT_CALL_S:
                share.run += 1
                own = next((t for t in self._queue if t.session == session), None)
                if own is not None:  # its next call already waits: the grant is its
                    self._queue.remove(own)
                    own.hand()
                else:
                    share.kept_until = time.monotonic() + REUSE_GRACE_S
                return
            if not others:
                share.run = 0
            self._ungrant(session, share)
            self._dispatch()

    def kept(self) -> frozenset[Hashable]:
        """The sessions holding a kept grant now (their idle workers are spared)."""
        with self._cond:
            self._expire_kept(time.monotonic())
            return frozenset(s for s, share in self._shares.items() if share.kept_until)

    def shares(self) -> dict[str, int]:
        """Granted calls by session now (sessions with none left out), for ``stats()``."""
        with self._cond:
            return {str(s): share.granted for s, share in self._shares.items() if share.granted}

    def waiting_calls(self) -> int:
        """Calls waiting for a grant now."""
        with self._cond:
            return len(self._queue)

    def _grantable(self, share: _Share) -> bool:
        return self._granted < self.running and share.granted < self.per_session

    def _dispatch(self) -> None:
        """Hand free grants to waiting calls in fair order: of the sessions below their
        share, the one with the fewest granted calls first, then the oldest call."""
        while self._granted < self.running and self._queue:
            best: _Ticket | None = None
            best_key: tuple[int, int] | None = None
            for t in self._queue:
                share = self._shares.get(t.session)
                granted = share.granted if share is not None else 0
                if granted >= self.per_session:
                    continue
                if best_key is None or (granted, t.seq) < best_key:
                    best, best_key = t, (granted, t.seq)
            if best is None:
                return
            self._queue.remove(best)
            self._grant(self._shares.setdefault(best.session, _Share()))
            best.hand()

    def _grant(self, share: _Share) -> None:
        share.granted += 1
        share.run = 0
        self._granted += 1

    def _ungrant(self, session: Hashable, share: _Share) -> None:
        share.granted -= 1
        self._granted -= 1
        if not share.granted and not any(t.session == session for t in self._queue):
            self._shares.pop(session, None)

    def _expire_kept(self, now: float) -> None:
        expired = False
        for session, share in list(self._shares.items()):
            if share.kept_until and share.kept_until <= now:
                share.kept_until = 0.0
                self._ungrant(session, share)
                expired = True
        if expired:
            self._dispatch()

    def _next_expiry(self, now: float) -> float:
        pending = [s.kept_until - now for s in self._shares.values() if s.kept_until]
        return max(0.001, min(pending)) if pending else 0.25

    # --- process slots ---------------------------------------------------------------------

    def give_back(self, claim: list[bool]) -> None:
        """Free the process slot ``claim`` holds (the one-item list :meth:`try_acquire`
        filled, emptied by whoever takes the slot over), unless it was given back or
        handed on already: once, whichever thread or handler gets here."""
        try:
            claim.pop()  # atomic: of two threads (or an interrupted start and its handler) one frees it
        except IndexError:
            return
        self.release()

    def try_acquire(self, claim: list[bool] | None = None) -> bool:
        """Take a slot if one is free now; ``claim`` (an empty list) is given a ``True``
        under the lock as it is taken, so that a caller interrupted anywhere (in this
        very call's return included) gives it back by it (:meth:`give_back`)."""
        with self._cond:
            if self.alive >= self.limit:
                return False
            self.alive += 1
            self.peak = max(self.peak, self.alive)
            if claim is not None:
                claim.append(True)
            return True

    def retire_idle(self) -> bool:
        """Stop the longest idle worker (of a session holding no kept grant) of the first
        pool sharing the cap that has one; whether one was stopped (its slot is free once
        it is reaped, which is done)."""
        spare = self.kept()
        return any(pool.retire_one_idle(spare) for pool in list(self._pools))

    def wait(self, deadline: float) -> bool:
        """While the cap is full, wait until a slot is freed or a worker becomes idle
        (at most 250 ms, and never past ``deadline``, a ``time.monotonic()`` instant);
        ``False`` once ``deadline`` has passed. Counted in ``waiting`` meanwhile: spares
        are not started while calls wait."""
        with self._cond:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.alive >= self.limit:
                self.waiting += 1
                try:
                    self._cond.wait(min(remaining, self._next_expiry(time.monotonic()), 0.25))
                finally:
                    self.waiting -= 1
                self._expire_kept(time.monotonic())
            return True

    def release(self) -> None:
        """Free a slot (its process was reaped)."""
        with self._cond:
            self.alive -= 1
            self._cond.notify_all()

    def poke(self) -> None:
        """A worker became idle, or a call was cancelled: every waiting call looks again
        (it may take the worker, retire it, or stop waiting)."""
        with self._cond:
            if self.waiting:  # else no call waits in wait(): no notify_all frames a call
                self._cond.notify_all()
            for ticket in self._queue:
                ticket.cond.notify()


def _held(grant: Grant | None) -> None:
    if grant is not None:
        grant.left = False
