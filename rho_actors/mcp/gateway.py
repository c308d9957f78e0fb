"""rho as a gateway for MCP servers (DESIGN §6b "The gateway"; ``rho-actors mcp serve --mcp ...``).

A :class:`Gateway` adds upstream MCP servers to a running :class:`~rho_actors.ActorSystem`
as sources (:class:`Upstream`, an :class:`~rho_actors.mcp.MCPServer`), so that
:func:`rho_actors.mcp.serve` serves their tools, beside the host's own, as one MCP
server, each call with rho's guarantees:

- a call has its server's ``timeout_ms``: at it the client gets a ``timeout`` result,
  whatever the upstream does (``notifications/cancelled`` is sent to it); a client's own
  cancellation reaches the upstream the same way;
- each upstream's connection is supervised with its own restart intensity: a server
  that exits, drops its connection or stops answering pings is restarted; meanwhile its
  tools stay listed and a call gets an ``unavailable`` result naming the server; past
  its intensity it is given up alone: its tools are withdrawn (the clients get
  ``tools/list_changed``; a call naming one gets ``unavailable``, an unknown tool);
- ``notifications/tools/list_changed`` from an upstream re-lists it, and the gateway's
  clients get ``tools/list_changed`` (through the registry's ``ToolSetChanged``);
- an untrusted upstream (``trusted = false``, ``--untrusted-mcp``) runs confined as
  untrusted workers are (:mod:`rho_actors.mcp.confined`), one process for each session
  that calls it (:mod:`rho_actors.mcp.session_servers`; ``shared = true``: one for all,
  which then sees every session's arguments).

Names. A tool name that two upstreams list, or an upstream lists and the host's own
tools have, is served as ``<server>__<tool>`` for every upstream listing it, while it
collides (``collisions = "namespace"``, the default; ``prefix = true`` namespaces all of
one server's tools); with ``collisions = "refuse"`` the gateway does not start and the
message names both servers. A tool whose own name starts with any server's
``<server>__`` (its own included) is always namespaced: a server can take neither
another's namespaced names nor, with a second tool, one of its own. A server's name has
no ``__`` and does not end in ``_``, so two servers' namespaced names never meet.
A collision that appears later (a ``list_changed``) under ``"refuse"`` follows the
registry's rule (DESIGN §3 "Names"): the tool that held the name first keeps it, the
other is left out and logged naming both origins.

The configuration (:func:`load_config`, ``--config gateway.toml``) is TOML::

    collisions = "namespace"          # or "refuse"

    [servers.files]                   # the server's name: [A-Za-z0-9_-]{1,32}, no "__", no "_" last
    command = ["python", "-m", "my_files_server", "/srv/docs"]   # or one string, split as a shell does
    env = { LOG_LEVEL = "warning" }   # added to its scrubbed environment
    timeout_ms = 20000                # each call's deadline
    max_restarts = 3                  # restart intensity: at most 3 restarts ...
    max_seconds = 5                   # ... in 5 seconds
    trusted = false                   # run it confined (default true)
    network = false                   # untrusted only: the host's network (default: none)
    read = ["/srv/docs"]              # untrusted only: extra read-only paths
    memory_mb = 1024                  # untrusted only: its whole tree's memory bound (each process's)
    rate = "10/s"                     # one token bucket for all its tools (or "600/min", "1000/h")
    idempotent_hints = true           # its tools' idempotentHint is trusted: their failed calls are retried
    shared = false                    # untrusted only: one process for every session (default: one each)
    mode = "auto"                     # the protocol era: "auto" (2026-07-28 if it answers it), "legacy", "2026-07-28"

    [servers.search]
    url = "http://127.0.0.1:9000/mcp" # streamable HTTP (trusted only)
    headers = { Authorization = "Bearer ..." }
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import shlex
import threading
import tomllib
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from loguru import logger
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from rho_actors.declarations.policy import parse_rate
from rho_actors.errors import RhoError
from rho_actors.mcp.confined import DEFAULT_HEAP_BYTES, check_startable, confined_transport
from rho_actors.mcp.names import default_name, numbered
from rho_actors.mcp.session_servers import SessionServers
from rho_actors.mcp.source import Link, MCPServer
from rho_actors.sandbox import ConfinePolicy
from rho_actors.tool import DEFAULT_TIMEOUT_MS

__all__ = [
    "COLLISIONS", "SEPARATOR", "Gateway", "GatewayConfig", "GatewayConfigError", "GatewayError", "Upstream",
    "UpstreamSpec", "gateway_config", "load_config", "specs_from_flags",
]

SEPARATOR: Final = "__"
"""Between a server's name and its tool's name in a namespaced tool name."""
COLLISIONS: Final = ("namespace", "refuse")
_SERVER_NAME: Final = re.compile(r"(?!.*__)[A-Za-z0-9_-]{0,31}[A-Za-z0-9-]")  # no "__", no "_" at the end
_KEYS: Final = frozenset({
    "command", "url", "env", "headers", "timeout_ms", "max_restarts", "max_seconds", "trusted", "network", "read",
    "memory_mb", "prefix", "connect_timeout_s", "cwd", "rate", "idempotent_hints", "shared",
    "mode",
})


class GatewayConfigError(RhoError, ValueError):
    """A gateway configuration that cannot be used; the message names the file, the
    server's table and the key."""


class GatewayError(RhoError, RuntimeError):
    """The gateway could not start (a name collision under ``collisions = "refuse"``)."""


@dataclass(frozen=True, slots=True)
class UpstreamSpec:
    """One upstream MCP server, as configured: exactly one of ``command`` (stdio:
    program and arguments) or ``url`` (streamable HTTP, trusted only). ``env`` is added
    to a stdio server's scrubbed environment, ``headers`` sent with every HTTP request;
    ``timeout_ms`` is each call's deadline (milliseconds); ``max_restarts`` in
    ``max_seconds`` its restart intensity; ``connect_timeout_s`` bounds connecting and
    listing (seconds). ``trusted=False``: confined (:mod:`rho_actors.mcp.confined`),
    with ``network`` (the host's network), ``read`` (extra read-only paths) and
    ``memory_mb`` (its tree's memory bound, MiB), and one process for each session that
    calls it unless ``shared`` (one for all: it sees every session's arguments).
    ``prefix``: serve every tool as ``<name>__<tool>``. ``cwd``: a trusted stdio
    server's working folder. ``rate`` (``"10/s"``...): one token bucket for all its
    tools; ``idempotent_hints``: its ``idempotentHint`` annotations are trusted (such a
    tool's failed calls are retried); ``mode``: its protocol era (``"auto"``, ``"legacy"``
    or ``"2026-07-28"``: :class:`~rho_actors.mcp.MCPServer`)."""

    name: str
    command: tuple[str, ...] | None = None
    url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    max_restarts: int = 3
    max_seconds: float = 5.0
    connect_timeout_s: float = 30.0
    trusted: bool = True
    network: bool = False
    read: tuple[str, ...] = ()
    memory_mb: int = DEFAULT_HEAP_BYTES // 2**20
    prefix: bool = False
    cwd: str | None = None
    rate: str | None = None
    idempotent_hints: bool = False
    shared: bool = False
    mode: str = "auto"


_DEFAULT: Final = UpstreamSpec("default")
"""The defaults a configuration's table falls back to."""


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """The upstream servers and the collision rule (``"namespace"`` or ``"refuse"``)."""

    servers: tuple[UpstreamSpec, ...] = ()
    collisions: Literal["namespace", "refuse"] = "namespace"


# --------------------------------------------------------------------------- configuration


def load_config(path: str | os.PathLike[str]) -> GatewayConfig:
    """Read a gateway configuration file (TOML, the module doc's format). Raises
    :class:`GatewayConfigError` naming the file, the table and the key of what is wrong
    (not TOML, an unknown key, a value of the wrong type, neither or both of ``command``
    and ``url``, a bad server name, an untrusted ``url``)."""
    where = os.fspath(path)
    try:
        with open(where, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise GatewayConfigError(f"{where}: cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise GatewayConfigError(f"{where}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"servers", "collisions"})
    if unknown:
        raise GatewayConfigError(f"{where}: unknown top-level key(s) {unknown}; expected 'collisions' and "
                                 "[servers.NAME] tables")
    collisions = data.get("collisions", "namespace")
    if collisions not in COLLISIONS:
        raise GatewayConfigError(f"{where}: collisions must be one of {list(COLLISIONS)}, got {collisions!r}")
    servers = data.get("servers", {})
    if not isinstance(servers, dict) or not servers:
        raise GatewayConfigError(f"{where}: no [servers.NAME] table: name at least one MCP server")
    specs = [_spec(f"{where}: [servers.{name}]", name, table) for name, table in servers.items()]
    return GatewayConfig(tuple(specs), collisions)


def _spec(where: str, name: str, table: Any) -> UpstreamSpec:
    if not _SERVER_NAME.fullmatch(name):
        raise GatewayConfigError(f"{where}: a server's name must be 1 to 32 of [A-Za-z0-9_-], without '__' and "
                                 f"not ending in '_' (it prefixes its tools' names as NAME__TOOL), got {name!r}")
    if not isinstance(table, dict):
        raise GatewayConfigError(f"{where}: must be a table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise GatewayConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(_KEYS)}")

    def typed(key: str, kinds: type | tuple[type, ...], default: Any) -> Any:
        value = table.get(key, default)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in _tuple(kinds)):
            raise GatewayConfigError(f"{where}: {key} must be {_kind_names(kinds)}, got {value!r}")
        return value

    command = table.get("command")
    if isinstance(command, str):
        command = shlex.split(command)
    if command is not None and (not isinstance(command, list) or not command
                                or not all(isinstance(a, str) and a for a in command)):
        raise GatewayConfigError(f"{where}: command must be a non-empty string or list of strings, got {command!r}")
    url = typed("url", (str, type(None)), None)
    if (command is None) == (url is None):
        raise GatewayConfigError(f"{where}: give exactly one of command (a stdio server) or url (streamable HTTP)")
    trusted = typed("trusted", bool, True)
    if url is not None and not trusted:
        raise GatewayConfigError(f"{where}: an untrusted server must be a command (rho confines its process); "
                                 "a url's server runs elsewhere")
    if url is not None and urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise GatewayConfigError(f"{where}: url must be http:// or https://, got {url!r}")
    rate = typed("rate", (str, type(None)), None)
    try:
        rate = None if rate is None else parse_rate(rate).text
    except ValueError as exc:
        raise GatewayConfigError(f"{where}: {exc}") from None
    numbers = {}
    for key, default in (("timeout_ms", _DEFAULT.timeout_ms), ("max_restarts", _DEFAULT.max_restarts),
                         ("memory_mb", _DEFAULT.memory_mb)):
        numbers[key] = typed(key, int, default)
        if numbers[key] < (0 if key == "max_restarts" else 1):
            raise GatewayConfigError(f"{where}: {key} must be {'0 or more' if key == 'max_restarts' else 'positive'}, "
                                     f"got {numbers[key]}")
    seconds = {}
    for key, default_s in (("max_seconds", _DEFAULT.max_seconds), ("connect_timeout_s", _DEFAULT.connect_timeout_s)):
        seconds[key] = float(typed(key, (int, float), default_s))
        if not seconds[key] > 0:
            raise GatewayConfigError(f"{where}: {key} must be a positive number of seconds, got {seconds[key]}")
    return UpstreamSpec(
        name=name, command=tuple(command) if command is not None else None, url=url,
        env=_strings(where, "env", table.get("env", {})), headers=_strings(where, "headers", table.get("headers", {})),
        timeout_ms=numbers["timeout_ms"], max_restarts=numbers["max_restarts"], max_seconds=seconds["max_seconds"],
        connect_timeout_s=seconds["connect_timeout_s"], trusted=trusted, network=typed("network", bool, False),
        read=tuple(_paths(where, table.get("read", []))), memory_mb=numbers["memory_mb"],
        prefix=typed("prefix", bool, False), cwd=typed("cwd", (str, type(None)), None), rate=rate,
        idempotent_hints=typed("idempotent_hints", bool, False),
        shared=typed("shared", bool, False), mode=_mode(where, typed("mode", str, "auto")),
    )


def _mode(where: str, mode: str) -> str:
    if mode not in ("auto", "legacy", *MODERN_PROTOCOL_VERSIONS):
        raise GatewayConfigError(f"{where}: mode must be \"auto\", \"legacy\" or "
                                 f"{', '.join(repr(v) for v in MODERN_PROTOCOL_VERSIONS)}, got {mode!r}")
    return mode


def _tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _kind_names(kinds: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "absent"}
    return " or ".join(names.get(k, k.__name__) for k in _tuple(kinds))


def _strings(where: str, key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise GatewayConfigError(f"{where}: {key} must be a table of strings, got {value!r}")
    return dict(value)


def _paths(where: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(p, str) and os.path.isabs(p) for p in value):
        raise GatewayConfigError(f"{where}: read must be a list of absolute paths, got {value!r}")
    return list(value)


def specs_from_flags(mcp: Iterable[str] = (), mcp_url: Iterable[str] = (), untrusted_mcp: Iterable[str] = (),
                     taken: Iterable[str] = ()) -> list[UpstreamSpec]:
    """The servers of ``--mcp "CMD ARGS"``, ``--mcp-url URL`` and ``--untrusted-mcp "CMD
    ARGS"`` (commands split as a shell does), named by
    :func:`rho_actors.mcp.names.default_name`, with ``-2``, ``-3``... for repeats and
    for names in ``taken`` (:func:`~rho_actors.mcp.names.numbered`). Raises
    :class:`GatewayConfigError` for an empty command or a URL that is not http(s)."""
    used = set(taken)
    specs: list[UpstreamSpec] = []

    def named(base: str) -> str:
        used.add(name := numbered(base, used))
        return name

    for flag, commands, trusted in (("--mcp", mcp, True), ("--untrusted-mcp", untrusted_mcp, False)):
        for text in commands:
            argv = shlex.split(text)
            if not argv:
                raise GatewayConfigError(f"{flag} needs a command, got {text!r}")
            specs.append(UpstreamSpec(named(default_name(argv)), command=tuple(argv), trusted=trusted))
    for url in mcp_url:
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise GatewayConfigError(f"--mcp-url must be an http:// or https:// URL, got {url!r}")
        specs.append(UpstreamSpec(named(default_name(url=url)), url=url))
    return specs


# --------------------------------------------------------------------------- names


class _Names:
    """Which upstream lists which tool names now, shared by a gateway's upstreams (their
    scans run in their source actors' threads)."""

    def __init__(self, mode: str, host: Iterable[str], servers: Iterable[str] = ()) -> None:
        self.mode = mode
        self.host = frozenset(host)
        self.servers = frozenset(servers)
        self._lock = threading.Lock()
        self._listed: dict[str, frozenset[str]] = {}
        self.upstreams: list[Upstream] = []

    def update(self, server: str, names: Iterable[str]) -> bool:
        """Record ``server``'s names; whether they changed."""
        now = frozenset(names)
        with self._lock:
            changed = self._listed.get(server) != now
            self._listed[server] = now
        return changed

    def served(self, server: str, name: str, prefix: bool) -> str:
        """The name ``server``'s tool ``name`` is served under."""
        if prefix or any(name.startswith(f"{s}{SEPARATOR}") for s in self.servers):
            return f"{server}{SEPARATOR}{name}"  # never in a namespace: not another's, nor its own namespaced names
        if self.mode != "namespace":
            return name
        with self._lock:
            clash = name in self.host or any(name in names for s, names in self._listed.items() if s != server)
        return f"{server}{SEPARATOR}{name}" if clash else name

    def clashes(self, prefixed: frozenset[str]) -> list[str]:
        """One sentence per name listed by two origins (servers in ``prefixed`` aside)."""
        with self._lock:
            listed = sorted((s, n) for s, n in self._listed.items() if s not in prefixed)
        found: list[str] = []
        for i, (server, names) in enumerate(listed):
            for name in sorted(names & self.host):
                found.append(f"tool {name!r} of MCP server {server!r} has the name of one of the host's own tools")
            for other, theirs in listed[i + 1:]:
                for name in sorted(names & theirs):
                    found.append(f"tool {name!r} is listed by both MCP servers {server!r} and {other!r}")
        return found


class _Served:
    """An upstream's tool under the name the gateway serves it as (``<server>__<tool>``)."""

    def __init__(self, tool: Any, served: str) -> None:
        self._tool = tool
        self._served = served

    def name(self) -> str:
        """The served name."""
        return self._served

    def description(self) -> Any:
        """The upstream's description."""
        return self._tool.description()

    def parameter_schema(self) -> Any:
        """The upstream's ``inputSchema``."""
        return self._tool.parameter_schema()

    def output_schema(self) -> Any:
        """The upstream's ``outputSchema`` (None without one): served on, as an un-namespaced tool's is."""
        return self._tool.output_schema()

    def timeout_ms(self) -> int:
        """The upstream server's per-call timeout (milliseconds)."""
        return int(self._tool.timeout_ms())

    def annotations(self) -> Any:
        """The upstream's title and hints (checked as any tool's: hints only)."""
        return self._tool.annotations()

    def run(self, args: dict[str, Any], ctx: Mapping[str, Any]) -> Any:
        """The upstream's ``tools/call`` under its own name; its error texts name both."""
        return self._tool.run_as(self._served, args, ctx)

    def rate_limit(self) -> Any:
        """The upstream server's rate (``rate`` in its table), shared by its tools."""
        return self._tool.rate_limit()

    def rate_group(self) -> Any:
        return self._tool.rate_group()

    def idempotent(self) -> Any:
        """The upstream's ``idempotentHint``, when its table trusts the hints."""
        return self._tool.idempotent()

    def background(self) -> Any:
        """``"optional"`` when the upstream serves tasks (a client's task follows the upstream's)."""
        return self._tool.background()

    def __repr__(self) -> str:
        return f"<{self._served!r}: {self._tool!r}>"


class Upstream(MCPServer):
    """One upstream server of a :class:`Gateway` (see the module doc): an
    :class:`~rho_actors.mcp.MCPServer` whose tools stay listed while it is down (a call
    is then ``unavailable``, naming it), served under their gateway names, and whose
    process, when untrusted, is confined by ``policy``."""

    revive = "restart the gateway (rho-actors mcp serve)"

    def __init__(self, spec: UpstreamSpec, names: _Names, policy: ConfinePolicy) -> None:
        common: dict[str, Any] = {
            "name": spec.name, "timeout_ms": spec.timeout_ms, "max_restarts": spec.max_restarts,
            "max_seconds": spec.max_seconds, "connect_timeout_s": spec.connect_timeout_s, "rate": spec.rate,
            "idempotent_hints": spec.idempotent_hints, "mode": spec.mode,
        }
        if spec.command is not None:
            super().__init__(command=list(spec.command), env=dict(spec.env), cwd=spec.cwd, **common)
        else:
            super().__init__(url=spec.url, headers=dict(spec.headers), **common)
        self.spec = spec
        self._names = names
        self._policy = policy
        self._held: dict[str, tuple[Any, object]] = {}  # what it listed last (kept while it is down)
        # an untrusted server's calls go to a process of the call's session (its listing never gets one)
        self.session_servers = SessionServers(self) if not spec.trusted and not spec.shared else None
        self._offered: dict[str, tuple[object, Any]] = {}  # served name -> (version, tool): one object while unchanged

    def attach(self, system: Any) -> None:
        """:meth:`MCPServer.attach`, an untrusted server first checked to be startable
        confined (:func:`rho_actors.mcp.confined.check_startable`: raises
        ``FileNotFoundError`` or ``PermissionError`` naming the path and the uid,
        before anything is started)."""
        if not self.spec.trusted:
            assert self.command is not None
            check_startable(self.command, policy=self._policy, env=self.env, reads=self.spec.read, name=self.name)
        super().attach(system)

    def call_link(self, tool: str, ctx: Mapping[str, Any]) -> contextlib.AbstractContextManager[Link]:
        """The connection of the call's session's own process (an untrusted server, not
        ``shared``), else the server's one connection."""
        if self.session_servers is None:
            return super().call_link(tool, ctx)
        return self.session_servers.link(tool, ctx)

    def detach(self) -> None:
        """:meth:`MCPServer.detach`, every session's process stopped first."""
        if self.session_servers is not None:
            self.session_servers.close()
        super().detach()

    async def open_transport(self, stack: contextlib.AsyncExitStack) -> tuple[Any, Any] | None:
        """A trusted server's usual transport (``None``); an untrusted one's confined process."""
        if self.spec.trusted:
            return None
        assert self.command is not None
        opened: tuple[Any, Any] = await stack.enter_async_context(confined_transport(
            self.command, policy=self._policy, env=self.env, reads=self.spec.read, network=self.spec.network,
            heap_bytes=self.spec.memory_mb * 2**20, label=f"MCP server {self.name}",
        ))
        return opened

    def scan(self) -> dict[str, tuple[Any, object]]:
        """``{served name: (tool, version)}``: what the server lists now, or listed last
        while it is down."""
        listed = super().scan()
        if self.given_up is not None:  # past its restart intensity: its tools are withdrawn
            if self._held:
                logger.error("MCP server {} is given up ({}): its {} tools are withdrawn; it is not restarted "
                             "again", self.name, self.given_up, len(self._held))
            self._held = listed = {}
        elif listed or self.connected:
            self._held = listed
        else:
            listed = self._held
        changed = self._names.update(self.name, listed)
        found: dict[str, tuple[Any, object]] = {}
        for name, (tool, version) in listed.items():
            served = self._names.served(self.name, name, self.spec.prefix)
            held = self._offered.get(served)
            if held is None or held[0] != version:
                held = (version, tool if served == name else _Served(tool, served))
                self._offered[served] = held
            found[served] = (held[1], version)
        for gone in set(self._offered) - set(found):
            del self._offered[gone]
        if found:
            self._last_offered = set(found)
        if changed:  # another server's tools may be served under other names now
            for other in self._names.upstreams:
                if other is not self:
                    other.refresh_offer()
        return found

    def status(self) -> dict[str, Any]:
        """``connected``, ``connections`` made, ``last_error``, ``given_up`` (why, or
        ``None``), ``trusted``, ``server_info`` (its own ``serverInfo``) and the
        ``tools`` served (served name -> the upstream's name)."""
        with self._link.lock:
            error = self._link.last_error
        served = {name: str(tool._tool.name()) if isinstance(tool, _Served) else name
                  for name, (_, tool) in self._offered.items()}
        return {"connected": self.connected, "connections": self.connections, "last_error": error,
                "given_up": self.given_up, "trusted": self.spec.trusted, "server_info": self.server_info,
                "tools": served}


# --------------------------------------------------------------------------- the gateway


class Gateway:
    """Upstream MCP servers served by a system (see the module doc). ``config``: the
    servers and the collision rule. Use :meth:`start` once, then serve the system
    (:func:`rho_actors.mcp.serve`); :meth:`close` removes the servers."""

    def __init__(self, config: GatewayConfig) -> None:
        names = [s.name for s in config.servers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise GatewayConfigError(f"MCP server name(s) {twice} are given more than once")
        self.config = config
        self.upstreams: list[Upstream] = []
        self._handles: list[Any] = []

    def start(self, system: Any) -> None:
        """Add every server to ``system`` (connecting them at once, each within its
        ``connect_timeout_s``; one still down then keeps being restarted within its
        intensity, and is logged). The host's own tools must be registered before (they
        count for collisions). Raises :class:`GatewayError` (the servers are removed
        again) when a server cannot start at all (its program is not found; an untrusted
        one cannot run confined: the message names the path and the uid) and, under
        ``collisions = "refuse"``, for a name listed by two servers, or by a server and
        the host; ``RuntimeError`` when called twice."""
        if self.upstreams:
            raise RuntimeError("this gateway has started already")
        names = _Names(self.config.collisions, (info.name for info in system.tools()),
                       (spec.name for spec in self.config.servers))
        policy: ConfinePolicy = system.confine_policy
        self.upstreams = [Upstream(spec, names, policy) for spec in self.config.servers]
        names.upstreams = list(self.upstreams)
        def add(upstream: Upstream) -> Any:
            try:
                return system.add_source(upstream, poll_s=None)
            except (OSError, ValueError) as exc:  # cannot start (its program, confined), a name taken
                return exc

        with concurrent.futures.ThreadPoolExecutor(max(1, len(self.upstreams)), "gateway-start") as pool:
            added = list(pool.map(add, self.upstreams))
        self._handles = [h for h in added if not isinstance(h, Exception)]
        if failed := [str(h) for h in added if isinstance(h, Exception)]:
            self.close()
            raise GatewayError("; ".join(failed))
        for handle in self._handles:  # each one's names as the others' first listings make them
            with contextlib.suppress(Exception):
                handle.refresh()
        for upstream in self.upstreams:
            if not upstream.connected:
                why = upstream.status()["last_error"] or "still starting"
                if system.whereis(upstream.child_id) is None:
                    logger.error("MCP server {} could not be started and is given up ({}); its output is in "
                                 "the log", upstream.name, why)
                else:
                    logger.warning("MCP server {} is not connected yet ({}); it is restarted within its intensity",
                                   upstream.name, why)
        if self.config.collisions == "refuse":
            clashes = names.clashes(frozenset(s.name for s in self.config.servers if s.prefix))
            if clashes:
                self.close()
                raise GatewayError("; ".join(clashes) + ": rename a server's tools, set prefix = true on one of "
                                   "them, or collisions = \"namespace\" (served as <server>__<tool>)")

    def status(self) -> dict[str, dict[str, Any]]:
        """Each server's :meth:`Upstream.status`, by name."""
        return {up.name: up.status() for up in self.upstreams}

    def close(self) -> None:
        """Remove every server from the system (stopping their processes); never raises."""
        for handle in self._handles:
            with contextlib.suppress(Exception):
                handle.close()
        self._handles = []


def gateway_config(config: str | None = None, mcp: Iterable[str] = (), mcp_url: Iterable[str] = (),
                   untrusted_mcp: Iterable[str] = (), collisions: str | None = None) -> GatewayConfig:
    """The servers of ``rho-actors mcp serve``: those of the ``config`` file (a path, or
    ``None``), then those of the flags (:func:`specs_from_flags`, named apart from the
    file's); ``collisions`` overrides the file's rule. Raises :class:`GatewayConfigError`."""
    loaded = load_config(config) if config is not None else GatewayConfig()
    flags = specs_from_flags(mcp, mcp_url, untrusted_mcp, taken=(s.name for s in loaded.servers))
    rule = collisions if collisions is not None else loaded.collisions
    if rule not in COLLISIONS:
        raise GatewayConfigError(f"collisions must be one of {list(COLLISIONS)}, got {rule!r}")
    return GatewayConfig((*loaded.servers, *flags), rule)  # type: ignore[arg-type]
