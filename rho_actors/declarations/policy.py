"""A tool's call policy: the rules of its calls as part of its checked declaration, in
one place: the governor's bounds and retries (DESIGN §4 "The governor"), whether its
calls run in the background (§4 "Background calls") and whether they may wait for a
decision (``requires_approval``, §4 "Approvals").

A tool declares them with ``@tool(max_concurrency=4, rate="10/s", idempotent=True,
retry=RetryPolicy(attempts=3))``, or, as a class or module tool, with the optional
callbacks of :data:`POLICY_CALLBACKS`:

=============================== ===========================================================
``max_concurrency()``           its calls running at once in the whole system (an ``int`` >= 1)
``max_concurrency_per_session()`` its calls running at once in one session (an ``int`` >= 1)
``max_calls()``                 its calls in one session (an ``int`` >= 1): the next is ``budget_exhausted``
``rate_limit()``                a token bucket: ``"10/s"``, ``"600/min"``, ``"1000/h"`` (burst = the count)
``rate_group()``                a name: the tools answering it share one bucket (an MCP server's)
``idempotent()``                ``True``: a failed call may be run again (retried, see :class:`RetryPolicy`)
``retry_policy()``              a :class:`RetryPolicy` (or its fields as a dict) for an idempotent tool
``background()``                ``True``: its calls run as tasks, past their turn (:mod:`rho_actors.tasks`);
                                ``"optional"``: when the caller asks (``run_turn(..., background=...)``)
                                or the model does (its ``run_in_background`` argument)
``background_timeout_ms()``     a background call's deadline in ms (an ``int`` >= 1; default 1 h)
=============================== ===========================================================

and ``requires_approval`` (a ``bool``, or a rule ``(args, ctx) -> bool`` over each call,
which the declaration reads as ``True``: its calls may wait for a decision).

:func:`call_policy` checks the options of ``@tool`` (``TypeError``/``ValueError`` at
decoration); :func:`policy_from_answers` reads the callbacks' answers in a declaration,
where a bad answer means no bound (logged once), as a bad ``timeout_ms`` means the default.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal

import tenacity

__all__ = ["NO_POLICY", "POLICY_CALLBACKS", "Background", "CallPolicy", "Rate", "RetryPolicy", "TOOL_RETRY",
           "call_policy", "parse_rate", "policy_from_answers"]

Background = bool | Literal["optional"]
"""Whether a tool's calls run as tasks: ``True`` always, ``False`` never, ``"optional"``
when the caller chooses (an MCP client asking for a task is one such choice)."""

POLICY_CALLBACKS: Final = ("max_concurrency", "max_concurrency_per_session", "max_calls", "rate_limit",
                           "rate_group", "idempotent", "retry_policy", "background", "background_timeout_ms")
"""The optional callbacks of the tool contract that make its :class:`CallPolicy`."""

_UNITS: Final = {"s": 1.0, "sec": 1.0, "second": 1.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
_RATE: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*/\s*([a-z]+)\s*")


@dataclass(frozen=True, slots=True)
class Rate:
    """A token bucket's rate: ``per_s`` tokens a second, at most ``burst`` saved up
    (a call takes one); ``text`` is how it was written (``"10/s"``)."""

    per_s: float
    burst: int
    text: str


def parse_rate(text: Any) -> Rate:
    """``"N/s"``, ``"N/min"`` or ``"N/h"`` (N > 0, a decimal; burst = N, at least 1) as
    a :class:`Rate`. Raises ``TypeError`` for a non-``str``, ``ValueError`` naming the
    forms for another text, and naming the range for an N so large or so small that it
    or the time between two tokens (in ms) is not a finite float."""
    if not isinstance(text, str):
        raise TypeError(f"rate must be a str such as '10/s', got {type(text).__name__} {text!r}")
    match = _RATE.fullmatch(text.lower())
    if match is None or match.group(2) not in _UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"rate must be 'N/s', 'N/min' or 'N/h' with N > 0, got {text!r}")
    count, unit = float(match.group(1)), _UNITS[match.group(2)]
    if not math.isfinite(count) or not math.isfinite(1000.0 * unit / count):
        raise ValueError(f"rate {text[:40]!r}{'...' if len(text) > 40 else ''}: N must be a finite number whose "
                         "time between two tokens, in ms, is finite too")
    return Rate(count / unit, max(1, math.floor(count)), text.strip())


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a failure that retrying can help is retried: a model provider's errors
    (:mod:`rho_actors.agent.providers`), and an idempotent tool's failed calls (the
    governor). All times in seconds.

    At most ``attempts`` tries in all. Before try *n* + 1 the wait is
    ``min(initial_s * 2 ** (n - 1) + uniform(0, jitter_s), max_wait_s)`` (tenacity's
    ``wait_exponential`` plus ``wait_random``; a provider uses the server's
    ``Retry-After`` instead when it gave one). No try starts later than ``total_s``
    after the first began, and a tool's call's none past its deadline. A tool's call is
    retried when it failed ``crashed``, ``exited`` or ``unavailable``, with a
    ``ToolFailure(..., retryable=True)``, or, with ``on_timeout``, ``timeout`` (one the
    tool reported before its deadline: at the deadline no time is left). Raises
    ``ValueError`` for ``attempts < 1`` or a negative time.
    """

    attempts: int = 4
    initial_s: float = 0.5
    max_wait_s: float = 8.0
    jitter_s: float = 0.5
    total_s: float = 120.0
    on_timeout: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, not {self.attempts}")
        for name in ("initial_s", "max_wait_s", "jitter_s", "total_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must not be negative, not {value}")
        if not isinstance(self.on_timeout, bool):
            raise ValueError(f"on_timeout must be a bool, not {self.on_timeout!r}")

    def wait(self) -> tenacity.wait.wait_base:
        """The backoff as a tenacity wait strategy (before the ``max_wait_s`` cut)."""
        return tenacity.wait_exponential(multiplier=self.initial_s, max=self.max_wait_s) + tenacity.wait_random(
            0, self.jitter_s)

    def wait_s(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1-based), in seconds (random within
        the jitter, at most ``max_wait_s``)."""
        state = tenacity.RetryCallState(retry_object=tenacity.Retrying(), fn=None, args=(), kwargs={})
        state.attempt_number = retry
        return min(float(self.wait()(state)), self.max_wait_s)

    def as_data(self) -> dict[str, Any]:
        """Its fields as plain data (``tree()``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True, kw_only=True)
class CallPolicy:
    """The rules of a tool's calls (every field ``None``/``False``: none). See the
    module doc; ``retry`` is used only when ``idempotent`` (default then:
    ``RetryPolicy()``); ``requires_approval``: its calls may wait for a decision.
    ``governed`` (derived): whether the governor has anything to keep, a rule other than
    ``requires_approval`` set."""

    max_concurrency: int | None = None
    max_concurrency_per_session: int | None = None
    max_calls: int | None = None
    rate: Rate | None = None
    rate_group: str | None = None  # tools of one group share one token bucket (default: the tool's own)
    idempotent: bool = False
    retry: RetryPolicy | None = None
    background: Background = False
    background_timeout_ms: int | None = None
    requires_approval: bool = False
    governed: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "governed", any(getattr(self, f.name) != f.default for f in fields(self)
                                                 if f.name not in ("requires_approval", "governed")))

    @property
    def retries(self) -> RetryPolicy | None:
        """The retry policy in force: ``None`` unless idempotent (and more than one attempt)."""
        if not self.idempotent:
            return None
        policy = self.retry if self.retry is not None else TOOL_RETRY
        return policy if policy.attempts > 1 else None

    def as_data(self) -> dict[str, Any]:
        """The bounds set, as plain data (``tree()``): ``{"max_concurrency": 4, "rate": "10/s", ...}``."""
        out: dict[str, Any] = {}
        for name in ("max_concurrency", "max_concurrency_per_session", "max_calls"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.rate is not None:
            out["rate"] = self.rate.text
        if self.rate_group is not None:
            out["rate_group"] = self.rate_group
        if self.idempotent:
            out["idempotent"] = True
            retries = self.retries
            out["retry"] = retries.as_data() if retries is not None else None
        if self.background:
            out["background"] = self.background
        if self.background_timeout_ms is not None:
            out["background_timeout_ms"] = self.background_timeout_ms
        if self.requires_approval:
            out["requires_approval"] = True
        return out


NO_POLICY: Final = CallPolicy()
"""The policy of a tool that declares none (checked by identity on the call path)."""
TOOL_RETRY: Final = RetryPolicy(attempts=3, initial_s=0.05, max_wait_s=2.0, jitter_s=0.05)
"""The retries of an idempotent tool that gives no ``retry``: 3 attempts, waits from 50 ms."""


def _count(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= 1 or None, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1 or None, got {value}")
    return value


def _retry(value: Any) -> RetryPolicy | None:
    if value is None or isinstance(value, RetryPolicy):
        return value
    if isinstance(value, Mapping):
        known = {f.name for f in fields(RetryPolicy)}
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            raise ValueError(f"retry: unknown fields {unknown}; RetryPolicy takes {sorted(known)}")
        return RetryPolicy(**value)
    raise TypeError(f"retry must be a RetryPolicy (or its fields as a dict), got {type(value).__name__}")


def call_policy(
    *, max_concurrency: Any = None, max_concurrency_per_session: Any = None, max_calls: Any = None,
    rate: Any = None, idempotent: Any = False, retry: Any = None, rate_group: Any = None, background: Any = False,
    background_timeout_ms: Any = None, requires_approval: Any = False,
) -> CallPolicy:
    """The checked :class:`CallPolicy` of these options (:data:`NO_POLICY` when none is
    set). Raises ``TypeError``/``ValueError`` naming the bad option (a ``retry`` given
    to a tool that is not ``idempotent`` too: it would never be used)."""
    for flag, value in (("idempotent", idempotent), ("requires_approval", requires_approval)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool, got {type(value).__name__} {value!r}")
    if not isinstance(background, bool) and background != "optional":
        raise TypeError(f'background must be a bool or "optional", got {type(background).__name__} {background!r}')
    if rate_group is not None and (type(rate_group) is not str or not 1 <= len(rate_group) <= 128):
        raise ValueError(f"rate_group must be a str of 1 to 128 characters, got {rate_group!r}")
    policy = CallPolicy(
        max_concurrency=_count("max_concurrency", max_concurrency),
        max_concurrency_per_session=_count("max_concurrency_per_session", max_concurrency_per_session),
        max_calls=_count("max_calls", max_calls),
        rate=None if rate is None else parse_rate(rate),
        rate_group=rate_group,
        idempotent=idempotent,
        retry=_retry(retry),
        background=background,
        background_timeout_ms=_count("background_timeout_ms", background_timeout_ms),
        requires_approval=requires_approval,
    )
    if policy.retry is not None and not idempotent:
        raise ValueError("retry is given but the tool is not idempotent=True: a non-idempotent call is never retried")
    return NO_POLICY if policy == NO_POLICY else policy


def policy_from_answers(raw: Mapping[str, Any], warn: Callable[[str, Any, str], None],
                        requires_approval: bool = False) -> CallPolicy:
    """The :class:`CallPolicy` of a declaration's answers to :data:`POLICY_CALLBACKS`
    (absent: unset) and its ``requires_approval``. A bad or raising answer leaves that
    bound unset, and ``warn(callback, answer, problem)`` is called for it."""
    options: dict[str, Any] = {}
    names = {"rate_limit": "rate", "retry_policy": "retry"}
    for callback in POLICY_CALLBACKS:
        if callback not in raw:
            continue
        option = names.get(callback, callback)
        try:  # each alone (a retry policy as if idempotent: whether it is is checked below)
            call_policy(**{option: raw[callback]}, **({"idempotent": True} if option == "retry" else {}))
        except (TypeError, ValueError) as err:
            warn(callback, raw[callback], str(err))
            continue
        options[option] = raw[callback]
    if "retry" in options and options.get("idempotent") is not True:
        warn("retry_policy", options.pop("retry"), "the tool is not idempotent: it is never retried")
    return call_policy(**options, requires_approval=requires_approval)
