"""A stdio MCP server written with the standard library only (for a Python that has no
MCP SDK: the gateway exec-s it confined). Tools: read_file (a file's text), whoami (uid
and working folder)."""

import json
import os
import sys
from typing import Any

TOOLS = [
    {"name": "read_file", "description": "The text of a file.",
     "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "whoami", "description": "This server's uid and working folder.",
     "inputSchema": {"type": "object", "properties": {}}},
]


def call(name: str, args: dict[str, Any]) -> tuple[str, bool]:
    if name == "whoami":
        return f"{os.getuid()} {os.getcwd()}", False
    try:
        with open(args["path"], encoding="utf-8") as f:
            return f.read(), False
    except OSError as exc:
        return f"read_file: {exc}", True


def answer(request: dict[str, Any]) -> dict[str, Any]:
    method = request.get("method")
    if method == "initialize":
        return {"protocolVersion": request["params"]["protocolVersion"], "capabilities": {"tools": {}},
                "serverInfo": {"name": "plain", "version": "1"}}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        text, failed = call(request["params"]["name"], request["params"].get("arguments") or {})
        return {"content": [{"type": "text", "text": text}], "isError": failed}
    return {}


for line in sys.stdin:
    request = json.loads(line)
    if "id" in request and "method" in request:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": answer(request)}) + "\n")
        sys.stdout.flush()
