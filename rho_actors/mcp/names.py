"""The default name of an MCP server: one rule for a source and a gateway's upstream.

:func:`default_name` is the name an :class:`~rho_actors.mcp.MCPServer` gets without
``name=``, and the name ``rho-actors mcp serve --mcp/--mcp-url/--untrusted-mcp`` and
``chat --mcp`` give a server (then :func:`numbered` for repeats). It is made of what
the server is, as its command says: the module or script of a Python server (``python
-m mcp_server_time`` is ``mcp_server_time``, ``python /srv/weather.py`` is
``weather``), the package or script a launcher runs (``uvx mcp-server-git`` is
``mcp-server-git``, ``npx -y @modelcontextprotocol/server-everything`` is
``server-everything``, ``docker run -i --rm mcp/time`` is ``time``), else the
program's own name (``/usr/local/bin/my-server`` is ``my-server``); a URL's host and
port (``http://127.0.0.1:9000/mcp`` is ``127_0_0_1-9000``). Characters outside
``[A-Za-z0-9_-]`` become ``_``, a run of ``_`` one, none at the end, at most
:data:`MAX_NAME` characters: so a default name is also a valid gateway server name
(no ``__``: ``<server>__<tool>`` stays unambiguous and within a tool name's 64).

The name is chosen before the server runs and never from what it says of itself
(``serverInfo.name``, kept as :attr:`MCPServer.server_info` for display): it names the
supervised connection (``mcp:<name>``) and the log lines of its first start, the
gateway decides collisions and namespaces at start from it, and an untrusted server
must not pick its own name (one calling itself ``files`` would take the ``files__``
namespace of another server, or pass for it in the log).
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Container, Sequence
from typing import Final

__all__ = ["LAUNCHERS", "MAX_NAME", "PYTHON_NAME", "default_name", "numbered", "python_arguments"]

MAX_NAME: Final = 32
"""The longest default name (characters)."""
PYTHON_NAME: Final = re.compile(r"python(3(\.\d+)?)?")
"""A Python interpreter's program name (``python``, ``python3``, ``python3.N``)."""
LAUNCHERS: Final = frozenset({"node", "npx", "uv", "uvx", "pipx", "deno", "bun", "bunx", "env", "docker", "podman"})
"""Programs named by what they run (their first argument that is no option)."""
_PYTHON_FLAGS: Final = frozenset({"-u", "-I", "-B", "-E", "-s", "-S", "-O", "-OO", "-q"})
_SKIPPED: Final = frozenset({"run", "exec", "x", "tool"})  # "uv run X", "docker run X", "bun x X", "pipx run X"


def python_arguments(arguments: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """``(kind, target, args)`` of a Python interpreter's ``arguments``: kind
    ``"module"`` (``-m MODULE``) or ``"path"`` (``SCRIPT``, made absolute); ``None``
    when they run no module or script (``-c``, no target). Flags among ``-u -I -B -E -s
    -S -O -OO -q`` before the target are accepted and dropped."""
    rest = list(arguments)
    while rest and rest[0] in _PYTHON_FLAGS:
        rest.pop(0)
    if len(rest) >= 2 and rest[0] == "-m":
        return "module", rest[1], rest[2:]
    if rest and not rest[0].startswith("-"):
        return "path", os.path.abspath(rest[0]), rest[1:]
    return None


def default_name(command: Sequence[str] | None = None, url: str | None = None) -> str:
    """The default name of the server ``command`` starts (program and arguments) or
    ``url`` serves (see the module doc): 1 to :data:`MAX_NAME` of ``[A-Za-z0-9_-]``,
    no ``__``, not ending in ``_``; ``"mcp"`` when nothing is left. Raises
    ``ValueError`` for neither or an empty ``command``."""
    if url is not None:
        parts = urllib.parse.urlsplit(url)
        base = f"{parts.hostname or 'mcp'}-{parts.port}" if parts.port else (parts.hostname or "mcp")
    elif command:
        program = os.path.basename(command[0].rstrip("/")) or command[0]
        target = python_arguments(command[1:]) if PYTHON_NAME.fullmatch(program) else None
        if target is not None:
            base = target[1].rsplit(".", 1)[-1] if target[0] == "module" else _stem(target[1])
        elif program in LAUNCHERS:
            args = [a for a in command[1:] if not a.startswith("-") and a not in _SKIPPED and "=" not in a]
            base = _stem(args[0].split(":", 1)[0]) if args else program  # an image's ":tag" dropped
            base = base.rsplit("@", 1)[0] if base.rfind("@") > 0 else base  # a package's "@version" dropped
        else:
            base = program
    else:
        raise ValueError("default_name needs a command (program and arguments) or a url")
    name = re.sub(r"_{2,}", "_", re.sub(r"[^A-Za-z0-9_-]", "_", base))[:MAX_NAME].rstrip("_")
    return name or "mcp"


def numbered(base: str, taken: Container[str]) -> str:
    """``base``, or the first of ``base-2``, ``base-3``... not in ``taken`` (cut so that
    it stays within :data:`MAX_NAME` characters)."""
    name, n = base, 1
    while name in taken:
        n += 1
        suffix = f"-{n}"
        name = f"{base[:MAX_NAME - len(suffix)].rstrip('_')}{suffix}"
    return name


def _stem(path: str) -> str:
    """A path's last part without its extension (``/srv/weather.py``: ``weather``)."""
    return os.path.splitext(os.path.basename(path.rstrip("/")))[0]
