"""Helpers shared by the tests."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rho_actors import Loop, ToolCall, tool
from rho_actors.sandbox import START_TIMEOUT_ENV
from tests.conftest import WAIT_S

if TYPE_CHECKING:
    from rho_actors import ActorSystem
    from rho_actors.mcp.gateway import UpstreamSpec

OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}
ROOT = Path(__file__).resolve().parent.parent
HOST_TIMEOUT_S = 4 * WAIT_S
"""The bound on a whole host process started from nothing (seconds), on a loaded machine."""


def scrubbed_env(**extra: str) -> dict[str, str]:
    """A host process's environment: ``PATH``, ``LANG`` and ``HOME`` of this one, the
    tests' bound on a worker's start (``RHO_ACTORS_START_TIMEOUT_MS``, tests/conftest.py),
    this checkout on ``PYTHONPATH``, and ``extra``; nothing else of the test run's."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "HOME", START_TIMEOUT_ENV)}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def run_host_script(folder: Path, script: str, *args: str, timeout_s: float = HOST_TIMEOUT_S,
                    env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (Python source) as ``folder/host.py ARGS...`` in a fresh interpreter,
    in ``folder``, with :func:`scrubbed_env` (or ``env``), within ``timeout_s``; its
    output captured as text. The exit code is the caller's to assert."""
    host = folder / "host.py"
    host.write_text(script)
    return subprocess.run(  # noqa: PLW1510 - the caller asserts the exit code
        [sys.executable, str(host), *args], capture_output=True, text=True, timeout=timeout_s,
        env=scrubbed_env() if env is None else env, cwd=folder,
    )


@tool
def echo(text: str) -> str:
    """Return the text."""
    return text


def echoed(loop: Loop, text: str) -> str:
    """What :func:`echo` returns for ``text`` through a turn of ``loop`` (it must be ok)."""
    [result] = loop.run_turn([ToolCall("e", "echo", json.dumps({"text": text}))], timeout_s=WAIT_S)
    assert result.ok, result.content
    return str(result.content)


def make_tool(
    name: str,
    run: Callable[[Any, Any], Any] | Any = "ok",
    *,
    description: str | None = None,
    schema: dict[str, Any] | None = None,
    **callbacks: Any,
) -> type:
    """A class tool with static callbacks (DESIGN §2): ``name()`` returns ``name``;
    ``description()`` returns ``description`` (default ``"The <name> tool."``);
    ``parameter_schema()`` returns ``schema`` (default ``{"type": "object"}``);
    ``run(args, ctx)`` calls ``run`` when it is callable, else returns it. Each other
    keyword (``timeout_ms=100``, ``concurrency="exclusive"``, ``selftest=fn``) becomes a
    callback: a callable is called with no arguments, any other value is returned.
    The class belongs to the calling test module (its origin in messages)."""
    text = description if description is not None else f"The {name} tool."
    parameters = schema if schema is not None else OBJECT_SCHEMA

    class Tool:
        @staticmethod
        def name() -> str:
            return name

        @staticmethod
        def description() -> str:
            return text

        @staticmethod
        def parameter_schema() -> dict[str, Any]:
            return parameters

        @staticmethod
        def run(args: Any, ctx: Any) -> Any:
            return run(args, ctx) if callable(run) else run

    for key, value in callbacks.items():
        setattr(Tool, key, staticmethod(value if callable(value) else (lambda value=value: value)))
    Tool.__name__ = Tool.__qualname__ = f"{name}_tool"
    caller = inspect.currentframe()
    if caller is not None and caller.f_back is not None:
        Tool.__module__ = caller.f_back.f_globals.get("__name__", __name__)
    return Tool


def unchecked_image(data: Any, mime_type: Any) -> Any:
    """An :class:`rho_actors.Image` that skipped its checks (a tool can no longer make
    one; a transcript or an older caller might): what a request builder must still
    leave out with a notice."""
    from rho_actors import Image

    image = object.__new__(Image)
    object.__setattr__(image, "data", data)
    object.__setattr__(image, "mime_type", mime_type)
    return image


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free now (the kernel's pick), for a server to bind."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port`` now (one try,
    bounded at 0.2 s)."""
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def served_gateway(system: ActorSystem, specs: Sequence[UpstreamSpec], *, tasks: bool = False) -> Iterator[str]:
    """``system`` serving a :class:`~rho_actors.mcp.gateway.Gateway` over ``specs``
    (started, so connected to each upstream) as MCP over HTTP on loopback: the URL, with
    ``tests.test_mcp_protocol_eras``'s guard. ``tasks``: assert that the first upstream
    makes tasks. The gateway is closed on the way out."""
    from rho_actors.mcp.gateway import Gateway, GatewayConfig
    from tests.test_mcp_protocol_eras import _served_http

    gateway = Gateway(GatewayConfig(tuple(specs)))
    gateway.start(system)
    try:
        assert not tasks or gateway.upstreams[0].supports_tasks
        with _served_http(system) as (url, _guard):
            yield url
    finally:
        gateway.close()
