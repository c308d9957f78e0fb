"""The Model Context Protocol both ways, under supervision (needs ``pip install 'rho_actors[mcp]'``).

- :func:`serve` / :func:`aserve` serve an :class:`~rho_actors.ActorSystem`'s tools to any
  MCP client over stdio or streamable HTTP (``rho-actors mcp serve``).
- :class:`MCPServer` is a source: ``system.add_source(MCPServer(command=[...]))`` offers
  an MCP server's tools as supervised, deadline-bound rho tools.
- :func:`client_of` gives a served tool the MCP client that called it (log messages,
  sampling, elicitation).
"""

from rho_actors.errors import needs_extra

with needs_extra("mcp", "rho_actors.mcp"):
    from rho_actors.mcp.client_requests import ClientRequestError, MCPClient, client_of
    from rho_actors.mcp.guard import HTTPGuard
    from rho_actors.mcp.serve import DEFAULT_MAX_ARGUMENT_BYTES, aserve, build_server, serve
    from rho_actors.mcp.source import ENV_ALLOWLIST, MCPConnection, MCPServer, MCPTool, scrubbed_environment

__all__ = [
    "DEFAULT_MAX_ARGUMENT_BYTES",
    "ClientRequestError",
    "ENV_ALLOWLIST",
    "HTTPGuard",
    "MCPClient",
    "MCPConnection",
    "MCPServer",
    "MCPTool",
    "aserve",
    "build_server",
    "client_of",
    "scrubbed_environment",
    "serve",
]
