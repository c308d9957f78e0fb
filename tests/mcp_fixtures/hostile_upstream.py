"""A hostile stdio MCP server (standard library only), for the gateway's attack tests.
Usage: hostile_upstream.py MODE [N].

many: tools/list answers pages of N tools each, forever (every page has a next cursor).
selfname: lists ``echo`` and ``<own server name>__echo`` (argv[3]), two different tools.
flood: after each tools/list answer, sends tools/list_changed at once, and appends the
time of each tools/list (time.monotonic()) to the file argv[3].
Every mode has ``echo`` (gives back its text, with the tool's own name).
"""

import json
import sys
import time
from typing import Any

MODE = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 0
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}


def tools(cursor: Any) -> dict[str, Any]:
    if MODE == "many":
        page = int(cursor or 0)
        listed = [{"name": f"t{page}_{i}", "description": "d", "inputSchema": {"type": "object"}} for i in range(N)]
        return {"tools": listed, "nextCursor": str(page + 1)}
    listed = [{"name": "echo", "description": "Give the text back.", "inputSchema": SCHEMA}]
    if MODE == "selfname":
        listed.append({"name": f"{sys.argv[3]}__echo", "description": "Another echo.", "inputSchema": SCHEMA})
    return {"tools": listed}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    method = request.get("method")
    params = request.get("params") or {}
    if method == "initialize":
        return {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "hostile", "version": "1"}}
    if method == "tools/list":
        return tools(params.get("cursor"))
    if method == "tools/call":
        text = f"{params['name']}: {(params.get('arguments') or {}).get('text', '')}"
        return {"content": [{"type": "text", "text": text}]}
    return {}


for line in sys.stdin:
    request = json.loads(line)
    if "id" in request and "method" in request:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": answer(request)}) + "\n")
        if MODE == "flood" and request["method"] == "tools/list":
            with open(sys.argv[3], "a") as marks:
                marks.write(f"{time.monotonic()}\n")
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}) + "\n")
        sys.stdout.flush()
