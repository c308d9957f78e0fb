"""Concurrency places: bounded counts of running calls, and the calls waiting for a place
(DESIGN §4 "The governor").

A :class:`Gate` is one bound (a tool's ``max_concurrency``, its ``max_concurrency_per_session``
in one session, or the system's ``max_thread_calls``) and how many calls hold a place in
it. A call needs a place in each of its gates, taken all at once or not at all. A call
that finds no place waits in :class:`Waiting`: by session, by tool, in arrival order;
when places free, sessions are served in turn (round robin: a session served goes to
the back), and within a session its earliest call that fits. :class:`SessionGates`
keeps the gates of each session (a tool's ``max_concurrency_per_session``, its one
exclusive place) until the session is forgotten and they are free. Not thread-safe: the
governor holds its lock around every use.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

__all__ = ["Gate", "SessionGates", "Waiter", "Waiting", "blocking", "fits", "release", "take"]


class Gate:
    """One bound: ``bound`` places, ``running`` taken; ``key`` names it in messages and
    ``stats()`` (``("tool", name)``, ``("session", name, session_id)``, ``("thread",)``)."""

    __slots__ = ("bound", "key", "running")

    def __init__(self, key: tuple[str, ...], bound: int) -> None:
        self.key = key
        self.bound = bound
        self.running = 0

    def __repr__(self) -> str:
        return f"Gate({self.key}, {self.running}/{self.bound})"


def fits(gates: Sequence[Gate]) -> bool:
    """Whether each of ``gates`` has a free place."""
    for gate in gates:  # noqa: SIM110 (a loop: no generator made on the call path)
        if gate.running >= gate.bound:
            return False
    return True


def blocking(gates: Sequence[Gate]) -> Gate | None:
    """The first of ``gates`` without a free place (what a refusal names), or ``None``."""
    for gate in gates:
        if gate.running >= gate.bound:
            return gate
    return None


def take(gates: Sequence[Gate]) -> None:
    """Take a place in each of ``gates`` (they fit)."""
    for gate in gates:
        gate.running += 1


def release(gates: Sequence[Gate]) -> None:
    """Give back a place in each of ``gates``."""
    for gate in gates:
        gate.running -= 1


class SessionGates:
    """The gates of each session: per (tool, session) for ``max_concurrency_per_session``,
    and one exclusive place per session. A session forgotten (its loop stopped) has
    its free gates dropped at once and each other one once its last call ends
    (:meth:`released`): until then it is kept, so its bound holds should the session
    come back; a host serving sessions without end keeps none of theirs. ``dropped``
    is called with the session whose exclusive gate was dropped (what holds it drops it too)."""

    def __init__(self, dropped: Callable[[str], object] | None = None) -> None:
        self.per_session: dict[tuple[str, str], Gate] = {}
        self.exclusive: dict[str, Gate] = {}
        self.orphans: set[Gate] = set()  # gates of forgotten sessions with calls in them
        self._dropped = dropped  # called with a session whose exclusive gate was dropped

    def per_tool(self, name: str, session: str, bound: int) -> Gate:
        """Tool ``name``'s gate in ``session``, of ``bound`` places."""
        gate = self.per_session.get((name, session))
        if gate is None:
            gate = self.per_session[name, session] = Gate(("session", name, session), bound)
        elif self.orphans:
            self.orphans.discard(gate)  # its session is back
        gate.bound = bound  # a tool registered again may bring another bound
        return gate

    def exclusive_of(self, session: str) -> Gate:
        """``session``'s one place for calls of its exclusive tools."""
        gate = self.exclusive.get(session)
        if gate is None:
            gate = self.exclusive[session] = Gate(("exclusive", session), 1)
        elif self.orphans:
            self.orphans.discard(gate)
        return gate

    def forget(self, session: str) -> None:
        """``session`` ended: its gates dropped, each once free."""
        gates = [gate for key, gate in self.per_session.items() if key[1] == session]
        if session in self.exclusive:
            gates.append(self.exclusive[session])
        for gate in gates:
            if gate.running == 0:
                self._drop(gate)
            else:
                self.orphans.add(gate)

    def released(self, gates: Sequence[Gate]) -> None:
        """Places of ``gates`` were given back: those of forgotten sessions now free are dropped."""
        for gate in gates:
            if gate.running == 0 and gate in self.orphans:
                self.orphans.discard(gate)
                self._drop(gate)

    def _drop(self, gate: Gate) -> None:
        key = gate.key
        if key[0] == "session":
            if self.per_session.get((key[1], key[2])) is gate:
                del self.per_session[key[1], key[2]]
        elif self.exclusive.get(key[1]) is gate:
            del self.exclusive[key[1]]
            if self._dropped is not None:
                self._dropped(key[1])


class Waiter(Protocol):
    """A call waiting for places: its ``session``, ``tool``, arrival ``seq`` and ``gates``."""

    session: str
    tool: str
    seq: int
    gates: tuple[Gate, ...]


class Waiting:
    """The calls waiting for places: per session, per tool, in arrival order."""

    def __init__(self) -> None:
        self._by_session: dict[str, dict[str, deque[Any]]] = {}
        self._turn: deque[str] = deque()  # sessions with waiting calls, the next to serve first
        self.count = 0

    def add(self, call: Waiter) -> None:
        """Queue ``call`` behind the calls of its session and tool."""
        queues = self._by_session.get(call.session)
        if queues is None:
            queues = self._by_session[call.session] = {}
            self._turn.append(call.session)
        queues.setdefault(call.tool, deque()).append(call)
        self.count += 1

    def remove(self, call: Waiter) -> bool:
        """Take ``call`` out (its deadline came, or it was cancelled); whether it waited."""
        queues = self._by_session.get(call.session)
        queue = queues.get(call.tool) if queues is not None else None
        if queue is None or call not in queue:
            return False
        queue.remove(call)
        self._forget_empty(call.session, call.tool)
        self.count -= 1
        return True

    def _forget_empty(self, session: str, tool: str) -> None:
        queues = self._by_session[session]
        if not queues[tool]:
            del queues[tool]
            if not queues:
                del self._by_session[session]
                self._turn.remove(session)

    def ready(self) -> Iterator[Any]:
        """Take the calls that fit now, each with its places taken, and yield them: the
        first session in turn with a call that fits gives its earliest such call and
        goes to the back of the turn (a session whose calls do not fit keeps its
        place), until none fits."""
        while True:
            for session in self._turn:
                best: Any = None
                for queue in self._by_session[session].values():
                    head = queue[0]
                    if (best is None or head.seq < best.seq) and fits(head.gates):
                        best = head
                if best is not None:
                    break
            else:
                return
            self._turn.remove(session)
            self._turn.append(session)
            self._by_session[session][best.tool].popleft()
            self._forget_empty(session, best.tool)
            self.count -= 1
            take(best.gates)
            yield best

    def per_tool(self) -> dict[str, int]:
        """How many calls of each tool wait now."""
        out: dict[str, int] = {}
        for queues in self._by_session.values():
            for tool, queue in queues.items():
                out[tool] = out.get(tool, 0) + len(queue)
        return out
