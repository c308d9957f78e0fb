"""The tools of an :class:`~rho_actors.ActorSystem` (DESIGN §3; internal: the methods are
the system's, re-exported as ``rho_actors.ActorSystem``'s).

:class:`SystemTools` is the part of the system that registers and unregisters tools,
each change asked of the system's ``registry`` actor (:meth:`~SystemTools.register`,
:meth:`~SystemTools.register_many`, :meth:`~SystemTools.unregister`,
:meth:`~SystemTools.set_removed_reason`), and shows what is registered and offered
(:meth:`~SystemTools.registrations`, :meth:`~SystemTools.tool_set`,
:meth:`~SystemTools.tools`). What a registration checks in the caller's thread is
:mod:`rho_actors.registry.registering`; the registry itself,
:mod:`rho_actors.registry.tool_registry`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rho_actors.declarations.toolset import IsolationName, ToolSet, ToolSetView, copied_infos
from rho_actors.registry.registering import Options, prepare, register_many
from rho_actors.registry.tool_registry import Registration
from rho_actors.runtime import Runtime, UntrustedReads
from rho_actors.system.host_actors import REGISTRY
from rho_actors.tool import ToolInfo

__all__ = ["SystemTools"]


class SystemTools:
    """The tools of an :class:`~rho_actors.ActorSystem` (see the module doc); the system
    sets every attribute below, and its asks are
    :class:`~rho_actors.system.host_actors.HostActors`'."""

    _runtime: Runtime
    _untrusted: UntrustedReads
    _ask_timeout_s: float
    _tools: ToolSetView
    _ask: Callable[..., Any]
    _proxy: Callable[[str], Any]

    def register(
        self, tool: Any, *, origin: str | None = None, untrusted: bool = False,
        isolation: IsolationName | None = None, env: dict[str, str] | None = None, deps: dict[str, Any] | None = None,
        worker_scope: str | None = None, resources: Mapping[str, Any] | None = None, source: str | None = None,
    ) -> Registration:
        """Register a tool (a module, class or object with the callbacks of DESIGN §2). Its declaration is read and
        checked once; one that fails is left out of what loops offer (see :attr:`Registration.reason`, also logged
        once).

        A trusted tool is read in the DeclarationActor's thread. An untrusted one (``untrusted=True``, or marked
        with :func:`rho_actors.untrusted`) is read in a throwaway process within the time and heap bounds of
        ``untrusted`` reads; this returns when that first read is done (a read that ran over leaves the tool out for
        now and is retried on the schedule). ``isolation`` is where its calls run: ``"thread"`` (the default for
        trusted tools) or ``"process"`` (the default for untrusted ones): a name in
        :data:`rho_actors.isolation.ISOLATIONS`. ``origin`` names where the tool comes from in messages (default:
        its module, qualified name, file and line).

        No code of an untrusted tool runs in this process: not even an attribute lookup (a missing callback shows in
        its declaration check, or as the call's error).

        For untrusted tools only (DESIGN §5): ``env`` (str -> str) is added to its workers' scrubbed environment
        (which holds only ``PATH``, ``LANG``, ``LC_*``, ``TZ``, and ``HOME``/``TMPDIR`` set to a private folder);
        ``deps`` (plain JSON data, default ``{}``) is its calls' ``ctx["deps"]``: the session's ``deps`` never reach
        it; ``worker_scope`` is ``"session"`` (default: a worker process serves one (tool, session) pair only) or
        ``"call"`` (a fresh worker process per call).

        ``source`` names the source serving the tool (set by ``add_source``; ``None``: the host's own, which takes a
        name from a source's tool, evicting it: DESIGN §3 "Names").

        ``resources`` are what its isolation runs each call with, checked by the isolation (``isolation="ray"``:
        ``num_cpus``, ``num_gpus``, ``memory`` in bytes, ``runtime_env`` and custom resources such as ``{"browser":
        1}``). ``ray`` takes trusted tools only (Ray unpickles what its workers return).

        A trusted LangChain tool (a ``langchain_core.tools.BaseTool``, ``@tool`` functions included) is registered
        as :func:`rho_actors.integrations.langgraph.langchain_tool.from_langchain` makes it: its name, description
        and argument schema are its own.

        Raises ``TypeError`` when a trusted ``tool`` lacks a required callback,
        :class:`~rho_actors.sandbox.main_guard.UnguardedStartError` when called from the top level of a main script
        outside ``if __name__ == "__main__":`` (its child processes would import the script and run it again),
        ``ValueError`` for an unknown isolation, an untrusted tool on an isolation that refuses them, bad
        ``resources``, or a bad ``env``/``deps``/``worker_scope`` (or any of them for a trusted tool),
        ``ImportError`` for ``ray`` resources without the ``ray`` extra, :class:`rho_actors.DuplicateToolError` when
        another registered tool has its name (but see ``source``), and ``RuntimeError`` when the system stops while
        an untrusted declaration is being read."""
        from rho_actors.integrations.adopt import adopted  # another framework's tool as a rho tool

        options = Options(untrusted, isolation, env, deps, worker_scope, resources, source)
        tool, untrusted, placement = prepare(self._runtime.isolations, tool, options, adopted)
        answer = self._ask(REGISTRY, "register", tool, origin, untrusted, isolation, placement, source)
        if isinstance(answer, Registration):
            return answer
        return answer.result(timeout=self._untrusted.timeout_s + self._ask_timeout_s)  # type: ignore[no-any-return]

    def register_many(
        self, tools: Iterable[Any], *, untrusted: bool = False, isolation: IsolationName | None = None,
        env: dict[str, str] | None = None, deps: dict[str, Any] | None = None, worker_scope: str | None = None,
        resources: Mapping[str, Any] | None = None, source: str | None = None, origins: Sequence[str] | None = None,
    ) -> list[Registration]:
        """Register many tools, each as :meth:`register` would with these options (same checks and errors); returns
        their :class:`Registration` values in order. Each tool is checked here first (the first bad one raises,
        named, before any is registered); the trusted ones are then registered as one change, all or nothing: a name
        held by a registered tool or taken twice raises :class:`rho_actors.DuplicateToolError` naming the tool and
        its index, and none is registered; loops see one new tool set. Untrusted ones are then read in parallel,
        each registered when read, in that order (a ``DuplicateToolError`` among them is raised once all are read;
        the others stay). ``origins`` names where each tool comes from in messages, in the tools' order (as
        :meth:`register`'s ``origin``; ``ValueError`` when its length differs)."""
        from rho_actors.integrations.adopt import adopted
        options = Options(untrusted, isolation, env, deps, worker_scope, resources, source)
        return register_many(self._proxy(REGISTRY), self._runtime.isolations, tools, options, adopted,
                             self._ask_timeout_s, self._untrusted.timeout_s, origins)

    def unregister(self, name_or_tool: Any, reason: str | None = None) -> bool:
        """Remove a tool (by name or object); loops stop offering it from their next turn, and a call naming it gets an
        ``unavailable`` error with text ``reason`` (default "tool 'x' was unregistered"). Returns whether a tool was
        removed."""
        from rho_actors.integrations.adopt import registered_as

        name_or_tool = registered_as(name_or_tool)
        return bool(self._ask(REGISTRY, "unregister", name_or_tool, reason))

    def set_removed_reason(self, name: str, reason: str) -> bool:
        """The text a call naming ``name`` gets, when it was unregistered and is not registered again (a tool
        registered under it is left as it is). Returns whether the text was set."""
        return bool(self._ask(REGISTRY, "set_removed_reason", name, reason))

    def registrations(self) -> list[Registration]:
        """Every registered tool, offered or left out, in registration order."""
        result: list[Registration] = self._ask(REGISTRY, "registrations")
        return result

    def tool_set(self) -> ToolSet:
        """The registry's current :class:`rho_actors.declarations.toolset.ToolSet` (immutable: entries with their
        tools, isolation and declarations; a ``version`` that grows with every change)."""
        return self._tools.current

    def tools(self) -> list[ToolInfo]:
        """The checked declarations of every tool that can be offered, in registration
        order, each the caller's own copy (as :meth:`Loop.offered`)."""
        return copied_infos(list(self._tools.current.entries.values()))
