"""The host's side of registration: what :meth:`rho_actors.ActorSystem.register` and
:meth:`~rho_actors.ActorSystem.register_many` check in the caller's thread before they
ask the :class:`~rho_actors.registry.tool_registry.ToolRegistry`, and how a batch is
split between the registry's one-message path (trusted tools) and the untrusted reads.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rho_actors.declarations.checks import describe_origin, not_a_tool
from rho_actors.declarations.toolset import IsolationName, Placement, make_placement
from rho_actors.isolation import Isolation, place
from rho_actors.registry.tool_registry import ASK_PER_TOOL_S, Registration
from rho_actors.sandbox import refuse_unguarded_children
from rho_actors.tool import is_untrusted, missing_callbacks

__all__ = ["Options", "prepare", "register_many"]


@dataclass(frozen=True, slots=True)
class Options:
    """What ``register``/``register_many`` were given besides the tools (see
    :meth:`rho_actors.ActorSystem.register`)."""

    untrusted: bool = False
    isolation: IsolationName | None = None
    env: Mapping[str, str] | None = None
    deps: Mapping[str, Any] | None = None
    worker_scope: str | None = None
    resources: Mapping[str, Any] | None = None
    source: str | None = None


def prepare(
    isolations: Mapping[str, Isolation], tool: Any, options: Options, adopt: Callable[[Any, str | None], Any],
) -> tuple[Any, bool, Placement]:
    """``tool`` as it is registered (a trusted one passed through ``adopt`` with the
    isolation asked for: a LangChain tool becomes a rho tool), whether it is untrusted,
    and its checked :class:`Placement`. Raises as ``register`` documents: ``TypeError``
    (a missing callback), ``ValueError`` (a bad isolation, ``env``, ``deps``,
    ``worker_scope`` or ``resources``, or a framework's tool that cannot run in that
    isolation), ``ImportError``, ``UnguardedStartError``."""
    untrusted = options.untrusted or is_untrusted(tool)
    placement = place(
        isolations, options.isolation,
        make_placement(untrusted, options.worker_scope, options.env, options.deps), options.resources,
    )
    if options.isolation == "process" and not untrusted:
        # its workers come from multiprocessing's fork server, which imports the script (untrusted
        # children start clean and never do): they would start the script's system again
        refuse_unguarded_children()
    if not untrusted:
        tool = adopt(tool, options.isolation)
    missing = [] if untrusted else missing_callbacks(tool)
    if missing:
        raise TypeError(f"{describe_origin(tool)} is not a tool: {not_a_tool(tool)}")
    return tool, untrusted, placement


def register_many(
    registry: Any, isolations: Mapping[str, Isolation], tools: Iterable[Any], options: Options,
    adopt: Callable[[Any, str | None], Any], ask_timeout_s: float, read_timeout_s: float,
    origins: Sequence[str] | None = None,
) -> list[Registration]:
    """Register ``tools`` through the registry's proxy ``registry``: every tool is
    prepared first (so a bad one raises before anything is registered), then the trusted
    ones go in one message (:meth:`ToolRegistry.register_many`: all or nothing, one
    published tool set), then the untrusted ones are read in parallel, each registered
    when its read is done. Returns one :class:`Registration` per tool, in order; raises
    the first untrusted tool's ``DuplicateToolError`` once every read has settled.
    ``origins``: where each tool comes from in messages, in order (default: its module,
    qualified name, file and line)."""
    prepared = [prepare(isolations, tool, options, adopt) for tool in tools]
    if origins is not None and len(origins) != len(prepared):
        raise ValueError(f"origins names {len(origins)} tools, and {len(prepared)} tools were given")
    results: list[Registration | None] = [None] * len(prepared)
    trusted = [i for i, (_, untrusted, _) in enumerate(prepared) if not untrusted]
    if trusted:
        batch = [prepared[i][0] for i in trusted]
        answer: list[Registration] = registry.register_many(
            batch, options.isolation, prepared[trusted[0]][2], options.source,
            None if origins is None else [origins[i] for i in trusted],
        ).get(timeout=ask_timeout_s + len(batch) * ASK_PER_TOOL_S)
        for i, registration in zip(trusted, answer, strict=True):
            results[i] = registration
    waiting: list[tuple[int, concurrent.futures.Future[Registration]]] = []
    for i, (tool, untrusted, placement) in enumerate(prepared):
        if untrusted:
            origin = None if origins is None else origins[i]
            future = registry.register(tool, origin, True, options.isolation, placement, options.source).get(
                timeout=ask_timeout_s
            )
            waiting.append((i, future))
    if waiting:
        concurrent.futures.wait([f for _, f in waiting], timeout=read_timeout_s + ask_timeout_s)
        for i, future in waiting:
            results[i] = future.result(timeout=0)  # raises its DuplicateToolError (the first, in order)
    return [r for r in results if r is not None]
