"""The governor: bounds on calls (concurrency places, call budgets, the repeated-call
breaker, rate limits) and retries of idempotent calls (DESIGN §4 "The governor").

The bounds a tool declares are its :class:`~rho_actors.declarations.policy.CallPolicy`;
the system's are :class:`GovernorSettings`; :class:`Governor` keeps both at the one
point where a call starts."""

from rho_actors.governor.governor import Governor
from rho_actors.governor.settings import GovernorSettings, default_max_thread_calls

__all__ = ["Governor", "GovernorSettings", "default_max_thread_calls"]
