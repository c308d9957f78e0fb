"""Model provider adapters: :class:`rho_actors.agent.model.Model` over real chat APIs.

==============================  ==============================================================
adapter                         API and SDK (an optional extra)
==============================  ==============================================================
:class:`OpenAIModel`            OpenAI Chat Completions through the ``openai`` SDK, also any
                                OpenAI-compatible server (vLLM, llama.cpp, Ollama) by
                                ``base_url``: ``pip install 'rho_actors[openai]'``
:class:`AnthropicModel`         Anthropic Messages through the ``anthropic`` SDK:
                                ``pip install 'rho_actors[anthropic]'``
==============================  ==============================================================

Each SDK is imported only when its adapter is first used (``from rho_actors.agent.providers
import OpenAIModel`` imports ``openai``); a missing SDK is an ``ImportError`` naming the
install command. One retry policy governs provider errors (the SDKs' own retries are off):
a rate limit (HTTP 429), a server error (5xx), a 408, a timeout or a connection error is
retried per :class:`RetryPolicy`; anything else (400, 401, 403, 404, 422...) and a retry
budget spent raise :class:`ModelError` at once.

Example::

    from rho_actors.agent.providers import model_from_spec

    model = model_from_spec("openai:gpt-4o-mini")
    reply = model.complete([Message.user("add 1 and 2")], loop.declarations("neutral"))
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from loguru import logger
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from rho_actors.declarations.policy import RetryPolicy

if TYPE_CHECKING:
    from rho_actors.agent.model import Model
    from rho_actors.agent.providers.anthropic import AnthropicModel
    from rho_actors.agent.providers.openai import OpenAIModel

__all__ = ["PROVIDERS", "AnthropicModel", "ModelError", "OpenAIModel", "RetryPolicy", "model_from_spec"]

PROVIDERS = ("openai", "anthropic")
"""The provider names :func:`model_from_spec` knows."""

T = TypeVar("T")


class ModelError(Exception):
    """A provider error that retrying did not (or could not) cure.

    ``provider``: ``"openai"`` or ``"anthropic"``; ``status``: the HTTP status of the
    last answer, or ``None`` when there was none (timeout, connection error, a bad
    response); ``message``: the provider's own explanation; ``attempts``: how many
    requests were sent; ``retryable``: whether the last error was of a retryable kind
    (so the budget ran out, and a later call may succeed). The SDK's exception is the
    ``__cause__``.
    """

    def __init__(
        self, provider: str, status: int | None, message: str, *, attempts: int = 1, retryable: bool = False
    ) -> None:
        self.provider = provider
        self.status = status
        self.message = message
        self.attempts = attempts
        self.retryable = retryable
        where = f"HTTP {status}" if status is not None else "no HTTP status"
        tries = f" (gave up after {attempts} attempts)" if attempts > 1 else ""
        super().__init__(f"{provider} error, {where}: {message}{tries}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_model_error, (self.provider, self.status, self.message, self.attempts, self.retryable))


def _model_error(provider: str, status: int | None, message: str, attempts: int, retryable: bool) -> ModelError:
    return ModelError(provider, status, message, attempts=attempts, retryable=retryable)


DEFAULT_RETRY = RetryPolicy()
"""4 attempts, waits from 0.5 s (doubling, + up to 0.5 s jitter, at most 8 s), 120 s in all."""


@dataclass(frozen=True, slots=True)
class Failure:
    """An adapter's reading of an SDK exception (see :func:`send_with_retry`):
    ``retryable``, the HTTP ``status`` (``None`` without one), the provider's
    ``message``, and the server's ``retry_after_s`` (seconds) when it gave one."""

    retryable: bool
    status: int | None
    message: str
    retry_after_s: float | None = None


class _Retry(Exception):
    """An attempt failed in a way that retrying may cure (internal to the retry loop)."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


RETRYABLE_STATUSES = frozenset({408, 429})
"""Statuses below 500 that are retried (every 5xx is too)."""


def retryable_status(status: int) -> bool:
    """Whether an HTTP ``status`` is worth retrying: 408, 429 and every 5xx."""
    return status in RETRYABLE_STATUSES or status >= 500


def retry_after_s(headers: Any) -> float | None:
    """The wait a server asked for, in seconds, from ``retry-after-ms`` (milliseconds)
    or ``retry-after`` (seconds; an HTTP date is ignored); ``None`` when neither is a
    non-negative number. ``headers`` is a case-insensitive mapping (httpx's)."""
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None and float(ms) >= 0:
            return float(ms) / 1000.0
        seconds = headers.get("retry-after")
        if seconds is not None and float(seconds) >= 0:
            return float(seconds)
    except (TypeError, ValueError, AttributeError):
        return None
    return None


def _wait(policy: RetryPolicy) -> Callable[[RetryCallState], float]:
    backoff = wait_exponential(multiplier=policy.initial_s, max=policy.max_wait_s) + wait_random(0, policy.jitter_s)

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, _Retry) and exc.failure.retry_after_s is not None:
            wanted = exc.failure.retry_after_s
        else:
            wanted = float(backoff(state))
        remaining = policy.total_s - (time.monotonic() - state.start_time)
        return max(0.0, min(wanted, policy.max_wait_s, remaining))

    return wait


def send_with_retry(
    provider: str,
    policy: RetryPolicy,
    send: Callable[[], T],
    classify: Callable[[Exception], Failure | None],
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``send()`` under ``policy``: an exception that ``classify`` reads as retryable
    is retried; one it reads as not retryable, or the last retryable one, is raised as
    :class:`ModelError` (the SDK exception as its cause); one it does not know
    (``None``) propagates unchanged."""
    attempts = 0

    def attempt() -> T:
        nonlocal attempts
        attempts += 1
        try:
            return send()
        except Exception as exc:
            failure = classify(exc)
            if failure is None:
                raise
            if failure.retryable:
                raise _Retry(failure) from exc
            raise ModelError(provider, failure.status, failure.message, attempts=attempts) from exc

    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        sleep_s = state.next_action.sleep if state.next_action is not None else 0.0
        logger.warning("{}: attempt {} failed ({}); retrying in {:.2f} s", provider, state.attempt_number, exc, sleep_s)

    retrying = Retrying(
        sleep=sleep,
        stop=stop_after_attempt(policy.attempts) | stop_after_delay(policy.total_s),
        wait=_wait(policy),
        retry=retry_if_exception_type(_Retry),
        before_sleep=log_retry,
        reraise=True,
    )
    try:
        return retrying(attempt)
    except _Retry as last:
        failure = last.failure
        raise ModelError(provider, failure.status, failure.message, attempts=attempts, retryable=True) from (
            last.__cause__
        )


def text_or_empty(value: Any) -> str:
    """A reply's field that must be text (a call's id, name or argument text), or ``""``
    when the server sent something else or nothing (the agent loop gives such a call an
    id and an error result)."""
    return value if isinstance(value, str) else ""


def tokens(value: Any) -> int:
    """A token count a provider reported, as a non-negative ``int`` (``0`` for a missing
    or malformed one: a usage figure never costs the reply it came with)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        return 0
    try:
        return int(value)
    except (OverflowError, ValueError):
        return 0


def model_from_spec(spec: str, *, base_url: str | None = None) -> Model:
    """The model named by ``spec``, ``"PROVIDER:MODEL"``: ``"openai:gpt-4o-mini"`` or
    ``"anthropic:claude-sonnet-5"`` (``MODEL`` may itself contain colons, as
    Ollama's ``"openai:llama3.2:3b"``). ``base_url`` points it at another server (an
    OpenAI-compatible one for ``openai``). Credentials come from the SDK's usual
    environment variables (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``).

    Raises ``ValueError`` for a malformed spec or an unknown provider, ``ImportError``
    (naming the install command) when the provider's SDK is not installed.
    """
    provider, sep, model = spec.partition(":")
    provider = provider.strip().lower()
    model = model.strip()
    if not sep or not model:
        raise ValueError(f"model spec {spec!r} is not PROVIDER:MODEL (for example 'openai:gpt-4o-mini')")
    if provider == "openai":
        from rho_actors.agent.providers.openai import OpenAIModel

        return OpenAIModel(model, base_url=base_url)
    if provider == "anthropic":
        from rho_actors.agent.providers.anthropic import AnthropicModel

        return AnthropicModel(model, base_url=base_url)
    raise ValueError(f"unknown model provider {provider!r} in {spec!r}; expected one of {', '.join(PROVIDERS)}")


def __getattr__(name: str) -> Any:
    # The adapters are imported on first use, so that importing this package never
    # imports an SDK.
    if name == "OpenAIModel":
        from rho_actors.agent.providers.openai import OpenAIModel

        return OpenAIModel
    if name == "AnthropicModel":
        from rho_actors.agent.providers.anthropic import AnthropicModel

        return AnthropicModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
