"""Token buckets: a tool's rate limit (DESIGN §4 "The governor").

A :class:`TokenBucket` of rate ``r`` a second and burst ``b`` holds at most ``b``
tokens and gains ``r`` a second; a call takes one. A call that finds none reserves the
next token to come (the balance goes below zero), so calls over the rate start in
arrival order, each at the instant its token comes, and lateness never accumulates: the
instants are fixed when reserved, not when the previous call started. A reservation
whose instant is past the call's deadline is not made (the call is ``rate_limited``); a
token taken by a call that never starts (cancelled while it waits) is given back.
Thread-safe.
"""

from __future__ import annotations

import threading

from rho_actors.declarations.policy import Rate

__all__ = ["TokenBucket"]


class TokenBucket:
    """A token bucket of ``rate`` (:class:`~rho_actors.declarations.policy.Rate`), full at first."""

    __slots__ = ("_lock", "_stamp", "_tokens", "rate")

    def __init__(self, rate: Rate, now: float) -> None:
        self.rate = rate
        self._tokens = float(rate.burst)
        self._stamp = now
        self._lock = threading.Lock()

    def reserve(self, now: float, deadline: float) -> tuple[float, bool]:
        """Take a token for a call at ``now`` (``time.monotonic()`` seconds): the
        instant it may start (``now`` when a token is there) and ``True``; or that
        instant and ``False`` when it would be at or past ``deadline`` (nothing is
        taken then)."""
        with self._lock:
            self._refill(now)
            tokens = self._tokens - 1.0
            when = now if tokens >= 0.0 else now - tokens / self.rate.per_s
            if when > now and when >= deadline:
                return when, False
            self._tokens = tokens
            return when, True

    def give_back(self, now: float) -> None:
        """A call that took a token (:meth:`reserve`) will never start (cancelled while it
        waited, or its deadline came first): the token is there again for the next call
        (at most ``burst`` saved up). Reservations made since keep their instants."""
        with self._lock:
            self._refill(now)
            self._tokens = min(float(self.rate.burst), self._tokens + 1.0)

    def _refill(self, now: float) -> None:
        """The tokens earned since the last look, at most ``burst`` (under the lock)."""
        elapsed = now - self._stamp
        if elapsed > 0.0:
            self._tokens = min(float(self.rate.burst), self._tokens + elapsed * self.rate.per_s)
            self._stamp = now

    def tokens(self, now: float) -> float:
        """The balance at ``now`` (negative: tokens reserved ahead)."""
        with self._lock:
            return min(float(self.rate.burst), self._tokens + max(0.0, now - self._stamp) * self.rate.per_s)
