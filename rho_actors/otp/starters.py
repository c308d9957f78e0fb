"""Starters: children started in the caller's thread and handed to a bound supervisor
(``starter=`` of :class:`rho_actors.otp.supervisor.Supervisor`), OTP's
``simple_one_for_one`` ``start_child`` without a round trip through the supervisor's
inbox.

Example::

    calls = ChildStarter(ChildSpec("call", CallActor.start, restart="temporary"))
    sup = start_link(Supervisor, [], starter=calls)
    ref = calls.start()  # in this thread, supervised by ``sup`` from now on
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pykka

if TYPE_CHECKING:
    from rho_actors.otp.supervisor import ChildSpec, Supervisor

__all__ = ["ChildStarter", "StarterBinding"]


class StarterBinding:
    """What a starter shares with the supervisor it hands children to (``starter=`` in
    :class:`Supervisor`, which binds itself on start and unbinds on stop): it outlives a
    restart of that supervisor (the new one binds to it), and :meth:`running_supervisor`
    waits up to ``rebind_s`` seconds for one being restarted."""

    def __init__(self, rebind_s: float = 1.0) -> None:
        self._supervisor: Supervisor | None = None
        self._bound = threading.Condition()
        self._rebind_s = rebind_s
        self.closed = False

    def _bind(self, supervisor: Supervisor | None) -> None:
        with self._bound:
            self._supervisor = supervisor
            self._bound.notify_all()

    def close(self) -> None:
        """No more children: starting fails at once from now on (the system stops)."""
        self.closed = True
        self._bind(None)

    def running_supervisor(self, what: str) -> Supervisor:
        """The bound supervisor, waiting up to ``rebind_s`` seconds while it is restarted.
        Raises ``pykka.ActorDeadError`` naming ``what`` it supervises when there is none,
        or saying the system is stopping once :meth:`close` was called."""
        supervisor = self._supervisor
        if supervisor is not None and not self.closed:
            return supervisor
        with self._bound:
            self._bound.wait_for(lambda: self.closed or self._supervisor is not None, self._rebind_s)
            supervisor = self._supervisor
        if self.closed:
            raise pykka.ActorDeadError("the system is stopping")
        if supervisor is None:
            raise pykka.ActorDeadError(f"the supervisor of {what} is not running (waited {self._rebind_s} s)")
        return supervisor


class ChildStarter(StarterBinding):
    """Starts children of one spec in the caller's thread, each handed to the bound
    supervisor without a message (``starter=`` in :class:`Supervisor`): OTP's
    ``simple_one_for_one`` ``start_child`` without the round trip through the
    supervisor's inbox, so a burst of starts from many threads is not serialised
    through its one thread. Safe from any thread. It outlives a restart of its
    supervisor: the new one binds to it."""

    def __init__(self, spec: ChildSpec, rebind_s: float = 1.0) -> None:
        super().__init__(rebind_s)
        self.spec = spec

    def start(self) -> pykka.ActorRef[Any]:
        """A child started now, in this thread, and supervised from now on (waiting up
        to ``rebind_s`` seconds for a supervisor being restarted). Raises
        ``pykka.ActorDeadError`` naming why when there is no supervisor."""
        supervisor = self.running_supervisor(repr(self.spec.id))
        started = self.spec.start()
        try:
            supervisor.adopt(started, self.spec)
        except BaseException:
            started.stop(block=False)
            raise
        return started

    def abandon(self, ref: pykka.ActorRef[Any]) -> None:
        """Stop supervising a child that was given up on (a call past its deadline): no
        shutdown waits for it."""
        supervisor = self._supervisor
        if supervisor is not None:
            supervisor.forget(ref)
