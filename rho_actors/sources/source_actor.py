"""Sources: things that serve a changing set of tools (DESIGN §1 "source").

A source is any object with a ``name`` (``str``) and a ``scan()`` method returning
``{key: (tool, version)}``: a stable key (a file path, an entry point) for each tool it
serves now, and a version that changes when that tool's code changes. ``scan()`` may
raise; that is a failed refresh. A key it cannot turn into a tool maps to a
:class:`Broken` value (with why) instead of a tool, so one bad plugin never hides the
others. Two sources come with the runtime (in :mod:`rho_actors.sources.builtin`,
re-exported here):

- :class:`PluginFolder`: each ``*.py`` file directly in a folder is a tool module (the
  module itself is the tool: ``name``, ``description``, ``parameter_schema`` and ``run``
  at module level). Names starting with ``.`` or ``_`` are skipped (editor files,
  ``__init__.py``, helpers). A file's version is a hash of its bytes, so a file saved
  unchanged is not reloaded and a changed one always is.
- :class:`EntryPointGroup`: each entry point of a group (default ``rho_actors.tools``)
  of the installed distributions loads to a tool (a module, class or object); its
  version is the distribution's version and the entry point's value.

:func:`add_source` (``system.add_source(source)``) puts a source under a supervised
:class:`SourceActor` (a ``permanent`` child of the system's ``sources`` supervisor, apart
from the host's servers, DESIGN §6), which scans at once and then every ``poll_s``
seconds (a timer message to itself, no sleeping thread), and applies the difference to
the system's registry:

- a new key registers its tool (``untrusted=not trusted``: an untrusted tool's
  declaration is read in a throwaway process and its calls run in a worker process);
  a trusted source's new tools of one scan are registered as one change
  (``register_many``), so loops see a listing appear whole (an MCP server's, after its
  restart), and one by one only when the registry refuses the batch (a name clash,
  a tool that is not one: each key then gets its own verdict);
- a changed version unregisters the old tool, then registers the new one (a key whose
  new version is broken stays out until it is fixed: old code is not kept offered);
- a removed key unregisters its tool;
- a scan that raises changes nothing: the last good set stays registered, and the error
  is logged (once per distinct message) and shown in :meth:`SourceHandle.status`;
- names (DESIGN §3): the host's own ``register`` takes a name from a source's tool (the
  tool is evicted: logged, announced, and shown in :meth:`SourceHandle.status`; it is
  registered again once the host frees the name); a source's tool never takes a name;
- a registration error (another tool holds the name: :class:`DuplicateToolError` names
  both origins; the registry is restarting) is recorded for its key and tried again at
  a later scan (a refused name once the registry's tool set has changed, so a name
  freed by another file is taken up; anything else at the next scan); a declaration that fails
  its checks is recorded (the registry holds it, not offered) until the code changes.
  Nothing a source or a tool does crashes the actor.

What a loop sees: each turn reads the registry's current tool set, so a tool added by
a scan is offered from the next turn on, and a call naming a tool removed since the
model's offer gets an ``unavailable`` error. A call *in flight* when its tool is
removed is not affected: its CallActor (or worker process) already holds the tool
object, so the call finishes and its result is returned as usual.

Trust: an untrusted :class:`PluginFolder` (the default) never imports its files in the
host process: which tool a file holds is found in a throwaway child process, and the
host holds a :class:`~rho_actors.sandbox.plugins.PluginRef` (path, tool name, bytes)
that child processes load (DESIGN §3). An entry point's import, and a trusted
folder's files, run in the host process when the source scans.

Example::

    with ActorSystem() as system:
        handle = add_source(system, PluginFolder("plugins/"), poll_s=2.0)
        loop = system.start_loop("s1")
        ...                        # drop a file in plugins/: offered within ~2 s
        handle.refresh()           # or apply the folder's state now
        print(handle.status()["tools"])
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pykka
from loguru import logger

from rho_actors.encoding import describe_exception, shown_text
from rho_actors.otp.actor import Actor, monitor
from rho_actors.otp.supervisor import ChildSpec, StartChild
from rho_actors.otp.timers import Timer
from rho_actors.registry.tool_registry import DuplicateToolError, Registration
from rho_actors.sandbox import PluginLoadError, load_module_file, tools_in_module
from rho_actors.sources.builtin import DEFAULT_GROUP, MAX_REASON_CHARS, Broken, EntryPointGroup, PluginFolder

__all__ = [
    "tools_in_module",
    "DEFAULT_GROUP",
    "Broken",
    "EntryPointGroup",
    "PluginFolder",
    "PluginLoadError",
    "Source",
    "SourceActor",
    "SourceHandle",
    "SourceState",
    "add_source",
    "load_module_file",
]

_SOURCES = "sources"
_MAX_KEY_CHARS = 1_000


def _shown_key(key: str) -> str:
    """A source's key (a plugin file's path, an upstream's tool name: anyone who may write
    the folder or run the server chose it) as status and logs show it: one line, escaped,
    cut (:func:`~rho_actors.encoding.shown_text`)."""
    return shown_text(key, _MAX_KEY_CHARS)


def _reason(text: str) -> str:
    """Why a key is not offered, or a scan failed (a child's words, a file's name inside):
    one line, escaped, cut, as every reason shown."""
    return shown_text(text, MAX_REASON_CHARS)


@runtime_checkable
class Source(Protocol):
    """Something that serves a changing set of tools.

    ``name`` names it in messages and must be unique among a system's sources;
    ``scan()`` returns ``{key: (tool, version)}`` for every tool it serves now (a
    :class:`Broken` in place of a tool for a key it could not load). ``version`` is any
    value compared with ``==``; it must change when the tool's code changes. A scan may
    raise: the last good set is kept. Optional (DESIGN §6b): ``attach(system)`` and ``detach()``
    start and stop a source's own actors; ``halt()`` ends the source's own threads (reads
    under way cancelled) when its actor stops (the system's stop, a restart; a later scan
    may start new ones); ``contained = True`` registers its tools trusted;
    ``withdrawn(key)`` gives the text a call naming a tool it withdrew gets (``None``: "tool 'x'
    was unregistered").
    """

    name: str

    def scan(self) -> dict[str, tuple[Any, object]]: ...


# --------------------------------------------------------------------------- the actor


@dataclass(slots=True)
class _Key:
    """What a source serves under one key, and what became of it."""

    tool: Any
    version: object
    name: str | None = None
    registered: bool = False  # the registry holds it (offered or not)
    reason: str | None = None
    retry: bool = False  # registration failed in a way that may pass at a later scan
    retry_unless: int | None = None  # ...but not while the registry's tool set is still this version
    logged: str | None = None  # the last reason logged, so it is logged once


@dataclass(slots=True)
class SourceState:
    """A source's state, kept by its :class:`SourceHandle` so that a restarted
    :class:`SourceActor` goes on from it (no tool registered twice or forgotten)."""

    keys: dict[str, _Key] = field(default_factory=dict)
    scans: int = 0
    failed_scans: int = 0
    last_error: str | None = None
    last_scan: float | None = None  # time.time() of the last scan, good or failed
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True, slots=True)
class _Tick:
    """A timer's message: scan now and schedule the next."""


@dataclass(frozen=True, slots=True)
class _Sync:
    """Answered once every message before it is handled."""


class SourceActor(Actor):
    """Scans one source and applies the difference to the system's registry (see the
    module doc). Started by :func:`add_source` as a ``permanent`` child of ``sources``."""

    def __init__(self, system: Any, source: Any, state: SourceState, trusted: bool, poll_s: float | None) -> None:
        super().__init__()
        self._system = system
        self._source = source
        self._state = state
        self._trusted = trusted
        self._poll_s = poll_s
        self._timer: Timer | None = None
        self._label = str(getattr(source, "name", "?"))

    def on_start(self) -> None:
        self.actor_ref.tell(_Tick())  # the first scan, right after start (and after a restart)

    def on_stop(self) -> None:
        """The system's stop, a restart, the source's close: no periodic scan follows,
        and the source's own threads end (its optional ``halt()``: a
        :class:`PluginFolder` cancels its file reads under way and waits for their threads)."""
        if self._timer is not None:
            self._timer.cancel()
        if callable(halt := getattr(self._source, "halt", None)):
            try:
                halt()
            except Exception:
                logger.exception("source {}: halting its reads failed", self._label)

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Tick):
            try:
                self.refresh()
            except Exception as exc:  # a crash loop here could escalate to the root: contain it
                logger.exception("source {}: applying a scan failed", self._label)
                with self._state.lock:
                    self._state.last_error = _reason(f"applying the scan failed: {describe_exception(exc)}")
        elif isinstance(message, _Sync):
            return True
        return None

    # --- asks -----------------------------------------------------------------------------

    def described(self) -> str:
        """The source's ``repr`` (for a message naming it)."""
        return repr(self._source)[:300]

    def refresh(self) -> None:
        """Scan now, apply the difference, and schedule the next periodic scan."""
        try:
            if not self._state.closed:
                self._scan_and_apply()
        finally:
            self._schedule()

    def unload(self) -> None:
        """Unregister every tool of this source and stop scanning (before it is removed)."""
        with self._state.lock:
            self._state.closed = True
            keys = list(self._state.keys.items())
        for key, entry in keys:
            self._withdraw(key, entry)
        with self._state.lock:
            self._state.keys.clear()
        if self._timer is not None:
            self._timer.cancel()

    # --- scanning -------------------------------------------------------------------------

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._poll_s is None or self._state.closed:
            return
        try:
            self._timer = self._system.timers.send_after(self._poll_s, self.actor_ref, _Tick())
        except RuntimeError:  # the system's timers are stopped: the system is stopping
            pass

    def _scan_and_apply(self) -> None:
        state = self._state
        try:
            found = _checked_scan(self._source.scan())
            if state.closed:  # closed while it ran (SourceHandle.close past its timeout): nothing applied
                logger.info("source {}: a scan that ended after the source was closed is dropped", self._label)
                return
        except BaseException as exc:  # a source's SystemExit must not end this actor
            message = _reason(f"scan failed: {describe_exception(exc)}")
            with state.lock:
                repeated = state.last_error == message
                state.scans += 1
                state.failed_scans += 1
                state.last_error = message
                state.last_scan = time.time()
            (logger.debug if repeated else logger.warning)(
                "source {}: {}; the last good set of {} tools stays", self._label, message, len(state.keys)
            )
            return
        keys = state.keys
        # Withdrawals first, so that a tool moving from one key to another keeps its name.
        for key, entry in list(keys.items()):
            now = found.get(key)
            if now is None or not _same(now[1], entry.version) or now[0] is not entry.tool:
                self._withdraw(key, entry)
                if now is None:
                    with state.lock:
                        del keys[key]
                    logger.info("source {}: {} is gone; its tool was unregistered", self._label, _shown_key(key))
        fresh: list[tuple[str, _Key]] = []  # new tools: registered together below
        for key in sorted(found):
            tool, version = found[key]
            held = keys.get(key)
            if held is not None and _same(held.version, version) and held.tool is tool:
                evicted = _evicted_by(self._system.tool_set(), held)
                if evicted is not None:  # the host took its name: try again once the tool set changes
                    self._failed(held, evicted, retry=True)
                    held.retry_unless = self._system.tool_set().version
                elif held.retry and held.retry_unless != self._system.tool_set().version:
                    self._offer(key, held)
                continue
            entry = _Key(tool, version)
            with state.lock:
                keys[key] = entry
            if isinstance(tool, Broken):
                entry.reason = _reason(tool.reason)
                self._log_once(entry, f"source {self._label}: {_shown_key(key)} is not loaded: {entry.reason}")
            else:
                fresh.append((key, entry))
        self._offer_all(fresh)
        with state.lock:
            state.scans += 1
            state.last_error = None
            state.last_scan = time.time()

    def _offer_all(self, fresh: list[tuple[str, _Key]]) -> None:
        """Register a scan's new tools. A trusted source's go in as one change
        (``register_many``: loops see a server's listing appear whole, as after its
        restart, never a part of it); when the registry refuses the batch (a name held
        or taken twice, a tool that is not one), each is registered alone, so each key
        gets its own verdict. An untrusted source's are registered one at a time."""
        if self._trusted and len(fresh) > 1:
            tools_version = self._system.tool_set().version
            try:
                registrations = self._system.register_many(
                    [entry.tool for _, entry in fresh], source=self._label,
                    origins=[self._origin(key) for key, _ in fresh])
            except (DuplicateToolError, TypeError):  # one key's fault: each key alone, below
                pass
            except BaseException as exc:  # the registry restarting, a timeout: try again next scan
                for _, entry in fresh:
                    self._not_offered(entry, exc, tools_version)
                return
            else:
                for (key, entry), registration in zip(fresh, registrations, strict=True):
                    self._offered(key, entry, registration)
                return
        for key, entry in fresh:
            self._offer(key, entry)

    def _origin(self, key: str) -> str:
        return f"{_shown_key(key)} (source {self._label})"

    def _offer(self, key: str, entry: _Key) -> None:
        tools_version = self._system.tool_set().version
        try:
            registration = self._system.register(entry.tool, origin=self._origin(key), untrusted=not self._trusted,
                                                 source=self._label)
        except BaseException as exc:
            self._not_offered(entry, exc, tools_version)
        else:
            self._offered(key, entry, registration)

    def _not_offered(self, entry: _Key, exc: BaseException, tools_version: int) -> None:
        """A registration of ``entry`` raised ``exc``; the registry's tool set was at
        ``tools_version`` when it was tried."""
        if isinstance(exc, DuplicateToolError):  # tried again once the tool set has changed (a name may be free)
            self._failed(entry, str(exc), retry=True)
            entry.retry_unless = tools_version
        elif isinstance(exc, TypeError):  # not a tool
            self._failed(entry, str(exc), retry=False)
        else:  # the registry restarting, a timeout: try again next scan
            self._failed(entry, f"registration failed: {describe_exception(exc)}", retry=True)
            entry.registered = True  # it may be held or pending: unregister it on withdrawal

    def _offered(self, key: str, entry: _Key, registration: Registration) -> None:
        """``entry`` (under ``key``) was registered: ``registration`` says as what."""
        with self._state.lock:
            entry.registered, entry.retry = True, False
            entry.name = registration.info.name if registration.info is not None else None
            entry.reason = None if registration.reason is None else _reason(registration.reason)
        if entry.reason is not None:
            self._log_once(entry, f"source {self._label}: {_shown_key(key)} is registered but not offered: "
                                  f"{entry.reason}")
        else:
            logger.info("source {}: {} registered as tool {!r}", self._label, _shown_key(key), entry.name)

    def _failed(self, entry: _Key, reason: str, *, retry: bool) -> None:
        with self._state.lock:
            entry.registered, entry.retry, entry.reason = False, retry, _reason(reason)
            entry.retry_unless = None
        self._log_once(entry, f"source {self._label}: {entry.reason}")

    def _withdraw(self, key: str, entry: _Key) -> None:
        if isinstance(entry.tool, Broken) or not (entry.registered or entry.retry):
            return
        withdrawn = getattr(self._source, "withdrawn", None)  # optional: why a call naming it is refused
        try:
            self._system.unregister(entry.tool, withdrawn(key) if callable(withdrawn) else None)
        except BaseException as exc:
            logger.warning("source {}: unregistering the tool of {} failed: {}", self._label, _shown_key(key),
                           _reason(describe_exception(exc)))
        with self._state.lock:
            entry.registered, entry.retry = False, False

    def _log_once(self, entry: _Key, message: str) -> None:
        if entry.logged != message:
            entry.logged = message
            logger.warning("{}", message)


def _evicted_by(tools: Any, entry: _Key) -> str | None:
    """Why ``entry``'s registered tool lost its name to another (the host's own
    registration takes a name from a source's tool, DESIGN §3), or ``None``."""
    if not entry.registered or entry.name is None:
        return None
    holder = tools.entries.get(entry.name)
    if holder is None or holder.tool is entry.tool:
        return None
    return (f"tool name {entry.name!r} is taken by the host's own registration of {holder.origin}; "
            "this tool yields it and is registered again once the name is free")


def _distinct(taken: Mapping[str, Any], shown: str, last: dict[str, int]) -> str:
    """``shown``, or ``shown #N`` with the first ``N`` >= 2 not in ``taken``; ``last``
    (``shown`` -> its last ``N``, kept by the caller across one listing) makes the search
    start where the last one for ``shown`` ended: ``n`` keys that show alike (``2**k``
    names spell ``k`` control characters raw or escaped) cost ``O(n)``, not ``O(n**2)``
    (16,384 took 48 s, the source's lock held)."""
    n = last.get(shown, 1)
    key = shown if n == 1 else f"{shown} #{n}"
    while key in taken:
        n += 1
        key = f"{shown} #{n}"
    last[shown] = n
    return key


def _bounds(source: Any) -> dict[str, Any]:
    """``source.bounds()`` when it has one (plain data), else ``{}``; never raises."""
    try:
        found = source.bounds() if callable(getattr(source, "bounds", None)) else {}
    except Exception:
        return {}
    return dict(found) if isinstance(found, Mapping) else {}


def _same(a: object, b: object) -> bool:
    """``a == b``, false when the comparison raises or answers something odd."""
    try:
        return (a == b) is True
    except Exception:
        return False


def _checked_scan(found: Any) -> dict[str, tuple[Any, object]]:
    """``found`` if it has the shape of a scan's answer; raises ``TypeError`` otherwise."""
    if not isinstance(found, Mapping):
        raise TypeError(f"scan() returned a {type(found).__name__}, not a dict of key -> (tool, version)")
    checked: dict[str, tuple[Any, object]] = {}
    for key, value in found.items():
        if not isinstance(key, str) or not isinstance(value, tuple) or len(value) != 2:
            raise TypeError(f"scan() returned {key!r}: {value!r}; expected str: (tool, version)")
        checked[key] = value
    return checked


# --------------------------------------------------------------------------- the handle


class SourceHandle:
    """The host's handle to a source added with :func:`add_source`."""

    def __init__(self, system: Any, source: Any, state: SourceState, child_id: str, trusted: bool,
                 poll_s: float | None) -> None:
        self.name: str = source.name
        self.source = source
        self.trusted = trusted
        self.poll_s = poll_s
        self.child_id = child_id
        self._system = system
        self._state = state

    def _ref(self) -> pykka.ActorRef[Any]:
        ref: pykka.ActorRef[Any] | None = self._system.whereis(self.child_id)
        if ref is None:
            raise RuntimeError(f"the actor of source {self.name!r} is not running (removed, restarting, "
                               "or the system has stopped)")
        return ref

    @property
    def alive(self) -> bool:
        """Whether the source's actor is running."""
        return self._system.whereis(self.child_id) is not None

    def refresh(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Scan now and return once the difference is applied (registrations included),
        with :meth:`status`. Raises ``RuntimeError`` when the actor is not running and
        ``pykka.Timeout`` past ``timeout_s`` seconds (the scan still completes later)."""
        self._ref().proxy().refresh().get(timeout=timeout_s)
        return self.status()

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        """Return once every message the actor had when called is handled (the first
        scan, a periodic scan under way). Raises as :meth:`refresh`."""
        self._ref().ask(_Sync(), timeout=timeout_s)

    def status(self) -> dict[str, Any]:
        """The source's state as plain data (JSON-ready), read without waiting for a scan::

            {"source": str, "trusted": bool, "poll_s": float | None, "alive": bool,
             "scans": int,             # scans done, good or failed
             "failed_scans": int,
             "last_error": str | None, # why the last scan failed (None once one passes)
             "last_scan": float | None,  # time.time() of the last scan
             "tools": {key: {"name": str | None,    # the checked name, when known
                             "version": str,        # (key and texts escaped to one line, cut)
                             "registered": bool,    # the registry holds it
                             "offered": bool,       # loops offer it now
                             "reason": str | None}},  # why it is not offered
             "bounds": {...}}          # the source's own bounds (PluginFolder.bounds()), if any

        ``offered`` is read from the registry's current tool set, so an untrusted tool
        whose declaration read is retried later shows up when it passes. A key, a version
        and a reason are shown as :func:`~rho_actors.encoding.shown_text` makes them (a
        plugin file's name is anyone's who may write the folder): one line, control and
        bidi characters escaped (``\\x1b``, ``\\n``), cut; two keys that show alike are
        told apart by a `` #2``, `` #3``... suffix.
        """
        entries = self._system.tool_set().entries
        offered = {id(e.tool): name for name, e in entries.items()}
        with self._state.lock:
            state = self._state
            tools: dict[str, dict[str, Any]] = {}
            last: dict[str, int] = {}
            for key, entry in state.keys.items():
                live = offered.get(id(entry.tool)) if entry.registered else None
                live_entry = entries.get(live) if live is not None else None
                is_offered = live_entry is not None and live_entry.tool is entry.tool
                evicted = None if is_offered else _evicted_by(self._system.tool_set(), entry)
                tools[_distinct(tools, _shown_key(key), last)] = {
                    "name": live if is_offered else entry.name,
                    "version": _reason(str(entry.version)),
                    "registered": entry.registered and evicted is None,
                    "offered": is_offered,
                    "reason": None if is_offered else (evicted or entry.reason),
                }
            return {
                "source": self.name,
                "trusted": self.trusted,
                "poll_s": self.poll_s,
                "alive": self.alive,
                "scans": state.scans,
                "failed_scans": state.failed_scans,
                "last_error": state.last_error,
                "last_scan": state.last_scan,
                "tools": tools,
                "bounds": _bounds(self.source),
            }

    def close(self, timeout_s: float = 60.0) -> None:
        """Unregister every tool of this source and stop its actor (it is not
        restarted), then call the source's ``detach()`` once that actor has ended: at
        once as a rule; when a scan still runs past ``timeout_s`` (the unload and the
        stop wait behind it), the source is detached when that scan ends, in a thread of
        its own (a scan never runs on with what ``detach()`` tore down; what it found is
        not applied). Idempotent; a no-op once the system has stopped."""
        ref = self._system.whereis(self.child_id)
        if ref is not None:
            try:
                ref.proxy().unload().get(timeout=timeout_s)
            except (pykka.ActorDeadError, pykka.Timeout) as exc:
                logger.warning("source {}: unloading failed: {}", self.name, describe_exception(exc))
        self._state.closed = True
        ref = ref or self._system.whereis(self.child_id)  # (one restarted meanwhile)
        sources = self._system.whereis(_SOURCES)
        if sources is not None:
            try:
                sources.proxy().terminate_child(self.child_id).get(timeout=timeout_s)
            except (pykka.ActorDeadError, pykka.Timeout):
                pass
        if callable(detach := getattr(self.source, "detach", None)):
            self._detach_at_end(ref, detach, timeout_s)

    def _detach_at_end(self, ref: pykka.ActorRef[Any] | None, detach: Any, timeout_s: float) -> None:
        """``detach()`` once the actor behind ``ref`` has ended (its ``on_stop``, the
        source's ``halt()``, done): here when it has (the usual), else from its end, in a
        thread of its own (an actor's end must be quick)."""
        if ref is None:
            detach()
            return
        here = threading.get_ident()
        at_once: list[bool] = []

        def ended(_ref: Any, _reason: object) -> None:
            if threading.get_ident() == here:  # reported at once: it had ended
                at_once.append(True)
                detach()
            else:
                threading.Thread(target=self._detach_late, args=(detach,), name=f"rho-source-detach-{self.name}",
                                 daemon=True).start()

        monitor(ref, ended)
        if not at_once:
            logger.warning("source {}: a scan still runs after close's {} s; the source is detached once it ends",
                           self.name, timeout_s)

    def _detach_late(self, detach: Any) -> None:
        try:
            detach()
        except Exception:
            logger.exception("source {}: detaching it once its last scan ended failed", self.name)
        else:
            logger.info("source {}: detached once its last scan ended", self.name)

    def __repr__(self) -> str:
        return f"<SourceHandle {self.name!r} {'alive' if self.alive else 'stopped'}>"


def _collision(name: str, held: Any, source: Any) -> str:
    """The message for ``source`` whose name another running source holds."""
    try:
        other = held.proxy().described().get(timeout=5)
    except (pykka.ActorDeadError, pykka.Timeout):
        other = "a source that is stopping"
    return (f"a source named {name!r} is already added to this system: {other} and {source!r} have that name; "
            "give one of them another (name=...)")


def add_source(
    system: Any,
    source: Source,
    *,
    trusted: bool = False,
    poll_s: float | None = 2.0,
    timeout_s: float = 60.0,
) -> SourceHandle:
    """Serve ``source``'s tools from ``system`` (an :class:`rho_actors.ActorSystem`),
    kept in step with it by a supervised :class:`SourceActor` (see the module doc).

    ``trusted``: register its tools as trusted (declaration read and calls run in this
    process) instead of untrusted (read in a throwaway process, calls in worker
    processes). It says how tools are registered, not how the source loads them: an
    untrusted :class:`PluginFolder` (its own ``trusted=False``, the default) serves
    :class:`~rho_actors.sandbox.plugins.PluginRef` stand-ins, which are untrusted
    whatever this says; trusting a folder takes ``PluginFolder(path, trusted=True)``.
    ``poll_s``: seconds between scans (``None``: scan only on :meth:`SourceHandle.refresh`).
    Returns once the first scan is applied, or after
    ``timeout_s`` seconds (it then goes on in the background).

    Raises ``TypeError`` when ``source`` has no ``str`` ``name`` or no ``scan()``,
    ``ValueError`` for a ``poll_s`` that is not a positive number or a name another
    running source of this system has, and ``RuntimeError`` once the system has stopped.
    """
    name = getattr(source, "name", None)
    if not isinstance(name, str) or not name or not callable(getattr(source, "scan", None)):
        raise TypeError(f"{source!r} is not a source: it needs a non-empty str name and a scan() method")
    if poll_s is not None and not (isinstance(poll_s, (int, float)) and poll_s > 0):
        raise ValueError(f"poll_s must be a positive number of seconds or None, got {poll_s!r}")
    child_id = f"source:{name}"
    if (held := system.whereis(child_id)) is not None:
        raise ValueError(_collision(name, held, source))
    trusted = trusted or getattr(source, "contained", False) is True  # stand-ins for code elsewhere
    if callable(attach := getattr(source, "attach", None)):
        attach(system)  # the source's own actors (DESIGN §6b)
    state = SourceState()
    spec = ChildSpec(child_id, StartChild(SourceActor, (system, source, state, trusted, poll_s)),
                     restart="permanent", name=child_id)
    sources = system.whereis(_SOURCES)
    if sources is None:
        raise RuntimeError("the system's sources supervisor is not running: the system has stopped")
    try:
        sources.proxy().start_child(spec).get(timeout=timeout_s)
    except ValueError as err:  # the name was taken in between
        raise ValueError(f"a source named {name!r} is already added to this system ({err})") from None
    handle = SourceHandle(system, source, state, child_id, trusted, poll_s)
    try:
        handle.wait_idle(timeout_s)
    except (pykka.Timeout, pykka.ActorDeadError, RuntimeError) as exc:
        logger.warning("source {}: the first scan is not done after {} s ({}); it goes on in the background",
                       name, timeout_s, describe_exception(exc))
    return handle
