"""The HTTP flags of ``rho-actors mcp serve`` and the :class:`~rho_actors.mcp.HTTPGuard`
they make (its bearer token and its bounds)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["add_http_flags", "http_guard"]


def add_http_flags(serve: argparse.ArgumentParser) -> None:
    """Add ``mcp serve``'s HTTP group of flags to its parser ``serve``."""
    http = serve.add_argument_group(
        "HTTP", "clients send Authorization: Bearer TOKEN, the token in $RHO_MCP_TOKEN (at least 16 "
                "characters) or, without it, one generated and printed at start")
    # the defaults are HTTPGuard's (rho_actors.mcp.guard; the MCP SDK is not imported here)
    http.add_argument("--max-sessions", type=_positive(int), default=None, metavar="N",
                      help="sessions open at once, in all (default 64; then 503)")
    http.add_argument("--max-sessions-per-client", type=_positive(int), default=None, metavar="N",
                      help="sessions open at once per client: a uid on loopback, else an address "
                           "(default 8; then 429)")
    http.add_argument("--max-tasks-per-client", type=_positive(int), default=None, metavar="N",
                      help="MCP tasks open at once per client, all its sessions together (default 32)")
    http.add_argument("--max-connections-per-client", type=_positive(int), default=None, metavar="N",
                      help="HTTP connections open at once per client (default 128; then 503 and closed)")
    http.add_argument("--header-timeout", type=_positive(float), default=None, metavar="S",
                      help="a request's headers must arrive whole within S seconds (default 20; then 408 and "
                           "closed)")
    http.add_argument("--body-timeout", type=_positive(float), default=None, metavar="S",
                      help="a request's body must arrive whole within S seconds of its headers (default 60; "
                           "then 408 and closed)")
    http.add_argument("--send-timeout", type=_positive(float), default=None, metavar="S",
                      help="close a connection whose client takes none of what it is sent for S seconds "
                           "(default 60)")
    http.add_argument("--idle-timeout", type=_positive(float), default=None, metavar="S",
                      help="close a session with no request for S seconds (default 300)")
    http.add_argument("--client-gone", type=_positive(float), default=None, metavar="S",
                      help="stop a session's loop S seconds after its client's last connection closed "
                           "(default 5)")
    http.add_argument("--insecure-no-auth", action="store_true",
                      help="serve without a token: loopback only, for local test suites (logged loudly)")


def _positive(kind: Callable[[str], float]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a number more than 0, got {text!r}")
        return value

    return parse


def http_guard(args: argparse.Namespace) -> Any:
    """The :class:`~rho_actors.mcp.HTTPGuard` of ``mcp serve --http`` (raises ``ValueError``)."""
    import secrets

    from rho_actors.mcp import HTTPGuard

    names = ("max_sessions", "max_sessions_per_client", "max_tasks_per_client", "max_connections_per_client")
    given = {"idle_timeout_s": args.idle_timeout, "client_gone_s": args.client_gone,
             "header_timeout_s": args.header_timeout, "body_timeout_s": args.body_timeout,
             "send_timeout_s": args.send_timeout,
             **{name: getattr(args, name) for name in names}}
    settings = {k: v for k, v in given.items() if v is not None}
    if args.insecure_no_auth:
        guard = HTTPGuard(auth=False, **settings)
        guard.check_host(args.http[0])
        print("rho-actors mcp serve: WARNING: no authentication (--insecure-no-auth): any local process "
              "can call these tools", file=sys.stderr, flush=True)
        return guard
    token = os.environ.get("RHO_MCP_TOKEN")
    guard = HTTPGuard(token or secrets.token_hex(32), **settings)
    if not token:
        print(f"MCP bearer token: {guard.token}", file=sys.stderr, flush=True)
    return guard
