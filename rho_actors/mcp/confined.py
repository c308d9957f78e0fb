"""A stdio MCP server confined as untrusted workers are (DESIGN §6b "The gateway").

:func:`confined_transport` starts an MCP server's process from rho's clean fork server
(:mod:`rho_actors.sandbox.clean`, never ``multiprocessing``) under an
:class:`~rho_actors.sandbox.confine.enclosure.Enclosure` of the untrusted policy: a
scrubbed environment (the allowlist, ``HOME``/``TMPDIR`` its private folder, plus the
server's ``env``), its own private folder (a bounded tmpfs, its working directory), a
cgroup bounding its whole tree's memory and processes, its own PID, IPC, mount and network
namespaces (no socket at all unless ``network=True``), ``no_new_privs``, Landlock
(the Python installation, the system's libraries, the server's own files and the
``read`` paths, read-only; the private folder writable), a uid/gid of its own when the
host is root, and the seccomp filter, all applied before any of the server's code runs
(:func:`rho_actors.sandbox.child.enter_child`).

The server speaks MCP over its standard input and output, which are one end of a
``socketpair``, every message it sends bounded before it is parsed
(:mod:`rho_actors.mcp.bounds`) (its stderr is logged by the host through loguru, bounded, as every
child's output: :mod:`rho_actors.sandbox.output`). Two ways to run it:

- a Python server (``python -m MODULE ...`` or ``python SCRIPT ...``, the program
  a bare ``python``, ``python3``, ``python3.N`` or this interpreter's path) runs on rho's own
  interpreter, in the confined child itself (``runpy``), importing the host's installed
  packages through folders opened before the uid drop; a script's folder is readable;
- any other program is ``exec``-ed in the confined child (confinement survives
  ``exec``): it must be readable by uid 65534 and lie under the read paths (``/usr``,
  ``/bin``, ``/lib``... or a ``read`` path); the folder of its first argument that is a
  file (``node server.js``) is readable too.

When the connection ends the server's whole tree is killed and its cgroup and folder
removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import importlib.machinery
import os
import runpy
import select
import shutil
import socket
import stat
import sys
import traceback
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

import anyio

from rho_actors.mcp.bounds import MAX_MESSAGE_BYTES, message_streams
from rho_actors.mcp.names import PYTHON_NAME, python_arguments
from rho_actors.otp.owned import owner_now
from rho_actors.sandbox import Channel, ConfinePolicy, Enclosure, spawn_clean

__all__ = [
    "DEFAULT_HEAP_BYTES", "MAX_LINE_BYTES", "check_startable", "confined_transport", "python_arguments",
    "python_target",
]

DEFAULT_HEAP_BYTES: Final = 1024 * 2**20
"""The memory bound of a confined server's whole tree (bytes): 1 GiB."""
MAX_LINE_BYTES: Final = MAX_MESSAGE_BYTES
"""The longest JSON-RPC line read from a confined server (bytes); a longer one ends the
connection (every message passes :class:`rho_actors.mcp.bounds.MessageBounds`)."""
_PIDS_MAX: Final = 128  # processes and threads of its tree (an SDK server runs a thread pool)
_START_TIMEOUT_S: Final = 30.0
_READY: Final = b"R"


def python_target(command: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """``(kind, target, args)`` when ``command`` runs Python code this interpreter runs
    itself: the program is a bare ``python``, ``python3`` or ``python3.N``, or this
    interpreter's own path (``sys.executable``), and kind is ``"module"`` (``-m
    MODULE``) or ``"path"`` (``SCRIPT``); ``None`` for any other program, another
    interpreter's path included (it is ``exec``-ed). Flags among ``-u -I -B -E -s -S -O
    -OO -q`` before the target are accepted and dropped."""
    program = command[0]
    bare = os.sep not in program and PYTHON_NAME.fullmatch(program)
    if not (bare or os.path.abspath(program) == os.path.abspath(sys.executable)):
        return None  # another interpreter (a venv's own python): exec-ed, with its own packages
    return python_arguments(command[1:])


def _serve_child(channel: Channel, payload: dict[str, Any]) -> None:
    """In the confined child (entered already): make the channel's socket standard input
    and output, tell the host, then run the server (Python here, or ``exec``)."""
    fd = channel.conn.fileno()
    os.set_blocking(fd, True)
    os.write(fd, _READY)
    os.dup2(fd, 0)
    os.dup2(fd, 1)
    if payload["kind"] == "exec":
        try:
            os.execv(payload["program"], payload["argv"])
        except OSError as exc:
            os.write(2, f"cannot start {payload['program']}: {exc}\n".encode())
            os._exit(127)
    os.close(fd)
    kind, target, args = payload["kind"], payload["target"], payload["args"]
    sys.argv = [target, *args]
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
            return
        folder = _pinned(payload["folder"])  # the script's folder, opened before the uid drop
        sys.path.insert(0, folder)
        runpy.run_path(os.path.join(folder, os.path.basename(target)), run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.stderr.flush()
        os._exit(code)
    except BaseException:  # the server's own failure, in the host's log (its stderr)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def _pinned(identity: tuple[int, int]) -> str:
    """The ``sys.path`` entry (``/proc/self/fd/N`` once pinned) of the folder whose
    ``(st_dev, st_ino)`` is ``identity``."""
    for entry in sys.path:
        with contextlib.suppress(OSError):
            st = os.stat(entry)
            if (st.st_dev, st.st_ino) == identity:
                return entry
    raise FileNotFoundError("the server script's folder is not readable in the confined process")


def _payload(command: Sequence[str], path: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """What the child runs, and the folders it must read (a script's folder)."""
    target = python_target(command)
    if target is None:
        program = shutil.which(command[0], path=path) if os.sep not in command[0] else command[0]
        if program is None:
            raise FileNotFoundError(f"{command[0]!r} is not found on PATH={path}")
        scripts = [a for a in command[1:] if not a.startswith("-") and os.path.isfile(a)][:1]
        folders = tuple(os.path.dirname(os.path.realpath(a)) for a in scripts)  # node server.js: its folder
        venvs = tuple(v for p, _ in _exec_chain(program, path) for v in _venv_of(p))  # its own installation
        return {"kind": "exec", "program": os.path.realpath(program), "argv": list(command)}, (*folders, *venvs)
    kind, name, args = target
    if kind == "module":
        return {"kind": kind, "target": name, "args": args}, ()
    if not os.path.isfile(name):
        raise FileNotFoundError(f"the server script {name} does not exist")
    folder = os.path.dirname(os.path.realpath(name))
    st = os.stat(folder)
    return {"kind": kind, "target": name, "args": args, "folder": (st.st_dev, st.st_ino)}, (folder,)


def _exec_chain(program: str, path: str) -> list[tuple[str, str]]:
    """``(path, what)`` of each file ``exec`` of ``program`` needs: the program, then
    the interpreter of each ``#!`` line (``/usr/bin/env NAME``: both), 4 deep at most."""
    chain = [(program, "its program")]
    current = program
    for _ in range(4):
        if not os.path.isfile(current):  # never open a FIFO or a device
            break
        try:
            with open(current, "rb") as f:
                head = f.read(512)
        except OSError:
            break
        words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split() if head.startswith(b"#!") else []
        if not words:
            break
        interpreter = words[0]
        said = f"the interpreter on the #! line of {current}"
        if os.path.basename(interpreter) == "env":
            chain.append((interpreter, said))
            named = [w for w in words[1:] if not w.startswith("-")][:1]
            found = shutil.which(named[0], path=path) if named else None
            if found is None:
                break  # exec fails as it would unconfined; the server's output says so
            interpreter = found
        chain.append((interpreter, said))
        current = interpreter
    return chain


def _venv_of(program: str) -> tuple[str, ...]:
    """What of the virtualenv ``program`` lies in (``<venv>/bin/<name>`` beside a
    ``<venv>/pyvenv.cfg``) a confined process may read: its ``pyvenv.cfg``, ``bin``,
    ``lib`` and ``lib64`` (never the rest of the folder: a venv made in a project's
    folder is beside that project's files), and of the Python its ``home`` names, only
    an installation's interpreter files, standard library and ``libpython`` (so a
    ``pyvenv.cfg`` saying ``home = /home/me`` opens nothing); real paths, ``()`` for a
    program in no venv."""
    venv = os.path.dirname(os.path.dirname(os.path.abspath(program)))
    config = os.path.join(venv, "pyvenv.cfg")
    if not os.path.isfile(config):
        return ()
    found = [config, *(os.path.join(venv, d) for d in ("bin", "lib", "lib64") if os.path.isdir(os.path.join(venv, d)))]
    home = None
    with contextlib.suppress(OSError), open(config, encoding="utf-8", errors="replace") as f:
        for line in f.read(65536).splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() == "home" and value.strip():
                home = os.path.realpath(value.strip())
    if home is not None and os.path.isdir(home):
        prefix = os.path.dirname(home)
        stdlib = [os.path.dirname(p) for p in glob.glob(os.path.join(glob.escape(prefix), "lib", "python3*", "os.py"))]
        if stdlib:  # a Python installation: its interpreters, standard library and shared library
            found += [os.path.join(home, n) for n in os.listdir(home) if PYTHON_NAME.fullmatch(n)]
            found += stdlib + glob.glob(os.path.join(glob.escape(prefix), "lib", "libpython3*"))
    return tuple(dict.fromkeys(os.path.realpath(p) for p in found))


def _closed_to(path: str, uid: int, gid: int) -> str | None:
    """Why ``uid``/``gid`` cannot reach and read ``path`` by its mode bits (each folder
    on the way searchable, the file readable and executable), or ``None``."""
    parts = os.path.abspath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        current = os.sep.join(parts[:i])
        try:
            st = os.stat(current)
        except OSError as exc:
            return f"{current}: {exc.strerror}"
        shift = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0
        need = stat.S_IXOTH | (stat.S_IROTH if i == len(parts) else 0)
        if (st.st_mode >> shift) & need != need:
            return f"{current} (mode {stat.filemode(st.st_mode)}, owner uid {st.st_uid}) is closed to it"
    return None


def check_startable(command: Sequence[str], *, policy: ConfinePolicy, env: Mapping[str, str] | None = None,
                    reads: Sequence[str] = (), name: str = "MCP server") -> None:
    """Check, before anything is started, that ``command`` can run confined by
    ``policy`` (as :func:`confined_transport` would run it): a Python module is
    installed for this interpreter; an ``exec``-ed program, and the interpreter of each
    ``#!`` line it starts, lie under the paths the confined process may read (the
    read paths, its script's folder, its own virtualenv and that venv's interpreter,
    ``reads``) and can be reached and read by the uid it drops to. Raises
    ``FileNotFoundError`` (no such program, script or module) or ``PermissionError``
    naming ``name``, the path, the uid and what to do; nothing when confinement is off."""
    path = dict(env or {}).get("PATH") or os.environ.get("PATH", os.defpath)
    target = python_target(command)
    if target is not None and target[0] == "module":
        top = target[1].split(".", 1)[0]  # found, not imported: its code must not run here
        if importlib.machinery.PathFinder.find_spec(top, sys.path) is None and top not in sys.builtin_module_names:
            raise FileNotFoundError(f"the MCP server {name!r} cannot start: the module {target[1]!r} is not "
                                    f"installed for {sys.executable} (rho's interpreter, which runs `python -m`): "
                                    "install it beside rho_actors, or give the interpreter that has it by its path")
    payload, folders = _payload(command, path)
    if payload["kind"] != "exec":
        return
    enclosure = _enclosure(policy, DEFAULT_HEAP_BYTES, dict(env or {}),
                           (*folders, *(os.path.realpath(p) for p in reads)), False)
    try:
        spec = enclosure.setup.confinement
    finally:
        enclosure.remove()
    if spec is None:
        return
    readable = tuple(spec.read_only)
    uid = spec.uid if spec.uid is not None and os.geteuid() == 0 else None
    gid = spec.gid if spec.gid is not None else 65534
    program = command[0] if os.sep in command[0] else (shutil.which(command[0], path=path) or command[0])
    for file, what in _exec_chain(program, path):
        real = os.path.realpath(file)
        if uid is not None and (why := _closed_to(file, uid, gid) or _closed_to(real, uid, gid)) is not None:
            raise PermissionError(
                f"the MCP server {name!r} cannot start confined: {what}, {file}, cannot be read by uid {uid}, "
                f"which it runs as: {why}. Start a Python server as `python -m MODULE` (it runs on rho's own "
                f"interpreter and packages), or install it where uid {uid} can read it (a virtualenv made from "
                "a system Python, e.g. `/usr/bin/python3 -m venv /opt/mcp/NAME`)")
        if not any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in readable):
            raise PermissionError(
                f"the MCP server {name!r} cannot start confined: {what}, {file} ({real}), is outside the paths "
                "it may read (the Python installation, /usr, /bin, /lib..., its script's folder, its own "
                "virtualenv): give its folder in the server's read = [...]")


def _enclosure(policy: ConfinePolicy, heap_bytes: int, env: Mapping[str, str], reads: tuple[str, ...],
               network: bool) -> Enclosure:
    base = dataclasses.replace(policy.base, network=network)
    enclosure = Enclosure(dataclasses.replace(policy, base=base, pids_max=_PIDS_MAX), heap_bytes, env=env,
                          modules=reads)
    spec = enclosure.setup.confinement
    if spec is not None and enclosure.cgroup is not None:
        # the cgroup bounds the tree's memory; an address-space limit would break runtimes
        # that reserve more than they use (V8, Go), so it is left off then
        unbounded = dataclasses.replace(spec, address_space=None)
        enclosure.setup = dataclasses.replace(enclosure.setup, confinement=unbounded)
    return enclosure


def _start(command: Sequence[str], policy: ConfinePolicy, heap_bytes: int, env: Mapping[str, str],
           reads: tuple[str, ...], network: bool, label: str) -> tuple[Enclosure, Any, Channel]:
    """Start the confined server (blocking): its enclosure, process and channel, once
    it is confined and about to run (raises ``ConnectionError`` when it ended before)."""
    path = env.get("PATH") or os.environ.get("PATH", os.defpath)
    payload, folders = _payload(command, path)
    extra = tuple(os.path.realpath(p) for p in reads)
    enclosure = _enclosure(policy, heap_bytes, env, (*folders, *extra), network)
    try:
        proc, channel = spawn_clean(_serve_child, payload, enclosure.setup, label=label)
    except BaseException:
        enclosure.remove()
        raise
    enclosure.started(proc.pid)
    sock: socket.socket = channel.conn
    ready, _, _ = select.select([sock], [], [], _START_TIMEOUT_S)
    first = b""
    with contextlib.suppress(OSError):
        first = sock.recv(1) if ready else b""
    if first != _READY:
        _end(enclosure, proc, channel)
        why = f"exit code {proc.exitcode}" if ready else f"not confined within {_START_TIMEOUT_S:g} s"
        raise ConnectionError(f"the confined MCP server ended before it started ({why}; its output is logged "
                              f"as {label!r})")
    return enclosure, proc, channel


def _end(enclosure: Enclosure, proc: Any, channel: Channel) -> None:
    """Kill the server's whole tree, reap it, and remove its cgroup and folder."""
    channel.close()
    enclosure.kill()
    proc.join(5.0)
    enclosure.remove()
    with contextlib.suppress(ValueError):
        proc.close()


@contextlib.asynccontextmanager
async def confined_transport(
    command: Sequence[str], *, policy: ConfinePolicy, env: Mapping[str, str] | None = None,
    reads: Sequence[str] = (), network: bool = False, heap_bytes: int = DEFAULT_HEAP_BYTES, label: str = "MCP server",
) -> AsyncIterator[tuple[Any, Any]]:
    """Start ``command`` (program and arguments) confined by ``policy`` (see the module
    doc) and yield ``(read, write)``: the SDK's ``SessionMessage`` streams of its stdio,
    as ``mcp.client.stdio.stdio_client`` gives. ``env`` is added to its scrubbed
    environment; ``reads`` are extra read-only paths; ``network=True`` gives it the
    host's network (else no socket at all); ``heap_bytes`` bounds its tree's memory
    (bytes); ``label`` names it in the host's log. Raises ``FileNotFoundError`` for a
    program or script that does not exist, ``OSError`` when no child could be started,
    ``ConnectionError`` when it ended before it ran."""
    started = await anyio.to_thread.run_sync(
        _start, list(command), policy, heap_bytes, dict(env or {}), tuple(reads), network, label
    )
    enclosure, proc, channel = started
    owner = owner_now()  # a system's stop that cannot wait for this connection kills the tree (otp.owned)
    process = enclosure.process
    owned = owner.add(process, enclosure.kill, label) if owner is not None and process is not None else -1
    try:
        try:
            reader, writer = await _streams(channel.conn)
        except BaseException:
            await anyio.to_thread.run_sync(_end, enclosure, proc, channel)
            raise
        try:
            async with message_streams(reader, writer, label) as streams:
                yield streams
        finally:
            writer.close()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_end, enclosure, proc, channel)
    finally:  # (ended and reaped by _end by now)
        if owner is not None:
            owner.discard(owned)


async def _streams(sock: socket.socket) -> tuple[Any, Any]:
    import asyncio

    return await asyncio.open_unix_connection(sock=sock, limit=MAX_LINE_BYTES)
